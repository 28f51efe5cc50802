// The inner optimizer's Adam moments as mend::Reducer reads and adjusts them
// (DES-LOC averages them; heal_inner_optimizer copies them, and the step
// count, from the heal source). The reducer never owns the optimizer: it sees its moments through
// this small interface: a C++ torch::optim::Adam or AdamW
// (TorchAdamMoments). The C ABI, and so the Python package, hands moments
// over as raw fp32 buffers instead (mend/mend.h).
//
// Thread-safety: called from the training thread only (from Reducer::step),
// like the optimizer itself.
#pragma once

#include <cstddef>
#include <cstdint>
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
  // Adam's beta for `which` (beta1, beta2): the share of a moment one step
  // keeps. By default torch's defaults, 0.9 and 0.999.
  virtual double Beta(Which which) const { return which == kFirst ? 0.9 : 0.999; }
  // The optimizer's step count (Adam's t, the exponent of its bias
  // correction), 0 while it has none; a healed learner takes its source's
  // with the moments, so that both take the same next step. By default
  // none is kept (0, and SetStep does nothing).
  virtual uint64_t Step() const { return 0; }
  virtual void SetStep(uint64_t /*step*/) {}
};

// torch::optim::Adam or AdamW, looked up in the optimizer's state on each
// call. INVALID_ARGUMENT for any other optimizer. `optimizer` is not owned
// and must outlive the result.
[[nodiscard]] StatusOr<std::unique_ptr<InnerMoments>> TorchAdamMoments(
    torch::optim::Optimizer& optimizer, std::vector<at::Tensor> parameters);

}  // namespace mend
