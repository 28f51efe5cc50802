#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "ATen/ATen.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "mend/checkpoint.h"
#include "mend/data_parallel.h"
#include "mend/inner_moments.h"
#include "mend/learner_agent.h"
#include "mend/reducer.h"
#include "reducer/diagnostics.h"
#include "reducer/learner_session.h"
#include "reducer/options_from_config.h"
#include "spdlog/spdlog.h"
#include "torch/nn/utils/clip_grad.h"
#include "torch/optim/adamw.h"
#include "train/model.h"

namespace mend::train {
namespace {

using Seconds = std::chrono::duration<double>;
using SteadyClock = std::chrono::steady_clock;

// Inputs and targets for windows starting at `starts`.
std::pair<at::Tensor, at::Tensor> MakeBatch(const std::string& text,
                                            const std::vector<size_t>& starts, int64_t context) {
  at::Tensor window = at::empty({static_cast<int64_t>(starts.size()), context + 1}, at::kLong);
  int64_t* out = window.data_ptr<int64_t>();
  for (size_t b = 0; b < starts.size(); ++b) {
    for (int64_t t = 0; t <= context; ++t) {
      *out++ = static_cast<unsigned char>(text[starts[b] + static_cast<size_t>(t)]);
    }
  }
  return {window.slice(1, 0, context).contiguous(), window.slice(1, 1, context + 1).contiguous()};
}

// The mean loss over the windows at `starts`, a batch at a time. When
// `stop` turns true it ends after the batch in hand: the mean of the windows
// evaluated (a stopped learner leaves promptly, its loss on fewer windows).
struct Evaluated {
  double loss = 0;
  size_t windows = 0;  // fewer than asked when `stop` ended it
};
Evaluated Evaluate(Gpt& model, const std::string& text, const std::vector<size_t>& starts,
                   int64_t context, int64_t batch, const std::function<bool()>& stop) {
  at::NoGradGuard no_grad;
  model->eval();
  double sum = 0;
  size_t evaluated = 0;
  for (size_t first = 0; first < starts.size(); first += static_cast<size_t>(batch)) {
    const size_t last = std::min(starts.size(), first + static_cast<size_t>(batch));
    std::vector<size_t> chunk(starts.begin() + static_cast<long>(first),
                              starts.begin() + static_cast<long>(last));
    auto [x, y] = MakeBatch(text, chunk, context);
    sum += model->Loss(x, y).item<double>() * static_cast<double>(chunk.size());
    evaluated = last;
    if (stop()) break;
  }
  model->train();
  return {sum / static_cast<double>(evaluated), evaluated};
}

double LearningRate(const TrainOptions& options, int64_t step) {
  if (step <= options.warmup_steps) {
    return options.lr * static_cast<double>(step) /
           static_cast<double>(std::max<int64_t>(1, options.warmup_steps));
  }
  const double progress =
      static_cast<double>(step - options.warmup_steps) /
      static_cast<double>(std::max<int64_t>(1, options.steps - options.warmup_steps));
  const double cosine = 0.5 * (1 + std::cos(M_PI * std::min(1.0, progress)));
  return options.lr * (options.min_lr_fraction + (1 - options.min_lr_fraction) * cosine);
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(values.size() / 2),
                   values.end());
  return values[values.size() / 2];
}

}  // namespace

Status CheckTrainOptions(const TrainOptions& options) {
  MEND_RETURN_IF_ERROR(CheckGptOptions(options.model));
  if (options.mode != "diloco" && options.mode != "ddp" && options.mode != "local") {
    return InvalidArgumentError(
        fmt::format("train: mode '{}': must be diloco, ddp or local", options.mode));
  }
  auto positive = [](const char* name, int64_t value) -> Status {
    if (value >= 1) return OkStatus();
    return InvalidArgumentError(fmt::format("train: {} = {}: must be at least 1", name, value));
  };
  MEND_RETURN_IF_ERROR(positive("batch", options.batch));
  if (options.batch > kMaxBatch) {
    return InvalidArgumentError(
        fmt::format("train: batch = {}: must be at most {}", options.batch, kMaxBatch));
  }
  if (options.eval_windows > kMaxEvalWindows) {
    return InvalidArgumentError(fmt::format("train: eval_windows = {}: must be at most {}",
                                            options.eval_windows, kMaxEvalWindows));
  }
  if (!(options.weight_decay >= 0 && options.weight_decay <= 1)) {
    return InvalidArgumentError(
        fmt::format("train: weight_decay = {}: must be in [0, 1]", options.weight_decay));
  }
  MEND_RETURN_IF_ERROR(positive("steps", options.steps));
  MEND_RETURN_IF_ERROR(positive("eval_windows", options.eval_windows));
  MEND_RETURN_IF_ERROR(positive("progress_every", options.progress_every));
  if (!(options.lr > 0 && options.lr < 1)) {
    return InvalidArgumentError(fmt::format("train: lr = {}: must be in (0, 1)", options.lr));
  }
  if (options.start_step < 0 || options.start_step >= options.steps) {
    return InvalidArgumentError(fmt::format("train: start_step = {}: must be in [0, steps = {})",
                                            options.start_step, options.steps));
  }
  if (options.warmup_steps < 0 || options.eval_every < 0 || options.step_time_ms < 0) {
    return InvalidArgumentError(
        "train: warmup_steps, eval_every and step_time_ms must not be negative");
  }
  return OkStatus();
}

nlohmann::json TrainResult::ToJson() const {
  nlohmann::json curve = nlohmann::json::array();
  for (const auto& point : eval_curve) curve.push_back({point.step, point.loss, point.seconds});
  return {{"id", id},
          {"mode", mode},
          {"parameters", parameters},
          {"steps", steps},
          {"steps_run", steps_run},
          {"tokens", tokens},
          {"seconds", seconds},
          {"final_merge_seconds", final_merge_seconds},
          {"final_rounds", final_rounds},
          {"tokens_per_s", tokens_per_s},
          {"train_loss", train_loss},
          {"eval_loss", eval_loss},
          {"eval_windows", eval_windows},
          {"bytes_sent", bytes_sent},
          {"rounds", rounds},
          {"failed_rounds", failed_rounds},
          {"passed_over", passed_over},
          {"heals", heals},
          {"inner_step_ms", inner_step_ms},
          {"compute_fraction", compute_fraction},
          {"reducer_step_us_median", reducer_step_us_median},
          {"reducer_step_us_mean", reducer_step_us_mean},
          {"reducer_quiet_steps", reducer_quiet_steps},
          {"eval_curve", curve}};
}

namespace {

// After a step: the checkpoint asked for (SIGUSR1), if any, written through
// `reducer` (none without one). A group's checkpoint is collective: a rank
// asked for one tells the others with its next gradient average, and all
// write it after that step.
void CheckpointIfAsked(const Config& config, TrainSignals* signals, DataParallel* group,
                       Reducer* reducer) {
  if (group != nullptr && signals != nullptr && signals->checkpoint.exchange(false)) {
    group->RequestCheckpoint();
  }
  const bool checkpoint_now =
      group != nullptr ? group->CheckpointAgreed() : signals && signals->checkpoint.exchange(false);
  if (!checkpoint_now || reducer == nullptr) return;
  if (config.checkpoint_dir.empty()) {
    spdlog::warn("checkpoint asked for, but checkpoint_dir is not set");
    return;
  }
  const std::string path =
      CheckpointDirectory(config.checkpoint_dir, static_cast<int>(config.checkpoint_keep))
          .PathOf(reducer->stats().last_round_id);
  std::error_code error;
  std::filesystem::create_directories(config.checkpoint_dir, error);
  if (Status saved = reducer->SaveCheckpoint(path); saved.ok()) {
    spdlog::info("checkpoint {} {} (on demand)",
                 config.group_rank == 0 ? "written to" : "written by group rank 0 to", path);
  } else {
    spdlog::error("checkpoint on demand failed: {}", saved);
  }
}

// The job's configuration, checked once (the session, its agent and the
// reducer take it as it is). Its length is --steps unless the configuration
// says otherwise: the lighthouse checks it among the shared settings at
// registration.
StatusOr<ValidConfig> JobConfig(const TrainOptions& options, Config config) {
  if (options.mode == "diloco" && config.total_steps == 0) config.total_steps = options.steps;
  return ValidConfig::Check(std::move(config));
}

// The learner's ways out of the process, by mode: a session (its agent)
// unless it trains locally alone; the reducer (diloco) or DDP's average
// (ddp) across learners; a group's gradient average among its ranks. Torn
// down in reverse order, the session last.
struct Links {
  std::unique_ptr<reducer::LearnerSession> session;
  LearnerAgent* agent = nullptr;  // (the session's)
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<DataParallel> data_parallel;
  // A multi-rank learner: its ranks average gradients every step among
  // themselves (the DDP inside the rack), and each takes its slice of the
  // cross-rack rounds.
  std::unique_ptr<DataParallel> group_data_parallel;

  uint64_t bytes_sent() const {
    if (reducer) return reducer->stats().bytes_sent;
    if (data_parallel) return data_parallel->stats().bytes_sent;
    return 0;
  }
};

// One learner's training: Connect, then Run the steps, then Leave.
class TrainRun {
 public:
  TrainRun(const TrainOptions& options, const Config& config, Corpus corpus,
           const std::function<void(const TrainProgress&)>& progress, TrainSignals* signals)
      : options_(options),
        config_(config),
        corpus_(std::move(corpus)),
        sampler_(corpus_.train(), options.model.context, DataSeed(options, config)),
        eval_starts_(EvalWindowStarts(corpus_.eval(), options.model.context, options.eval_windows)),
        model_(MakeModel(options)),
        optimizer_(model_->parameters(), torch::optim::AdamWOptions(options.lr)
                                             .betas({0.9, 0.95})
                                             .weight_decay(options.weight_decay)),
        progress_(progress),
        signals_(signals),
        tokens_per_step_(static_cast<uint64_t>(options.batch * options.model.context)) {
    result_.id = options.id;
    result_.mode = options.mode;
    result_.parameters = model_->parameter_count();
  }

  // The session and the reducer or averages the mode needs.
  Status Connect(const ValidConfig& job, const std::string& token, const Clock& clock);
  // The steps, to --steps or a stop; the first failure ends them.
  Status Run();
  // The shutdowns (the round in flight, the final merge), then the result.
  StatusOr<TrainResult> Leave(Status failure);

 private:
  // Different batches per shard, --data-seed, start step (a learner joining
  // late draws other batches than its first run did) and group rank.
  static uint64_t DataSeed(const TrainOptions& options, const Config& config) {
    return (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(options.corpus.shard + 1) *
            (options.data_seed != 0 ? 0x2545f4914f6cdd1dULL * options.data_seed : 1)) ^
           (0xbf58476d1ce4e5b9ULL * static_cast<uint64_t>(options.start_step)) ^
           // The ranks of a multi-rank learner draw apart (one rank: as before).
           (config.group_size > 1
                ? 0x94d049bb133111ebULL * static_cast<uint64_t>(config.group_rank + 1)
                : 0);
  }
  static Gpt MakeModel(const TrainOptions& options) {
    Gpt model(options.model);
    InitGpt(model, options.init_seed);
    return model;
  }
  bool grouped() const { return config_.group_size > 1; }
  double Elapsed() const { return Seconds(SteadyClock::now() - started_).count() - eval_seconds_; }
  bool StopAsked() const { return signals_ && signals_->stop.load(); }
  // A stop asked while a step or the shutdown waits for a round calls that
  // round's join off (the learner leaves: a stop ends its part in the job).
  void Waiting(bool now) {
    if (!signals_) return;
    LearnerAgent* agent = links_.agent;
    signals_->Waiting(now ? std::function<void()>([agent]() { agent->Interrupt(); }) : nullptr);
  }
  double EvaluateAt(int64_t step);
  // The forward, backward, averages and optimizer step; its loss.
  StatusOr<double> InnerStep(int64_t step);
  // The reducer's step after it: the job's step may move (a heal).
  Status ReducerStep(SteadyClock::time_point inner_done);
  void LogTrainingState(int64_t step, double lr);
  void Report(std::optional<double> eval_loss);
  void TakeStats();

  const TrainOptions& options_;
  const Config& config_;
  Corpus corpus_;
  WindowSampler sampler_;
  const std::vector<size_t> eval_starts_;
  Gpt model_;
  torch::optim::AdamW optimizer_;
  const std::function<void(const TrainProgress&)>& progress_;
  TrainSignals* const signals_;
  const uint64_t tokens_per_step_;
  Links links_;
  TrainResult result_;
  SteadyClock::time_point started_;
  double smoothed_ = 0;
  double inner_seconds_ = 0;
  double eval_seconds_ = 0;
  std::vector<double> quiet_us_;
  double quiet_sum_ = 0;
  // The job's step: from the options, a resumed checkpoint, or (after a
  // heal) the source's.
  int64_t step_ = 0;
  int64_t steps_run_ = 0;
  // What `mend chaos` compares across learners at equal job steps
  // (<learner>.train.jsonl in diagnostics_dir): each step's learning rate,
  // the optimizer's step count after it, and where that count comes from:
  // "job" (counted from the job's start), "own" (a resume from a checkpoint,
  // or a heal without the moments, moved the step but not it) or "heal" (a
  // heal with heal_inner_optimizer brought the source's count, with
  // "heal_step" the job step it healed to: the job's if the source's was).
  std::unique_ptr<reducer::JsonLines> train_log_;
  std::unique_ptr<InnerMoments> adam_;
  std::string count_from_;
  int64_t heal_step_ = 0;
};

Status TrainRun::Connect(const ValidConfig& job, const std::string& token, const Clock& clock) {
  if (options_.mode != "local" || grouped()) {
    // The job's settings and the model's layout (--dim, --layers, ...): a
    // learner of another model is refused at registration.
    reducer::LearnerSessionOptions session_options{options_.id, token, &clock, {}, {}};
    for (const at::Tensor& p : model_->parameters())
      session_options.parameter_shapes.push_back(p.sizes().vec());
    MEND_ASSIGN_OR_RETURN(links_.session,
                          reducer::StartLearnerSession(job, std::move(session_options)));
    links_.agent = &links_.session->agent();
    const Status built = [&]() -> Status {
      // Before the reducer: every rank starts from group rank 0's parameters.
      if (grouped()) {
        MEND_ASSIGN_OR_RETURN(links_.group_data_parallel,
                              DataParallel::CreateInGroup(config_, *model_, *links_.agent));
      }
      if (options_.mode == "diloco") {
        MEND_ASSIGN_OR_RETURN(links_.reducer,
                              Reducer::Create(job, *model_, optimizer_, *links_.agent,
                                              static_cast<uint64_t>(options_.start_step)));
      } else if (options_.mode == "ddp") {
        MEND_ASSIGN_OR_RETURN(links_.data_parallel,
                              DataParallel::Create(config_, *model_, *links_.agent));
      }  // (local: no cross-rack exchange)
      return OkStatus();
    }();
    if (!built.ok()) return links_.session->Fail(built);
  }
  step_ =
      links_.reducer ? static_cast<int64_t>(links_.reducer->stats().steps) : options_.start_step;
  count_from_ = step_ == 0 ? "job" : "own";
  train_log_ = std::make_unique<reducer::JsonLines>(
      links_.reducer ? config_.diagnostics_dir : std::string(),
      (grouped() ? fmt::format("{}.rank{}", options_.id, config_.group_rank) : options_.id) +
          ".train.jsonl");
  if (train_log_->open()) {
    MEND_ASSIGN_OR_RETURN(adam_, TorchAdamMoments(optimizer_, model_->parameters()));
  }
  return OkStatus();
}

double TrainRun::EvaluateAt(int64_t step) {
  const double at = Elapsed();
  const auto begin = SteadyClock::now();
  const Evaluated evaluated = Evaluate(model_, corpus_.eval(), eval_starts_, options_.model.context,
                                       options_.batch, [this]() { return StopAsked(); });
  eval_seconds_ += Seconds(SteadyClock::now() - begin).count();
  result_.eval_curve.push_back({step, evaluated.loss, at});
  result_.eval_windows = static_cast<int64_t>(evaluated.windows);
  return evaluated.loss;
}

StatusOr<double> TrainRun::InnerStep(int64_t step) {
  const auto begin = SteadyClock::now();
  auto [x, y] = MakeBatch(corpus_.train(), sampler_.Next(options_.batch), options_.model.context);
  optimizer_.zero_grad();
  at::Tensor loss = model_->Loss(x, y);
  loss.backward();
  if (links_.data_parallel)
    MEND_RETURN_IF_ERROR(links_.data_parallel->AverageGradients(tokens_per_step_));
  if (links_.group_data_parallel) {
    if (Status averaged = links_.group_data_parallel->AverageGradients(tokens_per_step_);
        !averaged.ok()) {
      // A rank of this learner is gone: the whole group stops (its launcher
      // restarts it), the round in flight called off rather than waited for.
      spdlog::error("the group's gradient average failed: {}; this rank stops", averaged);
      links_.reducer.reset();
      if (links_.agent) (void)links_.agent->Leave("a rank of this learner's group is gone");
      return averaged;
    }
  }
  torch::nn::utils::clip_grad_norm_(model_->parameters(), options_.clip);
  const double lr = LearningRate(options_, step);
  for (auto& group : optimizer_.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  optimizer_.step();
  if (options_.step_time_ms > 0)
    std::this_thread::sleep_until(begin + std::chrono::milliseconds(options_.step_time_ms));
  LogTrainingState(step, lr);
  inner_seconds_ += Seconds(SteadyClock::now() - begin).count();
  return loss.item<double>();
}

void TrainRun::LogTrainingState(int64_t step, double lr) {
  if (!adam_) return;
  nlohmann::json record = {
      {"step", step}, {"lr", lr}, {"optimizer_step", adam_->Step()}, {"inner", count_from_}};
  if (count_from_ == "heal") record["heal_step"] = heal_step_;
  train_log_->Write(record);
}

Status TrainRun::ReducerStep(SteadyClock::time_point inner_done) {
  Reducer& reducer = *links_.reducer;
  const ReducerStats before = reducer.stats();
  Waiting(true);
  const Status stepped = reducer.step(tokens_per_step_);
  Waiting(false);
  const double us =
      std::chrono::duration<double, std::micro>(SteadyClock::now() - inner_done).count();
  MEND_RETURN_IF_ERROR(stepped);
  const ReducerStats after = reducer.stats();
  if (static_cast<int64_t>(after.steps) != step_) {  // a heal put it on the job's step
    const bool brought = config_.heal_inner_optimizer && after.heals > before.heals;
    count_from_ = brought ? "heal" : "own";
    heal_step_ = static_cast<int64_t>(after.steps);
  }
  step_ = static_cast<int64_t>(after.steps);
  const bool quiet = after.rounds_started == before.rounds_started &&
                     after.rounds == before.rounds && after.failed_rounds == before.failed_rounds;
  if (quiet) {
    quiet_us_.push_back(us);
    quiet_sum_ += us;
  }
  return OkStatus();
}

void TrainRun::Report(std::optional<double> eval_loss) {
  if (!progress_ || (step_ % options_.progress_every != 0 && !eval_loss)) return;
  progress_({step_, options_.steps, smoothed_,
             static_cast<double>(tokens_per_step_) * static_cast<double>(steps_run_) /
                 std::max(1e-9, Elapsed()),
             links_.bytes_sent(), links_.reducer ? links_.reducer->stats().rounds : 0, eval_loss});
}

Status TrainRun::Run() {
  started_ = SteadyClock::now();
  DataParallel* group = links_.group_data_parallel.get();
  // A group's ranks stop together: a rank asked to stop tells the others
  // with its next gradient average, and all end after that step.
  while (step_ < options_.steps && (group ? !group->StopAgreed() : !StopAsked())) {
    if (group && StopAsked()) group->RequestStop();
    ++step_;
    ++steps_run_;
    MEND_ASSIGN_OR_RETURN(const double loss, InnerStep(step_));
    const auto inner_done = SteadyClock::now();
    smoothed_ = steps_run_ == 1 ? loss : 0.95 * smoothed_ + 0.05 * loss;
    if (links_.reducer) MEND_RETURN_IF_ERROR(ReducerStep(inner_done));
    CheckpointIfAsked(config_, signals_, group, links_.reducer.get());
    std::optional<double> eval_loss;
    if (options_.eval_every > 0 && step_ % options_.eval_every == 0 && step_ < options_.steps) {
      eval_loss = EvaluateAt(step_);
    }
    Report(eval_loss);
  }
  return OkStatus();
}

StatusOr<TrainResult> TrainRun::Leave(Status failure) {
  // The training time ends with the last step: leaving (the round in
  // flight, then the final merge, so that the final model holds both) is
  // timed apart.
  result_.seconds = Elapsed();
  auto keep_first = [&failure](Status left) {
    if (failure.ok() && !left.ok()) failure = std::move(left);
  };
  if (links_.reducer) {
    Waiting(true);
    keep_first(links_.reducer->shutdown());
    Waiting(false);
    result_.final_merge_seconds = Elapsed() - result_.seconds;
  }
  if (links_.data_parallel) keep_first(links_.data_parallel->shutdown());
  if (links_.group_data_parallel) keep_first(links_.group_data_parallel->shutdown());
  if (links_.agent && !links_.reducer && !links_.data_parallel)
    (void)links_.agent->Leave("training finished");
  MEND_RETURN_IF_ERROR(failure);
  TakeStats();
  result_.eval_loss = EvaluateAt(step_);
  if (progress_) {
    progress_({step_, options_.steps, smoothed_, result_.tokens_per_s, result_.bytes_sent,
               result_.rounds, result_.eval_loss});
  }
  return std::move(result_);
}

void TrainRun::TakeStats() {
  result_.steps = step_;
  result_.steps_run = steps_run_;
  result_.tokens = tokens_per_step_ * static_cast<uint64_t>(steps_run_);
  result_.tokens_per_s = static_cast<double>(result_.tokens) / std::max(1e-9, result_.seconds);
  result_.train_loss = smoothed_;
  result_.inner_step_ms =
      steps_run_ > 0 ? 1e3 * inner_seconds_ / static_cast<double>(steps_run_) : 0;
  result_.compute_fraction = inner_seconds_ / std::max(1e-9, result_.seconds);
  if (links_.reducer) {
    const ReducerStats stats = links_.reducer->stats();
    if (stats.checkpoint_failures > 0) {  // (each was logged when it failed)
      spdlog::warn(
          "{} of {} checkpoint writes failed in {}: the newest checkpoint there may be "
          "older than the job's end",
          stats.checkpoint_failures, stats.checkpoints + stats.checkpoint_failures,
          config_.checkpoint_dir);
    }
    if (stats.rounds == 0 && stats.failed_rounds > 0) {  // (each was logged when it failed)
      spdlog::warn(
          "none of this learner's {} rounds completed: it trained alone, its model merged with "
          "no other learner's (the log says why each failed)",
          stats.failed_rounds);
    }
    result_.rounds = stats.rounds;
    result_.final_rounds = stats.final_rounds;
    result_.failed_rounds = stats.failed_rounds;
    result_.passed_over = stats.passed_over;
    result_.heals = stats.heals;
  }
  result_.bytes_sent = links_.bytes_sent();
  result_.reducer_quiet_steps = quiet_us_.size();
  result_.reducer_step_us_median = Median(quiet_us_);
  result_.reducer_step_us_mean =
      quiet_us_.empty() ? 0 : quiet_sum_ / static_cast<double>(quiet_us_.size());
}

}  // namespace

StatusOr<TrainResult> Train(const TrainOptions& options, const Config& config,
                            const std::string& token, const Clock& clock,
                            const std::function<void(const TrainProgress&)>& progress,
                            TrainSignals* signals) {
  MEND_RETURN_IF_ERROR(CheckTrainOptions(options));
  MEND_ASSIGN_OR_RETURN(Corpus corpus, Corpus::Load(options.corpus));
  const int64_t context = options.model.context;
  if (corpus.train().size() <= static_cast<size_t>(context) + 1) {
    return InvalidArgumentError(
        fmt::format("train: shard text ({} bytes) is shorter than the context {}",
                    corpus.train().size(), context));
  }
  if (config.group_size > 1 && options.mode == "ddp") {
    return InvalidArgumentError(
        fmt::format("train: mode ddp with group_size = {}: the DDP baseline runs every rank as a "
                    "learner of its own (group_size = 1)",
                    config.group_size));
  }
  MEND_ASSIGN_OR_RETURN(const ValidConfig job, JobConfig(options, config));
  TrainRun run(options, config, std::move(corpus), progress, signals);
  MEND_RETURN_IF_ERROR(run.Connect(job, token, clock));
  return run.Leave(run.Run());
}

}  // namespace mend::train
