// The chaos harness (`mend chaos`): a DiLoCo training job on this machine
// (an embedded lighthouse and N `mend train` learners, each one process or
// a group of R ranks) while, at seeded random times, one fault at a time is
// injected:
//   kill        SIGKILL a learner (in a group: one rank; then, as torchrun
//               restarts a group whose worker failed, the other ranks are
//               stopped too), restart it after a short delay (it resumes
//               from the newest checkpoint or starts fresh, and heals);
//   stop        SIGSTOP a learner (in a group: one rank) for a few seconds
//               (past the heartbeat timeout), then SIGCONT;
//   slow        throttle a learner (one rank) with a SIGSTOP/SIGCONT duty
//               cycle for a while;
//   lighthouse  shut the lighthouse down and start it again on the same port.
// Afterwards every round is checked from the diagnostics: the members'
// global state digests agree (rank by rank in groups), a group's ranks hold
// the same parameters after each round, at equal job steps every learner's
// optimizer used the same learning rate and (where its inner state is the
// job's: the harness heals the inner optimizer) has the same step count,
// no healthy learner's step waited
// longer than the bound, every loss is finite, and the final eval loss is
// within loss_tolerance of a fault-free run of the same job (same steps,
// same settings). The report gives rounds, faults, stalls and healing times.
//
// Thread-safety: RunChaos from one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cli/training_job.h"
#include "mend/status.h"
#include "nlohmann/json.hpp"

namespace mend::cli {

struct ChaosOptions {
  TrainingJobSpec job;            // mode diloco; the harness adds diagnostics and checkpoints
  int64_t steps = 0;              // the job's steps (also in job.train_args)
  int64_t sync_period_steps = 0;  // H (also in job.settings)
  uint64_t seed = 1;
  std::vector<std::string> faults = {"kill", "stop", "slow", "lighthouse"};
  double mean_gap_s = 20;  // mean time between the end of one fault and the next
  double min_gap_s = 3;
  double restart_delay_s = 1;  // a killed learner is restarted after this
  double stop_min_s = 4, stop_max_s = 8;
  double slow_s = 12;      // how long a learner is throttled
  double slow_duty = 0.5;  // the share of time it is stopped while throttled
  double lighthouse_down_s = 2;
  double quiet_end = 0.15;   // no new fault in the last share of the steps
  double stall_slack_s = 2;  // bound = grace window + heartbeat timeout + this
  bool reference = true;     // also run the job without faults
  // The fault run's learners take at least this per inner step (mend train
  // --step-time-ms): the faults need a job that lasts, not one that
  // computes. 0: as fast as the machine goes.
  int64_t step_time_ms = 0;
  double loss_tolerance = 0.01;  // the final eval loss may exceed the fault-free one by this share
};

struct FaultRecord {
  std::string kind;
  int learner = -1;      // 0-based; -1 for the lighthouse
  int rank = -1;         // the rank of a group hit (0-based); -1: a learner of one process
  int64_t start_ms = 0;  // Unix ms
  int64_t end_ms = 0;    // when the fault was over (restart, SIGCONT, lighthouse up)
  int64_t step = 0;      // the target's step when it began
  // kill only: restart -> first round completed with a heal, from its diagnostics.
  double restart_to_healed_s = -1;
  double heal_transfer_s = -1;
  uint64_t heal_bytes = 0;
};

struct ChaosReport {
  nlohmann::json json;  // everything below and more, for the report file
  std::vector<FaultRecord> faults;
  uint64_t rounds = 0;          // distinct rounds completed by any learner
  uint64_t rounds_checked = 0;  // with at least two members' digests compared
  uint64_t digest_mismatches = 0;
  uint64_t rank_rounds_checked = 0;     // (round, learner) pairs of a group's ranks compared
  uint64_t rank_digest_mismatches = 0;  // ... whose ranks' parameters differ
  // Job steps that two or more learners' optimizers took (train.jsonl), and
  // those at which their learning rates, or their step counts where both
  // are the job's, differ.
  uint64_t training_steps_checked = 0;
  uint64_t lr_mismatch_steps = 0;
  uint64_t optimizer_step_mismatch_steps = 0;
  uint64_t stalls = 0;  // healthy learners' step waits above the bound (learner faults)
  double stall_bound_s = 0;
  double max_wait_learner_fault_s = 0;  // longest healthy step wait during a learner fault
  double max_wait_lighthouse_s = 0;     // ... during a lighthouse restart
  double max_wait_no_fault_s = 0;       // ... of any learner while no fault was on (the baseline)
  uint64_t passed_over = 0;             // joins that missed their round (the learner trained on)
  bool losses_finite = true;
  double eval_loss = 0;            // mean over learners
  double reference_eval_loss = 0;  // 0 when not run
  double wall_s = 0;
  double reference_wall_s = 0;
  bool passed = false;  // every invariant held
  std::vector<std::string> violations;
};

// Runs it; `say` gets one line per event (faults, restarts). A learner that
// fails on its own (not by an injected fault) fails the run.
[[nodiscard]] StatusOr<ChaosReport> RunChaos(const ChaosOptions& options, const std::string& mend,
                                             const std::string& work_dir,
                                             const std::function<void(const std::string&)>& say,
                                             const std::atomic<bool>& interrupted);

}  // namespace mend::cli
