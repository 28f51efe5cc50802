// The inner optimizer's Adam moments of the reducer's parameters, read and
// adjusted as one flat fp32 buffer (DES-LOC's moment averaging, and the
// moments a heal carries), over an InnerMoments the caller provides.
//
// Thread-safety: the training thread only (the optimizer's state is its).
#pragma once

#include <span>
#include <vector>

#include "mend/inner_moments.h"

namespace mend::reducer {

class AdamMoments {
 public:
  enum Which { kFirst = InnerMoments::kFirst, kSecond = InnerMoments::kSecond };

  // `source` is not owned and must outlive this object; `numels` holds each
  // parameter's number of values, in the reducer's order.
  AdamMoments(InnerMoments* source, std::vector<int64_t> numels);

  size_t size() const { return size_; }
  // Copies the moment into `out`; false when some parameter has no state yet
  // (before the optimizer's first step).
  bool Read(Which which, std::span<float> out) const;
  // moment += average - snapshot: the average the members agreed on, plus
  // what this learner's optimizer added since the snapshot.
  void Adjust(Which which, std::span<const float> average, std::span<const float> snapshot);
  // moment <- average (nothing was added since the snapshot).
  void Replace(Which which, std::span<const float> average);

 private:
  // Parameter i's moment if it is a contiguous fp32 tensor of the right size,
  // else an undefined tensor.
  at::Tensor Moment(size_t i, Which which) const;

  InnerMoments* source_;
  std::vector<int64_t> numels_;
  size_t size_ = 0;
};

}  // namespace mend::reducer
