#include "reducer/moments.h"

#include <cstring>

#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"

namespace mend::reducer {

StatusOr<AdamMoments> AdamMoments::Bind(torch::optim::Optimizer& optimizer,
                                        std::vector<at::Tensor> parameters) {
  if (dynamic_cast<torch::optim::Adam*>(&optimizer) == nullptr &&
      dynamic_cast<torch::optim::AdamW*>(&optimizer) == nullptr) {
    return InvalidArgumentError(
        "desloc = true: the inner optimizer must be torch::optim::Adam or AdamW (DES-LOC averages "
        "their moments)");
  }
  size_t size = 0;
  for (const auto& p : parameters) size += static_cast<size_t>(p.numel());
  return AdamMoments(&optimizer, std::move(parameters), size);
}

at::Tensor AdamMoments::Moment(const at::Tensor& p, Which which) const {
  auto& state = optimizer_->state();
  auto it = state.find(c10::guts::to_string(p.unsafeGetTensorImpl()));
  if (it == state.end()) return {};
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
    return which == kFirst ? adamw->exp_avg() : adamw->exp_avg_sq();
  }
  if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
    return which == kFirst ? adam->exp_avg() : adam->exp_avg_sq();
  }
  return {};
}

bool AdamMoments::Read(Which which, std::span<float> out) const {
  size_t offset = 0;
  for (const auto& p : parameters_) {
    at::Tensor m = Moment(p, which);
    if (!m.defined()) return false;
    at::Tensor dense = m.contiguous();
    std::memcpy(out.data() + offset, dense.data_ptr<float>(), dense.numel() * sizeof(float));
    offset += static_cast<size_t>(dense.numel());
  }
  return true;
}

void AdamMoments::Adjust(Which which, std::span<const float> average,
                         std::span<const float> snapshot) {
  size_t offset = 0;
  for (const auto& p : parameters_) {
    at::Tensor m = Moment(p, which);
    const size_t n = static_cast<size_t>(p.numel());
    if (m.defined() && m.is_contiguous()) {
      float* values = m.data_ptr<float>();
      for (size_t i = 0; i < n; ++i) values[i] += average[offset + i] - snapshot[offset + i];
    }
    offset += n;
  }
}

void AdamMoments::Replace(Which which, std::span<const float> average) {
  size_t offset = 0;
  for (const auto& p : parameters_) {
    at::Tensor m = Moment(p, which);
    const size_t n = static_cast<size_t>(p.numel());
    if (m.defined() && m.is_contiguous()) {
      std::memcpy(m.data_ptr<float>(), average.data() + offset, n * sizeof(float));
    }
    offset += n;
  }
}

}  // namespace mend::reducer
