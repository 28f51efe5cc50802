// The round driver's fragments: which parameters each holds (layer l ->
// fragment l mod P, by index into the FlatParameters), laid out flat in
// parameter order, and its global state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "mend/outer_sync.h"

namespace mend::reducer {

struct Fragment {
  std::vector<size_t> parameters;
  std::vector<size_t> starts;  // where each parameter's values start in the flat state
  std::unique_ptr<FragmentState> state;
  uint64_t tokens_since_round = 0;
  // The job's boundary step of the last round this fragment completed: no
  // second round is launched for it (after a heal moved the step).
  uint64_t last_round_boundary = 0;
  // The buffers of its next round, allocated and faulted in after the start
  // (FragmentBook::StartPrefault); a round borrows them and gives them back:
  // the pseudo-gradient, and in concurrent mode its copy and the
  // provisional step (InFlight::delta, own, eager).
  ZeroedFloats spare;
  ZeroedFloats spare_own;
  ZeroedFloats spare_step;
};

// `spare` when it has `n` values (it is left empty), else a new buffer.
inline ZeroedFloats Borrow(ZeroedFloats& spare, size_t n) {
  if (spare.size() != n) return ZeroedFloats(n);
  ZeroedFloats buffer = std::move(spare);
  spare = {};
  return buffer;
}
// Back into `spare`, unless it holds one already; `buffer` is left empty.
inline void GiveBackBuffer(ZeroedFloats& spare, ZeroedFloats& buffer) {
  if (spare.empty()) spare = std::move(buffer);
  buffer = {};
}

}  // namespace mend::reducer
