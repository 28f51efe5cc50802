#include "reducer/heal_stream.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/status_format.h"
#include "fmt/format.h"
#include "xxhash.h"

namespace mend::reducer {
namespace {

constexpr size_t kDigestBytes = sizeof(XXH128_hash_t);

// memcpy of `n` bytes; nothing for none (memcpy's pointers must not be null
// even then, and an empty span's may be: UBSan's finding).
void CopyBytes(void* to, const void* from, size_t n) {
  if (n > 0) std::memcpy(to, from, n);
}

XXH128_hash_t Digest(std::span<const std::byte> chunk) {
  return XXH3_128bits(chunk.data(), chunk.size());
}

}  // namespace

Status StreamState(Communicator& comm, size_t bytes, const ReadState& read, const WriteState& write,
                   int source, const std::string& source_id, size_t chunk_bytes,
                   std::span<std::byte> header) {
  const size_t chunks = std::max<size_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes);
  const bool sending = comm.rank() == source;
  // One message buffer, reused: [header (the first only)] chunk digest.
  std::vector<std::byte> message(header.size() + std::min(bytes, chunk_bytes) + kDigestBytes);
  std::vector<std::byte> header_in(header.size());
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = std::min(bytes, c * chunk_bytes);
    const size_t size = std::min(chunk_bytes, bytes - begin);
    const size_t lead = c == 0 ? header.size() : 0;
    const std::span<std::byte> whole(message.data(), lead + size + kDigestBytes);
    const std::span<std::byte> chunk = whole.subspan(lead, size);
    if (sending) {
      if (lead > 0) CopyBytes(whole.data(), header.data(), lead);
      if (size > 0) read(begin, chunk);
      const XXH128_hash_t digest = Digest(whole.first(lead + size));
      std::memcpy(chunk.data() + size, &digest, kDigestBytes);
    }
    MEND_RETURN_IF_ERROR(comm.Broadcast(whole, source));
    if (sending) continue;
    const XXH128_hash_t digest = Digest(whole.first(lead + size));
    if (std::memcmp(&digest, chunk.data() + size, kDigestBytes) != 0) {
      return DataLossError(
          fmt::format("healing from {}: chunk {} of {} ({} bytes) fails its checksum", source_id,
                      c + 1, chunks, size));
    }
    if (lead > 0) CopyBytes(header_in.data(), whole.data(), lead);
    if (write && size > 0) write(begin, chunk);
  }
  // The header is taken only once everything checked out.
  if (!sending) CopyBytes(header.data(), header_in.data(), header.size());
  return OkStatus();
}

Status StreamState(Communicator& comm, std::span<std::byte> bytes, int source,
                   const std::string& source_id, size_t chunk_bytes, std::span<std::byte> header) {
  return StreamState(
      comm, bytes.size(),
      [&](size_t offset, std::span<std::byte> out) {
        CopyBytes(out.data(), bytes.data() + offset, out.size());
      },
      [&](size_t offset, std::span<const std::byte> in) {
        CopyBytes(bytes.data() + offset, in.data(), in.size());
      },
      source, source_id, chunk_bytes, header);
}

}  // namespace mend::reducer
