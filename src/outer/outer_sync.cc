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

// What each member tells the others before the merge.
struct MemberReport {
  double norm = 0;  // ||delta_i||, NaN when any value is not finite
  double weight = 0;
  double abstains = 0;  // 1: takes part with weight 0 (OuterSyncOptions::contributes)
};

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
      "robust merge: this member's pseudo-gradient is not finite; it is left out of this round");
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
  }
  // The rule looks at the contributing members (weight > 0) only.
  std::vector<double> norms;
  const Communicator::LeaveOut robust = [&](std::span<const double> squares,
                                            std::span<const double> weights) {
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
  values.leave_out = &robust;
  values.codec = codec;
  const double weight = options.contributes ? (options.token_weighted ? tokens : 1.0) : 0.0;
  const uint64_t sent_before = comm.stats().bytes_sent;
  MEND_ASSIGN_OR_RETURN(Communicator::Merged merged, comm.MergeAllReduce(delta, weight, values));
  result.bytes_sent = comm.stats().bytes_sent - sent_before;
  result.dropped = std::move(merged.left_out);
  if (std::find(result.dropped.begin(), result.dropped.end(), comm.rank()) !=
      result.dropped.end()) {
    WarnDroppedMe();
  } else if (!result.dropped.empty()) {
    spdlog::warn("robust merge: member(s) {} left out of this round (norms {})",
                 fmt::join(result.dropped, ", "), fmt::join(norms, ", "));
  }
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
  // fp32, and a dense codec among three or more (where the robust rule
  // needs every member's norm): the norms beside the merge's first pieces.
  // A dense codec between two, and a sparse one: below (with three or more,
  // a sparse codec's members gather their norms in a collective first).
  if (options.codec == nullptr || options.codec->kind() == CodecKind::kFp32 ||
      (options.codec->dense() && comm.world_size() >= 3)) {
    return Merge(comm, delta, tokens, options, norm, make);
  }
  if (make != nullptr && options.contributes) norm = std::sqrt((*make)(0, n));
  // 1. Everyone's norm and weight, so that every member drops the same ones.
  // The robust rule needs three contributing members; with fewer it drops
  // only a pseudo-gradient that is not finite, which its own member can tell,
  // so the reports (one collective, a link latency) are skipped: the member
  // goes silent, and the weights that travel with the merge leave it out.
  MemberReport mine{options.contributes ? (norm ? *norm : Norm(delta)) : 0.0,
                    options.token_weighted ? tokens : 1.0, options.contributes ? 0.0 : 1.0};
  RoundResult result;
  result.average = options.warmup;
  bool dropped_me = false;
  if (comm.world_size() < 3) {
    dropped_me = options.contributes && !std::isfinite(mine.norm);
    if (dropped_me) {
      result.dropped.push_back(comm.rank());
      WarnDroppedMe();
    }
  } else {
    std::vector<MemberReport> reports(comm.world_size());
    MEND_RETURN_IF_ERROR(comm.AllGather(std::as_bytes(std::span(&mine, 1)),
                                        std::as_writable_bytes(std::span(reports))));
    // The robust rule looks at the contributing members only.
    std::vector<double> norms;
    std::vector<int> contributing;
    for (size_t r = 0; r < reports.size(); ++r) {
      if (reports[r].abstains != 0) continue;
      norms.push_back(reports[r].norm);
      contributing.push_back(static_cast<int>(r));
    }
    for (int i : RobustDrops(norms, options.robust_zscore))
      result.dropped.push_back(contributing[static_cast<size_t>(i)]);
    if (contributing.empty())
      return AbortedError("no member of the round had a pseudo-gradient to merge");
    if (result.dropped.size() == contributing.size()) {
      return AbortedError("every member's pseudo-gradient was dropped by the robust merge");
    }
    dropped_me = std::find(result.dropped.begin(), result.dropped.end(), comm.rank()) !=
                 result.dropped.end();
    if (!result.dropped.empty()) {
      spdlog::warn("robust merge: member(s) {} left out of this round (norms {})",
                   fmt::join(result.dropped, ", "), fmt::join(norms, ", "));
    }
  }
  // A dropped or abstaining member sends zeros with weight 0 (0 x NaN would
  // still be NaN).
  const bool silent = dropped_me || !options.contributes;
  const double weight = silent ? 0.0 : mine.weight;
  if (silent) std::fill(delta.begin(), delta.end(), 0.0f);

  // 2. The merge, through the codec.
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
