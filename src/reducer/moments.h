// The inner Adam/AdamW optimizer's moments of a list of parameters, read and
// adjusted as flat fp32 buffers (for DES-LOC's moment averaging).
//
// Thread-safety: the training thread only (the optimizer's state is its).
#pragma once

#include <span>
#include <vector>

#include "mend/status.h"
#include "torch/optim/optimizer.h"

namespace mend::reducer {

class AdamMoments {
 public:
  enum Which { kFirst = 0, kSecond = 1 };

  // INVALID_ARGUMENT unless `optimizer` is torch::optim::Adam or AdamW.
  // `optimizer` is not owned and must outlive this object.
  [[nodiscard]] static StatusOr<AdamMoments> Bind(torch::optim::Optimizer& optimizer,
                                                  std::vector<at::Tensor> parameters);

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
  AdamMoments(torch::optim::Optimizer* optimizer, std::vector<at::Tensor> parameters, size_t size)
      : optimizer_(optimizer), parameters_(std::move(parameters)), size_(size) {}
  // The moment tensor of parameter p, or an undefined tensor.
  at::Tensor Moment(const at::Tensor& p, Which which) const;

  torch::optim::Optimizer* optimizer_;
  std::vector<at::Tensor> parameters_;
  size_t size_;
};

}  // namespace mend::reducer
