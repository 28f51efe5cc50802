// The inner optimizer's Adam moments of the reducer's parameters, read and
// adjusted as one flat fp32 buffer (DES-LOC's moment averaging, and the
// moments a heal carries), over an InnerMoments the caller provides.
//
// Thread-safety: the training thread only (the optimizer's state is its).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "mend/inner_moments.h"
#include "reducer/flat_state.h"

namespace mend::reducer {

class AdamMoments final : public FlatMoments {
 public:
  // `numels` holds each parameter's number of values, in the reducer's order.
  AdamMoments(std::unique_ptr<InnerMoments> source, std::vector<int64_t> numels);

  size_t size() const override { return size_; }
  bool Read(Which which, std::span<float> out) const override;
  void Adjust(Which which, std::span<const float> target, std::span<const float> snapshot,
              float weight) override;
  void Replace(Which which, std::span<const float> target) override;
  double beta(Which which) const override;
  uint64_t step() const override;
  void set_step(uint64_t step) override;

 private:
  // Parameter i's moment if it is a contiguous fp32 tensor of the right size,
  // else an undefined tensor.
  at::Tensor Moment(size_t i, Which which) const;

  std::unique_ptr<InnerMoments> source_;
  std::vector<int64_t> numels_;
  size_t size_ = 0;
};

}  // namespace mend::reducer
