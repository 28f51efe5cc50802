// A learner as a group of ranks: the hosts of one rack, each a process that
// trains the model with the others, as a replica (DDP inside the group
// keeps the replicas equal) or its shard (FSDP2, tensor parallelism); mend
// never touches that process group.
//
// Group rank 0 speaks for the group to the lighthouse: it registers (with
// the group size, which the lighthouse checks against the job's), heartbeats
// and joins rounds. The other ranks learn each round's decision from it
// through the group's store (keys under <job>/group/<learner>/<generation>/),
// so every rank of the group sees the same rounds in the same order.
//
// The cross-rack exchange is sharded: each rank exchanges its own pieces of
// the model (group_layout.h) with the same rank of the other member groups,
// on a communicator of its own (the round's prefix + "slice<r>/"). A
// replica of the model (DDP) is cut into group_size contiguous slices of
// its flat values; a model sharded over the ranks (FSDP2, TP) gives each
// rank its shard, and the pieces several ranks hold are sliced among them.
// So all R hosts of a rack carry the cross-rack traffic, each 1/R of it,
// and hold 1/R of the outer state.
//
// Inside the group, on a Gloo context mend owns (never the user's process
// group): rank 0's tau is everyone's (AgreeTau), a round commits only when
// every slice succeeded (AllOk), and the committed slices of what several
// ranks hold are all-gathered among those ranks only (ShareParameters, on a
// communicator of theirs where they are not all the group's): the whole
// model for DDP, nothing for a model sharded with nothing replicated. These run on the
// training thread at the same step on every rank: in a group a round's
// result is applied at boundary + tau exactly, never "when it arrives",
// which depends on each process's timing and would let replicas diverge.
//
// Thread-safety: the services (RoundServicesOver) from the round's thread;
// the rest from the training thread.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "mend/communicator.h"
#include "mend/learner_agent.h"
#include "mend/status.h"
#include "reducer/flat_state.h"
#include "reducer/group_layout.h"
#include "reducer/group_pulse.h"
#include "reducer/round_options.h"
#include "reducer/round_services.h"

namespace mend::reducer {

// Waits (up to quorum_timeout_ms on the agent's clock) until every rank of
// `agent`'s group has shown up under `prefix`, before a communicator among them connects
// with its shorter collective timeout: the ranks of a group start apart
// (process start, loading the model and data).
// `told` (optional): the lighthouse's store, where a rank that could not
// start tells why (TellGroupRanks).
[[nodiscard]] Status AwaitGroupRanks(RendezvousStore& store, RendezvousStore* told,
                                     const LearnerAgent& agent, const std::string& prefix);

// The group's keys in the store are under GroupStorePrefix (learner_agent.h).

class LearnerGroup {
 public:
  // Connects the group's communicator (every rank of learner agent.id(),
  // under GroupStorePrefix), after AwaitGroupRanks, and checks that they
  // hold the same model. `agent`
  // (rank 0's registered one, or a group rank's, see LearnerAgent::Start)
  // and `full` (this replica's whole model) are not owned and must outlive
  // the group.
  [[nodiscard]] static StatusOr<std::unique_ptr<LearnerGroup>> Join(const RoundOptions& rounds,
                                                                    LearnerAgent& agent,
                                                                    FlatParameters& full);
  ~LearnerGroup();

  int size() const { return size_; }
  int rank() const { return rank_; }
  const std::string& learner_id() const { return inner_.id(); }
  // The round services every rank's rounds go through, over this rank's
  // `own`: Quorum() is rank 0's join, whose decision (or error) the others
  // read from the group's store (group_round_services.h). Once.
  std::unique_ptr<RoundServices> RoundServicesOver(std::unique_ptr<RoundServices> own);
  // This rank's slice of the model, as the round driver's parameters.
  std::unique_ptr<FlatParameters> Slice();
  // The same slice of the inner optimizer's moments of `whole` (not owned).
  std::unique_ptr<FlatMoments> Slice(FlatMoments& whole);
  // Every rank's slice of `whole`'s moments into every replica's (after
  // DES-LOC averaged them, or a heal brought the source's), each moment the
  // ranks all hold.
  [[nodiscard]] Status ShareMoments(FlatMoments& whole);
  // Where this rank's slice of a round rendezvouses.
  std::string SlicePrefix(const std::string& round_prefix) const;

  // Rank 0's value, on every rank.
  [[nodiscard]] StatusOr<uint64_t> AgreeTau(uint64_t tau);
  // True when every rank's slice of the round succeeded; `*formed_step`
  // becomes rank 0's (the step at which the round formed, which a heal's
  // new step counts from: each rank saw the decision at its own step), and
  // `*step_us` (this rank's mean inner step since the last round) the
  // slowest rank's.
  [[nodiscard]] StatusOr<bool> AllOk(bool ok, uint64_t* formed_step, uint64_t* step_us);
  // For a join passed over: whether every rank's slice of its round has
  // arrived (`arrived`), and whether rank 0's join formed a round
  // (`formed`), on every rank.
  [[nodiscard]] StatusOr<std::pair<bool, bool>> AllArrived(bool arrived, bool formed);
  // Every rank's slice of the parameters into every rank that holds it.
  [[nodiscard]] Status ShareParameters();
  // This rank's own values (of every parameter it holds, total() of them,
  // in its model's order) from every rank's `slice` (its slice's values in
  // order): its pieces' values, and those of each set it shares with other
  // ranks gathered from them (one group collective; none when nothing is
  // shared). For a replicated model that is the whole model, on every rank.
  [[nodiscard]] Status GatherOwn(std::span<const float> slice, std::span<float> own);
  // This rank's slice out of its own values (no communication).
  void SliceOwn(std::span<const float> own, std::span<float> slice) const;
  // Whether some parameter is held by fewer than every rank (FSDP2, TP).
  bool sharded() const { return layout_.sharded(); }
  // The model's values (this rank's: a sharded model's are its own).
  size_t total() const { return prefix_.back(); }
  // Bytes this rank sent on the group's communicators: all of them, and
  // those of the collectives that moved the model's state (ShareSlices:
  // parameters, moments, a round's own values), not the agreements, whose
  // count depends on how long rank 0 waits for a quorum.
  uint64_t bytes_sent() const;
  uint64_t state_bytes_sent() const { return state_bytes_sent_; }
  // Rank 0's `value`, and whether every rank passed the same.
  [[nodiscard]] StatusOr<std::pair<uint64_t, bool>> Compare(uint64_t value);
  // Every rank's `value`, by rank (one group collective, like Compare).
  [[nodiscard]] StatusOr<std::vector<uint64_t>> ValuesByRank(uint64_t value) {
    return GatherValues({value});
  }
  // Removes the group's keys from the store (rank 0, when the group is done).
  void Forget();
  // Stops this rank's pulse (group_pulse.h); `done`: it shut down normally.
  // Before the learner leaves (rank 0) or the process ends.
  void StopPulse(bool done);

 private:
  // `store` and `decisions`: two connections to the group's store, for the
  // training thread and for the round's (rank 0's decisions).
  LearnerGroup(const RoundOptions& rounds, LearnerAgent& agent, FlatParameters& full,
               std::string base, std::unique_ptr<RendezvousStore> store,
               std::unique_ptr<RendezvousStore> decisions);
  // INVALID_ARGUMENT when another rank's parameter names or shapes differ.
  Status CheckSameModel();
  // Every rank's replica keys and value counts, into layout_.
  Status GatherLayout();
  // A communicator among the members of each set that some but not all
  // ranks hold and this rank is in (ShareSet), like `group`'s.
  Status ConnectSets(const CommunicatorOptions& group);
  // Every set of more than one member: its members' slices into each of
  // them, this rank's read out of its state by `read`, the others' written
  // by `write` (ShareSet for each of this rank's sets).
  Status ShareSlices(
      const std::function<void(const ParameterPiece&, std::span<float>)>& read,
      const std::function<void(const ParameterPiece&, std::span<const float>)>& write);
  // One collective among set `set`'s members (this rank one of them): on
  // the group's communicator when every rank is, else on the set's own, so
  // that a slice goes only to the ranks that hold it.
  Status ShareSet(size_t set,
                  const std::function<void(const ParameterPiece&, std::span<float>)>& read,
                  const std::function<void(const ParameterPiece&, std::span<const float>)>& write);
  // One collective: every rank's `mine` (the same size), by rank, of the
  // group (`among` null) or of `among`'s ranks.
  StatusOr<std::vector<std::byte>> Gather(std::span<const std::byte> mine,
                                          Communicator* among = nullptr);
  // The same for a few values: rank q's i-th at [q * mine.size() + i].
  StatusOr<std::vector<uint64_t>> GatherValues(std::initializer_list<uint64_t> mine);

  const int size_;
  const int rank_;
  const std::string base_;  // the group's store prefix
  LearnerAgent& inner_;
  FlatParameters& full_;
  std::vector<size_t> prefix_;  // where each parameter begins in the flat values
  GroupLayout layout_;
  std::unique_ptr<RendezvousStore> decisions_;  // until RoundServicesOver
  const Micros decision_margin_;                // what a rank waits beyond rank 0's round timeout
  const std::unique_ptr<RendezvousStore>
      store_;  // the group's (rendezvous, Forget), training thread
  std::unique_ptr<Communicator> comm_;
  // By set: its members' own communicator (ConnectSets), else null.
  std::vector<std::unique_ptr<Communicator>> set_comms_;
  std::unique_ptr<GroupPulse> pulse_;
  uint64_t state_bytes_sent_ = 0;
};

}  // namespace mend::reducer
