#include "reducer/round_services.h"

#include <utility>

#include "core/round_keys.h"
#include "dataplane/hierarchy.h"
#include "learner/lighthouse_rendezvous.h"
#include "reducer/abort_watch.h"

namespace mend::reducer {
namespace {

class LighthouseServices final : public RoundServices {
 public:
  LighthouseServices(LearnerAgent& agent, const Clock& clock)
      : agent_(agent), clock_(clock), abort_watch_(agent.client()) {}

  const Clock& clock() const override { return clock_; }

  StatusOr<QuorumResult> Quorum(uint64_t last_round_id, uint64_t tokens, Micros timeout,
                                uint64_t boundary_step) override {
    return agent_.Quorum(last_round_id, tokens, timeout, /*include_members=*/true, boundary_step);
  }

  // A round formed by a lighthouse that has since restarted (the agent
  // registered again) cannot rendezvous: its keys died with it.
  std::unique_ptr<RendezvousStore> OpenRendezvous(const QuorumResult& round) override {
    const uint64_t registrations = agent_.registrations();
    return std::make_unique<LighthouseRendezvousStore>(
        agent_.client(), clock_,
        [this, registrations]() { return agent_.registrations() == registrations; },
        round.rendezvous_prefix + kRoundAbortKey);
  }

  StatusOr<std::unique_ptr<Communicator>> Connect(RendezvousStore& store,
                                                  const CommunicatorOptions& options,
                                                  bool rack_aware) override {
    MEND_ASSIGN_OR_RETURN(auto comm, Communicator::Connect(store, options));
    if (!rack_aware) return comm;
    return ConnectRackAware(store, options, std::move(comm), options.member_racks);
  }

  void WatchAbort(const QuorumResult& round, Communicator* comm) override {
    abort_watch_.Watch(round.rendezvous_prefix + kRoundAbortKey, comm);
  }
  void Unwatch() override { abort_watch_.Unwatch(); }
  void Interrupt() override { agent_.Interrupt(); }

 private:
  LearnerAgent& agent_;
  const Clock& clock_;
  AbortWatch abort_watch_;
};

}  // namespace

std::unique_ptr<RoundServices> LighthouseRoundServices(LearnerAgent& agent, const Clock& clock) {
  return std::make_unique<LighthouseServices>(agent, clock);
}

}  // namespace mend::reducer
