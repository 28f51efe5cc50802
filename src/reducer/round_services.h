// What a round's background part needs from outside the process, in one
// place: the clock, the lighthouse's quorum, the store the round's members
// rendezvous through, the communicator among them, and the abort watch that
// calls the round off when the lighthouse does; and, for the training
// thread, the learner's side of the control plane (its step reports, what
// the lighthouse last said, its leave). The round runner (round_runner.h)
// and the round driver see nothing else of the control plane.
//
// LighthouseRoundServices is the one implementation in production: it goes
// through the learner's agent. A multi-rank learner's ranks see the rounds
// through GroupRoundServices (group_round_services.h) over it. Tests give
// the runner and the driver fakes: a scripted quorum, an in-process store
// and a communicator of one member (tests/reducer/round_fakes.h).
//
// Thread-safety: Quorum, OpenRendezvous, Connect, WatchAbort and Unwatch
// from the rounds' threads (the joins one at a time, see FlightOrder in
// round_runner.h); Interrupt and the learner's side from any.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mend/clock.h"
#include "mend/communicator.h"
#include "mend/learner_agent.h"
#include "mend/lighthouse_client.h"
#include "mend/rendezvous_store.h"
#include "mend/status.h"

namespace mend::reducer {

// What the lighthouse last told this learner, as its heartbeats learned it.
struct LighthouseNews {
  uint64_t latest_round_id = 0;    // the newest round it formed or closed
  uint64_t latest_round_step = 0;  // ... and that round's step
  bool lost = false;               // unreachable beyond its timeout
  bool short_of_quorum = false;    // fewer learners alive than the quorum's minimum
};

class RoundServices {
 public:
  virtual ~RoundServices() = default;
  virtual const Clock& clock() const = 0;
  // Joins a round: this learner's last round and its tokens since then;
  // the round with its members, or the error (timeout, interrupted).
  [[nodiscard]] virtual StatusOr<QuorumResult> Quorum(uint64_t last_round_id, uint64_t tokens,
                                                      Micros timeout, uint64_t boundary_step) = 0;
  // The store `round`'s members rendezvous through. Its waits end early
  // (ABORTED) when the round is called off or the lighthouse that formed it
  // is gone.
  [[nodiscard]] virtual std::unique_ptr<RendezvousStore> OpenRendezvous(
      const QuorumResult& round) = 0;
  // The round's communicator over `store`; with `rack_aware`, merging by
  // rack first (dataplane/hierarchy.h) among `options.member_racks`.
  [[nodiscard]] virtual StatusOr<std::unique_ptr<Communicator>> Connect(
      RendezvousStore& store, const CommunicatorOptions& options, bool rack_aware) = 0;
  // Calls `abort(reason)` (once, from another thread) when the lighthouse
  // calls `round` off, until Unwatch(owner): `owner` names the watch (the
  // round's connect in progress, then its communicator); what `abort`
  // touches must stay alive until then. Several rounds in flight are
  // watched at once, each for its own owner.
  virtual void WatchAbort(const QuorumResult& round, const void* owner,
                          std::function<void(const std::string&)> abort) = 0;
  virtual void Unwatch(const void* owner) = 0;
  // Makes a Quorum() in progress, and every later one, end with ABORTED: the
  // round is called off (shutdown, a group gone). From any thread.
  virtual void Interrupt() = 0;

  // The learner's side, for the training thread.
  // Its step, the step's tokens (summed there) and step time, for its heartbeats.
  virtual void RecordStep(uint64_t step, uint64_t tokens, Micros step_time) = 0;
  virtual LighthouseNews News() const = 0;
  // Why training cannot go on (the learner was refused for good); OK if it can.
  virtual Status fatal_status() const = 0;
  // Leaves the job, telling the lighthouse why.
  virtual Status Leave(const std::string& reason) = 0;
  virtual const std::string& learner_id() const = 0;
};

// Over the learner's agent (its client for the store and the abort watch's
// own thread). `agent` and `clock` are not owned and must outlive it.
// `rendezvous_timeout` (collective_timeout_ms): how long a round's store
// write is tried again while the lighthouse is unreachable. With
// `train_through_outage` (train_through_lighthouse_outage) a round's store
// wait ends with UNAVAILABLE once the agent has lost the lighthouse (it
// answered nothing for a heartbeat timeout): the round cannot meet before
// the lighthouse is back, and its keys die with a lighthouse that
// restarts, so the learner trains on instead of waiting that out.
std::unique_ptr<RoundServices> LighthouseRoundServices(LearnerAgent& agent, const Clock& clock,
                                                       Micros rendezvous_timeout,
                                                       bool train_through_outage);

}  // namespace mend::reducer
