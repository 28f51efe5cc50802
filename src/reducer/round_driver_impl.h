// The round driver's implementation: the training thread's side of the
// rounds. At each step it observes the rounds in flight (their phase), asks
// the phase table (round_plan.h) what the step's events call for, and has
// its owners do it:
//   Flights (flights.h)            the rounds in flight: launch, wait, take up
//   OuterState (outer_state.h)     the fragment book, resume, restore, export,
//                                  import and checkpoints
//   RoundPolicy (group_policy.h)   what differs for a learner of several ranks
//   RoundServices (round_services.h)  its only way to the lighthouse
// Files: round_driver.cc (the steps), round_driver_shutdown.cc (the end, and
// final_merge.h), round_driver_state.cc (construction, the outer state's
// calls), round_driver_plan.cc (PlanStep); RoundDriver::Create in
// round_driver_create.cc.
//
// Thread-safety: the training thread only (see round_driver.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "mend/codec.h"
#include "outer/overlap_tuner.h"
#include "reducer/diagnostics.h"
#include "reducer/flights.h"
#include "reducer/group_policy.h"
#include "reducer/outer_state.h"
#include "reducer/round_driver.h"
#include "reducer/round_options.h"
#include "reducer/round_plan.h"
#include "reducer/round_services.h"

namespace mend::reducer {

class RoundDriverImpl final : public RoundDriver {
 public:
  // `policy` owns what a group needs (its LearnerGroup and whole model);
  // `parameters` are this rank's (a group's slice); `learner_id` names its
  // checkpoints, which `options.checkpoints.secret` authenticates.
  RoundDriverImpl(RoundOptions options, const Clock& clock, std::string learner_id,
                  FragmentSchedule schedule, std::unique_ptr<Codec> codec,
                  std::unique_ptr<RoundPolicy> policy, std::unique_ptr<FlatParameters> parameters,
                  std::unique_ptr<FlatMoments> moments);
  // Without shutdown() (the caller is unwinding): the rounds in flight are
  // called off and their results dropped (Flights goes first).
  ~RoundDriverImpl() override = default;

  // `services`: the round services before the policy's (a group's) part.
  Status Init(uint64_t start_step, std::unique_ptr<RoundServices> services);

  // RoundDriver.
  Status step(uint64_t tokens) override;
  Status shutdown() override;
  bool NextStepMayWait() const override;
  bool NewestJoinFormed() const override {
    return !flights_->empty() && flights_->newest().Status().formed;
  }
  StepPlan PlanStep() override;
  ReducerStats stats() const override;
  std::span<const float> global(int fragment) const override {
    return outer_.book().at(fragment).state->global();
  }
  int fragments() const override { return static_cast<int>(outer_.book().size()); }
  Status SaveCheckpoint(const std::string& path) override;
  Status SetBuffers(bool from_first_member, std::unique_ptr<FlatParameters> buffers) override;
  StatusOr<std::string> ExportState() override;
  Status ImportState(std::string_view bytes, bool keep_parameters) override;
  size_t OwnValues() const override { return outer_.OwnCount(); }
  StatusOr<std::string> ExportOwn(std::span<float> global, std::span<float> momentum) override;
  Status ImportOwn(std::string_view described, std::span<const float> global,
                   std::span<const float> momentum) override;

 private:
  // round_driver.cc
  // The phase table's decision on `event` at this step, the oldest round as
  // it is now (or as the planned step saw it: Flights::HeadPhase).
  Decision Ask(Event event, const bool* arrived = nullptr) const {
    return Next(flights_->View(stats_.steps, flights_->HeadPhase(arrived)), event);
  }
  void RecordStep(uint64_t tokens);
  Status TakeUpFlights();
  Status ApplyOrTrainOn(InFlight& head, bool* taken_up);
  Status LookAtGroupJoin(Phase* phase);
  Status AtBoundary(int f, Phase* phase);
  StatusOr<Decision> BoundaryDecision(int f, Phase phase);
  Status Launch(int f);
  std::vector<uint8_t> LaunchesAt(uint64_t step) const;
  // round_driver_shutdown.cc
  Status ShutdownBroken(Status why);
  enum class Settled { kNothing, kCalledOff, kLeftOutOfTheEnd };
  StatusOr<Settled> SettleAtShutdown();
  Status TakeTheJobsFinalModel();
  void DropStepsPastTheFinalState();
  // round_driver_plan.cc
  Action NextStepAction() const;
  void SayIfPastTheEnd();
  // round_driver_state.cc
  Progress Now() const { return {stats_.steps, stats_.last_round_id, stats_.tokens}; }
  void MoveTo(const Restored& restored);
  Status BetweenRounds(std::string_view call) const;

  const Clock& clock_;
  RoundOptions options_;
  // Before everything that uses it (a group's policy holds the whole model
  // the parameters are a slice of), so that it goes last.
  const std::unique_ptr<RoundPolicy> policy_;
  const FragmentSchedule schedule_;
  const std::unique_ptr<FlatParameters> parameters_;
  const std::unique_ptr<FlatMoments> moments_;  // null without an Adam inner optimizer
  const std::unique_ptr<Codec> codec_;
  ReducerStats stats_;
  ThreadPool pool_{options_.round_threads};  // the round's arithmetic on the training thread
  OuterState outer_;
  // tau: overlap_steps, or the cap (applied on arrival), or tuned from this
  // learner's round and step times (a group).
  outer::OverlapTuner overlap_;
  std::unique_ptr<Diagnostics> diagnostics_;
  std::unique_ptr<Flights> flights_;  // last: its rounds read all of the above
  Micros last_step_ = 0;
  Micros last_return_ = 0;  // when step() last returned
  bool stepped_ = false;
  bool shut_down_ = false;
  bool said_past_the_end_ = false;  // (once per learner)
};

}  // namespace mend::reducer
