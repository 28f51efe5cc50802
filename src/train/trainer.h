// The training example end to end: one learner training the byte-level GPT
// on its shard of the fortunes corpus, in one of three modes:
//   diloco  the mend::Reducer (DiLoCo, streaming fragments, concurrent outer
//           step, codecs, DES-LOC: whatever the Config says);
//   ddp     the mend::DataParallel baseline (gradients averaged every step);
//   local   no exchange at all (the compute-only ceiling).
// Inner optimizer: AdamW (betas 0.9, 0.95), gradient clipping, linear warmup
// and cosine decay. `mend train` runs it; tests run it in threads.
//
// Thread-safety: Train() may run on several threads at once (one learner
// each), each with its own options.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mend/clock.h"
#include "mend/config.h"
#include "mend/status.h"
#include "nlohmann/json.hpp"
#include "train/corpus.h"
#include "train/gpt_options.h"

namespace mend::train {

// Bounds of TrainOptions that CheckTrainOptions enforces.
inline constexpr int64_t kMaxBatch = 4096;         // sequences per inner step
inline constexpr int64_t kMaxEvalWindows = 65536;  // held-out windows

struct TrainOptions {
  std::string id = "learner";
  std::string mode = "diloco";  // diloco | ddp | local
  CorpusOptions corpus;
  GptOptions model;
  int64_t batch = 16;
  int64_t steps = 300;  // the job's last step
  // Steps already done when this learner (re)joins a job in progress; the
  // schedule continues from there, and after a heal from the job's step.
  int64_t start_step = 0;
  double lr = 1e-3;              // peak inner learning rate
  double min_lr_fraction = 0.1;  // the cosine decays to lr * this at the last step
  int64_t warmup_steps = 20;
  double weight_decay = 0.1;
  double clip = 1.0;
  int64_t eval_windows = 512;  // held-out windows of `context` bytes
  int64_t eval_every = 0;      // steps between evaluations; 0: at the end only
  uint64_t init_seed = 1;      // the same on every learner
  uint64_t data_seed =
      0;  // mixed with the shard (and start step): each learner draws its own batches
  int64_t progress_every = 10;
  // Each inner step takes at least this long (0: as fast as the CPU goes):
  // a faster step sleeps the rest, as if an accelerator computed it, while
  // the rounds go on in the background. The chaos harness's faults need a
  // job that lasts, not one that computes.
  int64_t step_time_ms = 0;
};

[[nodiscard]] Status CheckTrainOptions(const TrainOptions& options);

struct TrainProgress {
  int64_t step = 0;
  int64_t steps = 0;
  double loss = 0;          // training loss, smoothed
  double tokens_per_s = 0;  // so far
  uint64_t bytes_sent = 0;
  uint64_t rounds = 0;
  std::optional<double> eval_loss;  // when this step evaluated
};

struct TrainResult {
  std::string id;
  std::string mode;
  int64_t parameters = 0;
  int64_t steps = 0;      // the step it ended at
  int64_t steps_run = 0;  // inner steps this process ran (fewer after a late start or a heal)
  uint64_t tokens = 0;
  double seconds = 0;  // training, to the end of the last step (evaluations excluded)
  // Leaving the job after the last step: the round in flight and the final
  // merge (final_merge), which tokens_per_s leaves out.
  double final_merge_seconds = 0;
  uint64_t final_rounds = 0;  // rounds of the final merge
  double tokens_per_s = 0;
  double train_loss = 0;  // smoothed, at the end
  double eval_loss = 0;   // the final model on the held-out windows
  // Held-out windows the last evaluation covered: fewer than eval_windows
  // when a stop ended it early (a signal), and eval_loss is of those.
  int64_t eval_windows = 0;
  uint64_t bytes_sent = 0;  // data plane, this learner
  uint64_t rounds = 0;
  uint64_t failed_rounds = 0;
  uint64_t passed_over = 0;  // rounds for its boundary that closed without it
  uint64_t heals = 0;
  double inner_step_ms = 0;     // mean forward + backward + optimizer step
  double compute_fraction = 0;  // inner steps' share of the training time
  // reducer.step() on steps that neither started nor applied a round.
  double reducer_step_us_median = 0;
  double reducer_step_us_mean = 0;
  uint64_t reducer_quiet_steps = 0;
  struct EvalPoint {
    int64_t step = 0;
    double loss = 0;
    double seconds = 0;  // training time so far (evaluations excluded)
  };
  std::vector<EvalPoint> eval_curve;  // JSON: [step, eval loss, seconds]

  nlohmann::json ToJson() const;
};

// Set from another thread (a signal handler's thread) to steer training.
struct TrainSignals {
  std::atomic<bool> stop{false};        // end early and cleanly
  std::atomic<bool> checkpoint{false};  // write a checkpoint at the next step (diloco mode)

  // Asks for a stop (any thread): `stop`, and a wait for a round that the
  // learner is in is called off (its join ends at once), so that a stop
  // asked while the lighthouse is gone is not held for a quorum timeout.
  void Stop() {
    stop.store(true);
    std::lock_guard lock(mu_);
    if (call_off_) call_off_();
  }
  // Train's: from Waiting(call_off) to Waiting(nullptr) the learner may
  // wait for a round, and `call_off` ends that wait; called at once when a
  // stop was asked before.
  void Waiting(std::function<void()> call_off) {
    std::lock_guard lock(mu_);
    call_off_ = std::move(call_off);
    if (call_off_ && stop.load()) call_off_();
  }

 private:
  std::mutex mu_;
  std::function<void()> call_off_;
};

// Trains; `progress` (optional) is called every progress_every steps and
// after the last one. `signals` is optional. `token` is the job token
// (unused in local mode). `clock` is the learner agent's (see
// LearnerAgent::Start): the control plane's waits and timeouts run on it.
[[nodiscard]] StatusOr<TrainResult> Train(const TrainOptions& options, const Config& config,
                                          const std::string& token, const Clock& clock,
                                          const std::function<void(const TrainProgress&)>& progress,
                                          TrainSignals* signals);

}  // namespace mend::train
