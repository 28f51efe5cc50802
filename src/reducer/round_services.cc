#include "reducer/round_services.h"

#include <atomic>
#include <deque>
#include <utility>

#include "core/mutex.h"
#include "core/round_keys.h"
#include "dataplane/hierarchy.h"
#include "learner/lighthouse_rendezvous.h"
#include "reducer/abort_watch.h"

namespace mend::reducer {
namespace {

class LighthouseServices final : public RoundServices {
 public:
  LighthouseServices(LearnerAgent& agent, const Clock& clock, Micros rendezvous_timeout,
                     bool train_through_outage)
      : agent_(agent),
        clock_(clock),
        rendezvous_timeout_(rendezvous_timeout),
        train_through_outage_(train_through_outage) {
    MutexLock lock(mu_);
    watches_.push_back({nullptr, std::make_unique<AbortWatch>(agent.client())});
  }

  const Clock& clock() const override { return clock_; }

  StatusOr<QuorumResult> Quorum(uint64_t last_round_id, uint64_t tokens, Micros timeout,
                                uint64_t boundary_step) override {
    return agent_.Quorum(last_round_id, tokens, timeout, /*include_members=*/true, boundary_step);
  }

  // A round formed by a lighthouse that has since restarted (the agent
  // registered again) cannot rendezvous: its keys died with it. Once the
  // learner's rounds are called off (Interrupt: shutdown), a wait in the
  // store ends too (a connect left behind is joined without waiting out
  // collective_timeout_ms); so does one while the lighthouse is lost, when
  // the learner trains through outages.
  std::unique_ptr<RendezvousStore> OpenRendezvous(const QuorumResult& round) override {
    const uint64_t registrations = agent_.registrations();
    return std::make_unique<LighthouseRendezvousStore>(
        agent_.client(), clock_,
        [this, registrations]() -> Status {
          if (interrupted_.load(std::memory_order_relaxed))
            return AbortedError("rendezvous: the learner's rounds were called off");
          if (agent_.registrations() != registrations) {
            return AbortedError(
                "rendezvous: the lighthouse restarted after the round was formed; its keys are "
                "gone");
          }
          if (train_through_outage_ && agent_.lighthouse_lost()) {
            return UnavailableError(
                "rendezvous: the lighthouse has answered nothing for a heartbeat timeout; the "
                "round cannot meet before it is back, so it ends and the learner trains on "
                "(train_through_lighthouse_outage)");
          }
          return OkStatus();
        },
        round.rendezvous_prefix() + kRoundAbortKey, rendezvous_timeout_);
  }

  StatusOr<std::unique_ptr<Communicator>> Connect(RendezvousStore& store,
                                                  const CommunicatorOptions& options,
                                                  bool rack_aware) override {
    CommunicatorOptions secured = options;
    secured.secret = agent_.data_plane_secret();
    MEND_ASSIGN_OR_RETURN(auto comm, Communicator::Connect(store, secured));
    if (!rack_aware) return comm;
    return ConnectRackAware(store, secured, std::move(comm), options.member_racks);
  }

  // A watch (a thread of its own) per round in flight, kept for the next.
  void WatchAbort(const QuorumResult& round, const void* owner,
                  std::function<void(const std::string&)> abort) override {
    MutexLock lock(mu_);
    Watching* free = nullptr;
    for (Watching& watching : watches_) {
      if (watching.owner == nullptr) free = &watching;
    }
    if (free == nullptr) {
      watches_.push_back({nullptr, std::make_unique<AbortWatch>(agent_.client())});
      free = &watches_.back();
    }
    free->owner = owner;
    free->watch->Watch(round.rendezvous_prefix() + kRoundAbortKey, std::move(abort));
  }
  void Unwatch(const void* owner) override {
    MutexLock lock(mu_);
    for (Watching& watching : watches_) {
      if (watching.owner != owner) continue;
      watching.watch->Unwatch();
      watching.owner = nullptr;
    }
  }
  void Interrupt() override {
    interrupted_.store(true, std::memory_order_relaxed);
    agent_.Interrupt();
  }

  void RecordStep(uint64_t step, uint64_t tokens, Micros step_time) override {
    agent_.RecordStep(step, tokens, step_time);
  }
  LighthouseNews News() const override {
    return {agent_.latest_round_id(), agent_.latest_round_step(), agent_.lighthouse_lost(),
            agent_.short_of_quorum()};
  }
  Status fatal_status() const override { return agent_.fatal_status(); }
  Status Leave(const std::string& reason) override { return agent_.Leave(reason); }
  const std::string& learner_id() const override { return agent_.id(); }

 private:
  struct Watching {
    const void* owner = nullptr;  // null: free
    std::unique_ptr<AbortWatch> watch;
  };

  LearnerAgent& agent_;
  const Clock& clock_;
  const Micros rendezvous_timeout_;
  const bool train_through_outage_;
  std::atomic<bool> interrupted_{false};  // Interrupt(): for good
  Mutex mu_;
  std::deque<Watching> watches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<RoundServices> LighthouseRoundServices(LearnerAgent& agent, const Clock& clock,
                                                       Micros rendezvous_timeout,
                                                       bool train_through_outage) {
  return std::make_unique<LighthouseServices>(agent, clock, rendezvous_timeout,
                                              train_through_outage);
}

}  // namespace mend::reducer
