#include "reducer/unreachable_peers.h"

#include <algorithm>

namespace mend::reducer {

std::vector<std::string> UnreachableMembers(std::string_view error,
                                            const std::vector<RoundMember>& members,
                                            const std::string& self) {
  std::vector<std::string> ids;
  size_t at = 0;
  while ((at = error.find('[', at)) != std::string_view::npos) {
    const size_t end = error.find(']', at + 1);
    if (end == std::string_view::npos) break;
    const std::string_view host = error.substr(at + 1, end - at - 1);
    at = end + 1;
    const RoundMember* named = nullptr;
    int matches = 0;
    for (const RoundMember& member : members) {
      if (member.address != host) continue;
      ++matches;
      named = &member;
    }
    if (matches == 1 && named->id != self) ids.push_back(named->id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace mend::reducer
