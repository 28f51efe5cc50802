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

// Broadcasts `bytes` from rank `source` in chunks of `chunk_bytes`. The
// first message carries `header` (the source's; any small fixed-size data
// that travels with the state), every chunk's SHA-256 digest and the first
// chunk, so that a state of one chunk costs one collective. A receiver
// checks every chunk: DATA_LOSS naming the chunk and `source_id` on a
// mismatch (the round fails; nothing is applied, `header` is left as it
// was). Every member of `comm` must call it with the same sizes.
[[nodiscard]] Status StreamState(Communicator& comm, std::span<std::byte> bytes, int source,
                                 const std::string& source_id, size_t chunk_bytes = kHealChunkBytes,
                                 std::span<std::byte> header = {});
}  // namespace mend::reducer
