// The merges every Communicator has (include/mend/communicator.h): made
// values and the members left out, over the communicator's own collectives.
#include "mend/communicator.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "dataplane/left_out.h"
#include "fmt/format.h"

namespace mend {

std::vector<int> LeftOut(const Communicator::LeaveOut* leave_out, std::span<const double> squares,
                         std::span<const double> weights) {
  std::vector<int> left;
  if (leave_out != nullptr) {
    left = (*leave_out)(squares, weights);
  } else {
    for (size_t r = 0; r < squares.size(); ++r)
      if (!std::isfinite(squares[r])) left.push_back(static_cast<int>(r));
  }
  std::sort(left.begin(), left.end());
  left.erase(std::unique(left.begin(), left.end()), left.end());
  return left;
}

std::vector<double> Column(std::span<const double> gathered, size_t stride, size_t field) {
  std::vector<double> column(gathered.size() / stride);
  for (size_t r = 0; r < column.size(); ++r) column[r] = gathered[stride * r + field];
  return column;
}

MemberNorms::MemberNorms(double squares, double weight, int members, std::optional<bool> makes)
    : mine_{squares, weight} {
  if (makes.has_value()) mine_.push_back(*makes ? 1.0 : 0.0);
  gathered_.resize(mine_.size() * static_cast<size_t>(members));
}

Status MemberNorms::Gather(Communicator& comm) {
  if (gathered_.size() == mine_.size()) {
    std::copy(mine_.begin(), mine_.end(), gathered_.begin());
    return OkStatus();
  }
  return comm.AllGather(std::as_bytes(std::span(mine_)),
                        std::as_writable_bytes(std::span(gathered_)));
}

bool MemberNorms::AnyMade() const {
  if (mine_.size() < 3) return false;
  for (double made : Column(gathered_, mine_.size(), 2))
    if (made != 0) return true;
  return false;
}

std::vector<int> MemberNorms::LeftOut(const Communicator::LeaveOut* rule) const {
  return mend::LeftOut(rule, Column(gathered_, mine_.size(), 0),
                       Column(gathered_, mine_.size(), 1));
}

namespace {

// Every member's sum of squares and weight (one small collective): the
// members `leave_out` names (LeftOut), alike on every member.
StatusOr<std::vector<int>> GatherLeftOut(Communicator& comm, double squares, double weight,
                                         const Communicator::LeaveOut* leave_out) {
  MemberNorms norms(squares, weight, comm.world_size());
  MEND_RETURN_IF_ERROR(norms.Gather(comm));
  return norms.LeftOut(leave_out);
}

}  // namespace

// Made first, then every member's sum of squares and weight (one small
// collective), then the merge, those left out with zeros and weight 0.
StatusOr<Communicator::Merged> Communicator::MergeAllReduce(std::span<float> data, double weight,
                                                            const MergeValues& values) {
  if (values.make != nullptr && values.codec != nullptr &&
      values.codec->kind() != CodecKind::kFp32) {
    return InvalidArgumentError("all-reduce: made values are fp32 only");
  }
  Merged merged;
  merged.squares = values.make != nullptr ? (*values.make)(0, data.size()) : values.squares;
  MEND_ASSIGN_OR_RETURN(merged.left_out,
                        GatherLeftOut(*this, merged.squares, weight, values.leave_out));
  if (std::binary_search(merged.left_out.begin(), merged.left_out.end(), rank())) {
    std::fill(data.begin(), data.end(), 0.0f);
    weight = 0;
  }
  MEND_RETURN_IF_ERROR(WeightedAllReduce(data, weight, values.codec));
  return merged;
}

// Every member's sum of squares and weight (one small collective), then the
// gather, those left out sending the codec's zeros with weight 0.
StatusOr<std::vector<int>> Communicator::MergeAllGatherDecode(std::span<const std::byte> payload,
                                                              double weight, double squares,
                                                              const LeaveOut* leave_out,
                                                              const Codec& codec,
                                                              std::span<float> out) {
  MEND_ASSIGN_OR_RETURN(std::vector<int> left_out,
                        GatherLeftOut(*this, squares, weight, leave_out));
  if (std::binary_search(left_out.begin(), left_out.end(), rank())) {
    std::vector<std::byte> zeros(payload.size());
    codec.Encode(std::vector<float>(out.size(), 0.0f), zeros);
    MEND_RETURN_IF_ERROR(WeightedAllGatherDecode(zeros, 0, codec, out));
  } else {
    MEND_RETURN_IF_ERROR(WeightedAllGatherDecode(payload, weight, codec, out));
  }
  return left_out;
}

StatusOr<double> Communicator::MadeAllReduce(std::span<float> data, double weight,
                                             const MakeValues& make) {
  MergeValues values;
  values.make = &make;
  MEND_ASSIGN_OR_RETURN(Merged merged, MergeAllReduce(data, weight, values));
  return merged.squares;
}

Status Communicator::Fp32AllReduce(std::span<float> data, double weight, Fp32Sum sum) {
  if (sum == Fp32Sum::kWeightedMean) return WeightedAllReduce(data, weight, nullptr);
  return FailedPreconditionError(
      "Fp32AllReduce: this communicator has no fp32 weighted sum but the mean");
}

}  // namespace mend
