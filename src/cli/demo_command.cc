// mend demo: the README's main job. Trains the example byte-level GPT on the
// fortunes corpus with N learner processes and an embedded lighthouse on this
// machine, behind an emulated cross-rack link (link_latency_ms per
// collective), once per mode: DDP, synchronous DiLoCo, streaming DiLoCo with
// 4-bit values and an overlapped outer step, and local training (no
// exchange, the compute-only ceiling). Shows progress bars and ends with a
// table: tokens/s, eval loss, bytes sent per learner.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "cli/commands.h"
#include "cli/signals.h"
#include "cli/training_job.h"
#include "fmt/format.h"
#include "mend/logging.h"
#include "core/subprocess.h"
#include "core/status_format.h"

namespace mend::cli {
namespace {

struct DemoOptions {
  int learners = 2;
  int64_t steps = 300;
  int64_t batch = 16;
  int64_t dim = 128;
  int64_t layers = 2;
  int64_t sync_every = 50;
  int64_t delay_ms = 100;
  std::string modes = "ddp,diloco,streaming,local";
  std::string corpus;
  std::vector<std::string> settings;  // KEY=VALUE for every learner, after the mode's own
  std::string http;
  std::string work_dir;
};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

StatusOr<std::vector<TrainingJobSpec>> DemoJobs(const DemoOptions& o) {
  std::vector<std::string> train_args = {
      "--steps", std::to_string(o.steps), "--batch", std::to_string(o.batch), "--dim",
      std::to_string(o.dim), "--layers", std::to_string(o.layers), "--progress-every", "5"};
  if (!o.corpus.empty()) train_args = Concat(train_args, {"--corpus", o.corpus});
  const std::string link = fmt::format("link_latency_ms={}", o.delay_ms);
  const std::string period = fmt::format("sync_period_steps={}", o.sync_every);
  std::vector<TrainingJobSpec> jobs;
  std::stringstream list(o.modes);
  std::string mode;
  while (std::getline(list, mode, ',')) {
    TrainingJobSpec job;
    job.learners = o.learners;
    job.train_args = train_args;
    job.http = o.http;
    if (mode == "ddp") {
      job.name = "DDP (gradients every step)";
      job.mode = "ddp";
      job.settings = {link};
    } else if (mode == "diloco") {
      job.name = fmt::format("DiLoCo, H={}, synchronous", o.sync_every);
      job.settings = {link, period, "concurrent_outer_step=false", "codec=fp32"};
    } else if (mode == "streaming") {
      job.name = fmt::format("Streaming DiLoCo, 4-bit, overlapped");
      job.settings = {link, period, "fragments=2", "concurrent_outer_step=true",
                      fmt::format("overlap_steps={}", std::max<int64_t>(1, o.sync_every / 4)),
                      "codec=int4"};
    } else if (mode == "local") {
      job.name = "Local only (no exchange)";
      job.mode = "local";
    } else {
      return InvalidArgumentError(
          fmt::format("--modes: unknown mode '{}' (choose from ddp, diloco, streaming, local)", mode));
    }
    if (job.mode != "local") job.settings.insert(job.settings.end(), o.settings.begin(), o.settings.end());
    jobs.push_back(std::move(job));
  }
  if (jobs.empty()) return InvalidArgumentError("--modes: no mode given");
  return jobs;
}

void PrintTable(const std::vector<TrainingJobResult>& results) {
  const TrainingJobResult* ddp = nullptr;
  const TrainingJobResult* local = nullptr;
  for (const auto& r : results) {
    if (r.mode == "ddp") ddp = &r;
    if (r.mode == "local") local = &r;
  }
  fmt::print("\n{:<38} {:>10} {:>9} {:>9} {:>14} {:>11} {:>7}\n", "mode", "tokens/s", "vs local",
             "eval loss", "MB sent/learner", "vs DDP", "rounds");
  for (const auto& r : results) {
    std::string vs_local = local ? fmt::format("{:.2f}", r.tokens_per_s / local->tokens_per_s) : "-";
    std::string vs_ddp = "-";
    if (ddp && r.mode != "local" && r.bytes_per_learner > 0) {
      vs_ddp = &r == ddp ? "1x" : fmt::format("{:.0f}x less", ddp->bytes_per_learner / r.bytes_per_learner);
    }
    fmt::print("{:<38} {:>10.0f} {:>9} {:>9.4f} {:>14.3f} {:>11} {:>7}\n", r.name, r.tokens_per_s,
               vs_local, r.eval_loss, r.bytes_per_learner / 1e6, vs_ddp,
               r.mode == "diloco" ? std::to_string(r.rounds) : "-");
  }
}

int RunDemo(const DemoOptions& options, const std::string& dir, const std::atomic<bool>& interrupted) {
  auto jobs = DemoJobs(options);
  if (!jobs.ok()) {
    fmt::print(stderr, "mend demo: {}\n", jobs.status().message());
    return kExitBadConfig;
  }
  fmt::print("mend demo: {} learners train a byte-level GPT (dim {}, {} layers) on Debian's fortunes,\n"
             "           {} steps of {} x 64 bytes each, over an emulated cross-rack link with {} ms\n"
             "           latency per collective. Logs, results and diagnostics in {}\n",
             options.learners, options.dim, options.layers, options.steps, options.batch,
             options.delay_ms, dir);
  std::vector<TrainingJobResult> results;
  for (size_t j = 0; j < jobs->size(); ++j) {
    TrainingJobSpec& job = (*jobs)[j];
    const std::string job_dir = fmt::format("{}/{}-{}", dir, j + 1, job.mode);
    job.settings.push_back(fmt::format("diagnostics_dir={}/diagnostics", job_dir));
    fmt::print("\n[{}/{}] {}\n", j + 1, jobs->size(), job.name);
    ProgressBars bars;
    auto result = RunTrainingJob(job, SelfExecutable(), job_dir,
                                 [&bars](const std::vector<LearnerProgressView>& v) { bars.Draw(v); },
                                 interrupted);
    if (!result.ok()) {
      fmt::print(stderr, "mend demo: {}\n", result.status().message());
      return kExitFailure;
    }
    if (!result->http_address.empty()) fmt::print("  status page was http://{}/\n", result->http_address);
    results.push_back(std::move(*result));
  }
  PrintTable(results);
  fmt::print("\ntokens/s is the job's (all learners); eval loss is the mean over learners on the same\n"
             "held-out windows; 'vs DDP' compares bytes sent per learner. Per-step and per-round\n"
             "JSON lines are under {}/*/diagnostics.\n",
             dir);
  return kExitOk;
}

}  // namespace

void AddDemoCommand(CLI::App& app, int* exit_code) {
  CLI::App* command = app.add_subcommand(
      "demo",
      "Train the example GPT with several learners on this machine over an emulated slow link: "
      "DDP vs DiLoCo vs streaming 4-bit DiLoCo vs local, with progress bars and a summary table.");
  auto options = std::make_shared<DemoOptions>();
  command->add_option("--learners", options->learners, "Learner processes")
      ->capture_default_str()
      ->check(CLI::Range(2, 64));
  command->add_option("--steps", options->steps, "Inner steps per learner and mode")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{1'000'000}));
  command->add_option("--batch", options->batch, "Sequences per inner step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  command->add_option("--dim", options->dim, "Model width")->capture_default_str();
  command->add_option("--layers", options->layers, "Transformer blocks")->capture_default_str();
  command->add_option("--sync-every", options->sync_every, "H: inner steps between rounds")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{100'000}));
  command->add_option("--delay-ms", options->delay_ms, "Emulated cross-rack latency per collective")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{60'000}));
  command->add_option("--modes", options->modes, "Comma-separated: ddp, diloco, streaming, local")
      ->capture_default_str();
  command->add_option("--set", options->settings,
                      "KEY=VALUE configuration for every learner (after the mode's own; repeatable)");
  command->add_option("--corpus", options->corpus,
                      "Directory of fortune files (default: /usr/share/games/fortunes)");
  command->add_option("--http", options->http,
                      "Lighthouse status page address while a mode runs (e.g. 127.0.0.1:0)");
  command->add_option("--work-dir", options->work_dir, "Where logs go (default: a new directory under /tmp)");
  command->callback([options, exit_code]() {
    (void)InitLogging("warn", "demo");
    std::atomic<bool> interrupted{false};
    SignalThread signals({SIGINT, SIGTERM}, [&interrupted](int) { interrupted = true; });
    auto dir = MakeWorkDir(options->work_dir, "/tmp/mend-demo-XXXXXX");
    if (!dir.ok()) {
      fmt::print(stderr, "mend demo: {}\n", dir.status().message());
      *exit_code = kExitFailure;
      return;
    }
    *exit_code = RunDemo(*options, *dir, interrupted);
  });
}

}  // namespace mend::cli
