// The rounds in flight of a learner, oldest first, and what is done with
// them: each is launched at its boundary with the boundary's snapshot and
// run on a thread of its own (the round runner over the round services);
// waited for until a verdict (it arrived, or the learner trains on without
// it); and taken up in launch order: joined, its outcome brought into the
// fragment book, the moments and the model's buffers, recorded in the
// diagnostics, and checkpointed when due. The round driver decides when
// (the phase table, round_plan.h); Flights carries it out.
//
// It also keeps the view of the rounds a planned step took (Plan), so that
// a round that arrives after the plan is taken up at a later step.
//
// Thread-safety: the training thread only. Each round's thread touches its
// InFlight (round_flight.h) and reads what the runner reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "mend/clock.h"
#include "mend/reducer_stats.h"
#include "mend/status.h"
#include "outer/overlap_tuner.h"
#include "reducer/diagnostics.h"
#include "reducer/flat_state.h"
#include "reducer/group_policy.h"
#include "reducer/outer_state.h"
#include "reducer/round_flight.h"
#include "reducer/round_options.h"
#include "reducer/round_plan.h"
#include "reducer/round_runner.h"
#include "reducer/round_services.h"

namespace mend::reducer {

// What the flights work on and report to; not owned, all outlive them.
struct FlightsContext {
  const Clock& clock;
  const RoundOptions& options;
  const FragmentSchedule& schedule;
  RoundPolicy& policy;
  OuterState& outer;
  FlatMoments* moments;  // null without an Adam inner optimizer
  ReducerStats& stats;   // its steps, tokens and last round are the learner's
  outer::OverlapTuner& overlap;
  Diagnostics& diagnostics;
};

class Flights {
 public:
  Flights(const FlightsContext& context, std::unique_ptr<RoundServices> services);
  // Every round in flight called off, its result dropped.
  ~Flights();

  RoundServices& services() { return *services_; }
  bool empty() const { return flights_.empty(); }
  // Whether step `next`, doing `action` (the plan's), with a launch there,
  // only reads the parameters: concurrent, nothing in flight to take up or
  // to make room for, and no provisional step at its launch.
  bool LaunchOnlyReads(uint64_t next, Action action) const;
  // Whether a launch now is a fresh learner's first round in a job in
  // progress, taken up at its boundary (see Launch); as Plan saw it for
  // the step it planned, so that a plan and its step agree.
  bool JoinsInProgress(uint64_t step) const;
  size_t size() const { return flights_.size(); }
  InFlight& head() const { return *flights_.front(); }
  InFlight& newest() const { return *flights_.back(); }
  // sync_buffers: `kind` 0, averaged; 1, the first member's. Before the first round.
  void SetBuffers(int kind, std::unique_ptr<FlatParameters> buffers) {
    buffers_[kind] = std::move(buffers);
  }
  // The learner's step, for the rounds' threads (after every change of stats.steps).
  void StepNow(uint64_t step) { step_now_.store(step, std::memory_order_relaxed); }

  // Launches fragment f's round at this step, to be applied `tau` steps on
  // (never before an older round). A final merge's first takes up every
  // round in flight.
  Status Launch(int f, uint64_t tau, bool final_merge);
  // Takes up the oldest round: its result applied, or (failed) its tokens
  // and provisional step given back. An error is the group's (broken).
  Status TakeUp();
  Status TakeUpAll();
  // Waits for `flight` until it arrived, or (a concurrent round, a final
  // merge) until the learner trains on without it at `give_up_step`.
  StatusOr<Verdict> AwaitVerdict(InFlight& flight, uint64_t give_up_step, bool train_on_if_lost);
  // Gives up `flight`'s join (shutdown) and interrupts it.
  void CallOff(InFlight& flight);
  void CallOffAll();
  // The learner trains on without `flight` (passed over, counted and said once).
  void TrainOn(InFlight& flight, Verdict verdict);
  // A step waits for `flight` (counted once per round).
  void CountWait(InFlight& flight);
  // Whether fragment f's boundary must take up the oldest round before it
  // launches (a group: rank 0's view).
  StatusOr<bool> LaunchBlocked(int f);

  // The rounds as the phase table sees them at `step`, the oldest in `phase`.
  RoundView View(uint64_t step, Phase phase) const;
  // The oldest round's phase (kIdle: none); `arrived`: whether it had
  // arrived as a planned step saw it (so that a front end that staged the
  // parameters for the step's plan is not overtaken by a late arrival);
  // null: now.
  Phase HeadPhase(const bool* arrived = nullptr) const;

  // PlanStep's view of the rounds, for step `step`.
  void Plan(uint64_t step);
  void Unplan() { planned_step_ = 0; }
  // Whether `step` was planned, and then whether its k-th oldest round had arrived.
  bool Planned(uint64_t step) const { return planned_step_ == step; }
  bool ArrivedWhenPlanned(size_t k) const { return k < planned_arrivals_; }
  // The fragments planned step `next` may touch, given those it launches.
  std::vector<uint8_t> PlannedFragments(uint64_t next, std::vector<uint8_t> launches) const;

 private:
  uint64_t HeldRoundId() const;
  FlightStatus PlannedStatus(InFlight& flight) const;
  InFlight& Start(std::unique_ptr<InFlight> flight);
  bool EagerAt(const InFlight& flight) const;
  // Whether a round launched at step `step` takes the provisional step.
  bool EagerAtBoundary(uint64_t step) const;
  void Snap(Fragment& fragment, InFlight& flight);
  Status Join(InFlight& flight);
  Status GiveBack(InFlight& flight);
  Status Commit(InFlight& flight);
  bool Apply(InFlight& flight);
  std::optional<Verdict> TrainOnBecause(const InFlight& flight, uint64_t give_up_step,
                                        bool train_on_if_lost) const;
  static bool PollDone(InFlight& flight);
  bool MarkPassedOver(InFlight& flight);
  void Record(const InFlight& flight);

  const FlightsContext context_;
  const RoundOptions& options_;
  ReducerStats& stats_;
  RoundPolicy& policy_;
  const Clock& clock_;
  // sync_buffers: the model's buffers averaged at every round, and those
  // taken from the round's first member (null: none).
  std::unique_ptr<FlatParameters> buffers_[2];
  const std::unique_ptr<RoundServices> services_;  // before flights_: outlives their rounds
  RoundRunner runner_;
  std::deque<std::unique_ptr<InFlight>> flights_;  // oldest first: taken up in this order
  uint64_t launched_ = 0;                          // rounds launched (their FlightOrder numbers)
  uint64_t failed_in_a_row_ = 0;                   // rounds failed since the last that succeeded
  std::atomic<uint64_t> step_now_{0};
  // Plan's view for the step it planned (0: none planned): the oldest
  // rounds that had arrived then, and each round's status.
  uint64_t planned_step_ = 0;
  size_t planned_arrivals_ = 0;
  std::vector<std::pair<const InFlight*, FlightStatus>> planned_status_;
  bool planned_joins_in_progress_ = false;
  // JoinsInProgress as things stand now.
  bool JoinsInProgressNow() const;
};

}  // namespace mend::reducer
