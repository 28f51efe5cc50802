// mend::LearnerAgent: a learner's side of the control plane, for the whole
// life of a learner process.
//
// It registers with the lighthouse, keeps the heartbeat stream open on a
// background thread (step, tokens, recent inner-step times), and recovers on
// its own: when the lighthouse restarts or forgets it, it registers again;
// when the stream stops being acknowledged for heartbeat_timeout, it reopens
// it. Quorum() joins a round, riding over such recoveries until its timeout.
//
// A refusal that retrying cannot fix (wrong token, bad identity) is fatal:
// fatal_status() reports it and every later call returns it.
//
// Thread-safety: every method may be called from any thread. The heartbeat
// thread is joined by Stop() and on destruction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "mend/agent_options.h"
#include "mend/clock.h"
#include "mend/communicator.h"
#include "mend/lighthouse_client.h"
#include "mend/status.h"

namespace mend {

// Where learner `learner_id`'s group keeps its keys in the lighthouse's
// store: <job>/group/<learner>/<group_generation>.<torchrun's restart
// count>/, so that a group restarted by its launcher does not meet its old
// keys.
std::string GroupStorePrefix(const AgentOptions& options, const std::string& learner_id);

// How a learner reaches its lighthouse (address, TLS, call deadline) with
// `token`.
LighthouseClientOptions LighthouseClientOptionsFor(const AgentOptions& options,
                                                   const std::string& token);

// Opens a new connection to a learner group's own store (group_store):
// each caller (thread) gets its own.
using GroupStoreOpener = std::function<StatusOr<std::unique_ptr<RendezvousStore>>()>;

class LearnerAgent {
 public:
  // Connects and makes the first registration attempt. Returns the error of
  // a fatal refusal at once; an unreachable lighthouse is retried in the
  // background (a learner may start before its lighthouse). In a group
  // (options.group_size > 1) every rank first publishes its data-plane host
  // (options.dataplane_host) in the group's store, and rank 0 registers once
  // it has every rank's (waiting up to quorum_timeout_ms for them).
  // Every wait and timeout of the agent (and of the reducer and group code
  // built on it, see clock()) is measured on `clock`, which is not owned
  // and must outlive the agent.
  [[nodiscard]] static StatusOr<std::unique_ptr<LearnerAgent>> Start(
      const AgentOptions& options, const std::string& token, const LearnerIdentity& identity,
      const Clock& clock, GroupStoreOpener group_store = nullptr);
  virtual ~LearnerAgent() = default;

  // Records one finished inner step; cheap, never blocks on the network.
  virtual void RecordStep(uint64_t step, uint64_t tokens, Micros step_time) = 0;
  // Joins the next round. `last_round_id` is the last round this learner
  // completed; tokens are those since then. DEADLINE_EXCEEDED when no round
  // closed in `timeout`. `include_members` asks for the member list.
  // `boundary_step` is the step the join is for (its boundary; the round's
  // step is its members' largest); 0: the latest step recorded. A join sent
  // late (its thread ran after the training thread went on) must not make
  // the round's step look later than its boundary: the others read it to
  // tell whether the round left them out.
  [[nodiscard]] virtual StatusOr<QuorumResult> Quorum(uint64_t last_round_id,
                                                      uint64_t tokens_since_last_round,
                                                      Micros timeout, bool include_members,
                                                      uint64_t boundary_step = 0) = 0;
  // Makes a Quorum() in progress, and every later one, return ABORTED at
  // once; for shutting a learner down while it waits for a round.
  virtual void Interrupt() = 0;
  // Leaves the job (the lighthouse stops waiting for this learner at once)
  // and stops the heartbeat thread.
  virtual Status Leave(const std::string& reason) = 0;
  // Stops the heartbeat thread without leaving (as if the process died).
  virtual void Stop() = 0;
  // While true, no heartbeat is sent (registration and joins go on): the
  // lighthouse declares the learner dead after its heartbeat timeout and
  // aborts the round it is in, as for a stopped process. A group's rank 0
  // withholds them while another rank of its group is silent (see
  // reducer/group_pulse.h). False sends them again; the lighthouse revives
  // the learner, and the acknowledgements' silence counts from then.
  virtual void WithholdHeartbeats(bool withhold) = 0;

  // The learner's id, as registered.
  virtual const std::string& id() const = 0;
  virtual bool slow() const = 0;
  virtual double slow_zscore() const = 0;
  virtual uint64_t latest_round_id() const = 0;
  // The boundary step of the latest round the lighthouse closed (from its
  // heartbeat acknowledgements; the largest seen): a join of this learner's
  // for that step or an earlier one that is still pending was passed over.
  virtual uint64_t latest_round_step() const = 0;
  // True while the lighthouse, which answered before, has answered nothing
  // (no heartbeat acknowledgement, registration or quorum answer) for longer
  // than the heartbeat timeout and a call to it has failed since: it is
  // down, restarting or cut off. A join pending then cannot form a round
  // until it is back.
  virtual bool lighthouse_lost() const = 0;
  // True once every heartbeat acknowledgement for a heartbeat timeout has
  // said that this learner's pending join is short of a quorum: fewer
  // learners are alive than the quorum's minimum (the others left or died),
  // so it cannot form a round until some come back. Reset by each Quorum().
  virtual bool short_of_quorum() const = 0;
  // How many times this agent has registered (1 + re-registrations).
  virtual uint64_t registrations() const = 0;
  virtual Status fatal_status() const = 0;
  // The clock the agent was given at Start: the one the reducer and the
  // group code built on this agent measure their waits and timeouts on, so
  // that a test's FakeClock reaches all of them.
  virtual const Clock& clock() const = 0;
  // The lighthouse client, for the rendezvous store.
  virtual LighthouseClient& client() = 0;
  // A new connection to where the ranks of this learner's group meet and
  // share round decisions: the group's own store when Start was given one,
  // else the lighthouse's store.
  [[nodiscard]] virtual StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupStore() = 0;
  // What this learner's communicators seal their pieces with
  // (CommunicatorOptions::secret): the job token with dataplane_encrypt,
  // else empty (the data plane in the clear).
  virtual std::string data_plane_secret() const { return ""; }
  // What this learner's checkpoints (files and exported state) are
  // authenticated with: the job token with checkpoint_authenticate, else
  // empty (a SHA-256 only; see mend/checkpoint.h).
  virtual std::string checkpoint_secret() const { return ""; }
  // The options it was started with (a test double's: the defaults).
  virtual const AgentOptions& options() const {
    static const AgentOptions kDefaults;
    return kDefaults;
  }
};

}  // namespace mend
