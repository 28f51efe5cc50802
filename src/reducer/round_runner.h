// The round runner: the background part of one round, on the round's own
// thread, over injected round services (round_services.h):
//
//   quorum -> rendezvous store -> communicator (abort watch on)
//     -> heal from the source, or agree that every member holds the same state
//     -> the pseudo-gradient exchange and outer step (OuterRound::Exchange)
//     -> DES-LOC moments, model buffers
//
// It reads the fragments' global state (the training thread leaves it alone
// while a round is in flight: the fragment it exchanges has no other round in
// flight, and a round that heals waits for the earlier ones to be taken up,
// see FlightOrder) and writes only the flight's formed status and the
// Outcome it returns; the driver applies that on the training thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/mutex.h"
#include "mend/communicator.h"
#include "mend/lighthouse_client.h"
#include "mend/outer.h"
#include "mend/outer_sync.h"
#include "mend/status.h"
#include "reducer/connect_threads.h"
#include "reducer/fragment_book.h"
#include "reducer/group_policy.h"
#include "reducer/round_flight.h"
#include "reducer/round_options.h"
#include "reducer/round_services.h"

namespace mend::reducer {

// The order of the rounds in flight (rounds_in_flight > 1). The lighthouse
// holds one join per learner, so the rounds join one at a time, in the order
// they were launched. A round that may heal waits until every earlier one
// was taken up by the training thread: a heal's source then sends a global
// state that holds them, and a healed learner applies them before the heal.
// Flights numbered 0 are on their own and wait for nothing.
//
// Thread-safety: any thread.
class FlightOrder {
 public:
  // The round's thread: until every join launched before flight `seq`'s
  // was answered (or ended); then Joined(seq) once its own was.
  [[nodiscard]] Status AwaitJoinTurn(uint64_t seq, std::chrono::milliseconds timeout);
  void Joined(uint64_t seq);
  // The round's thread: until every flight before `seq` was taken up; the
  // training thread calls TakenUp for each, in order.
  [[nodiscard]] Status AwaitEarlierTakenUp(uint64_t seq, std::chrono::milliseconds timeout);
  void TakenUp(uint64_t seq);
  // Every wait, now and later, ends with ABORTED (shutdown, a group gone).
  void Stop();

 private:
  // Until flights up to seq - 1 have joined (`join`) or were taken up.
  Status Await(bool join, uint64_t seq, std::chrono::milliseconds timeout);
  uint64_t Done(bool join) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return join ? joined_ : taken_up_;
  }

  Mutex mu_;
  CondVar changed_;
  uint64_t joined_ ABSL_GUARDED_BY(mu_) = 0;    // flights up to this one have joined
  uint64_t taken_up_ ABSL_GUARDED_BY(mu_) = 0;  // ... were taken up
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

class RoundRunner {
 public:
  // Nothing is owned; all must outlive the runner. `moment_values`: the
  // inner optimizer's moments' size (0: none).
  RoundRunner(const RoundOptions& options, const FragmentSchedule& schedule,
              RoundServices& services, FragmentBook& book, const RoundSlices& policy,
              size_t moment_values);

  // Runs `flight`'s round; `step_now` is the learner's step (for the
  // flight's formed_step).
  StatusOr<Outcome> Run(InFlight& flight, const std::function<uint64_t()>& step_now);

  FlightOrder& order() { return order_; }
  // Every round's waits, now and later, end with ABORTED: its join's turn,
  // the earlier rounds' take-up, its connect (shutdown, a group gone).
  void Stop();
  const ConnectThreads& connects() const { return connects_; }

 private:
  StatusOr<QuorumResult> Join(InFlight& flight);
  StatusOr<std::unique_ptr<Communicator>> Connect(const std::shared_ptr<RendezvousStore>& store,
                                                  const QuorumResult& round,
                                                  CommunicatorOptions* options);
  int ExchangedFragment(const QuorumResult& round, const InFlight& flight) const;
  // `status`, after reporting the members it names as failing
  // authentication (the secure data plane) as out of reach: a learner whose
  // pieces keep failing is left out of rounds by the lighthouse.
  Status Reported(RendezvousStore& store, const QuorumResult& round, Status status);
  Status HealOrAgree(Communicator& comm, RendezvousStore& store, const QuorumResult& round,
                     InFlight& flight, Micros timeout, Outcome* outcome);
  StatusOr<bool> StatesAgree(RendezvousStore& store, const QuorumResult& round,
                             const InFlight& flight, Micros timeout) const;
  Status Merge(Communicator& comm, const QuorumResult& round, InFlight& flight, Outcome* outcome);
  Status AverageMoments(Communicator& comm, uint64_t round_id, const InFlight& flight,
                        Outcome* outcome);
  Status SyncBuffers(Communicator& comm, uint32_t rank, const InFlight& flight, Outcome* outcome);

  const RoundOptions& options_;
  const FragmentSchedule& schedule_;
  RoundServices& services_;
  FragmentBook& book_;  // its state written by a heal in place (HealRound) only
  const RoundSlices& policy_;
  const size_t moment_values_;
  FlightOrder order_;
  ConnectThreads connects_;  // last: joins its connects (which use the above) first
};

// What this member sent to members of other racks (or of no rack, or when
// the member list is unknown: everything) between two stats.
uint64_t CrossRackBytes(const CommunicatorStats& before, const CommunicatorStats& after,
                        const std::vector<std::string>& racks, uint32_t me);

}  // namespace mend::reducer
