#include "mend/data_parallel.h"

#include <cstring>
#include <span>

#include "core/status_format.h"
#include "fmt/format.h"
#include "learner/lighthouse_rendezvous.h"
#include "mend/communicator.h"
#include "reducer/learner_group.h"
#include "reducer/options_from_config.h"

namespace mend {
namespace {

class DataParallelImpl final : public DataParallel {
 public:
  DataParallelImpl(const Config& config, LearnerAgent& agent, bool in_group)
      : config_(config), agent_(agent), in_group_(in_group) {}

  Status Init(torch::nn::Module& module) {
    parameters_ = module.parameters(/*recurse=*/true);
    size_t total = 0;
    for (size_t l = 0; l < parameters_.size(); ++l) {
      const at::Tensor& p = parameters_[l];
      if (p.scalar_type() != at::kFloat || !p.device().is_cpu() || !p.is_contiguous()) {
        return InvalidArgumentError(fmt::format(
            "data parallel: parameter {} is {} on {}; it needs contiguous fp32 CPU parameters", l,
            c10::toString(p.scalar_type()), p.device().str()));
      }
      total += static_cast<size_t>(p.numel());
    }
    // In a group two more values travel with the gradients: whether some
    // rank was asked to stop, or to write a checkpoint, so that all do it
    // after the same step.
    buffer_.resize(total + (in_group_ ? size_t{kControls} : size_t{0}));
    if (in_group_) {
      MEND_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> store, agent_.OpenGroupStore());
      // The group's own: its ranks, inside the rack (no emulated link).
      CommunicatorOptions options = reducer::CommunicatorOptionsFrom(config_);
      options.link = {};
      options.prefix = GroupStorePrefix(agent_.options(), agent_.id()) + "ddp/";
      options.secret = agent_.data_plane_secret();
      options.rank = static_cast<int>(config_.group_rank);
      options.world_size = static_cast<int>(config_.group_size);
      LighthouseRendezvousStore told(agent_.client(), agent_.clock());
      MEND_RETURN_IF_ERROR(reducer::AwaitGroupRanks(*store, &told, agent_, options.prefix));
      MEND_ASSIGN_OR_RETURN(comm_, Communicator::Connect(*store, options));
      stats_.rank = static_cast<uint32_t>(options.rank);
      stats_.world_size = static_cast<uint32_t>(options.world_size);
    } else {
      MEND_ASSIGN_OR_RETURN(QuorumResult round,
                            agent_.Quorum(0, 0, config_.quorum_timeout_ms * kMicrosPerMilli,
                                          /*include_members=*/true));
      CommunicatorOptions options =
          CommunicatorOptionsForRound(reducer::CommunicatorOptionsFrom(config_), round);
      options.secret = agent_.data_plane_secret();
      LighthouseRendezvousStore store(agent_.client(), agent_.clock());
      MEND_ASSIGN_OR_RETURN(comm_, Communicator::Connect(store, options));
      stats_.rank = round.rank();
      stats_.world_size = round.world_size();
    }
    // Everyone starts from rank 0's parameters.
    Flatten(/*gradients=*/false);
    MEND_RETURN_IF_ERROR(comm_->Broadcast(std::as_writable_bytes(std::span(buffer_)), 0));
    Unflatten(/*gradients=*/false);
    return OkStatus();
  }

  Status AverageGradients(uint64_t tokens) override {
    if (!comm_)
      return FailedPreconditionError("data parallel: AverageGradients() after shutdown()");
    Flatten(/*gradients=*/true);
    const std::span<float> controls =
        std::span(buffer_).last(in_group_ ? size_t{kControls} : size_t{0});
    for (size_t c = 0; c < controls.size(); ++c) controls[c] = requested_[c] ? 1.0f : 0.0f;
    requested_[kCheckpoint] = false;  // once; a stop stays asked for
    const uint64_t sent_before = comm_->stats().bytes_sent;
    // The group's ranks are replicas: a plain mean (weights by tokens would
    // give a rank that reported none weight 0 in the stop flag too).
    const double weight = in_group_                      ? 1.0
                          : config_.token_weighted_merge ? static_cast<double>(tokens)
                                                         : 1.0;
    MEND_RETURN_IF_ERROR(comm_->WeightedAllReduce(buffer_, weight));
    for (size_t c = 0; c < controls.size(); ++c) agreed_[c] = controls[c] > 0.0f;
    stats_.bytes_sent += comm_->stats().bytes_sent - sent_before;
    Unflatten(/*gradients=*/true);
    stats_.steps++;
    return OkStatus();
  }

  Status shutdown() override {
    if (!comm_) return OkStatus();
    comm_.reset();
    return in_group_ ? OkStatus() : agent_.Leave("training finished");
  }

  DataParallelStats stats() const override { return stats_; }
  void RequestStop() override { requested_[kStop] = true; }
  bool StopAgreed() const override { return agreed_[kStop]; }
  void RequestCheckpoint() override { requested_[kCheckpoint] = true; }
  bool CheckpointAgreed() const override { return agreed_[kCheckpoint]; }

 private:
  void Flatten(bool gradients) {
    size_t offset = 0;
    for (const at::Tensor& p : parameters_) {
      const size_t n = static_cast<size_t>(p.numel());
      const at::Tensor source = gradients ? p.grad() : p;
      if (source.defined()) {
        at::Tensor contiguous = source.contiguous();
        std::memcpy(buffer_.data() + offset, contiguous.data_ptr<float>(), n * sizeof(float));
      } else {
        std::fill_n(buffer_.data() + offset, n, 0.0f);
      }
      offset += n;
    }
  }

  void Unflatten(bool gradients) {
    size_t offset = 0;
    for (at::Tensor& p : parameters_) {
      const size_t n = static_cast<size_t>(p.numel());
      at::Tensor target = p;
      if (gradients) {
        if (!p.grad().defined() || !p.grad().is_contiguous()) p.mutable_grad() = at::zeros_like(p);
        target = p.grad();
      }
      std::memcpy(target.data_ptr<float>(), buffer_.data() + offset, n * sizeof(float));
      offset += n;
    }
  }

  const Config config_;
  LearnerAgent& agent_;
  const bool in_group_;
  // In a group, flags that travel after the gradients (the mean of the
  // ranks' 0 or 1: above 0 when some rank asked).
  enum Control : size_t { kStop, kCheckpoint, kControls };
  bool requested_[kControls] = {};
  bool agreed_[kControls] = {};
  std::vector<at::Tensor> parameters_;
  std::vector<float> buffer_;
  std::unique_ptr<Communicator> comm_;
  DataParallelStats stats_;
};

}  // namespace

StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(const Config& config,
                                                             torch::nn::Module& module,
                                                             LearnerAgent& agent) {
  auto data_parallel = std::make_unique<DataParallelImpl>(config, agent, /*in_group=*/false);
  MEND_RETURN_IF_ERROR(data_parallel->Init(module));
  return std::unique_ptr<DataParallel>(std::move(data_parallel));
}

StatusOr<std::unique_ptr<DataParallel>> DataParallel::CreateInGroup(const Config& config,
                                                                    torch::nn::Module& module,
                                                                    LearnerAgent& agent) {
  if (config.group_size < 2) {
    return InvalidArgumentError(
        fmt::format("data parallel in a group: group_size = {}", config.group_size));
  }
  auto data_parallel = std::make_unique<DataParallelImpl>(config, agent, /*in_group=*/true);
  MEND_RETURN_IF_ERROR(data_parallel->Init(module));
  return std::unique_ptr<DataParallel>(std::move(data_parallel));
}

}  // namespace mend
