#include "reducer/heal_stream.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "core/status_format.h"
#include "fmt/format.h"
#include "mend/checkpoint.h"

namespace mend::reducer {
namespace {

// memcpy of `n` bytes; nothing for none (memcpy's pointers must not be null
// even then, and an empty span's may be: UBSan's finding).
void CopyBytes(void* to, const void* from, size_t n) {
  if (n > 0) std::memcpy(to, from, n);
}

}  // namespace

Status StreamState(Communicator& comm, std::span<std::byte> bytes, int source,
                   const std::string& source_id, size_t chunk_bytes, std::span<std::byte> header) {
  using Digest = std::array<unsigned char, 32>;
  const size_t chunks = std::max<size_t>(1, (bytes.size() + chunk_bytes - 1) / chunk_bytes);
  auto chunk = [&](size_t c) {
    const size_t begin = std::min(bytes.size(), c * chunk_bytes);
    return bytes.subspan(begin, std::min(chunk_bytes, bytes.size() - begin));
  };
  // The first message: the header, every chunk's digest, then chunk 1; so a
  // state of one chunk (and its boundary) costs one collective.
  const size_t lead = header.size() + chunks * sizeof(Digest);
  std::vector<std::byte> first(lead + chunk(0).size());
  if (comm.rank() == source) {
    CopyBytes(first.data(), header.data(), header.size());
    for (size_t c = 0; c < chunks; ++c) {
      const Digest digest = Sha256Digest(chunk(c).data(), chunk(c).size());
      std::memcpy(first.data() + header.size() + c * sizeof(Digest), digest.data(), sizeof(Digest));
    }
    CopyBytes(first.data() + lead, chunk(0).data(), chunk(0).size());
  }
  MEND_RETURN_IF_ERROR(comm.Broadcast(first, source));
  for (size_t c = 1; c < chunks; ++c) MEND_RETURN_IF_ERROR(comm.Broadcast(chunk(c), source));
  if (comm.rank() == source) return OkStatus();
  CopyBytes(chunk(0).data(), first.data() + lead, chunk(0).size());
  for (size_t c = 0; c < chunks; ++c) {
    Digest expected;
    std::memcpy(expected.data(), first.data() + header.size() + c * sizeof(Digest), sizeof(Digest));
    if (Sha256Digest(chunk(c).data(), chunk(c).size()) != expected) {
      return DataLossError(
          fmt::format("healing from {}: chunk {} of {} ({} bytes) fails its checksum", source_id,
                      c + 1, chunks, chunk(c).size()));
    }
  }
  // The header is taken only once everything checked out.
  CopyBytes(header.data(), first.data(), header.size());
  return OkStatus();
}

}  // namespace mend::reducer
