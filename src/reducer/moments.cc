#include "reducer/moments.h"

#include <cstring>

#include "core/status_format.h"
#include "fmt/format.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"

namespace mend {
namespace {

class TorchAdam final : public InnerMoments {
 public:
  TorchAdam(torch::optim::Optimizer* optimizer, std::vector<at::Tensor> parameters)
      : optimizer_(optimizer), parameters_(std::move(parameters)) {}

  at::Tensor Moment(size_t index, Which which) override {
    if (index >= parameters_.size()) return {};
    auto& state = optimizer_->state();
    auto it = state.find(c10::guts::to_string(parameters_[index].unsafeGetTensorImpl()));
    if (it == state.end()) return {};
    if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
      return which == kFirst ? adamw->exp_avg() : adamw->exp_avg_sq();
    }
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
      return which == kFirst ? adam->exp_avg() : adam->exp_avg_sq();
    }
    return {};
  }

 private:
  torch::optim::Optimizer* optimizer_;
  std::vector<at::Tensor> parameters_;
};

bool Fits(const at::Tensor& t, int64_t numel) {
  return t.defined() && t.scalar_type() == at::kFloat && t.device().is_cpu() && !t.is_sparse() &&
         t.is_contiguous() && t.numel() == numel;
}

}  // namespace

StatusOr<std::unique_ptr<InnerMoments>> TorchAdamMoments(torch::optim::Optimizer& optimizer,
                                                         std::vector<at::Tensor> parameters) {
  if (dynamic_cast<torch::optim::Adam*>(&optimizer) == nullptr &&
      dynamic_cast<torch::optim::AdamW*>(&optimizer) == nullptr) {
    return InvalidArgumentError(
        "the inner optimizer must be torch::optim::Adam or AdamW (mend reads their moments)");
  }
  return std::unique_ptr<InnerMoments>(new TorchAdam(&optimizer, std::move(parameters)));
}

namespace reducer {

AdamMoments::AdamMoments(std::unique_ptr<InnerMoments> source, std::vector<int64_t> numels)
    : source_(std::move(source)), numels_(std::move(numels)) {
  for (int64_t n : numels_) size_ += static_cast<size_t>(n);
}

at::Tensor AdamMoments::Moment(size_t i, Which which) const {
  at::Tensor m = source_->Moment(i, static_cast<InnerMoments::Which>(which));
  return Fits(m, numels_[i]) ? m : at::Tensor();
}

bool AdamMoments::Read(Which which, std::span<float> out) const {
  size_t offset = 0;
  for (size_t i = 0; i < numels_.size(); ++i) {
    at::Tensor m = Moment(i, which);
    if (!m.defined()) return false;
    std::memcpy(out.data() + offset, m.data_ptr<float>(), m.numel() * sizeof(float));
    offset += static_cast<size_t>(numels_[i]);
  }
  return true;
}

void AdamMoments::Adjust(Which which, std::span<const float> average,
                         std::span<const float> snapshot) {
  size_t offset = 0;
  for (size_t i = 0; i < numels_.size(); ++i) {
    at::Tensor m = Moment(i, which);
    const size_t n = static_cast<size_t>(numels_[i]);
    if (m.defined()) {
      float* values = m.data_ptr<float>();
      for (size_t k = 0; k < n; ++k) values[k] += average[offset + k] - snapshot[offset + k];
    }
    offset += n;
  }
}

void AdamMoments::Replace(Which which, std::span<const float> average) {
  size_t offset = 0;
  for (size_t i = 0; i < numels_.size(); ++i) {
    at::Tensor m = Moment(i, which);
    const size_t n = static_cast<size_t>(numels_[i]);
    if (m.defined()) std::memcpy(m.data_ptr<float>(), average.data() + offset, n * sizeof(float));
    offset += n;
  }
}

}  // namespace reducer
}  // namespace mend
