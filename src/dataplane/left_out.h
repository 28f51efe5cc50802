// Whom a round's merge leaves out (Communicator::MergeValues::leave_out),
// shared by the communicators' merges.
//
// Thread-safety: a pure function (it calls `leave_out`).
#pragma once

#include <span>
#include <vector>

#include "mend/communicator.h"

namespace mend {

// The members `leave_out` names (ascending, each once), or without it those
// whose sum of squares is not finite.
std::vector<int> LeftOut(const Communicator::LeaveOut* leave_out, std::span<const double> squares,
                         std::span<const double> weights);

}  // namespace mend
