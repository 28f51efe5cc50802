// Whom a round's merge leaves out (Communicator::MergeValues::leave_out),
// shared by the communicators' merges.
//
// Thread-safety: LeftOut and Column are pure functions (LeftOut calls
// `leave_out`); a MemberNorms is used by one thread.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "mend/communicator.h"
#include "mend/status.h"

namespace mend {

// The members `leave_out` names (ascending, each once), or without it those
// whose sum of squares is not finite.
std::vector<int> LeftOut(const Communicator::LeaveOut* leave_out, std::span<const double> squares,
                         std::span<const double> weights);

// Field `field` of each member's record of `stride` doubles, out of an
// all-gather of them (member r's record at r * stride).
std::vector<double> Column(std::span<const double> gathered, size_t stride, size_t field);

// Every member's sum of squares and weight and, for a merge whose members may
// make their values, whether each does: one small all-gather, then whom a
// merge's rule leaves out of them, alike on every member.
class MemberNorms {
 public:
  MemberNorms(double squares, double weight, int members, std::optional<bool> makes = {});

  // The all-gather (nothing to send for a member alone).
  [[nodiscard]] Status Gather(Communicator& comm);
  // After Gather: whether some member makes its values (with `makes`).
  bool AnyMade() const;
  // After Gather: the members `rule` leaves out (LeftOut).
  std::vector<int> LeftOut(const Communicator::LeaveOut* rule) const;

 private:
  std::vector<double> mine_;  // squares, weight[, makes]
  std::vector<double> gathered_;
};

}  // namespace mend
