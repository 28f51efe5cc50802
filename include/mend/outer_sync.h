// One fragment's outer round over the data plane (docs/architecture.md,
// "Outer synchronizer arithmetic"): the pseudo-gradient exchange with token weights, the robust
// merge, the codec (top-k through error feedback), and the outer Nesterov
// step on the global state. Flat fp32 buffers; the LibTorch reducer maps a
// model's parameters onto fragments of these.
//
// A round is two steps so that it can run in the background while training
// goes on (the concurrent outer step):
//   1. Exchange(): every member's delta_i = theta_base - theta_i(s) is merged
//      and the outer step is computed into a RoundResult; the state is not
//      touched, so a round that fails (a member died) changes nothing.
//   2. Commit(): the global state becomes the result's; the caller then
//      brings it into its local parameters (ApplyOuterResult, mend/outer.h).
//
// Thread-safety: a FragmentState is used by one thread at a time; Exchange
// reads it and may run on another thread than Commit if the caller orders
// the two.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "mend/codec.h"
#include "mend/communicator.h"
#include "mend/outer.h"
#include "mend/status.h"
#include "mend/zeroed_allocator.h"

namespace mend {

struct OuterSyncOptions {
  OuterOptions outer;
  bool token_weighted = true;  // weights = tokens; false: every member 1
  // A member whose pseudo-gradient norm has a robust z-score (median and MAD
  // of the members' norms, the MAD at least a quarter of the median) above
  // this is dropped from the round: about 3.2x the median norm at 6. 0 turns
  // the norm check off. Non-finite pseudo-gradients are always dropped. Norms are
  // compared only with at least 3 members.
  double robust_zscore = 6.0;
  const Codec* codec = nullptr;       // not owned; nullptr = fp32
  float error_feedback_beta = 0.95f;  // for a sparse codec
  // false: this member takes part with weight 0 and its delta is not read
  // (a learner that joined with nothing trained from the job's state: its
  // first round heals it). At least one member must contribute.
  bool contributes = true;
  // An outer warm-up round: theta_g <- theta_g - delta (the members'
  // average) and the momentum is left as it is, instead of the outer
  // Nesterov step.
  bool warmup = false;
};

// The global state of one fragment as this learner holds it.
class FragmentState {
 public:
  // theta_g = theta_base = `initial`, momentum 0.
  explicit FragmentState(std::span<const float> initial);
  // `values` zeros (theta_g to be written by the caller), momentum 0.
  // (Untouched until written: ZeroedFloats.)
  explicit FragmentState(size_t values);

  std::span<const float> global() const { return global_; }
  std::span<const float> momentum() const { return momentum_; }
  // For the round driver's fused commit (the outer step taken in place,
  // chunk by chunk, beside the parameters' update): see OuterRound::Commit.
  std::span<float> mutable_global() { return global_; }
  std::span<float> mutable_momentum() { return momentum_; }
  size_t size() const { return global_.size(); }
  // Replaces the global state (healing from a peer).
  void Assign(std::span<const float> global, std::span<const float> momentum);
  // This learner's error feedback (sparse codecs; empty until used): its own,
  // not the job's; carried by an exported state.
  std::span<const float> residual() const { return residual_; }
  void AssignResidual(std::span<const float> residual) {
    residual_.assign(residual.begin(), residual.end());
  }

 private:
  friend class OuterRound;
  ZeroedFloats global_;
  ZeroedFloats momentum_;
  std::vector<float> residual_;  // error feedback (sparse codecs; empty until used)
};

// What a round's exchange brings: the members' merged pseudo-gradient is in
// the caller's buffer (Exchange's `delta`); the outer step is taken by
// Commit, which needs no more memory than the state and that buffer.
struct RoundResult {
  // The outer step to take: the average (outer warm-up, the final merge:
  // theta_g <- theta_g - delta, the momentum kept) or Nesterov's.
  bool average = false;
  std::vector<float> residual;  // error feedback after this round (sparse codecs)
  // Ranks left out by the robust merge: the same on every member with three
  // or more; with fewer (no reports exchanged) a member lists only itself.
  std::vector<int> dropped;
  double merged_norm = 0;      // ||delta||, set by the commit
  bool made_in_merge = false;  // `make` made delta as the merge reached each piece
  uint64_t bytes_sent = 0;
};

class OuterRound {
 public:
  // Merges `delta` (in: this member's pseudo-gradient, state.size() values;
  // out: the members' merged pseudo-gradient, bit-identical on every member)
  // with the other members', in place. `tokens` is this member's weight
  // under token weighting; `norm`, when given, is ||delta|| already computed
  // (the round driver's snapshot pass does). In fp32, one collective: the
  // members' norms travel beside the weights and the pieces
  // (Communicator::MergeAllReduce), and the robust rule leaves out the same
  // members on every member. With a codec, two with three members or more
  // (the norms first, for the rule), one with fewer. The state is not
  // touched (a round that fails changes nothing but `delta`). Errors: what
  // the communicator returns (INVALID_ARGUMENT when the weights of the
  // members not left out sum to 0), or, with a codec, ABORTED when every
  // member was dropped.
  //
  // `make`, when given, writes `delta` (Communicator::MakeValues) instead of
  // the caller: in fp32, for a contributing member, as the merge reaches
  // each piece (a piece is sent while the next is made); with a codec,
  // whole, before the round. The same bits either way.
  [[nodiscard]] static StatusOr<RoundResult> Exchange(
      Communicator& comm, const FragmentState& state, std::span<float> delta, double tokens,
      const OuterSyncOptions& options, std::optional<double> norm = std::nullopt,
      const Communicator::MakeValues* make = nullptr);
  // The outer step with the merged pseudo-gradient (Exchange's `delta`)
  // on the state, in place, and the result's error feedback kept:
  // theta_g' and m' are the same bits on every member.
  static void Commit(FragmentState& state, RoundResult&& result, std::span<const float> merged,
                     const OuterOptions& outer);
};

// The robust-merge rule on the members' pseudo-gradient norms (NaN or Inf =
// non-finite): the ranks to drop. Pure, the same on every member.
std::vector<int> RobustDrops(std::span<const double> norms, double zscore_threshold);

}  // namespace mend
