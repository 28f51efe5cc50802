#pragma once

#include <cstddef>
#include <vector>

#include "core/parallel.h"

namespace mend::reducer {

// The boundary's pseudo-gradient made later, range by range: a synchronous
// round makes it as its merge reaches each piece (OuterRound::Exchange's
// `make`), on the round's thread, while the training thread waits for the
// round and leaves the parameters and the fragment's state alone. It holds
// the parameters' values in place (FlatParameters::Values), taken on the
// training thread at the boundary (FragmentBook::DeferSnapshot), and runs
// on the book's pool (round_threads), which that thread leaves alone
// meanwhile.
class DeferredSnapshot {
 public:
  // delta[begin, end) <- theta_g - theta_i; their sum of squares (parts of
  // the range on the pool's threads, their sums added in order).
  double Make(size_t begin, size_t end) const;

 private:
  friend class FragmentBook;
  double MakePart(size_t begin, size_t end) const;

  ThreadPool* pool_ = nullptr;
  const float* global_ = nullptr;
  float* delta_ = nullptr;
  std::vector<const float*> theta_;  // each parameter's values ...
  std::vector<size_t> starts_;       // ... at this offset in the fragment
  size_t size_ = 0;
};

}  // namespace mend::reducer
