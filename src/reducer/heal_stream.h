// Live healing's transfer: the source's global state streamed to every
// member of the round in chunks, each checked against its SHA-256.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "mend/communicator.h"
#include "mend/status.h"

namespace mend::reducer {

inline constexpr size_t kHealChunkBytes = 4 << 20;

// Broadcasts `bytes` from rank `source` in chunks of `chunk_bytes`, then the
// chunks' SHA-256 digests. A receiver checks every chunk: DATA_LOSS naming
// the chunk and `source_id` on a mismatch (the round fails; nothing is
// applied). Every member of `comm` must call it with the same size.
[[nodiscard]] Status StreamState(Communicator& comm, std::span<std::byte> bytes, int source,
                                 const std::string& source_id, size_t chunk_bytes = kHealChunkBytes);

}  // namespace mend::reducer
