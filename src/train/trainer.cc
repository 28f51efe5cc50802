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
#include "spdlog/spdlog.h"
#include "torch/nn/utils/clip_grad.h"
#include "torch/optim/adamw.h"

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
  // A learner joining late draws other batches than its first run did.
  const uint64_t data_seed =
      (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(options.corpus.shard + 1) *
       (options.data_seed != 0 ? 0x2545f4914f6cdd1dULL * options.data_seed : 1)) ^
      (0xbf58476d1ce4e5b9ULL * static_cast<uint64_t>(options.start_step)) ^
      // The ranks of a multi-rank learner draw apart (one rank: as before).
      (config.group_size > 1 ? 0x94d049bb133111ebULL * static_cast<uint64_t>(config.group_rank + 1)
                             : 0);
  WindowSampler sampler(corpus.train(), context, data_seed);
  const std::vector<size_t> eval_starts =
      EvalWindowStarts(corpus.eval(), context, options.eval_windows);

  Gpt model(options.model);
  InitGpt(model, options.init_seed);
  torch::optim::AdamW optimizer(
      model->parameters(),
      torch::optim::AdamWOptions(options.lr).betas({0.9, 0.95}).weight_decay(options.weight_decay));

  std::unique_ptr<reducer::LearnerSession> session;
  LearnerAgent* agent = nullptr;  // (the session's)
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<DataParallel> data_parallel;
  // A multi-rank learner: its ranks average gradients every step among
  // themselves (the DDP inside the rack), and each takes its slice of the
  // cross-rack rounds.
  std::unique_ptr<DataParallel> group_data_parallel;
  const bool grouped = config.group_size > 1;
  if (grouped && options.mode == "ddp") {
    return InvalidArgumentError(
        fmt::format("train: mode ddp with group_size = {}: the DDP baseline runs every rank as a "
                    "learner of its own "
                    "(group_size = 1)",
                    config.group_size));
  }
  MEND_ASSIGN_OR_RETURN(const ValidConfig job, JobConfig(options, config));
  if (options.mode != "local" || grouped) {
    // The job's settings and the model's layout (--dim, --layers, ...): a
    // learner of another model is refused at registration.
    reducer::LearnerSessionOptions session_options{options.id, token, &clock, {}, {}};
    for (const at::Tensor& p : model->parameters())
      session_options.parameter_shapes.push_back(p.sizes().vec());
    MEND_ASSIGN_OR_RETURN(session, reducer::LearnerSession::Start(job, std::move(session_options)));
    agent = &session->agent();
    const Status built = [&]() -> Status {
      // Before the reducer: every rank starts from group rank 0's parameters.
      if (grouped) {
        MEND_ASSIGN_OR_RETURN(group_data_parallel,
                              DataParallel::CreateInGroup(config, *model, *agent));
      }
      if (options.mode == "local") {
        // No cross-rack exchange.
      } else if (options.mode == "diloco") {
        MEND_ASSIGN_OR_RETURN(reducer, Reducer::Create(job, *model, optimizer, *agent,
                                                       static_cast<uint64_t>(options.start_step)));
      } else {
        MEND_ASSIGN_OR_RETURN(data_parallel, DataParallel::Create(config, *model, *agent));
      }
      return OkStatus();
    }();
    if (!built.ok()) return session->Fail(built);
  }

  TrainResult result;
  result.id = options.id;
  result.mode = options.mode;
  result.parameters = model->parameter_count();
  const uint64_t tokens_per_step = static_cast<uint64_t>(options.batch * context);
  double smoothed = 0;
  double inner_seconds = 0;
  double eval_seconds = 0;
  std::vector<double> quiet_us;
  double quiet_sum = 0;
  const auto started = SteadyClock::now();
  auto elapsed = [&]() { return Seconds(SteadyClock::now() - started).count() - eval_seconds; };
  auto stop_asked = [&]() { return signals && signals->stop.load(); };
  // A stop asked while a step or the shutdown waits for a round calls that
  // round's join off (the learner leaves: a stop ends its part in the job).
  auto waiting = [&](bool now) {
    if (signals) {
      signals->Waiting(now ? std::function<void()>([&agent]() { agent->Interrupt(); }) : nullptr);
    }
  };
  auto evaluate = [&](int64_t step) {
    const double at = elapsed();
    const auto begin = SteadyClock::now();
    const Evaluated evaluated =
        Evaluate(model, corpus.eval(), eval_starts, context, options.batch, stop_asked);
    eval_seconds += Seconds(SteadyClock::now() - begin).count();
    result.eval_curve.push_back({step, evaluated.loss, at});
    result.eval_windows = static_cast<int64_t>(evaluated.windows);
    return evaluated.loss;
  };
  auto bytes_sent = [&]() -> uint64_t {
    if (reducer) return reducer->stats().bytes_sent;
    if (data_parallel) return data_parallel->stats().bytes_sent;
    return 0;
  };
  Status failure = OkStatus();
  // The job's step: from the options, a resumed checkpoint, or (after a
  // heal) the source's.
  int64_t step = reducer ? static_cast<int64_t>(reducer->stats().steps) : options.start_step;
  int64_t steps_run = 0;
  // What `mend chaos` compares across learners at equal job steps
  // (<learner>.train.jsonl in diagnostics_dir): each step's learning rate,
  // the optimizer's step count after it, and where that count comes from:
  // "job" (counted from the job's start), "own" (a resume from a checkpoint,
  // or a heal without the moments, moved the step but not it) or "heal" (a
  // heal with heal_inner_optimizer brought the source's count, with
  // "heal_step" the job step it healed to: the job's if the source's was).
  reducer::JsonLines train_log(
      reducer ? config.diagnostics_dir : std::string(),
      (grouped ? fmt::format("{}.rank{}", options.id, config.group_rank) : options.id) +
          ".train.jsonl");
  std::unique_ptr<InnerMoments> adam;
  if (train_log.open()) {
    MEND_ASSIGN_OR_RETURN(adam, TorchAdamMoments(optimizer, model->parameters()));
  }
  std::string count_from = step == 0 ? "job" : "own";
  int64_t heal_step = 0;
  // A group's ranks stop together: a rank asked to stop tells the others
  // with its next gradient average, and all end after that step.
  while (step < options.steps &&
         (group_data_parallel ? !group_data_parallel->StopAgreed() : !stop_asked())) {
    if (group_data_parallel && stop_asked()) group_data_parallel->RequestStop();
    ++step;
    ++steps_run;
    const auto begin = SteadyClock::now();
    auto [x, y] = MakeBatch(corpus.train(), sampler.Next(options.batch), context);
    optimizer.zero_grad();
    at::Tensor loss = model->Loss(x, y);
    loss.backward();
    if (data_parallel) {
      failure = data_parallel->AverageGradients(tokens_per_step);
      if (!failure.ok()) break;
    }
    if (group_data_parallel) {
      failure = group_data_parallel->AverageGradients(tokens_per_step);
      if (!failure.ok()) {
        // A rank of this learner is gone: the whole group stops (its launcher
        // restarts it), the round in flight called off rather than waited for.
        spdlog::error("the group's gradient average failed: {}; this rank stops", failure);
        reducer.reset();
        if (agent) (void)agent->Leave("a rank of this learner's group is gone");
        break;
      }
    }
    torch::nn::utils::clip_grad_norm_(model->parameters(), options.clip);
    const double lr = LearningRate(options, step);
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    optimizer.step();
    if (options.step_time_ms > 0)
      std::this_thread::sleep_until(begin + std::chrono::milliseconds(options.step_time_ms));
    if (adam) {
      nlohmann::json record = {
          {"step", step}, {"lr", lr}, {"optimizer_step", adam->Step()}, {"inner", count_from}};
      if (count_from == "heal") record["heal_step"] = heal_step;
      train_log.Write(record);
    }
    const auto inner_done = SteadyClock::now();
    inner_seconds += Seconds(inner_done - begin).count();
    const double value = loss.item<double>();
    smoothed = steps_run == 1 ? value : 0.95 * smoothed + 0.05 * value;
    if (reducer) {
      const ReducerStats before = reducer->stats();
      waiting(true);
      failure = reducer->step(tokens_per_step);
      waiting(false);
      const double us =
          std::chrono::duration<double, std::micro>(SteadyClock::now() - inner_done).count();
      if (!failure.ok()) break;
      const ReducerStats after = reducer->stats();
      if (static_cast<int64_t>(after.steps) != step) {  // a heal put it on the job's step
        const bool brought = config.heal_inner_optimizer && after.heals > before.heals;
        count_from = brought ? "heal" : "own";
        heal_step = static_cast<int64_t>(after.steps);
      }
      step = static_cast<int64_t>(after.steps);
      const bool quiet = after.rounds_started == before.rounds_started &&
                         after.rounds == before.rounds &&
                         after.failed_rounds == before.failed_rounds;
      if (quiet) {
        quiet_us.push_back(us);
        quiet_sum += us;
      }
    }
    CheckpointIfAsked(config, signals, group_data_parallel.get(), reducer.get());
    std::optional<double> eval_loss;
    if (options.eval_every > 0 && step % options.eval_every == 0 && step < options.steps) {
      eval_loss = evaluate(step);
    }
    if (progress && (step % options.progress_every == 0 || eval_loss)) {
      progress({step, options.steps, smoothed,
                static_cast<double>(tokens_per_step) * static_cast<double>(steps_run) /
                    std::max(1e-9, elapsed()),
                bytes_sent(), reducer ? reducer->stats().rounds : 0, eval_loss});
    }
  }
  // The training time ends with the last step: leaving (the round in
  // flight, then the final merge, so that the final model holds both) is
  // timed apart.
  result.seconds = elapsed();
  if (reducer) {
    waiting(true);
    if (Status left = reducer->shutdown(); failure.ok() && !left.ok()) failure = left;
    waiting(false);
    result.final_merge_seconds = elapsed() - result.seconds;
  }
  if (data_parallel) {
    if (Status left = data_parallel->shutdown(); failure.ok() && !left.ok()) failure = left;
  }
  if (group_data_parallel) {
    if (Status left = group_data_parallel->shutdown(); failure.ok() && !left.ok()) failure = left;
  }
  if (agent && !reducer && !data_parallel) (void)agent->Leave("training finished");
  if (!failure.ok()) return failure;
  result.steps = step;
  result.steps_run = steps_run;
  result.tokens = tokens_per_step * static_cast<uint64_t>(steps_run);
  result.tokens_per_s = static_cast<double>(result.tokens) / std::max(1e-9, result.seconds);
  result.train_loss = smoothed;
  result.inner_step_ms = steps_run > 0 ? 1e3 * inner_seconds / static_cast<double>(steps_run) : 0;
  result.compute_fraction = inner_seconds / std::max(1e-9, result.seconds);
  if (reducer) {
    const ReducerStats stats = reducer->stats();
    if (stats.checkpoint_failures > 0) {  // (each was logged when it failed)
      spdlog::warn(
          "{} of {} checkpoint writes failed in {}: the newest checkpoint there may be "
          "older than the job's end",
          stats.checkpoint_failures, stats.checkpoints + stats.checkpoint_failures,
          config.checkpoint_dir);
    }
    if (stats.rounds == 0 && stats.failed_rounds > 0) {  // (each was logged when it failed)
      spdlog::warn(
          "none of this learner's {} rounds completed: it trained alone, its model merged with "
          "no other learner's (the log says why each failed)",
          stats.failed_rounds);
    }
    result.rounds = stats.rounds;
    result.final_rounds = stats.final_rounds;
    result.failed_rounds = stats.failed_rounds;
    result.passed_over = stats.passed_over;
    result.heals = stats.heals;
  }
  result.bytes_sent = bytes_sent();
  result.reducer_quiet_steps = quiet_us.size();
  result.reducer_step_us_median = Median(quiet_us);
  result.reducer_step_us_mean =
      quiet_us.empty() ? 0 : quiet_sum / static_cast<double>(quiet_us.size());
  result.eval_loss = evaluate(step);
  if (progress) {
    progress({step, options.steps, smoothed, result.tokens_per_s, result.bytes_sent, result.rounds,
              result.eval_loss});
  }
  return result;
}

}  // namespace mend::train
