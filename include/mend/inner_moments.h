// The inner optimizer's Adam moments as mend::Reducer reads and adjusts them
// (DES-LOC averages them; heal_inner_optimizer copies them from the heal
// source). The reducer never owns the optimizer: it sees its moments through
// this small interface: a C++ torch::optim::Adam or AdamW
// (TorchAdamMoments). The C ABI, and so the Python package, hands moments
// over as raw fp32 buffers instead (mend/mend.h).
//
// Thread-safety: called from the training thread only (from Reducer::step),
// like the optimizer itself.
#pragma once

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

}  // namespace mend
