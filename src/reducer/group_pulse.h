// A group's pulse: how rank 0, which heartbeats to the lighthouse for the
// whole learner, learns that another rank of its group has gone silent.
//
// Every rank r > 0 writes a counter under <group>/pulse/<r> in the group's
// store each heartbeat interval (and "done" when it shuts down normally).
// Rank 0 reads them; while some rank's counter has not moved for a
// heartbeat timeout, it withholds the learner's heartbeats
// (LearnerAgent::WithholdHeartbeats). Without this, a stopped or hung rank
// r > 0 would hold every other learner's round: rank 0 keeps the learner
// alive at the lighthouse, and rank r of each other learner waits in the
// slice exchange with it until the collective timeout. With it, the
// lighthouse declares the learner dead one heartbeat timeout later and
// aborts its round, as it does for a stopped one-rank learner; when the
// rank runs again, the heartbeats resume and the learner is revived.
//
// A key not found is no beat; a store that does not answer (restarting,
// unreachable) is no evidence of silence: it restarts that rank's count.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "mend/clock.h"
#include "mend/communicator.h"
#include "mend/learner_agent.h"
#include "mend/status.h"

namespace mend::reducer {

// Rank 0's verdict from what it read of the other ranks' pulses; no threads,
// no store (the part the tests drive on a fake clock).
class PulseJudge {
 public:
  // Ranks 1..size-1 are judged; each counts as heard at `now`.
  PulseJudge(int size, Micros silence_limit, Micros now);

  // Rank `rank`'s key read `value` at `now`, or failed to be read.
  void Observe(int rank, const StatusOr<std::string>& value, Micros now);
  // The lowest rank not heard (its counter unmoved, not done) for longer
  // than the silence limit at `now`, or -1.
  int Silent(Micros now) const;
  // Whether rank `rank` said it is done.
  bool done(int rank) const { return ranks_[static_cast<size_t>(rank)].done; }

 private:
  struct Rank {
    std::string last;
    Micros heard_at = 0;
    bool done = false;
  };
  const Micros silence_limit_;
  std::vector<Rank> ranks_;
};

// The pulse of one rank: a thread that writes it (rank r > 0) or reads the
// others' and withholds `agent`'s heartbeats while one is silent (rank 0).
class GroupPulse {
 public:
  // `store`: a connection of its own to the group's store; `base`: the
  // group's prefix (GroupStorePrefix); `agent` (rank 0's, not owned) must
  // outlive this. `interval` and `silence_limit`: the heartbeat interval
  // and timeout.
  GroupPulse(std::unique_ptr<RendezvousStore> store, std::string base, int rank, int size,
             LearnerAgent& agent, Micros interval, Micros silence_limit);
  ~GroupPulse();
  GroupPulse(const GroupPulse&) = delete;
  GroupPulse& operator=(const GroupPulse&) = delete;

  // Stops the thread; rank r > 0 then writes "done" when `done` (it shut
  // down normally: rank 0 must not read its silence as a hang), and rank 0
  // stops withholding (it is leaving, or the learner is going away).
  void Stop(bool done);

  static std::string Key(const std::string& base, int rank);

 private:
  void Beat();
  void Watch();
  // Waits `interval_`; false once stopping.
  bool Pause();

  const std::unique_ptr<RendezvousStore> store_;
  const std::string base_;
  const int rank_;
  const int size_;
  LearnerAgent& agent_;
  const Micros interval_;
  const Micros silence_limit_;
  Mutex mu_;
  CondVar wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mend::reducer
