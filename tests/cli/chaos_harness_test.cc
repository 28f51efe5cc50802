// The chaos harness (cli/chaos.h) reading what its learners report, with
// stand-in learners: a shell script in place of `mend train` that prints
// the progress lines and writes the result file a real learner would. A
// learner whose loss goes NaN (JSON's null) is a failed invariant in the
// report, never an abort, whatever field holds it. No fault is injected
// (the learners are done long before the first).
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/chaos.h"
#include "cli/training_job.h"
#include "gtest/gtest.h"
#include "test_util/wait.h"

namespace mend::cli {
namespace {

// What learner-2 of the stand-ins says at job step 10 of its training
// state (its train.jsonl): the learning rate, the optimizer's step count and
// whose that count is; learner-1 says lr 0.001, count 10, "job". With inner
// "heal", learner-2's count came with a heal from learner-1 at job step 5
// (its rounds.jsonl says so), where learner-1's count was `source_inner`.
struct TrainingState {
  std::string lr = "0.001";
  std::string count = "10";
  std::string inner = "job";
  std::string source_inner = "job";
};

// A stand-in for `mend train`: learner-2 prints `bad_progress` as its
// progress lines' loss and writes `bad_eval` as its eval loss; learner-1
// reports finite values. Both write a train.jsonl record per step.
std::string WriteStandIn(const std::string& dir, const std::string& bad_progress,
                         const std::string& bad_eval, const TrainingState& at_10 = {}) {
  const std::string path = dir + "/stand-in-learner";
  std::ofstream(path) << R"(#!/bin/sh
id=""; result=""; diagnostics=""
while [ $# -gt 0 ]; do
  case "$1" in
    --id) id="$2"; shift ;;
    --result-file) result="$2"; shift ;;
    --set) case "$2" in diagnostics_dir=*) diagnostics="${2#diagnostics_dir=}" ;; esac; shift ;;
  esac
  shift
done
loss=2.5; eval=2.4; lr=0.001; count=10; inner=job; at_5=job
if [ "$id" = learner-2 ]; then loss=')"
                      << bad_progress << "'; eval='" << bad_eval << "'; lr='" << at_10.lr
                      << "'; count='" << at_10.count << "'; inner='" << at_10.inner
                      << "'; else at_5='" << at_10.source_inner << R"('; fi
mkdir -p "$diagnostics"
if [ "$inner" = heal ]; then
  echo '{"ok":true,"round_id":1,"healed":true,"heal_step":5,"heal_source":"learner-1"}' >> "$diagnostics/$id.rounds.jsonl"
fi
for step in 5 10 15 20; do
  echo "{\"step\":$step,\"steps\":20,\"loss\":$loss,\"tokens_per_s\":100,\"rounds\":0}"
  if [ $step = 10 ]; then
    echo "{\"step\":10,\"lr\":$lr,\"optimizer_step\":$count,\"inner\":\"$inner\",\"heal_step\":5}" >> "$diagnostics/$id.train.jsonl"
  elif [ $step = 5 ]; then
    echo "{\"step\":5,\"lr\":0.001,\"optimizer_step\":5,\"inner\":\"$at_5\"}" >> "$diagnostics/$id.train.jsonl"
  else
    echo "{\"step\":$step,\"lr\":0.001,\"optimizer_step\":$step,\"inner\":\"job\"}" >> "$diagnostics/$id.train.jsonl"
  fi
done
echo "{\"steps\":20,\"eval_loss\":$eval,\"tokens\":320,\"rounds\":0}" > "$result"
)";
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

StatusOr<ChaosReport> RunWithStandIns(const std::string& bad_progress, const std::string& bad_eval,
                                      const TrainingState& at_10 = {}) {
  const std::string dir = testing_util::MakeTempDir();
  ChaosOptions options;
  options.steps = 20;
  options.sync_period_steps = 10;
  options.job.learners = 2;
  options.job.timeout = 60 * kMicrosPerSecond;
  options.faults = {"slow"};
  options.mean_gap_s = 3600;  // no fault before the learners are done
  options.min_gap_s = 3600;
  options.reference = false;
  std::atomic<bool> interrupted{false};
  return RunChaos(
      options, WriteStandIn(dir, bad_progress, bad_eval, at_10), dir + "/work",
      [](const std::string&) {}, interrupted);
}

void ExpectTheNanReportedAsAFailedInvariant(const std::string& bad_progress,
                                            const std::string& bad_eval) {
  StatusOr<ChaosReport> report = RunWithStandIns(bad_progress, bad_eval);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(report->losses_finite);
  EXPECT_FALSE(report->passed);
  EXPECT_NE(
      std::find(report->violations.begin(), report->violations.end(), "a loss was not finite"),
      report->violations.end());
  EXPECT_FALSE(report->json.dump().empty());  // the report file's JSON is written whole
}

TEST(ChaosHarnessTest, ANullLossInProgressIsAFailedInvariantNotAnAbort) {
  ExpectTheNanReportedAsAFailedInvariant("null", "2.4");
}

TEST(ChaosHarnessTest, ANullEvalLossIsAFailedInvariantNotAnAbort) {
  ExpectTheNanReportedAsAFailedInvariant("2.5", "null");
}

TEST(ChaosHarnessTest, ALossOfAnotherTypeIsAFailedInvariantNotAnAbort) {
  ExpectTheNanReportedAsAFailedInvariant("\"nan\"", "[1]");
}

TEST(ChaosHarnessTest, FiniteLossesPassThatInvariant) {
  // The same stand-ins with every loss finite: only the rounds (none here)
  // fail the run.
  StatusOr<ChaosReport> report = RunWithStandIns("2.5", "2.4");
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->losses_finite);
  EXPECT_EQ(
      std::find(report->violations.begin(), report->violations.end(), "a loss was not finite"),
      report->violations.end());
  EXPECT_DOUBLE_EQ(report->eval_loss, 2.4);
  EXPECT_EQ(report->training_steps_checked, 4u);
  EXPECT_EQ(report->lr_mismatch_steps, 0u);
  EXPECT_EQ(report->optimizer_step_mismatch_steps, 0u);
}

bool Says(const ChaosReport& report, const std::string& violation) {
  return std::find(report.violations.begin(), report.violations.end(), violation) !=
         report.violations.end();
}

// A learner whose optimizer used another learning rate than the others at
// a job step (a heal or a resume that left its schedule behind) fails the run.
TEST(ChaosHarnessTest, ALearningRateThatDiffersAtAJobStepIsAFailedInvariant) {
  StatusOr<ChaosReport> report = RunWithStandIns("2.5", "2.4", {"0.0009", "10", "job"});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->lr_mismatch_steps, 1u);
  EXPECT_EQ(report->optimizer_step_mismatch_steps, 0u);
  EXPECT_FALSE(report->passed);
  EXPECT_TRUE(
      Says(*report, "1 job step(s) at which learners' optimizers used different learning rates"));
  EXPECT_EQ(report->json["training_state_mismatches_at"][0]["step"], 10);
}

// So does an optimizer step count that differs where both are the job's; a
// learner's own count (resumed from a checkpoint, no moments healed since)
// is not compared.
TEST(ChaosHarnessTest, AnOptimizerStepCountOfTheJobThatDiffersIsAFailedInvariant) {
  StatusOr<ChaosReport> report = RunWithStandIns("2.5", "2.4", {"0.001", "4", "job"});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->optimizer_step_mismatch_steps, 1u);
  EXPECT_FALSE(report->passed);
  StatusOr<ChaosReport> own = RunWithStandIns("2.5", "2.4", {"0.001", "4", "own"});
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->optimizer_step_mismatch_steps, 0u);
  EXPECT_EQ(own->lr_mismatch_steps, 0u);
}

// A count a heal brought (heal_inner_optimizer) is the job's where its
// source's was at the step it healed to: compared then, and not where the
// source's was its own (a source resumed from a checkpoint without its
// optimizer's moments, which a chaos run on CI once took for the job's).
TEST(ChaosHarnessTest, ACountAHealBroughtIsTheJobsWhereItsSourcesWas) {
  StatusOr<ChaosReport> of_job = RunWithStandIns("2.5", "2.4", {"0.001", "4", "heal", "job"});
  ASSERT_TRUE(of_job.ok()) << of_job.status();
  EXPECT_EQ(of_job->optimizer_step_mismatch_steps, 1u);
  EXPECT_FALSE(of_job->passed);
  StatusOr<ChaosReport> same = RunWithStandIns("2.5", "2.4", {"0.001", "10", "heal", "job"});
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->optimizer_step_mismatch_steps, 0u);
  StatusOr<ChaosReport> of_own = RunWithStandIns("2.5", "2.4", {"0.001", "4", "heal", "own"});
  ASSERT_TRUE(of_own.ok()) << of_own.status();
  EXPECT_EQ(of_own->optimizer_step_mismatch_steps, 0u);
}

// A job's lighthouse (mend train's, mend chaos's) takes the control plane
// its learners are given, so that --set control_plane=udp reaches both ends.
TEST(TrainingJobTest, TheJobsControlPlaneIsItsLighthousesToo) {
  TrainingJobSpec spec;
  EXPECT_EQ(JobLighthouseConfig(spec, "token").control_plane, ControlPlane::kGrpc);
  spec.settings = {"link_latency_ms=20", "control_plane=udp"};
  EXPECT_EQ(JobLighthouseConfig(spec, "token").control_plane, ControlPlane::kUdp);
}

}  // namespace
}  // namespace mend::cli
