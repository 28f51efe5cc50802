// A training job on this machine: an embedded lighthouse and N `mend train`
// learner processes (one shard each), their progress read live from their
// JSON progress lines, their results collected from their result files.
// `mend demo` and the training benchmarks (bench/) run jobs with it.
//
// Thread-safety: RunTrainingJob may be called from one thread at a time; the
// progress callback is called on that thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/subprocess.h"
#include "mend/clock.h"
#include "mend/lighthouse.h"
#include "mend/status.h"
#include "nlohmann/json.hpp"

namespace mend::cli {

struct TrainingJobSpec {
  std::string name;             // shown in tables, e.g. "DiLoCo (sync)"
  std::string mode = "diloco";  // diloco | ddp | local
  std::string label;            // its work folder's name (mend demo's mode: streaming, ...)
  int learners = 2;
  // Ranks per learner (a rack's hosts): diloco and local learners are groups
  // of this many processes on one shard (DDP inside, the cross-rack round
  // sharded); ddp runs every process as a learner on a shard of its own.
  int ranks_per_learner = 1;
  std::vector<std::string> train_args;  // more `mend train` flags (model, steps, ...)
  std::vector<std::string> settings;    // KEY=VALUE configuration for the learners
  std::string http = "";                // lighthouse status page ("" off, port 0 picks)
  int min_learners = 0;                 // quorum_min_learners (0: all of them)
  // The lighthouse's timing (the learners take theirs from the lighthouse).
  int64_t grace_window_ms = 2000;
  int64_t heartbeat_ms = 100;
  int64_t heartbeat_timeout_ms = 3000;
  Micros timeout = 30 * 60 * kMicrosPerSecond;
  // Each group's own store (group_store), by learner: RunTrainingJob picks
  // free loopback ports for a grouped job when none are given.
  std::vector<std::string> group_stores;
};

// The example model's learner, as `mend demo` and `mend chaos` run it.
struct ExampleLearner {
  int64_t steps = 0;
  int64_t batch = 0;
  int64_t dim = 0;
  int64_t layers = 0;
  std::string corpus;  // empty: the embedded one
};
// Its `mend train` arguments (TrainingJobSpec::train_args): the steps, the
// batch, the model's size, the corpus, and progress every 5 steps.
std::vector<std::string> ExampleTrainArgs(const ExampleLearner& learner);

struct LearnerProgressView {
  std::string label;  // "learner-2", or "learner-2.1" for rank 1 of a group
  int64_t step = 0;
  int64_t steps = 0;
  double loss = 0;
  double tokens_per_s = 0;
  uint64_t bytes_sent = 0;
  uint64_t rounds = 0;
  std::optional<double> eval_loss;
  bool finished = false;
  bool nonfinite_loss = false;  // some progress line had a loss that is not finite
};

struct TrainingJobResult {
  std::string name;
  std::string mode;
  int learners = 0;
  double wall_s = 0;
  int processes = 0;
  std::vector<nlohmann::json> results;  // each process's result file
  // Over the processes:
  double tokens_per_s = 0;       // sum (the job's throughput)
  double eval_loss = 0;          // mean
  double bytes_per_learner = 0;  // data-plane bytes sent, per learner (a group's ranks together)
  double bytes_per_process = 0;  // the same per process (per host)
  uint64_t tokens = 0;           // sum
  double inner_step_ms = 0;      // mean
  double compute_fraction = 0;   // mean: inner steps' share of each learner's training time
  double reducer_step_us = 0;    // mean of the learners' medians (steps without exchange)
  uint64_t rounds = 0;           // min over learners
  uint64_t failed_rounds = 0;    // sum
  double final_merge_s = 0;      // max: leaving after the last step (round in flight, final merge)
  uint64_t final_rounds = 0;     // min over learners
  std::string http_address;      // the status page, when on
};

// Starts a lighthouse in this process for learners started on this
// machine: writes a new random job token to config.token_file (mode 0600),
// where the learners read it, and serves `config` with it.
[[nodiscard]] StatusOr<std::unique_ptr<LighthouseServer>> StartLocalLighthouse(
    const Config& config);

// `given` when not empty, else a new directory made from `mkdtemp_pattern`
// (e.g. "/tmp/mend-demo-XXXXXX"); created with its parents.
[[nodiscard]] StatusOr<std::string> MakeWorkDir(const std::string& given,
                                                std::string mkdtemp_pattern);

// The lighthouse configuration of a job (local address, port 0 picks).
Config JobLighthouseConfig(const TrainingJobSpec& spec, const std::string& token_file);
// Each KEY=VALUE of a harness's --set, as its learners will read it: an
// unknown key or a bad value is INVALID_ARGUMENT naming it, before any
// learner starts.
[[nodiscard]] Status CheckSettings(const std::vector<std::string>& settings);

// Whether the job's learners are groups of ranks (ranks_per_learner > 1,
// not ddp), and how many processes it runs.
bool GroupedJob(const TrainingJobSpec& spec);
int JobProcesses(const TrainingJobSpec& spec);

// The `mend train` command line of process `index` (0-based). Ungrouped:
// id "learner-<index+1>", shard `index`; grouped: learner index / R, group
// rank index % R. `lighthouse` is empty for local mode of single ranks.
std::vector<std::string> LearnerArgv(const TrainingJobSpec& spec, const std::string& mend,
                                     int index, const std::string& lighthouse,
                                     const std::string& token_file, const std::string& result_file);

// Spawns it with one BLAS thread, stdout piped (progress), stderr to `log`.
[[nodiscard]] StatusOr<std::unique_ptr<Subprocess>> SpawnLearner(std::vector<std::string> argv,
                                                                 const std::string& log);

// Reads one learner's JSON progress lines into `view` (under `mu`,
// notifying `changed`) until its stdout closes; then sets view.finished.
void ReadLearnerProgress(Subprocess& child, std::mutex& mu, std::condition_variable& changed,
                         LearnerProgressView& view);

// The last `bytes` of a file (a learner's log, for error messages).
std::string FileTail(const std::string& path, size_t bytes);

// Runs the job to the end. `mend` is the path of the mend executable;
// `work_dir` receives each learner's log, result and diagnostics. A learner
// that fails makes the job fail with its exit status and the end of its log.
[[nodiscard]] StatusOr<TrainingJobResult> RunTrainingJob(
    const TrainingJobSpec& spec, const std::string& mend, const std::string& work_dir,
    const std::function<void(const std::vector<LearnerProgressView>&)>& on_progress,
    const std::atomic<bool>& interrupted);

// Progress bars for a job, redrawn in place on a terminal, else printed every
// 25%.
class ProgressBars {
 public:
  ProgressBars();
  void Draw(const std::vector<LearnerProgressView>& learners);

 private:
  bool tty_;
  int drawn_lines_ = 0;
  std::vector<int> printed_quarter_;
};

}  // namespace mend::cli
