// The round driver's implementation, shared by its files:
//   round_driver.cc        the training thread's side of a round: each step
//                          asks the round plan (round_plan.h) what to do and
//                          does it (launch, await, apply, train on)
//   round_driver_shutdown.cc  the end: what is in flight, the final merge
//   round_driver_state.cc  the state around the rounds: fragment layout,
//                          resume, restore, export and import, checkpoints,
//                          diagnostics
// What it is made of: a fragment book (the fragments and their appliers),
// a round runner over round services (the background part), and a policy
// for a learner of one rank or of several.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>

#include "mend/checkpoint.h"
#include "mend/codec.h"
#include "mend/config.h"
#include "mend/learner_agent.h"
#include "mend/outer.h"
#include "mend/outer_sync.h"
#include "outer/overlap_tuner.h"
#include "reducer/diagnostics.h"
#include "reducer/fragment_book.h"
#include "reducer/fragment_checkpoint.h"
#include "reducer/group_policy.h"
#include "reducer/round_driver.h"
#include "reducer/round_flight.h"
#include "reducer/round_plan.h"
#include "reducer/round_runner.h"
#include "reducer/round_services.h"

namespace mend::reducer {

class RoundDriverImpl final : public RoundDriver {
 public:
  // `policy` owns what a group needs (its LearnerGroup and whole model);
  // `parameters` are this rank's (a group's slice) and `agent` the
  // learner's view of the control plane.
  RoundDriverImpl(const Config& config, LearnerAgent& agent, const Clock& clock,
                  FragmentSchedule schedule, std::unique_ptr<Codec> codec,
                  std::unique_ptr<RoundPolicy> policy, std::unique_ptr<FlatParameters> parameters,
                  std::unique_ptr<FlatMoments> moments);
  // Without shutdown() (the caller is unwinding): a round in flight is called
  // off and its result dropped. The module and optimizer it would be applied
  // to may already be gone.
  ~RoundDriverImpl() override;

  // `services`: the round services before the policy's (a group's) part.
  Status Init(uint64_t start_step, std::unique_ptr<RoundServices> services);

  // RoundDriver.
  Status step(uint64_t tokens) override;
  Status shutdown() override;
  bool NextStepMayWait() const override;
  StepPlan PlanStep() override;
  ReducerStats stats() const override;
  std::span<const float> global(int fragment) const override {
    return book_.at(fragment).state->global();
  }
  int fragments() const override { return static_cast<int>(book_.size()); }
  Status SaveCheckpoint(const std::string& path) override;
  Status SetBuffers(bool from_first_member, std::unique_ptr<FlatParameters> buffers) override;
  StatusOr<std::string> ExportState() override;
  Status ImportState(std::string_view bytes, bool keep_parameters) override;

 private:
  // --- round_driver.cc: the rounds.
  RoundView View(uint64_t step, Phase phase) const;
  Phase CurrentPhase(const bool* arrived = nullptr) const;
  void RecordStep(uint64_t tokens);
  Action NextStepAction() const;
  std::vector<uint8_t> PlannedFragments(uint64_t next, bool touches) const;
  InFlight* Head() const { return flights_.empty() ? nullptr : flights_.front().get(); }
  uint64_t FinalPeriod() const { return rounds_in_flight_ * book_.period(); }
  uint64_t HeldRoundId() const;
  StatusOr<bool> LaunchBlocked(int f);
  FlightStatus PlannedStatus(InFlight& flight) const;
  void CountWait(InFlight& flight);
  Status TakeUpFlight();
  Status LookAtGroupJoin(Phase* phase);
  Status AtBoundary(int f, Phase* phase);
  void SayTrainingOn(Verdict verdict) const;
  StatusOr<Verdict> AwaitVerdict(InFlight& flight, uint64_t give_up_step, bool train_on_if_lost);
  std::optional<Verdict> TrainOnBecause(const InFlight& flight, uint64_t give_up_step,
                                        bool train_on_if_lost) const;
  bool ClosedWithout(const InFlight& flight, uint64_t step) const;
  static bool PollDone(InFlight& flight);
  void CallOff(InFlight& flight);
  bool MarkPassedOver(InFlight& flight);
  bool InFinalPeriod(uint64_t step) const;
  bool LaunchesAt(uint64_t step) const;
  Status ShutdownBroken();
  StatusOr<bool> SettleAtShutdown();
  Status FinalMerge();
  Status Launch(int f, bool final_merge = false);
  bool EagerAt(const InFlight& flight) const;
  void Snap(Fragment& fragment, InFlight& flight);
  Status FinishInFlight();
  Status FinishAll();
  void CallOffAll();
  Status JoinFlight(InFlight& flight);
  Status Commit(InFlight& flight);
  Status BreakGroup(Status status);
  void RecordRound(const InFlight& flight);

  // --- round_driver_state.cc: the state around the rounds.
  Status InitDesloc();
  Status ResumeFrom(const std::string& path);
  Status ResumeWith(const Checkpoint& checkpoint, const std::string& where);
  Status Resume();
  void WarnOfOtherFiles() const;
  Status Restore(const Checkpoint& checkpoint, const std::string& where);
  Status RestoreOuterState(const Checkpoint& checkpoint);
  void RestoredAt(uint64_t round_id, uint64_t step, uint64_t state_step);
  Status AgreeOnRestoredState(std::string_view what, std::string_view rule);
  void AddLearnerProgress(CheckpointMeta* meta) const;
  Checkpoint Described(uint64_t round_id, uint32_t members) const;
  StatusOr<std::shared_ptr<Checkpoint>> Snapshot(uint64_t round_id, uint32_t members);
  Status MaybeCheckpoint(uint64_t round_id, uint32_t rank, uint32_t members, bool always);

  const Config config_;
  // Before everything that uses it (a group's policy holds the whole model
  // the parameters are a slice of), so that it goes last.
  const std::unique_ptr<RoundPolicy> policy_;
  LearnerAgent& agent_;
  const Clock& clock_;
  const FragmentSchedule schedule_;
  const std::unique_ptr<FlatParameters> parameters_;
  const std::unique_ptr<FlatMoments> moments_;  // null without an Adam inner optimizer
  const bool concurrent_ = config_.concurrent_outer_step;
  // The most rounds in flight at once (rounds_in_flight; 1 when synchronous).
  const uint64_t rounds_in_flight_ =
      !concurrent_ ? 1
                   : static_cast<uint64_t>(config_.rounds_in_flight > 0 ? config_.rounds_in_flight
                                                                        : schedule_.fragments());
  ReducerStats stats_;
  // The round's arithmetic on the training thread (FragmentBook's passes).
  ThreadPool pool_{config_.round_threads > 0 ? static_cast<int>(config_.round_threads)
                                             : ThreadPool::DefaultThreads()};
  FragmentBook book_;
  std::unique_ptr<Codec> codec_;
  OuterSyncOptions options_;
  // tau: overlap_steps, or the cap (one rank: results are applied on
  // arrival), or tuned from this learner's round and step times (a group).
  outer::OverlapTuner overlap_{config_.overlap_steps,
                               std::max<uint64_t>(1, rounds_in_flight_* book_.period() - 1),
                               /*applied_on_arrival=*/!policy_->group()};
  const OuterApply apply_mode_ = config_.outer_apply;
  std::unique_ptr<RoundServices> services_;  // before flights_: outlives their rounds
  std::unique_ptr<RoundRunner> runner_;
  // The rounds in flight, oldest first: taken up in this order.
  std::deque<std::unique_ptr<InFlight>> flights_;
  uint64_t launched_ = 0;  // rounds launched (their FlightOrder numbers)
  std::unique_ptr<Diagnostics> diagnostics_;
  // The last round this learner completed (set when its result is applied).
  uint64_t last_round_id_ = 0;
  uint64_t tokens_total_ = 0;
  std::atomic<uint64_t> step_now_{0};  // stats_.steps, for the round's thread
  Micros last_step_ = 0;
  Micros last_return_ = 0;  // when step() last returned
  bool stepped_ = false;
  bool shut_down_ = false;
  // sync_buffers: the model's buffers averaged at every round, and those
  // taken from the round's first member (null: none).
  static constexpr int kAveragedBuffers = 0;
  static constexpr int kFirstMembersBuffers = 1;
  std::unique_ptr<FlatParameters> buffers_[2];
  // PlanStep's view for the step it planned (0: none planned).
  uint64_t planned_step_ = 0;
  size_t planned_arrivals_ = 0;  // the oldest rounds that had arrived then
  std::vector<std::pair<const InFlight*, FlightStatus>> planned_status_;  // ... and each's status
  // The step the global state was started or last restored at (see StateStep).
  uint64_t restored_step_ = 0;
  Status group_broken_ = OkStatus();
  CheckpointWriter checkpoint_writer_{config_.checkpoint_dir,
                                      static_cast<int>(config_.checkpoint_keep)};
};

}  // namespace mend::reducer
