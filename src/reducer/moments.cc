#include "reducer/moments.h"

#include <cstring>
#include <tuple>

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
    if (auto* adamw = StateOf<torch::optim::AdamWParamState>(index))
      return which == kFirst ? adamw->exp_avg() : adamw->exp_avg_sq();
    if (auto* adam = StateOf<torch::optim::AdamParamState>(index))
      return which == kFirst ? adam->exp_avg() : adam->exp_avg_sq();
    return {};
  }

  double Beta(Which which) const override {
    if (optimizer_->param_groups().empty()) return InnerMoments::Beta(which);
    auto& options = optimizer_->param_groups().front().options();
    std::tuple<double, double> betas;
    if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
      betas = adamw->betas();
    } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
      betas = adam->betas();
    } else {
      return InnerMoments::Beta(which);
    }
    return which == kFirst ? std::get<0>(betas) : std::get<1>(betas);
  }

  // The step count of the first parameter with state (Adam steps them all alike).
  uint64_t Step() const override {
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (auto* adamw = StateOf<torch::optim::AdamWParamState>(i))
        return static_cast<uint64_t>(adamw->step());
      if (auto* adam = StateOf<torch::optim::AdamParamState>(i))
        return static_cast<uint64_t>(adam->step());
    }
    return 0;
  }

  void SetStep(uint64_t step) override {
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (auto* adamw = StateOf<torch::optim::AdamWParamState>(i))
        adamw->step(static_cast<int64_t>(step));
      if (auto* adam = StateOf<torch::optim::AdamParamState>(i))
        adam->step(static_cast<int64_t>(step));
    }
  }

 private:
  // Parameter i's state in the optimizer as a `ParamState`, or null.
  template <typename ParamState>
  ParamState* StateOf(size_t i) const {
    auto& state = optimizer_->state();
    auto it = state.find(c10::guts::to_string(parameters_[i].unsafeGetTensorImpl()));
    return it == state.end() ? nullptr : dynamic_cast<ParamState*>(it->second.get());
  }

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

void AdamMoments::Adjust(Which which, std::span<const float> target,
                         std::span<const float> snapshot, float weight) {
  size_t offset = 0;
  for (size_t i = 0; i < numels_.size(); ++i) {
    at::Tensor m = Moment(i, which);
    const size_t n = static_cast<size_t>(numels_[i]);
    if (m.defined()) {
      AdjustMoment(which, std::span(m.data_ptr<float>(), n), target.subspan(offset, n),
                   snapshot.subspan(offset, n), weight);
    }
    offset += n;
  }
}

void AdamMoments::Replace(Which which, std::span<const float> target) {
  size_t offset = 0;
  for (size_t i = 0; i < numels_.size(); ++i) {
    at::Tensor m = Moment(i, which);
    const size_t n = static_cast<size_t>(numels_[i]);
    if (m.defined()) std::memcpy(m.data_ptr<float>(), target.data() + offset, n * sizeof(float));
    offset += n;
  }
}

double AdamMoments::beta(Which which) const {
  return source_->Beta(static_cast<InnerMoments::Which>(which));
}

uint64_t AdamMoments::step() const { return source_->Step(); }

void AdamMoments::set_step(uint64_t step) { source_->SetStep(step); }

}  // namespace reducer
}  // namespace mend
