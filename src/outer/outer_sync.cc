#include "mend/outer_sync.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/buffer_pool.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace mend {
namespace {

double Norm(std::span<const float> values) {
  double sum = 0;
  for (float v : values) sum += static_cast<double>(v) * v;
  return std::sqrt(sum);  // NaN or Inf propagates
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void WarnDroppedMe() {
  spdlog::warn(
      "robust merge: this member's pseudo-gradient is left out of this round (not finite, or its "
      "norm an outlier among the members')");
}

// The robust rule as a merge's LeaveOut: over the contributing members
// (weight > 0) only; their norms into `norms` (for the warning).
Communicator::LeaveOut RobustRule(const OuterSyncOptions& options, std::vector<double>& norms) {
  return [&options, &norms](std::span<const double> squares, std::span<const double> weights) {
    std::vector<int> contributing, left;
    norms.clear();
    for (size_t r = 0; r < squares.size(); ++r) {
      if (!(weights[r] > 0)) continue;
      norms.push_back(std::sqrt(squares[r]));
      contributing.push_back(static_cast<int>(r));
    }
    for (int i : RobustDrops(norms, options.robust_zscore))
      left.push_back(contributing[static_cast<size_t>(i)]);
    return left;
  };
}

// Says whom the merge left out.
void WarnLeftOut(const Communicator& comm, const std::vector<int>& dropped,
                 const std::vector<double>& norms) {
  if (std::find(dropped.begin(), dropped.end(), comm.rank()) != dropped.end()) {
    WarnDroppedMe();
  } else if (!dropped.empty()) {
    spdlog::warn("robust merge: member(s) {} left out of this round (norms {})",
                 fmt::join(dropped, ", "), fmt::join(norms, ", "));
  }
}

}  // namespace

std::vector<int> RobustDrops(std::span<const double> norms, double zscore_threshold) {
  std::vector<int> dropped;
  std::vector<double> finite;
  for (size_t r = 0; r < norms.size(); ++r) {
    if (std::isfinite(norms[r])) {
      finite.push_back(norms[r]);
    } else {
      dropped.push_back(static_cast<int>(r));
    }
  }
  if (zscore_threshold <= 0 || finite.size() < 3) return dropped;
  const double median = Median(finite);
  std::vector<double> deviations;
  for (double n : finite) deviations.push_back(std::fabs(n - median));
  // The MAD, floored at a quarter of the median: learners on different data
  // legitimately differ by a factor of two or so (and with three members the
  // MAD alone can be tiny); the rule is for gross outliers (a pseudo-gradient
  // many times the others', as from a diverging or corrupted learner).
  const double mad = std::max(Median(deviations), 0.25 * median);
  if (mad <= 0) return dropped;
  for (size_t r = 0; r < norms.size(); ++r) {
    if (std::isfinite(norms[r]) && 0.6745 * (norms[r] - median) / mad > zscore_threshold) {
      dropped.push_back(static_cast<int>(r));
    }
  }
  std::sort(dropped.begin(), dropped.end());
  return dropped;
}

FragmentState::FragmentState(size_t values) : global_(values), momentum_(values) {}

FragmentState::FragmentState(std::span<const float> initial)
    : global_(initial.begin(), initial.end()), momentum_(initial.size(), 0.0f) {}

void FragmentState::Assign(std::span<const float> global, std::span<const float> momentum) {
  global_.assign(global.begin(), global.end());
  momentum_.assign(momentum.begin(), momentum.end());
  residual_.clear();
}

namespace {

// fp32, or a dense codec: one collective, the members' sums of squares
// beside it (Communicator::MergeAllReduce), the robust rule deciding whom it
// leaves out on every member alike: before the sums when every member's
// pseudo-gradient was made before the round, after them (and a second
// reduction when it leaves someone out) when a member makes its own as the
// merge reaches each piece (fp32 only: a codec's are made first).
StatusOr<RoundResult> Merge(Communicator& comm, std::span<float> delta, double tokens,
                            const OuterSyncOptions& options, std::optional<double> norm,
                            const Communicator::MakeValues* make) {
  const Codec* codec = options.codec;
  if (codec != nullptr && codec->kind() == CodecKind::kFp32) codec = nullptr;
  if (codec != nullptr && make != nullptr && options.contributes) {
    norm = std::sqrt((*make)(0, delta.size()));
    make = nullptr;
  }
  RoundResult result;
  result.average = options.warmup;
  Communicator::MergeValues values;
  if (!options.contributes) {
    // Taking part with zeros and weight 0: out of the rule's statistics.
    std::fill(delta.begin(), delta.end(), 0.0f);
  } else if (make != nullptr) {
    values.make = make;
    result.made_in_merge = true;
  } else {
    const double given = norm ? *norm : Norm(delta);
    values.squares = given * given;
    // Not finite: every member leaves it out, and a codec's encoding of
    // values not finite is undefined (a float NaN to an integer): zeros go.
    if (codec != nullptr && !std::isfinite(values.squares))
      std::fill(delta.begin(), delta.end(), 0.0f);
  }
  std::vector<double> norms;
  const Communicator::LeaveOut robust = RobustRule(options, norms);
  values.leave_out = &robust;
  values.codec = codec;
  const double weight = options.contributes ? (options.token_weighted ? tokens : 1.0) : 0.0;
  const uint64_t sent_before = comm.stats().bytes_sent;
  MEND_ASSIGN_OR_RETURN(Communicator::Merged merged, comm.MergeAllReduce(delta, weight, values));
  result.bytes_sent = comm.stats().bytes_sent - sent_before;
  result.dropped = std::move(merged.left_out);
  WarnLeftOut(comm, result.dropped, norms);
  return result;
}

// A sparse codec among three or more: one collective too
// (Communicator::MergeAllGatherDecode), each member's payload encoded with
// its error feedback before the gather and its norm beside it; a member the
// rule leaves out is decoded as zeros with weight 0 on every member, and
// keeps its residual as it was (the round did not take its values).
StatusOr<RoundResult> MergeSparse(Communicator& comm, std::span<const float> residual,
                                  std::span<float> delta, double tokens,
                                  const OuterSyncOptions& options, std::optional<double> norm,
                                  const Communicator::MakeValues* make) {
  const size_t n = delta.size();
  const Codec& codec = *options.codec;
  RoundResult result;
  result.average = options.warmup;
  double squares = 0;
  if (options.contributes) {
    if (make != nullptr) norm = std::sqrt((*make)(0, n));
    const double given = norm ? *norm : Norm(delta);
    squares = given * given;
  } else {
    std::fill(delta.begin(), delta.end(), 0.0f);
  }
  result.residual.assign(residual.begin(), residual.end());
  result.residual.resize(n, 0.0f);
  std::vector<std::byte> payload(codec.EncodedBytes(n));
  if (!std::isfinite(squares)) {
    // Every member leaves it out (RobustDrops); its zeros are encoded
    // instead of values a codec cannot encode.
    std::fill(delta.begin(), delta.end(), 0.0f);
    codec.Encode(delta, payload);
  } else if (options.contributes) {
    std::vector<float> decoded(n);
    EncodeWithErrorFeedback(codec, options.error_feedback_beta, result.residual, delta, payload,
                            decoded);
  } else {
    codec.Encode(delta, payload);  // zeros
  }
  std::vector<double> norms;
  const Communicator::LeaveOut robust = RobustRule(options, norms);
  const double weight = options.contributes ? (options.token_weighted ? tokens : 1.0) : 0.0;
  const uint64_t sent_before = comm.stats().bytes_sent;
  MEND_ASSIGN_OR_RETURN(result.dropped,
                        comm.MergeAllGatherDecode(payload, weight, squares, &robust, codec, delta));
  result.bytes_sent = comm.stats().bytes_sent - sent_before;
  if (std::find(result.dropped.begin(), result.dropped.end(), comm.rank()) !=
      result.dropped.end()) {
    result.residual.assign(residual.begin(), residual.end());
    result.residual.resize(n, 0.0f);
  }
  WarnLeftOut(comm, result.dropped, norms);
  return result;
}

}  // namespace

StatusOr<RoundResult> OuterRound::Exchange(Communicator& comm, const FragmentState& state,
                                           std::span<float> delta, double tokens,
                                           const OuterSyncOptions& options,
                                           std::optional<double> norm,
                                           const Communicator::MakeValues* make) {
  const size_t n = state.size();
  if (delta.size() != n) {
    return InvalidArgumentError(
        fmt::format("pseudo-gradient of {} values for a fragment of {}", delta.size(), n));
  }
  // Among three or more (where the robust rule needs every member's norm),
  // each member's norm travels beside its weight in the merge: fp32 and a
  // dense codec through MergeAllReduce, a sparse one through
  // MergeAllGatherDecode; fp32 between two as well (both members then leave
  // out a pseudo-gradient that is not finite).
  if (options.codec == nullptr || options.codec->kind() == CodecKind::kFp32 ||
      (options.codec->dense() && comm.world_size() >= 3)) {
    return Merge(comm, delta, tokens, options, norm, make);
  }
  if (comm.world_size() >= 3)
    return MergeSparse(comm, state.residual(), delta, tokens, options, norm, make);
  // A codec between two: the rule drops only a pseudo-gradient that is not
  // finite, which its own member can tell: it goes silent (zeros with
  // weight 0: 0 x NaN would still be NaN).
  if (make != nullptr && options.contributes) norm = std::sqrt((*make)(0, n));
  RoundResult result;
  result.average = options.warmup;
  const bool dropped_me = options.contributes && !std::isfinite(norm ? *norm : Norm(delta));
  if (dropped_me) {
    result.dropped.push_back(comm.rank());
    WarnDroppedMe();
  }
  const bool silent = dropped_me || !options.contributes;
  const double weight = silent ? 0.0 : (options.token_weighted ? tokens : 1.0);
  if (silent) std::fill(delta.begin(), delta.end(), 0.0f);

  // The merge, through the codec.
  const uint64_t sent_before = comm.stats().bytes_sent;
  const Codec* codec = options.codec;
  if (codec != nullptr && !codec->dense()) {
    result.residual = state.residual_;
    result.residual.resize(n, 0.0f);
    std::vector<std::byte> payload(codec->EncodedBytes(n));
    std::vector<float> decoded(n);
    if (!silent) {
      EncodeWithErrorFeedback(*codec, options.error_feedback_beta, result.residual, delta, payload,
                              decoded);
    } else {
      codec->Encode(delta, payload);  // zeros
    }
    MEND_RETURN_IF_ERROR(comm.WeightedAllGatherDecode(payload, weight, *codec, delta));
  } else {
    MEND_RETURN_IF_ERROR(comm.WeightedAllReduce(delta, weight, codec));
  }
  result.bytes_sent = comm.stats().bytes_sent - sent_before;
  return result;
}

void OuterRound::Commit(FragmentState& state, RoundResult&& result, std::span<const float> merged,
                        const OuterOptions& outer) {
  if (result.average) {
    OuterAverageStep(state.global_, merged);
  } else {
    OuterNesterovStep(state.global_, state.momentum_, merged, outer);
  }
  result.merged_norm = Norm(merged);
  if (!result.residual.empty()) state.residual_ = std::move(result.residual);
}

}  // namespace mend
