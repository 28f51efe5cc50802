#include "reducer/unreachable_peers.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/round_keys.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace mend::reducer {
namespace {

constexpr std::string_view kTimedOut = "Connect timeout [";
constexpr std::string_view kUnauthenticated = "') failed authentication";

// `host` in the form inet_ntop writes it, when it is a numeric address.
std::string Canonical(const std::string& host) {
  unsigned char bytes[sizeof(struct in6_addr)];
  char text[INET6_ADDRSTRLEN];
  for (int family : {AF_INET, AF_INET6}) {
    if (inet_pton(family, host.c_str(), bytes) == 1 &&
        inet_ntop(family, bytes, text, sizeof(text)) != nullptr) {
      return text;
    }
  }
  return "";
}

// The numeric addresses of a member's data-plane host: `address` without a
// port, itself when numeric, else what it resolves to.
std::set<std::string> NumericHosts(const std::string& address) {
  std::string host = address;
  if (!host.empty() && host.front() == '[') {
    host = host.substr(1, host.find(']') - 1);  // [v6]:port
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));  // HOST:PORT
  }
  std::set<std::string> hosts;
  if (std::string numeric = Canonical(host); !numeric.empty()) {
    hosts.insert(numeric);
    return hosts;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (host.empty() || getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return hosts;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) ==
        0) {
      hosts.insert(Canonical(text));
    }
  }
  freeaddrinfo(found);
  return hosts;
}

}  // namespace

std::vector<UnreachableMember> UnreachableMembers(std::string_view error,
                                                  const RoundMembers& members,
                                                  const std::string& self) {
  std::map<std::string, bool> named_ids;                  // id -> it failed authentication
  std::map<std::string, std::set<std::string>> resolved;  // each address once
  size_t at = 0;
  while ((at = error.find(kTimedOut, at)) != std::string_view::npos) {
    at += kTimedOut.size();
    const size_t end = error.find(']', at);
    if (end == std::string_view::npos) break;
    const std::string host = Canonical(std::string(error.substr(at, end - at)));
    at = end + 1;
    if (host.empty()) continue;
    const RoundMember* named = nullptr;
    int matches = 0;
    for (const RoundMember& member : members) {
      auto [it, fresh] = resolved.try_emplace(member.address());
      if (fresh) it->second = NumericHosts(member.address());
      if (it->second.count(host) == 0) continue;
      ++matches;
      named = &member;
    }
    if (matches == 1 && named->learner_id() != self)
      named_ids.try_emplace(named->learner_id(), false);
  }
  for (at = 0; (at = error.find(kUnauthenticated, at)) != std::string_view::npos;
       at += kUnauthenticated.size()) {
    const size_t open = error.rfind("('", at);
    if (open == std::string_view::npos) continue;
    const std::string id(error.substr(open + 2, at - open - 2));
    const bool member = std::any_of(members.begin(), members.end(),
                                    [&](const RoundMember& m) { return m.learner_id() == id; });
    if (member && id != self) named_ids[id] = true;
  }
  std::vector<UnreachableMember> named;
  for (const auto& [id, unauthenticated] : named_ids) named.push_back({id, unauthenticated});
  return named;
}

void ReportUnreachable(RendezvousStore& store, const std::string& prefix,
                       const RoundMembers& members, const std::string& self, const Status& failed) {
  if (failed.ok()) return;
  const std::vector<UnreachableMember> peers =
      UnreachableMembers(std::string(failed.message()), members, self);
  if (peers.empty()) return;
  std::string report;
  for (const UnreachableMember& peer : peers) {
    report += fmt::format("{}{}{}", report.empty() ? "" : "\n", peer.id,
                          peer.unauthenticated ? kRoundUnauthenticatedTag : "");
  }
  (void)store.Set(prefix + kRoundUnreachablePrefix + self, report);
}

}  // namespace mend::reducer
