// The LibTorch side of the reducer: validates the parameter tensors, adapts
// them and the inner optimizer's moments to flat views, and forwards to the
// round driver (round_driver.h), which does everything else without
// LibTorch.
#include "mend/reducer.h"

#include <cstring>
#include <set>
#include <utility>

#include "core/status_format.h"
#include "fmt/format.h"
#include "reducer/moments.h"
#include "reducer/options_from_config.h"
#include "reducer/round_driver.h"
#include "torch/nn/module.h"

namespace mend {
namespace {

// Why a parameter tensor cannot be used in place ("" when it can): mend
// needs dense, contiguous fp32 CPU tensors.
std::string Unusable(const at::Tensor& p) {
  if (!p.defined()) return "an undefined tensor";
  if (p.is_sparse() || p.scalar_type() != at::kFloat || !p.device().is_cpu() ||
      !p.is_contiguous()) {
    return fmt::format("{} {} on {} ({}contiguous)", p.is_sparse() ? "sparse" : "dense",
                       c10::toString(p.scalar_type()), p.device().str(),
                       p.is_contiguous() ? "" : "not ");
  }
  return "";
}

// The parameters' tensors, shared with the caller, copied whole. A tensor
// whose storage the caller replaced (set_data) is used in its new storage.
class TensorParameters final : public reducer::FlatParameters {
 public:
  TensorParameters(std::vector<at::Tensor> tensors, std::vector<std::string> names)
      : tensors_(std::move(tensors)), names_(std::move(names)) {
    for (const at::Tensor& t : tensors_) numels_.push_back(t.numel());
  }

  // FAILED_PRECONDITION naming the first parameter that is no longer a
  // dense, contiguous fp32 CPU tensor of the size it had at Create.
  Status Check() const {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      std::string why = Unusable(tensors_[i]);
      if (!why.empty()) {
        why = "it is " + why + " now";
      } else if (tensors_[i].numel() != numels_[i]) {
        why = fmt::format("it holds {} values instead of {}", tensors_[i].numel(), numels_[i]);
      } else {
        continue;
      }
      return FailedPreconditionError(fmt::format(
          "reducer: parameter '{}' changed after Reducer::Create: {}; mend reads and writes it in "
          "place, so convert, move or resize the model before Create",
          names_[i], why));
    }
    return OkStatus();
  }

  size_t count() const override { return tensors_.size(); }
  const std::string& name(size_t i) const override { return names_[i]; }
  std::vector<int64_t> shape(size_t i) const override { return tensors_[i].sizes().vec(); }
  size_t numel(size_t i) const override { return static_cast<size_t>(tensors_[i].numel()); }
  void CopyOut(size_t i, std::span<float> out) const override {
    std::memcpy(out.data(), tensors_[i].data_ptr<float>(), out.size() * sizeof(float));
  }
  void CopyIn(size_t i, std::span<const float> in) override {
    std::memcpy(tensors_[i].data_ptr<float>(), in.data(), in.size() * sizeof(float));
  }
  // Dense, contiguous fp32 CPU tensors (Check, before every step that touches them).
  std::span<float> Values(size_t i) override {
    return {tensors_[i].data_ptr<float>(), static_cast<size_t>(tensors_[i].numel())};
  }

 private:
  std::vector<at::Tensor> tensors_;
  std::vector<std::string> names_;
  std::vector<int64_t> numels_;  // at Create
};

class ReducerImpl final : public Reducer {
 public:
  // `parameters` is owned by `driver`.
  ReducerImpl(std::unique_ptr<reducer::RoundDriver> driver, const TensorParameters* parameters)
      : driver_(std::move(driver)), parameters_(parameters) {}

  // The parameters are checked before a step that reads or writes them
  // (planned at its start, as an unplanned step would be).
  Status step(uint64_t tokens) override {
    if (driver_->PlanStep().touches_parameters) MEND_RETURN_IF_ERROR(parameters_->Check());
    return driver_->step(tokens);
  }
  Status shutdown() override {
    MEND_RETURN_IF_ERROR(parameters_->Check());
    return driver_->shutdown();
  }
  bool NextStepMayWait() const override { return driver_->NextStepMayWait(); }
  bool NewestJoinFormed() const override { return driver_->NewestJoinFormed(); }
  ReducerStats stats() const override { return driver_->stats(); }
  std::span<const float> global(int fragment) const override { return driver_->global(fragment); }
  int fragments() const override { return driver_->fragments(); }
  Status SaveCheckpoint(const std::string& path) override { return driver_->SaveCheckpoint(path); }

 private:
  std::unique_ptr<reducer::RoundDriver> driver_;
  const TensorParameters* parameters_;
};

}  // namespace

StatusOr<std::unique_ptr<Reducer>> Reducer::Create(const Config& config, NamedParameters parameters,
                                                   std::unique_ptr<InnerMoments> moments,
                                                   LearnerAgent& agent, uint64_t start_step) {
  MEND_ASSIGN_OR_RETURN(ValidConfig valid, ValidConfig::Check(config));
  return Create(valid, std::move(parameters), std::move(moments), agent, start_step);
}

StatusOr<std::unique_ptr<Reducer>> Reducer::Create(const Config& config, torch::nn::Module& module,
                                                   torch::optim::Optimizer& optimizer,
                                                   LearnerAgent& agent, uint64_t start_step) {
  MEND_ASSIGN_OR_RETURN(ValidConfig valid, ValidConfig::Check(config));
  return Create(valid, module, optimizer, agent, start_step);
}

StatusOr<std::unique_ptr<Reducer>> Reducer::Create(const ValidConfig& config,
                                                   NamedParameters parameters,
                                                   std::unique_ptr<InnerMoments> moments,
                                                   LearnerAgent& agent, uint64_t start_step) {
  std::vector<at::Tensor> tensors;
  std::vector<std::string> names;
  std::vector<int64_t> numels;
  std::set<std::string> seen;
  for (auto& [name, p] : parameters) {
    if (!p.defined()) {
      return InvalidArgumentError(
          fmt::format("reducer: parameter '{}' is an undefined tensor", name));
    }
    if (const std::string why = Unusable(p); !why.empty()) {
      return InvalidArgumentError(fmt::format(
          "reducer: parameter '{}' is {}; mend needs dense, contiguous fp32 CPU parameters", name,
          why));
    }
    if (!seen.insert(name).second) {
      return InvalidArgumentError(fmt::format("reducer: two parameters are named '{}'", name));
    }
    numels.push_back(p.numel());
    tensors.push_back(std::move(p));
    names.push_back(name);
  }
  std::unique_ptr<reducer::FlatMoments> flat_moments;
  if (moments)
    flat_moments = std::make_unique<reducer::AdamMoments>(std::move(moments), std::move(numels));
  auto flat = std::make_unique<TensorParameters>(std::move(tensors), std::move(names));
  const TensorParameters* view = flat.get();
  MEND_ASSIGN_OR_RETURN(reducer::RoundDriverOptions options, reducer::RoundDriverOptionsOf(config));
  MEND_ASSIGN_OR_RETURN(
      std::unique_ptr<reducer::RoundDriver> driver,
      reducer::RoundDriver::Create(std::move(options), agent, agent.clock(), std::move(flat),
                                   std::move(flat_moments), start_step));
  return std::unique_ptr<Reducer>(std::make_unique<ReducerImpl>(std::move(driver), view));
}

StatusOr<std::unique_ptr<Reducer>> Reducer::Create(const ValidConfig& config,
                                                   torch::nn::Module& module,
                                                   torch::optim::Optimizer& optimizer,
                                                   LearnerAgent& agent, uint64_t start_step) {
  NamedParameters named;
  std::vector<at::Tensor> parameters;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    // Frozen parameters are the learner's own unless asked for.
    if (!item.value().requires_grad() && !config->exchange_frozen_parameters) continue;
    named.emplace_back(item.key(), item.value());
    parameters.push_back(item.value());
  }
  if (named.empty() && !module.named_parameters(/*recurse=*/true).is_empty()) {
    return InvalidArgumentError(
        "reducer: every parameter of the model is frozen (requires_grad = false): nothing to "
        "exchange; set exchange_frozen_parameters = true to exchange them anyway");
  }
  StatusOr<std::unique_ptr<InnerMoments>> moments =
      TorchAdamMoments(optimizer, std::move(parameters));
  // Not Adam: none, fine unless the rounds need them (the round driver's
  // check, RoundOptions::CheckMoments, says so).
  if (!moments.ok()) moments = std::unique_ptr<InnerMoments>();
  return Create(config, std::move(named), std::move(*moments), agent, start_step);
}

}  // namespace mend
