// What differs between a learner of one rank and a learner of several
// (learner_group.h), in one place: the round driver asks its policy and
// never tests which kind it has. Three interfaces, one per user:
//
//   RoundSlices    the round's thread (RoundRunner): where a slice meets,
//                  its merge weight, whose view decides a round
//   ReplicaState   the outer state (OuterState): resume, restore, export
//                  and checkpoints of the learner's whole state
//   RoundPolicy    the training thread (the driver, Flights): the step's
//                  agreements, tau, verdicts, take-up, sharing the commits
//
// SingleRankPolicy: the process is the learner; every answer is its own.
// GroupPolicy over a LearnerGroup: the ranks run the driver on their slices
// and agree, through group collectives at the same step on every rank, on
// tau, on whether a round is applied, and on its success; they then share
// the committed slices into every replica. A failed group collective breaks
// the group (broken(): the caller stops; the group restarts as a whole).
//
// Thread-safety: the training thread only, except RoundSlices (the round's
// thread; it reads constants).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mend/checkpoint.h"
#include "mend/clock.h"
#include "mend/status.h"
#include "nlohmann/json_fwd.hpp"
#include "reducer/flat_state.h"
#include "reducer/fragment_book.h"
#include "reducer/learner_group.h"
#include "reducer/round_flight.h"
#include "reducer/round_plan.h"
#include "reducer/round_services.h"

namespace mend::reducer {

// The round's thread's questions (RoundRunner).
class RoundSlices {
 public:
  virtual ~RoundSlices() = default;
  // Where a round's slice rendezvouses, and the weight of `tokens` in its
  // merge (a rank's share: every group of the job has the same size).
  virtual std::string SlicePrefix(const std::string& round_prefix) const = 0;
  virtual uint64_t MergeWeight(uint64_t tokens) const = 0;
  // Whether what this rank sees of a round decides it (one rank: a round
  // that healed nothing narrows at once to its own fragment); else rank 0's
  // view, as the round formed, decides for every rank (a group: its slices
  // may differ).
  virtual bool DecidesAlone() const = 0;
};

// The learner's whole state across its ranks (OuterState).
class ReplicaState {
 public:
  virtual ~ReplicaState() = default;
  // The round a resume from checkpoint_dir restores, given this rank's
  // newest checkpoint there (0: none): that one (one rank), or rank 0's on
  // every rank (a group: its ranks list the directory at different times,
  // and another learner may write a newer checkpoint in between).
  [[nodiscard]] virtual StatusOr<uint64_t> ResumeRound(uint64_t newest) = 0;
  // After a restore or import: every rank must have restored `round_id`;
  // then every replica takes the restored parameters.
  [[nodiscard]] virtual Status AgreeOnRestored(uint64_t round_id, std::string_view what,
                                               std::string_view rule) = 0;
  // The whole model's global state and momentum as a checkpoint described
  // by `described`; in a group a collective whose checkpoint is rank 0's
  // (null on the others).
  [[nodiscard]] virtual StatusOr<std::shared_ptr<Checkpoint>> Snapshot(const FragmentBook& book,
                                                                       Checkpoint described) = 0;
  // This rank's own values of its model (OwnCount() of them, in its
  // parameters' order) from its slice's (in a group a collective: the
  // values of parameters it shares with other ranks are gathered), and its
  // slice's values out of its own.
  virtual size_t OwnCount(const FragmentBook& book) const = 0;
  [[nodiscard]] virtual Status OwnValues(std::span<const float> slice, std::span<float> own) = 0;
  virtual void SliceValues(std::span<const float> own, std::span<float> slice) const = 0;
  // An export's state of this rank alone: one rank's error feedback; none
  // in a group (its ranks' residuals are of their slices).
  virtual void AddOwnState(const FragmentBook& book, Checkpoint* checkpoint) const = 0;
};

// The training thread's agreements (the round driver, Flights).
class RoundPolicy : public RoundSlices, public ReplicaState {
 public:
  ~RoundPolicy() override = default;
  // A learner of several ranks: what the phase table (Next()) is told. The
  // driver passes it on and branches on nothing else.
  virtual bool group() const = 0;
  // Whether a synchronous round may make its pseudo-gradient from the
  // parameters where they lie as its merge reaches them (one rank); a
  // group's ranks take their slices' snapshots at the boundary.
  virtual bool SnapshotsAtMerge() const = 0;
  // Whether, in concurrent mode, a learner that joins a job in progress
  // with none of its state waits at the boundary for the round that heals
  // it (one rank); a group's ranks train on.
  virtual bool JoinWaitsForItsHeal() const = 0;
  // Whether a round's result is taken up as soon as it arrives, and a
  // boundary looks at the join in flight as it is now (one rank); or only
  // where the ranks agreed to, on what they saw at the step's start (a group).
  virtual bool AppliedOnArrival() const = 0;
  // The fragments a step may touch, given those its own rounds touch: those
  // (one rank), or every one (a group: each commit goes into the whole replica).
  virtual std::vector<uint8_t> TouchedFragments(std::vector<uint8_t> own) const = 0;
  // Why this rank must stop: the first group collective that failed (the
  // group is restarted as a whole); OK while none has. Never for one rank.
  virtual Status broken() const = 0;
  // The services the rounds go through, given this rank's own: as they are
  // for one rank; in a group, rank 0's joins shared with the other ranks
  // (GroupRoundServices). Once, before the first round.
  virtual std::unique_ptr<RoundServices> Services(std::unique_ptr<RoundServices> own) = 0;
  // The learner's tokens for a rank's step of `tokens`.
  virtual uint64_t LearnerTokens(uint64_t tokens) const = 0;
  // The step time the learner reports for this rank's `step_time` (0: the
  // first step): a group reports its slowest rank's, as of the last round.
  virtual Micros ReportedStepTime(Micros step_time) = 0;
  // The learner's tau: this rank's, or rank 0's on every rank.
  [[nodiscard]] virtual StatusOr<uint64_t> AgreeTau(uint64_t tau) = 0;
  // Whether a boundary must take up the oldest round in flight before it
  // launches another: this rank's view, or rank 0's on every rank.
  [[nodiscard]] virtual StatusOr<bool> AgreeLaunch(bool blocked) = 0;
  // The verdict of a wait for a round that may be passed over: `decide` is
  // asked (it waits up to a poll interval; nullopt: undecided) until it
  // decides; in a group only rank 0 decides, and every rank gets its answer.
  [[nodiscard]] virtual StatusOr<Verdict> AgreeVerdict(
      const std::function<std::optional<Verdict>()>& decide) = 0;
  // For a join passed over: whether every rank's slice arrived, and whether
  // rank 0's join formed a round (a group collective; never asked of one rank).
  [[nodiscard]] virtual StatusOr<std::pair<bool, bool>> AllArrived(bool arrived, bool formed) = 0;
  // Before the round's thread is joined: waits until every rank's slice
  // ended (`poll_done` waits up to a poll interval for this rank's).
  [[nodiscard]] virtual Status AwaitAllSlices(const std::function<bool()>& poll_done) = 0;
  // After it is joined: whether every rank's slice succeeded (the flight's
  // formed_step becomes rank 0's).
  [[nodiscard]] virtual StatusOr<bool> AllOk(InFlight& flight) = 0;
  // After a round was committed: the slices into every replica (the
  // moments too, when `moments_changed`).
  [[nodiscard]] virtual Status ShareCommitted(bool moments_changed) = 0;
  // The diagnostics' name for learner `id`, and a round record's group part.
  virtual std::string DiagnosticsName(const std::string& id) const = 0;
  virtual void AddToRecord(nlohmann::json& record) const = 0;
  // Bytes this rank sent to its group's other ranks (0 for one rank): all
  // of them, and those of the model's state alone (LearnerGroup).
  virtual uint64_t GroupBytesSent() const = 0;
  virtual uint64_t GroupStateBytesSent() const = 0;
  // At shutdown: the pulse stops (`done`: normally), and the group's keys go.
  virtual void Stop(bool done) = 0;
  virtual void Forget() = 0;
};

std::unique_ptr<RoundPolicy> SingleRankPolicy();
// `whole` and `whole_moments` (may be null): this replica's whole model.
std::unique_ptr<RoundPolicy> GroupPolicy(std::unique_ptr<LearnerGroup> group,
                                         std::unique_ptr<FlatParameters> whole,
                                         std::unique_ptr<FlatMoments> whole_moments);

}  // namespace mend::reducer
