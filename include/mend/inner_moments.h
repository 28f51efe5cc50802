// The inner optimizer's Adam moments as mend::Reducer reads and adjusts them
// (DES-LOC averages them; heal_inner_optimizer copies them from the heal
// source). The reducer never owns the optimizer: it sees its moments through
// this small interface, so the same reducer serves a C++ torch::optim::AdamW
// (TorchAdamMoments), and a Python torch.optim.AdamW whose
// optimizer.state[p]["exp_avg"] / ["exp_avg_sq"] tensors are handed over as
// they appear (TensorMoments).
//
// Thread-safety: called from the training thread only (from Reducer::step),
// like the optimizer itself.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <vector>

#include "ATen/core/Tensor.h"
#include "mend/status.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace mend {

class InnerMoments {
 public:
  enum Which { kFirst = 0, kSecond = 1 };
  virtual ~InnerMoments() = default;
  // The moment of parameter `index` (in the order the reducer was given its
  // parameters): an fp32 tensor of that parameter's shape, which the reducer
  // reads and writes in place; an undefined tensor while the optimizer holds
  // no state for it (before its first step).
  virtual at::Tensor Moment(size_t index, Which which) = 0;
};

// torch::optim::Adam or AdamW, looked up in the optimizer's state on each
// call. INVALID_ARGUMENT for any other optimizer. `optimizer` is not owned
// and must outlive the result.
[[nodiscard]] StatusOr<std::unique_ptr<InnerMoments>> TorchAdamMoments(
    torch::optim::Optimizer& optimizer, std::vector<at::Tensor> parameters);

// Moments handed over by the owner of the optimizer (the Python module: the
// tensors of optimizer.state[p]), one pair per parameter. The tensors are
// shared, not copied: the reducer's writes land in the optimizer's state.
class TensorMoments final : public InnerMoments {
 public:
  explicit TensorMoments(size_t parameters) : moments_(parameters) {}
  // INVALID_ARGUMENT when `index` is out of range or either tensor is not a
  // contiguous fp32 CPU tensor with `numel` values.
  [[nodiscard]] Status Set(size_t index, at::Tensor first, at::Tensor second, int64_t numel);
  at::Tensor Moment(size_t index, Which which) override;

 private:
  std::vector<std::array<at::Tensor, 2>> moments_;
};

}  // namespace mend
