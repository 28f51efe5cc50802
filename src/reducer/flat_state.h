// What the round driver (round_driver.h) sees of a model and its inner
// optimizer: flat fp32 values, without LibTorch. The reducer's LibTorch
// adapter (reducer.cc) implements both over at::Tensor; tests implement
// them over plain vectors.
//
// Thread-safety: the training thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mend::reducer {

// The model's parameters in the reducer's order: each a name, a shape and
// its values, copied out and in whole.
class FlatParameters {
 public:
  virtual ~FlatParameters() = default;
  virtual size_t count() const = 0;
  virtual const std::string& name(size_t i) const = 0;
  virtual std::vector<int64_t> shape(size_t i) const = 0;
  virtual size_t numel(size_t i) const = 0;
  virtual void CopyOut(size_t i, std::span<float> out) const = 0;  // out.size() == numel(i)
  virtual void CopyIn(size_t i, std::span<const float> in) = 0;
  // Parameter i's values in place, when they are host fp32 memory that the
  // round may read and write directly, from several threads at once (each
  // its own range); empty: only through CopyOut and CopyIn. The round's
  // fused passes (FragmentBook::Snapshot, CommitOuter) work in place, in
  // chunks, on every thread of round_threads when every parameter has them.
  virtual std::span<float> Values(size_t) { return {}; }
  // Parameter i's values were written through Values() (once per pass
  // that wrote them).
  virtual void Wrote(size_t) {}
  // The model's layer that parameter i is (or was cut from): what the
  // fragment schedule assigns to a fragment (FragmentOfLayer).
  virtual size_t layer(size_t i) const { return i; }
  // In a group: the ranks that pass the same key for parameter i hold the
  // same values of it (group_layout.h). 0 on every rank: each holds the
  // whole parameter (DDP); a key of its own: this rank's shard (FSDP2).
  virtual uint64_t replica_key(size_t) const { return 0; }
};

// The inner optimizer's Adam moments of those parameters, as one flat
// buffer each (DES-LOC's averaging, and the moments a heal carries), with
// its betas and its step count.
class FlatMoments {
 public:
  enum Which { kFirst = 0, kSecond = 1 };
  virtual ~FlatMoments() = default;
  virtual size_t size() const = 0;
  // Copies the moment into `out`; false when some parameter has no state yet
  // (before the optimizer's first step).
  virtual bool Read(Which which, std::span<float> out) const = 0;
  // moment += weight * (target - snapshot) (AdjustMoment): the moment as if
  // it had been `target` instead of `snapshot` at the boundary, with what
  // this learner's optimizer added since kept. After k steps Adam keeps
  // beta^k of a moment's start (its update m <- beta m + (1 - beta) g is
  // linear in it), so weight = beta^k, and a second moment stays >= 0.
  virtual void Adjust(Which which, std::span<const float> target, std::span<const float> snapshot,
                      float weight) = 0;
  // moment <- target (nothing was added since the snapshot).
  virtual void Replace(Which which, std::span<const float> target) = 0;
  // Adam's beta for `which` (beta1, beta2): the share of a moment one step keeps.
  virtual double beta(Which which) const = 0;
  // The optimizer's step count (Adam's t, the exponent of its bias
  // correction); 0 when it has none (yet) or keeps none mend can see.
  virtual uint64_t step() const = 0;
  // Sets it (a heal brings the source's); ignored where it keeps none.
  virtual void set_step(uint64_t step) = 0;
};

// FlatMoments::Adjust's arithmetic on one moment's values: the second
// moment is kept >= 0 against rounding (Adam takes its square root).
inline void AdjustMoment(FlatMoments::Which which, std::span<float> moment,
                         std::span<const float> target, std::span<const float> snapshot,
                         float weight) {
  for (size_t k = 0; k < moment.size(); ++k) {
    const float value = moment[k] + weight * (target[k] - snapshot[k]);
    moment[k] = which == FlatMoments::kSecond && value < 0.0f ? 0.0f : value;
  }
}

}  // namespace mend::reducer
