// Large scratch buffers kept across rounds. A round allocates several
// model-sized vectors (the boundary snapshot, the pseudo-gradient, the merged
// result, the collectives' scratch) and frees them when it ends; glibc hands
// blocks of 32 MiB and more straight to mmap, so every round paid for fresh
// pages (a page fault and a zeroed page per 4 KiB: measured, a third of a
// 64 MiB round's CPU). Buffers given back here are handed out again instead.
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <vector>

namespace mend {

// A vector of `n` values (their contents unspecified), reusing a buffer
// given back before when one is large enough.
std::vector<float> TakeFloats(size_t n);
std::vector<std::byte> TakeBytes(size_t n);
// Keeps `buffer` for a later Take (the pool holds a few of the largest).
void GiveBack(std::vector<float>&& buffer);
void GiveBack(std::vector<std::byte>&& buffer);

}  // namespace mend
