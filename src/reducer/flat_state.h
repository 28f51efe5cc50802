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
  // The model's layer that parameter i is (or was cut from): what the
  // fragment schedule assigns to a fragment (FragmentOfLayer).
  virtual size_t layer(size_t i) const { return i; }
};

// The inner optimizer's Adam moments of those parameters, as one flat
// buffer each (DES-LOC's averaging, and the moments a heal carries).
class FlatMoments {
 public:
  enum Which { kFirst = 0, kSecond = 1 };
  virtual ~FlatMoments() = default;
  virtual size_t size() const = 0;
  // Copies the moment into `out`; false when some parameter has no state yet
  // (before the optimizer's first step).
  virtual bool Read(Which which, std::span<float> out) const = 0;
  // moment += average - snapshot: the average the members agreed on, plus
  // what this learner's optimizer added since the snapshot.
  virtual void Adjust(Which which, std::span<const float> average,
                      std::span<const float> snapshot) = 0;
  // moment <- average (nothing was added since the snapshot).
  virtual void Replace(Which which, std::span<const float> average) = 0;
};

}  // namespace mend::reducer
