#include "reducer/group_round_services.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "fmt/format.h"
#include "learner/control_proto.h"

namespace mend::reducer {
namespace {

// How often a rank waiting for rank 0's decision looks whether it was
// interrupted.
constexpr Micros kDecisionPoll = 250 * kMicrosPerMilli;

class GroupServices final : public RoundServices {
 public:
  GroupServices(std::unique_ptr<RoundServices> inner, std::unique_ptr<RendezvousStore> decisions,
                std::string base, int rank, Micros margin, std::string learner_id)
      : inner_(std::move(inner)),
        decisions_(std::move(decisions)),
        base_(std::move(base)),
        rank_(rank),
        margin_(margin),
        learner_id_(std::move(learner_id)) {}

  const Clock& clock() const override { return inner_->clock(); }

  // The n-th call on every rank is the same round: rank 0 joins it and
  // publishes what came of it; the others wait for that.
  StatusOr<QuorumResult> Quorum(uint64_t last_round_id, uint64_t tokens, Micros timeout,
                                uint64_t boundary_step) override {
    const uint64_t seq = ++seq_;
    const std::string key = fmt::format("{}decision/{}", base_, seq);
    if (rank_ == 0) {
      StatusOr<QuorumResult> result = inner_->Quorum(last_round_id, tokens, timeout, boundary_step);
      MEND_RETURN_IF_ERROR(decisions_->Set(key, EncodeDecision(result)));
      if (seq > 2) (void)decisions_->Delete(fmt::format("{}decision/{}", base_, seq - 2), false);
      return result;
    }
    return AwaitDecision(key, clock().NowMicros() + timeout + margin_);
  }
  std::unique_ptr<RendezvousStore> OpenRendezvous(const QuorumResult& round) override {
    return inner_->OpenRendezvous(round);
  }
  StatusOr<std::unique_ptr<Communicator>> Connect(RendezvousStore& store,
                                                  const CommunicatorOptions& options,
                                                  bool rack_aware) override {
    return inner_->Connect(store, options, rack_aware);
  }
  void WatchAbort(const QuorumResult& round, const void* owner,
                  std::function<void(const std::string&)> abort) override {
    inner_->WatchAbort(round, owner, std::move(abort));
  }
  void Unwatch(const void* owner) override { inner_->Unwatch(owner); }
  void Interrupt() override {
    interrupted_ = true;
    inner_->Interrupt();
  }
  // The learner's side is this rank's own.
  void RecordStep(uint64_t step, uint64_t tokens, Micros step_time) override {
    inner_->RecordStep(step, tokens, step_time);
  }
  LighthouseNews News() const override { return inner_->News(); }
  Status fatal_status() const override { return inner_->fatal_status(); }
  Status Leave(const std::string& reason) override { return inner_->Leave(reason); }
  const std::string& learner_id() const override { return inner_->learner_id(); }

 private:
  StatusOr<QuorumResult> AwaitDecision(const std::string& key, Micros deadline) {
    while (true) {
      if (interrupted_.load())
        return AbortedError("group: interrupted while waiting for rank 0's round decision");
      const Micros left = deadline - clock().NowMicros();
      if (left <= 0) {
        return DeadlineExceededError(fmt::format(
            "group rank {}: rank 0 of learner '{}' published no round decision ({}) in time", rank_,
            learner_id_, key));
      }
      StatusOr<std::string> value = decisions_->Get(key, std::min(left, kDecisionPoll));
      if (value.ok()) return DecodeDecision(*value);
      if (value.status().code() == StatusCode::kUnavailable) {
        // The store is unreachable (it fails at once): look again in a while.
        std::this_thread::sleep_for(std::chrono::microseconds(std::min(left, kDecisionPoll)));
      } else if (value.status().code() != StatusCode::kDeadlineExceeded) {
        return value.status();
      }
    }
  }

  const std::unique_ptr<RoundServices> inner_;
  const std::unique_ptr<RendezvousStore> decisions_;
  const std::string base_;
  const int rank_;
  const Micros margin_;  // what a rank waits beyond rank 0's own timeout
  const std::string learner_id_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<bool> interrupted_{false};
};

}  // namespace

std::string EncodeDecision(const StatusOr<QuorumResult>& result) {
  return DecisionToProto(result).SerializeAsString();
}

StatusOr<QuorumResult> DecodeDecision(const std::string& bytes) {
  v1::DatagramDecision decision;
  if (!decision.ParseFromString(bytes)) {
    return InternalError("group: a round decision in the store does not parse");
  }
  return DecisionFromProto(decision, "");
}

std::unique_ptr<RoundServices> GroupRoundServices(std::unique_ptr<RoundServices> inner,
                                                  std::unique_ptr<RendezvousStore> decisions,
                                                  std::string base, int rank, Micros margin,
                                                  std::string learner_id) {
  return std::make_unique<GroupServices>(std::move(inner), std::move(decisions), std::move(base),
                                         rank, margin, std::move(learner_id));
}

}  // namespace mend::reducer
