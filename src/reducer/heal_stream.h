// Live healing's transfer: a source's state streamed to every member of the
// round in chunks, each checked against its digest, through one buffer of a
// chunk on every member: the source reads its state a chunk at a time
// where it lies, and a receiver writes each chunk, once checked, where it
// goes (neither needs a copy of the whole state).
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>

#include "mend/communicator.h"
#include "mend/status.h"

namespace mend::reducer {

inline constexpr size_t kHealChunkBytes = 4 << 20;

// The state's bytes [offset, offset + out.size()) into `out` (the source).
using ReadState = std::function<void(size_t offset, std::span<std::byte> out)>;
// `in`, checked, as the state's bytes from `offset` on (a receiver).
using WriteState = std::function<void(size_t offset, std::span<const std::byte> in)>;

// Broadcasts a state of `bytes` bytes from rank `source` in chunks of
// `chunk_bytes`, each message a chunk followed by its XXH3-128 digest (a
// check against damage on the way, not against an attacker); the first
// message leads with `header` (the source's; any small fixed-size data
// that travels with the state), which its digest covers too. On the source `read` gives the
// chunks; on every other member each chunk is checked on arrival and handed
// to `write` (may be empty: a member that only relays). DATA_LOSS naming
// the chunk and `source_id` on a mismatch (the round fails: a receiver
// must not use what `write` got; `header` is left as it was, and taken only
// once every chunk checked out). Every member of `comm` must call it with
// the same sizes.
[[nodiscard]] Status StreamState(Communicator& comm, size_t bytes, const ReadState& read,
                                 const WriteState& write, int source, const std::string& source_id,
                                 size_t chunk_bytes = kHealChunkBytes,
                                 std::span<std::byte> header = {});

// The same for a state that lies whole in `bytes` on every member.
[[nodiscard]] Status StreamState(Communicator& comm, std::span<std::byte> bytes, int source,
                                 const std::string& source_id, size_t chunk_bytes = kHealChunkBytes,
                                 std::span<std::byte> header = {});

}  // namespace mend::reducer
