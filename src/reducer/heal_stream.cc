#include "reducer/heal_stream.h"

#include <algorithm>
#include <array>
#include <vector>

#include "fmt/format.h"
#include "mend/checkpoint.h"
#include "core/status_format.h"

namespace mend::reducer {

Status StreamState(Communicator& comm, std::span<std::byte> bytes, int source, const std::string& source_id,
                   size_t chunk_bytes) {
  const size_t chunks = (bytes.size() + chunk_bytes - 1) / chunk_bytes;
  std::vector<std::array<unsigned char, 32>> digests(chunks);
  auto chunk = [&](size_t c) {
    const size_t begin = c * chunk_bytes;
    return bytes.subspan(begin, std::min(chunk_bytes, bytes.size() - begin));
  };
  if (comm.rank() == source) {
    for (size_t c = 0; c < chunks; ++c) digests[c] = Sha256Digest(chunk(c).data(), chunk(c).size());
  }
  for (size_t c = 0; c < chunks; ++c) MEND_RETURN_IF_ERROR(comm.Broadcast(chunk(c), source));
  MEND_RETURN_IF_ERROR(comm.Broadcast(std::as_writable_bytes(std::span(digests)), source));
  if (comm.rank() == source) return OkStatus();
  for (size_t c = 0; c < chunks; ++c) {
    if (Sha256Digest(chunk(c).data(), chunk(c).size()) != digests[c]) {
      return DataLossError(fmt::format("healing from {}: chunk {} of {} ({} bytes) fails its checksum", source_id,
                                       c + 1, chunks, chunk(c).size()));
    }
  }
  return OkStatus();
}

}  // namespace mend::reducer
