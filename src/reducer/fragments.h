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
  std::unique_ptr<FragmentState> state;
  uint64_t tokens_since_round = 0;
  // The job's boundary step of the last round this fragment completed: no
  // second round is launched for it (after a heal moved the step).
  uint64_t last_round_boundary = 0;
};

}  // namespace mend::reducer
