// mend demo: the README's main job. Trains the example byte-level GPT on the
// fortunes corpus with N learner processes and an embedded lighthouse on this
// machine, behind an emulated cross-rack link (link_latency_ms per
// collective and a link_rate_mbit limit), once per mode: DDP, synchronous
// DiLoCo, streaming DiLoCo with 4-bit values and an overlapped outer step,
// and local training (no exchange, the compute-only ceiling). Shows progress
// bars and ends with a table (tokens/s, held-out loss, bytes sent per
// learner, the time to reach DDP's final loss) and a PNG of held-out loss
// against training time (gnuplot).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/json_fields.h"
#include "cli/signals.h"
#include "cli/training_job.h"
#include "core/status_format.h"
#include "core/subprocess.h"
#include "core/text.h"
#include "fmt/format.h"
#include "mend/logging.h"

namespace mend::cli {
namespace {

struct DemoOptions {
  int learners = 2;
  int ranks_per_learner = 1;
  int64_t steps = 500;
  int64_t batch = 16;
  int64_t dim = 128;
  int64_t layers = 2;
  int64_t sync_every = 20;
  int64_t delay_ms = 100;
  double rate_mbit = 200;
  int64_t eval_points = 10;
  uint64_t seed = 1;  // the initial parameters and (mixed with each shard) the batches
  std::string modes = "ddp,diloco,streaming,local,diloco-2x";
  std::string corpus;
  std::vector<std::string> settings;  // KEY=VALUE for every learner, after the mode's own
  std::string http;
  std::string work_dir;
  std::string plot;  // the PNG (default: in the work directory)
};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

StatusOr<std::vector<TrainingJobSpec>> DemoJobs(const DemoOptions& o) {
  MEND_RETURN_IF_ERROR(CheckSettings(o.settings));
  if (!o.http.empty()) MEND_RETURN_IF_ERROR(CheckHostPort(o.http, "--http"));
  auto train_args_for = [&o](int64_t steps) {
    return Concat(
        ExampleTrainArgs({steps, o.batch, o.dim, o.layers, o.corpus}),
        {"--eval-every",
         std::to_string(std::max<int64_t>(1, steps / std::max<int64_t>(1, o.eval_points))),
         "--init-seed", std::to_string(o.seed), "--data-seed", std::to_string(o.seed)});
  };
  const std::vector<std::string> train_args = train_args_for(o.steps);
  const std::vector<std::string> link = {fmt::format("link_latency_ms={}", o.delay_ms),
                                         fmt::format("link_rate_mbit={}", o.rate_mbit)};
  const std::string period = fmt::format("sync_period_steps={}", o.sync_every);
  std::vector<TrainingJobSpec> jobs;
  std::stringstream list(o.modes);
  std::string mode;
  while (std::getline(list, mode, ',')) {
    TrainingJobSpec job;
    job.label = mode;
    job.learners = o.learners;
    job.ranks_per_learner = o.ranks_per_learner;
    job.train_args = train_args;
    job.http = o.http;
    if (mode == "ddp") {
      job.name = "DDP (gradients every step)";
      job.mode = "ddp";
      job.settings = link;
    } else if (mode == "diloco") {
      job.name = fmt::format("mend DiLoCo, H={}, synchronous", o.sync_every);
      job.settings = Concat(link, {period, "concurrent_outer_step=false", "codec=fp32"});
    } else if (mode == "streaming") {
      // tau is tuned from the measured round and step times (overlap_steps = 0).
      job.name = fmt::format("mend streaming, H={}, 4-bit, overlapped", o.sync_every);
      job.mode = "diloco";
      job.settings =
          Concat(link, {period, "fragments=2", "concurrent_outer_step=true", "codec=int4"});
    } else if (mode == "diloco-2x") {
      // The same synchronous DiLoCo for twice the steps: what the time DDP
      // spends on the slow link buys instead.
      job.name = fmt::format("mend DiLoCo, H={}, synchronous, 2x steps", o.sync_every);
      job.train_args = train_args_for(2 * o.steps);
      job.settings = Concat(link, {period, "concurrent_outer_step=false", "codec=fp32"});
    } else if (mode == "local") {
      job.name = "Local only (no exchange)";
      job.mode = "local";
    } else {
      return InvalidArgumentError(fmt::format(
          "--modes: unknown mode '{}' (choose from ddp, diloco, streaming, local, diloco-2x)",
          mode));
    }
    if (job.mode != "local")
      job.settings.insert(job.settings.end(), o.settings.begin(), o.settings.end());
    jobs.push_back(std::move(job));
  }
  if (jobs.empty()) return InvalidArgumentError("--modes: no mode given");
  return jobs;
}

// Held-out loss against training time, over the learners: at each evaluated
// step the mean loss and the slowest learner's training seconds so far (the
// job's time). Each learner's curve ends with its final evaluation (after
// the last round), so the last point is the job's end.
struct CurvePoint {
  int64_t step = 0;
  double seconds = 0;
  double loss = 0;
};

std::vector<CurvePoint> JobCurve(const TrainingJobResult& job) {
  std::map<int64_t, CurvePoint> by_step;
  std::map<int64_t, int> count;
  for (const auto& learner : job.results) {
    if (!learner.contains("eval_curve")) continue;
    for (const auto& point : learner["eval_curve"]) {
      // [step, loss, seconds]; a non-finite loss is null (NaN here).
      if (!point.is_array() || point.size() < 2 || !point[0].is_number_integer()) continue;
      const int64_t step = point[0].get<int64_t>();
      CurvePoint& p = by_step[step];
      p.step = step;
      p.loss += point[1].is_number() ? point[1].get<double>() : std::nan("");
      if (point.size() > 2 && point[2].is_number())
        p.seconds = std::max(p.seconds, point[2].get<double>());
      count[step]++;
    }
  }
  std::vector<CurvePoint> curve;
  for (auto& [step, p] : by_step) {
    p.loss /= count[step];
    curve.push_back(p);
  }
  return curve;
}

// The first time `curve` reaches `loss` (linear between evaluations).
std::optional<double> TimeToLoss(const std::vector<CurvePoint>& curve, double loss) {
  for (size_t i = 0; i < curve.size(); ++i) {
    if (curve[i].loss > loss) continue;
    if (i == 0) return curve[i].seconds;
    const CurvePoint& a = curve[i - 1];
    const CurvePoint& b = curve[i];
    const double f = (a.loss - loss) / std::max(1e-12, a.loss - b.loss);
    return a.seconds + f * (b.seconds - a.seconds);
  }
  return std::nullopt;
}

void PrintTable(const std::vector<TrainingJobResult>& results,
                const std::vector<std::vector<CurvePoint>>& curves, int ranks_per_learner) {
  // With groups, bytes per host: what each host's cross-rack link carries.
  const bool per_host = ranks_per_learner > 1;
  auto sent = [per_host](const TrainingJobResult& r) {
    return per_host ? r.bytes_per_process : r.bytes_per_learner;
  };
  const TrainingJobResult* ddp = nullptr;
  const TrainingJobResult* local = nullptr;
  for (const auto& r : results) {
    if (r.mode == "ddp") ddp = &r;
    if (r.mode == "local") local = &r;
  }
  fmt::print("\n{:<40} {:>9} {:>8} {:>13} {:>8} {:>10} {:>10} {:>9} {:>13} {:>6}\n", "mode",
             "tokens/s", "vs local", "held-out loss", "vs DDP", "train s",
             per_host ? "MB/host" : "MB/learner", "bytes", "s to DDP loss", "rounds");
  for (size_t i = 0; i < results.size(); ++i) {
    const TrainingJobResult& r = results[i];
    const std::string vs_local =
        local ? fmt::format("{:.2f}", r.tokens_per_s / local->tokens_per_s) : "-";
    std::string bytes = "-";
    if (ddp && r.mode != "local" && sent(r) > 0) {
      bytes = &r == ddp ? "1x" : fmt::format("{:.0f}x less", sent(*ddp) / sent(r));
    }
    const std::string vs_ddp = ddp ? fmt::format("{:.4f}", r.eval_loss / ddp->eval_loss) : "-";
    std::string to_ddp = "-";
    if (ddp) {
      auto t = TimeToLoss(curves[i], ddp->eval_loss);
      to_ddp = t ? fmt::format("{:.1f}", *t) : "not reached";
    }
    double seconds = 0;
    for (const auto& learner : r.results)
      seconds = std::max(seconds, Field(learner, "seconds", 0.0));
    fmt::print("{:<40} {:>9.0f} {:>8} {:>13.4f} {:>8} {:>10.1f} {:>10.3f} {:>9} {:>13} {:>6}\n",
               r.name, r.tokens_per_s, vs_local, r.eval_loss, vs_ddp, seconds, sent(r) / 1e6, bytes,
               to_ddp, r.mode == "diloco" ? std::to_string(r.rounds) : "-");
  }
  // Leaving after the last step is not in tokens/s: the round still in
  // flight and the final merge (every learner then holds the same model).
  for (const auto& r : results) {
    if (r.mode != "diloco") continue;
    fmt::print("  {}: final merge {:.2f} s after the last step ({} round(s), not in tokens/s)\n",
               r.name, r.final_merge_s, r.final_rounds == UINT64_MAX ? 0 : r.final_rounds);
  }
  if (ddp && local && local->eval_loss > ddp->eval_loss) {
    auto steps = [](const TrainingJobResult& r) {
      return r.results.empty() ? int64_t{0} : Field(r.results.front(), "steps", int64_t{0});
    };
    for (const auto& r : results) {
      if (&r == ddp || &r == local || steps(r) != steps(*ddp)) continue;  // at equal steps only
      fmt::print("  {}: closes {:.0f}% of the gap between local training and DDP\n", r.name,
                 100 * (local->eval_loss - r.eval_loss) / (local->eval_loss - ddp->eval_loss));
    }
  }
}

// Writes the curves as CSV next to the PNG and plots them with gnuplot.
void WritePlot(const std::vector<TrainingJobResult>& results,
               const std::vector<std::vector<CurvePoint>>& curves, const DemoOptions& options,
               const std::string& png) {
  const std::string base =
      png.size() > 4 && png.ends_with(".png") ? png.substr(0, png.size() - 4) : png;
  const std::string csv = base + ".csv";
  std::ofstream out(csv);
  out << "mode,step,seconds,held_out_loss\n";
  std::string plot;
  for (size_t m = 0; m < results.size(); ++m) {
    const std::string one = fmt::format("{}.{}.csv", base, m);
    std::ofstream series(one);
    series << "seconds,held_out_loss\n";
    for (const CurvePoint& p : curves[m]) {
      out << fmt::format("\"{}\",{},{:.3f},{:.5f}\n", results[m].name, p.step, p.seconds, p.loss);
      series << fmt::format("{:.3f},{:.5f}\n", p.seconds, p.loss);
    }
    plot += fmt::format("{}'{}' using 1:2 with linespoints lw 2 title '{}'", m ? ", " : "", one,
                        results[m].name);
  }
  const std::string script = base + ".gp";
  std::ofstream(script) << fmt::format(
      "set terminal pngcairo size 1000,600 font 'sans,11'\nset output '{}'\nset grid\n"
      "set datafile separator ','\nset key top right\n"
      "set title \"Held-out loss against training time: {} learners, {} ms + {} Mbit/s cross-rack "
      "link\"\n"
      "set xlabel 'training time (s)'\nset ylabel 'held-out loss (nats/byte)'\nplot {}\n",
      png, options.learners, options.delay_ms, options.rate_mbit, plot);
  if (std::system(fmt::format("gnuplot '{}' 2>/dev/null", script).c_str()) == 0) {
    fmt::print("\nplot: {} (data: {})\n", png, csv);
  } else {
    fmt::print(
        "\nplot: gnuplot is not installed or failed (apt-get install gnuplot-nox); data: {}, "
        "script: {}\n",
        csv, script);
  }
}

int RunDemo(const DemoOptions& options, const std::string& dir,
            const std::atomic<bool>& interrupted) {
  auto jobs = DemoJobs(options);
  if (!jobs.ok()) {
    fmt::print(stderr, "mend demo: {}\n", jobs.status().message());
    return kExitBadConfig;
  }
  if (!options.plot.empty()) {
    if (Status writable = CheckWritableFile(options.plot, "--plot"); !writable.ok()) {
      fmt::print(stderr, "mend demo: {}\n", writable.message());
      return kExitBadConfig;
    }
  }
  fmt::print(
      "mend demo: {} learners{} train a byte-level GPT (dim {}, {} layers) on Debian's fortunes,\n"
      "           {} steps of {} x 64 bytes each (seed {}), over an emulated cross-rack link: {} "
      "ms\n"
      "           latency per collective and {} Mbit/s. Logs, results and diagnostics in {}\n",
      options.learners,
      options.ranks_per_learner > 1
          ? fmt::format(" of {} ranks each (DDP inside; ddp runs all {} processes as learners)",
                        options.ranks_per_learner, options.learners * options.ranks_per_learner)
          : "",
      options.dim, options.layers, options.steps, options.batch, options.seed, options.delay_ms,
      options.rate_mbit, dir);
  std::vector<TrainingJobResult> results;
  for (size_t j = 0; j < jobs->size(); ++j) {
    TrainingJobSpec& job = (*jobs)[j];
    const std::string job_dir = fmt::format("{}/{}-{}", dir, j + 1, job.label);
    job.settings.push_back(fmt::format("diagnostics_dir={}/diagnostics", job_dir));
    fmt::print("\n[{}/{}] {}\n", j + 1, jobs->size(), job.name);
    ProgressBars bars;
    auto result = RunTrainingJob(
        job, SelfExecutable(), job_dir,
        [&bars](const std::vector<LearnerProgressView>& v) { bars.Draw(v); }, interrupted);
    if (!result.ok()) {
      fmt::print(stderr, "mend demo: {}\n", result.status().message());
      return ExitCodeOf(result.status());
    }
    if (!result->http_address.empty())
      fmt::print("  status page was http://{}/\n", result->http_address);
    results.push_back(std::move(*result));
  }
  std::vector<std::vector<CurvePoint>> curves;
  for (const auto& r : results) curves.push_back(JobCurve(r));
  PrintTable(results, curves, options.ranks_per_learner);
  fmt::print(
      "\ntokens/s is the job's (all learners); held-out loss is the mean over learners on the "
      "same\n"
      "held-out windows, 'vs DDP' its ratio to DDP's; 'train s' is the training time (evaluations\n"
      "excluded); 'bytes' compares bytes sent per learner; 's to DDP loss' is when the mode's "
      "held-out\n"
      "loss first reached DDP's final one. Per-step and per-round JSON lines are under\n"
      "{}/*/diagnostics.\n",
      dir);
  WritePlot(results, curves, options,
            options.plot.empty() ? dir + "/loss_vs_time.png" : options.plot);
  return kExitOk;
}

// The example model's and its data's options: each mode trains the same.
void AddDemoModelOptions(CLI::App* command, DemoOptions& options) {
  command->add_option("--steps", options.steps, "Inner steps per learner and mode")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{1'000'000}));
  command->add_option("--batch", options.batch, "Sequences per inner step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  command->add_option("--dim", options.dim, "Model width")->capture_default_str();
  command->add_option("--layers", options.layers, "Transformer blocks")->capture_default_str();
  command
      ->add_option("--seed", options.seed,
                   "Seed of the initial parameters and of the batches (every mode)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000'000}));
  command->add_option("--corpus", options.corpus,
                      "Directory of fortune files (default: /usr/share/games/fortunes)");
}

int RunDemoCommand(const DemoOptions& options) {
  (void)InitLogging(LogLevel::kWarn, "demo");
  std::atomic<bool> interrupted{false};
  SignalThread signals({SIGINT, SIGTERM}, [&interrupted](int) { interrupted = true; });
  auto dir = MakeWorkDir(options.work_dir, "/tmp/mend-demo-XXXXXX");
  if (!dir.ok()) {
    fmt::print(stderr, "mend demo: {}\n", dir.status().message());
    return kExitFailure;
  }
  return RunDemo(options, *dir, interrupted);
}

}  // namespace

void AddDemoCommand(CLI::App& app, int* exit_code) {
  CLI::App* command = app.add_subcommand(
      "demo",
      "Train the example GPT with several learners on this machine over an emulated slow link: "
      "DDP vs synchronous DiLoCo vs streaming 4-bit DiLoCo vs local (and DiLoCo for twice the "
      "steps), with "
      "progress bars, a summary table and a plot of held-out loss against time.");
  auto options = std::make_shared<DemoOptions>();
  AddDemoModelOptions(command, *options);
  command->add_option("--learners", options->learners, "Learner processes")
      ->capture_default_str()
      ->check(CLI::Range(2, 64));
  command
      ->add_option("--ranks-per-learner", options->ranks_per_learner,
                   "Processes per learner (a rack's hosts: DDP inside, the cross-rack round "
                   "sharded among them)")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  command->add_option("--sync-every", options->sync_every, "H: inner steps between rounds")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{100'000}));
  command->add_option("--delay-ms", options->delay_ms, "Emulated cross-rack latency per collective")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{60'000}));
  command
      ->add_option("--rate-mbit", options->rate_mbit,
                   "Emulated cross-rack link rate in Mbit/s per learner (0: unlimited)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  command
      ->add_option("--eval-points", options->eval_points,
                   "Held-out evaluations per mode (the plot's points)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  command
      ->add_option("--modes", options->modes,
                   "Comma-separated: ddp, diloco (synchronous fp32), streaming (P = 2, int4, "
                   "overlapped), local, "
                   "diloco-2x (synchronous, twice the steps)")
      ->capture_default_str();
  command->add_option(
      "--set", options->settings,
      "KEY=VALUE configuration for every learner (after the mode's own; repeatable)");
  command->add_option("--http", options->http,
                      "Lighthouse status page address while a mode runs (e.g. 127.0.0.1:0)");
  command->add_option("--work-dir", options->work_dir,
                      "Where logs go (default: a new directory under /tmp)");
  command->add_option("--plot", options->plot,
                      "The PNG of held-out loss against time (default: in the work dir)");
  command->callback([options, exit_code]() { *exit_code = RunDemoCommand(*options); });
}

}  // namespace mend::cli
