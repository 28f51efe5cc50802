// Training benchmarks: the example byte-level GPT on the fortunes corpus,
// each configuration a real job (embedded lighthouse + `mend train` learner
// processes), measured side by side in one run of this program.
//
//   mend_training_bench [--suite delay,convergence,overhead] [--learners 2]
//                       [--out bench-results/training] [--mend build/mend] ...
//
// delay        tokens/s of synchronous DiLoCo and of the concurrent outer step
//              at emulated cross-rack latencies (link_latency_ms per
//              collective), against local training with no exchange (the
//              compute-only ceiling, measured in the same run):
//              retained = tokens/s / ceiling, uplift = concurrent / sync.
// convergence  DDP, DiLoCo, streaming DiLoCo with 4-bit values and SparseLoCo
//              at equal tokens: eval loss (curve and final) and bytes sent per
//              learner, as ratios to DDP.
// overhead     reducer.step() on steps that neither start nor apply a round,
//              against the inner step (from every DiLoCo job of this run).
// heal         (run it by name) a learner SIGKILLed and restarted heals from
//              its peer: heal time per model size and emulated link rate,
//              against bytes / link rate.
// Each suite prints a table, writes <out>_<suite>.csv and, when gnuplot is
// installed, <out>_<suite>.png.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "CLI/CLI.hpp"
#include "cli/signals.h"
#include "cli/training_job.h"
#include "core/status_format.h"
#include "core/subprocess.h"
#include "fmt/format.h"
#include "mend/lighthouse.h"
#include "mend/logging.h"
#include "nlohmann/json.hpp"

namespace mend::bench {
namespace {

using cli::TrainingJobResult;
using cli::TrainingJobSpec;
using json = nlohmann::json;

struct BenchOptions {
  std::string suites = "delay,convergence,overhead";
  std::string out = "bench-results/training";
  std::string mend;
  int learners = 2;
  // Model and data (every job).
  int64_t batch = 16;
  int64_t dim = 128;
  int64_t layers = 2;
  double lr = 1e-3;
  // Delay sweep.
  std::string delays_ms = "0,500,1000,2000";
  int64_t delay_period = 100;
  int delay_repeats = 3;
  // Convergence.
  int64_t convergence_steps = 1000;
  int64_t convergence_period = 100;
  int64_t sparse_period = 10;
  int64_t eval_every = 100;
};

TrainingJobSpec Spec(std::string name, std::string mode, std::vector<std::string> settings,
                     std::vector<std::string> train_args = {}) {
  TrainingJobSpec spec;
  spec.name = std::move(name);
  spec.mode = std::move(mode);
  spec.settings = std::move(settings);
  spec.train_args = std::move(train_args);
  return spec;
}

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) values.push_back(std::stoll(item));
  return values;
}

class Bench {
 public:
  Bench(BenchOptions options, const std::atomic<bool>& interrupted)
      : o_(std::move(options)), interrupted_(interrupted) {}

  StatusOr<TrainingJobResult> Run(TrainingJobSpec spec, int64_t steps) {
    spec.learners = o_.learners;
    std::vector<std::string> args = {
        "--steps", std::to_string(steps),    "--batch",          std::to_string(o_.batch),
        "--dim",   std::to_string(o_.dim),   "--layers",         std::to_string(o_.layers),
        "--lr",    fmt::format("{}", o_.lr), "--progress-every", "50"};
    args.insert(args.end(), spec.train_args.begin(), spec.train_args.end());
    spec.train_args = args;
    const std::string dir = fmt::format("{}_jobs/{:02d}-{}", o_.out, ++jobs_, spec.mode);
    fmt::print(stderr, "  running {} ... ", spec.name);
    auto result = cli::RunTrainingJob(spec, o_.mend, dir, nullptr, interrupted_);
    if (result.ok()) {
      fmt::print(stderr, "{:.0f} tokens/s, eval loss {:.4f}, {:.1f} s\n", result->tokens_per_s,
                 result->eval_loss, result->wall_s);
      if (spec.mode == "diloco") diloco_runs_.push_back(*result);
    } else {
      fmt::print(stderr, "failed\n");
    }
    return result;
  }

  // Runs are repeated `delay_repeats` times, interleaved (ceiling, then
  // sync and concurrent at each delay, then again), and each configuration's
  // median is used: a shared 2-core machine drifts by 10% between minutes.
  // Each job runs 4 periods plus 60 steps, so that its last round is applied
  // (or waited for) inside the timed training, as in a long run, rather than
  // drained at shutdown. The concurrent job is told a longer total_steps (a
  // window of a longer run), or it would leave its round at step 4H out
  // (its result could come after the last step) and make one round less.
  Status Delay() {
    const int64_t steps = 4 * o_.delay_period + 60;
    fmt::print(
        "\n== Delay sweep: {} learners, H = {}, {} steps each, {} repeats; latency per collective "
        "==\n",
        o_.learners, o_.delay_period, steps, o_.delay_repeats);
    DelaySamples runs(o_.out + "_delay_runs.csv");
    for (int repeat = 1; repeat <= o_.delay_repeats; ++repeat) {
      MEND_RETURN_IF_ERROR(DelayRepeat(repeat, steps, runs));
    }
    PrintDelay(runs);
    return OkStatus();
  }

  Status Convergence() {
    const int64_t steps = o_.convergence_steps;
    fmt::print(
        "\n== Convergence at equal tokens: {} learners, {} steps each, no added latency ==\n",
        o_.learners, steps);
    std::vector<TrainingJobResult> results;
    for (const auto& spec : ConvergenceSpecs()) {
      MEND_ASSIGN_OR_RETURN(TrainingJobResult result, Run(spec, steps));
      results.push_back(std::move(result));
    }
    PrintConvergence(results);
    WriteConvergenceCurves(results, steps);
    return OkStatus();
  }

  // Healing time: learner b is SIGKILLed mid-run and started again; its
  // first round heals the global state (parameters + outer momentum, 8 bytes
  // a parameter) from a. Per model size and emulated link rate, the heal's
  // time (from b's round diagnostics) against bytes / link rate.
  Status Heal() {
    fmt::print("\n== Healing a restarted learner: time vs model size and link rate ==\n");
    std::ofstream csv(o_.out + "_heal.csv");
    csv << "dim,parameters,link_mbit,heal_bytes,heal_seconds,bytes_over_link_s,ratio\n";
    fmt::print("{:>5} {:>11} {:>10} {:>12} {:>11} {:>14} {:>8}\n", "dim", "parameters", "link Mbit",
               "heal bytes", "heal s", "bytes/link s", "ratio");
    for (int64_t dim : {128, 256, 512}) {
      for (double mbit : {0.0, 1000.0, 200.0}) {
        MEND_ASSIGN_OR_RETURN(json round, HealOnce(dim, mbit));
        const double bytes = round["heal_bytes"].get<double>();
        const double seconds = round["heal_seconds"].get<double>();
        const double ideal = mbit > 0 ? bytes * 8 / (mbit * 1e6) : 0;
        const int64_t parameters = static_cast<int64_t>(bytes / 8);
        fmt::print("{:>5} {:>11} {:>10} {:>12.0f} {:>11.3f} {:>14.3f} {:>8}\n", dim, parameters,
                   mbit > 0 ? fmt::format("{:.0f}", mbit) : "loopback", bytes, seconds, ideal,
                   ideal > 0 ? fmt::format("{:.2f}", seconds / ideal) : "-");
        csv << fmt::format("{},{},{},{:.0f},{:.4f},{:.4f},{:.3f}\n", dim, parameters, mbit, bytes,
                           seconds, ideal, ideal > 0 ? seconds / ideal : 0.0);
        csv.flush();
      }
    }
    return OkStatus();
  }

  // One run: lighthouse, learners a and b; b killed after 15 steps and
  // restarted; returns the restarted b's healing round record.
  StatusOr<json> HealOnce(int64_t dim, double mbit) {
    const std::string dir = fmt::format("{}_jobs/heal-{}-{:.0f}", o_.out, dim, mbit);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    Config config;
    config.job_id = "heal";
    config.bind = "127.0.0.1:0";
    config.http = "";
    config.quorum_min_learners = 1;
    config.grace_window_ms = 1000;
    config.heartbeat_timeout_ms = 1000;
    config.token_file = dir + "/token";
    MEND_ASSIGN_OR_RETURN(auto server, cli::StartLocalLighthouse(config));
    auto learner = [&](const std::string& id, int shard, int64_t steps) {
      std::vector<std::string> argv = {
          o_.mend, "train", "--id", id, "--mode", "diloco", "--shard", std::to_string(shard),
          "--shards", "2", "--steps", std::to_string(steps), "--dim", std::to_string(dim),
          "--layers", std::to_string(o_.layers), "--batch", "4", "--lighthouse",
          server->grpc_address(), "--token-file", dir + "/token", "--job-id", "heal",
          "--sync-every", "10", "--diagnostics-dir", dir + "/diagnostics", "--progress-json",
          "--progress-every", "1", "--set", "heartbeat_timeout_ms=1000",
          // (one job length for both runs of b, which stops
          // at its --steps: a shared setting)
          "--set", "total_steps=1000000", "--set", fmt::format("link_rate_mbit={}", mbit)};
      return cli::SpawnLearner(std::move(argv), dir + "/" + id + ".log");
    };
    MEND_ASSIGN_OR_RETURN(auto a, learner("a", 0, 1'000'000));
    MEND_ASSIGN_OR_RETURN(auto b, learner("b", 1, 1'000'000));
    for (bool reached = false; !reached;) {  // b's progress to step 15
      MEND_ASSIGN_OR_RETURN(std::string line, b->ReadLine(120 * kMicrosPerSecond));
      json progress = json::parse(line, nullptr, false);
      reached = progress.is_object() && progress.value("step", int64_t{0}) >= 15;
    }
    b->Kill();
    const std::string rounds_file = dir + "/diagnostics/b.rounds.jsonl";
    size_t before = 0;
    {
      std::ifstream in(rounds_file);
      for (std::string line; std::getline(in, line);) ++before;
    }
    MEND_ASSIGN_OR_RETURN(auto b2, learner("b", 1, 40));
    (void)b2->Wait(300 * kMicrosPerSecond);
    (void)a->Signal(SIGTERM);
    (void)a->Wait(120 * kMicrosPerSecond);
    server->Shutdown();
    std::ifstream in(rounds_file);
    size_t index = 0;
    for (std::string line; std::getline(in, line); ++index) {
      if (index < before) continue;
      json round = json::parse(line, nullptr, false);
      if (round.is_object() && round.value("healed", false)) return round;
    }
    return NotFoundError(fmt::format("dim {}, {} Mbit: the restarted learner did not heal (see {})",
                                     dim, mbit, dir));
  }

  Status Overhead() {
    if (diloco_runs_.empty()) {
      MEND_RETURN_IF_ERROR(
          Run(Spec("DiLoCo H=100 (overhead)", "diloco", {"sync_period_steps=100"}), 300).status());
    }
    fmt::print("\n== reducer.step() overhead on steps without an exchange ==\n");
    std::ofstream csv(o_.out + "_overhead.csv");
    csv << "job,learner,quiet_steps,step_us_median,step_us_mean,inner_step_ms,fraction\n";
    fmt::print("{:<40} {:<11} {:>7} {:>12} {:>12} {:>12} {:>10}\n", "job", "learner", "steps",
               "median us", "mean us", "inner ms", "fraction");
    for (const auto& run : diloco_runs_) {
      for (const auto& r : run.results) {
        const double median = r["reducer_step_us_median"].get<double>();
        const double inner_ms = r["inner_step_ms"].get<double>();
        const double fraction = median / (inner_ms * 1e3);
        fmt::print("{:<40} {:<11} {:>7} {:>12.2f} {:>12.2f} {:>12.2f} {:>9.4f}%\n", run.name,
                   r["id"].get<std::string>(), r["reducer_quiet_steps"].get<uint64_t>(), median,
                   r["reducer_step_us_mean"].get<double>(), inner_ms, 100 * fraction);
        csv << fmt::format("\"{}\",{},{},{:.3f},{:.3f},{:.3f},{:.6f}\n", run.name,
                           r["id"].get<std::string>(), r["reducer_quiet_steps"].get<uint64_t>(),
                           median, r["reducer_step_us_mean"].get<double>(), inner_ms, fraction);
      }
    }
    return OkStatus();
  }

 private:
  // Each delay-sweep run's tokens/s and compute fraction by configuration
  // ("ceiling", "sync/D", "concurrent/D"), also written to a CSV as it comes.
  struct DelaySamples {
    explicit DelaySamples(const std::string& path) : raw(path) {
      // final_merge_s: leaving after the last step (not in tokens_per_s).
      raw << "repeat,config,delay_ms,tokens_per_s,compute_fraction,rounds,failed_rounds,"
             "final_merge_s\n";
    }
    void Record(int repeat, const std::string& key, int64_t delay, const TrainingJobResult& r) {
      tokens[key].push_back(r.tokens_per_s);
      compute[key].push_back(r.compute_fraction);
      failed[key] += r.failed_rounds;
      raw << fmt::format("{},{},{},{:.1f},{:.4f},{},{},{:.3f}\n", repeat, key, delay,
                         r.tokens_per_s, r.compute_fraction, r.rounds, r.failed_rounds,
                         r.final_merge_s);
      raw.flush();
    }
    double Median(const std::string& key, bool of_compute = false) {
      std::vector<double> v = (of_compute ? compute : tokens)[key];
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    }
    std::string Spread(const std::string& key) {
      auto [lo, hi] = std::minmax_element(tokens[key].begin(), tokens[key].end());
      return fmt::format("{:.0f}-{:.0f}", *lo, *hi);
    }

    std::ofstream raw;
    std::map<std::string, std::vector<double>> tokens;
    std::map<std::string, std::vector<double>> compute;
    std::map<std::string, uint64_t> failed;
    double step_ms = 0;  // the ceiling run's inner step
  };

  // One repeat of the sweep: the ceiling, then sync and concurrent at each delay.
  Status DelayRepeat(int repeat, int64_t steps, DelaySamples& runs) {
    const std::string period = fmt::format("sync_period_steps={}", o_.delay_period);
    MEND_ASSIGN_OR_RETURN(TrainingJobResult ceiling,
                          Run(Spec("local (compute-only ceiling)", "local", {}), steps));
    runs.Record(repeat, "ceiling", 0, ceiling);
    runs.step_ms = ceiling.inner_step_ms;
    for (int64_t delay : ParseList(o_.delays_ms)) {
      const std::string link = fmt::format("link_latency_ms={}", delay);
      MEND_ASSIGN_OR_RETURN(TrainingJobResult sync,
                            Run(Spec(fmt::format("sync DiLoCo, {} ms", delay), "diloco",
                                     {link, period, "concurrent_outer_step=false"}),
                                steps));
      runs.Record(repeat, fmt::format("sync/{}", delay), delay, sync);
      MEND_ASSIGN_OR_RETURN(TrainingJobResult concurrent,
                            Run(Spec(fmt::format("concurrent outer step, {} ms", delay), "diloco",
                                     {link, period, "concurrent_outer_step=true",
                                      fmt::format("overlap_steps={}", o_.delay_period - 1),
                                      fmt::format("total_steps={}", steps + o_.delay_period)}),
                                steps));
      runs.Record(repeat, fmt::format("concurrent/{}", delay), delay, concurrent);
    }
    return OkStatus();
  }

  // The sweep's table of medians, its CSV and its plot.
  void PrintDelay(DelaySamples& runs) {
    const double ceiling = runs.Median("ceiling");
    std::ofstream csv(o_.out + "_delay.csv");
    csv << "delay_ms,sync_tokens_per_s,concurrent_tokens_per_s,ceiling_tokens_per_s,sync_retained,"
           "concurrent_retained,uplift,sync_compute_fraction,concurrent_compute_fraction,sync_"
           "failed_rounds,"
           "concurrent_failed_rounds\n";
    fmt::print("medians of {} runs; ceiling {:.0f} tokens/s (runs {})\n", o_.delay_repeats, ceiling,
               runs.Spread("ceiling"));
    fmt::print("{:>9} {:>11} {:>13} {:>11} {:>13} {:>9} {:>9} {:>8} {:>9} {:>9}\n", "delay ms",
               "sync tok/s", "(runs)", "conc tok/s", "(runs)", "sync ret", "conc ret", "uplift",
               "sync cf", "conc cf");
    for (int64_t delay : ParseList(o_.delays_ms)) {
      const std::string s_key = fmt::format("sync/{}", delay),
                        c_key = fmt::format("concurrent/{}", delay);
      const double sync = runs.Median(s_key), concurrent = runs.Median(c_key);
      const double sync_cf = runs.Median(s_key, true), concurrent_cf = runs.Median(c_key, true);
      fmt::print(
          "{:>9} {:>11.0f} {:>13} {:>11.0f} {:>13} {:>9.3f} {:>9.3f} {:>8.3f} {:>9.3f} {:>9.3f}\n",
          delay, sync, runs.Spread(s_key), concurrent, runs.Spread(c_key), sync / ceiling,
          concurrent / ceiling, concurrent / sync, sync_cf, concurrent_cf);
      csv << fmt::format("{},{:.1f},{:.1f},{:.1f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{},{}\n",
                         delay, sync, concurrent, ceiling, sync / ceiling, concurrent / ceiling,
                         concurrent / sync, sync_cf, concurrent_cf, runs.failed[s_key],
                         runs.failed[c_key]);
    }
    csv.flush();
    fmt::print(
        "inner step {:.1f} ms (ceiling run), H x step time = {:.2f} s; cf = the inner steps' share "
        "of\n"
        "the training time within each run (1 - time waiting for or applying rounds)\n",
        runs.step_ms, runs.step_ms * static_cast<double>(o_.delay_period) / 1e3);
    Plot("delay",
         fmt::format(
             "set title 'Throughput vs cross-rack latency ({} learners, H = {}, medians of {})'\n"
             "set xlabel 'emulated latency per collective (ms)'\nset ylabel 'tokens/s (job)'\n"
             "set yrange [0:*]\nset key bottom left\n"
             "plot '{}' using 1:2 with linespoints title 'synchronous DiLoCo', "
             "'' using 1:3 with linespoints title 'concurrent outer step', "
             "'' using 1:4 with lines dashtype 2 title 'compute-only ceiling'\n",
             o_.learners, o_.delay_period, o_.delay_repeats, o_.out + "_delay.csv"));
  }

  // The methods compared at equal tokens, DDP first (the ratios' base).
  std::vector<TrainingJobSpec> ConvergenceSpecs() const {
    const std::vector<std::string> eval = {"--eval-every", std::to_string(o_.eval_every)};
    const std::string period = fmt::format("sync_period_steps={}", o_.convergence_period);
    return {
        Spec("DDP", "ddp", {}, eval),
        Spec(fmt::format("DiLoCo H={} fp32", o_.convergence_period), "diloco",
             {period, "concurrent_outer_step=false", "codec=fp32"}, eval),
        Spec(fmt::format("DiLoCo H={} bf16", o_.convergence_period / 2), "diloco",
             {fmt::format("sync_period_steps={}", o_.convergence_period / 2),
              "concurrent_outer_step=false", "codec=bf16"},
             eval),
        Spec(fmt::format("Streaming DiLoCo H={} P=2 int4 overlap", o_.convergence_period), "diloco",
             {period, "fragments=2", "concurrent_outer_step=true", "overlap_steps=5", "codec=int4"},
             eval),
        Spec(fmt::format("SparseLoCo H={} top-64/4096 2-bit", o_.sparse_period), "diloco",
             {fmt::format("sync_period_steps={}", o_.sparse_period), "concurrent_outer_step=false",
              "codec=topk", "topk_k=64", "topk_chunk_size=4096", "outer_lr=1", "outer_momentum=0",
              "error_feedback_beta=0.95"},
             eval),
        Spec("local (no exchange)", "local", {}, eval),
    };
  }

  // The table and CSV of final eval loss and bytes, as ratios to DDP's (results[0]).
  void PrintConvergence(const std::vector<TrainingJobResult>& results) {
    const TrainingJobResult& ddp = results[0];
    std::ofstream csv(o_.out + "_convergence.csv");
    csv << "method,tokens,eval_loss,loss_vs_ddp,bytes_per_learner,bytes_fewer_than_ddp,tokens_per_"
           "s\n";
    fmt::print("{:<40} {:>10} {:>10} {:>9} {:>14} {:>12} {:>10}\n", "method", "tokens", "eval loss",
               "vs DDP", "MB/learner", "x fewer B", "tokens/s");
    for (const auto& r : results) {
      const double fewer =
          r.bytes_per_learner > 0 ? ddp.bytes_per_learner / r.bytes_per_learner : 0;
      fmt::print("{:<40} {:>10} {:>10.4f} {:>9.4f} {:>14.3f} {:>12.1f} {:>10.0f}\n", r.name,
                 r.tokens, r.eval_loss, r.eval_loss / ddp.eval_loss, r.bytes_per_learner / 1e6,
                 fewer, r.tokens_per_s);
      csv << fmt::format("\"{}\",{},{:.5f},{:.5f},{:.0f},{:.2f},{:.1f}\n", r.name, r.tokens,
                         r.eval_loss, r.eval_loss / ddp.eval_loss, r.bytes_per_learner, fewer,
                         r.tokens_per_s);
    }
  }

  // Eval-loss curves, mean over learners, against tokens (all learners):
  // one CSV of all, one per method for the plot, and the plot.
  void WriteConvergenceCurves(const std::vector<TrainingJobResult>& results, int64_t steps) {
    std::ofstream curves(o_.out + "_convergence_curves.csv");
    curves << "method,step,tokens,eval_loss\n";
    std::string plot = fmt::format(
        "set title 'Held-out loss at equal tokens ({} learners)'\nset xlabel 'tokens (all "
        "learners)'\n"
        "set ylabel 'eval loss (nats/byte)'\nset key top right\nset datafile separator ','\nplot ",
        o_.learners);
    for (size_t m = 0; m < results.size(); ++m) {
      const std::string file = fmt::format("{}_curve_{}.csv", o_.out, m);
      std::ofstream one(file);
      one << "tokens,eval_loss\n";
      std::map<int64_t, double> mean;
      for (const auto& learner : results[m].results) {
        for (const auto& point : learner["eval_curve"]) {
          mean[point[0].get<int64_t>()] +=
              point[1].get<double>() / static_cast<double>(results[m].results.size());
        }
      }
      const double tokens_per_step =
          static_cast<double>(results[m].tokens) / static_cast<double>(steps);
      for (const auto& [step, loss] : mean) {
        curves << fmt::format("\"{}\",{},{:.0f},{:.5f}\n", results[m].name, step,
                              tokens_per_step * step, loss);
        one << fmt::format("{:.0f},{:.5f}\n", tokens_per_step * step, loss);
      }
      plot += fmt::format("{}'{}' using 1:2 with linespoints title '{}'", m ? ", " : "", file,
                          results[m].name);
    }
    Plot("convergence", plot + "\n");
  }

  void Plot(const std::string& suite, const std::string& body) {
    const std::string script = fmt::format("{}_{}.gp", o_.out, suite);
    const std::string png = fmt::format("{}_{}.png", o_.out, suite);
    std::ofstream(script) << fmt::format(
        "set terminal pngcairo size 900,560 font 'sans,11'\nset output '{}'\nset grid\n"
        "set datafile separator ','\nset key autotitle columnhead\n{}",
        png, body);
    if (std::system(fmt::format("gnuplot '{}' 2>/dev/null", script).c_str()) == 0) {
      fmt::print("plot: {}\n", png);
    } else {
      fmt::print("plot: gnuplot not available or failed; the script is {}\n", script);
    }
  }

  const BenchOptions o_;
  const std::atomic<bool>& interrupted_;
  int jobs_ = 0;
  std::vector<TrainingJobResult> diloco_runs_;
};

}  // namespace
}  // namespace mend::bench

int main(int argc, char** argv) {
  using mend::bench::BenchOptions;
  BenchOptions o;
  CLI::App app{
      "mend training benchmarks: delay sweep, convergence at equal tokens, reducer overhead"};
  app.add_option("--suite", o.suites, "Comma-separated: delay, convergence, overhead, heal")
      ->capture_default_str();
  app.add_option("--out", o.out, "Prefix of the CSV and PNG files")->capture_default_str();
  app.add_option("--mend", o.mend, "The mend executable (default: ../mend next to this program)");
  app.add_option("--learners", o.learners, "Learner processes per job")
      ->capture_default_str()
      ->check(CLI::Range(2, 64));
  app.add_option("--batch", o.batch, "Sequences per inner step")->capture_default_str();
  app.add_option("--dim", o.dim, "Model width")->capture_default_str();
  app.add_option("--layers", o.layers, "Transformer blocks")->capture_default_str();
  app.add_option("--lr", o.lr, "Peak inner learning rate")->capture_default_str();
  app.add_option("--delays-ms", o.delays_ms, "Delay sweep latencies")->capture_default_str();
  app.add_option("--delay-repeats", o.delay_repeats, "Interleaved repeats of each delay-sweep job")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--delay-period", o.delay_period, "H in the delay sweep")->capture_default_str();
  app.add_option("--convergence-steps", o.convergence_steps, "Steps per convergence job")
      ->capture_default_str();
  app.add_option("--convergence-period", o.convergence_period, "H of DiLoCo and streaming")
      ->capture_default_str();
  app.add_option("--sparse-period", o.sparse_period, "H of SparseLoCo")->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "Steps between evaluations (convergence)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.mend.empty()) {
    o.mend = (std::filesystem::path(mend::SelfExecutable()).parent_path().parent_path() / "mend")
                 .string();
  }
  if (!std::filesystem::exists(o.mend)) {
    fmt::print(stderr, "mend_training_bench: no mend executable at {} (use --mend)\n", o.mend);
    return 2;
  }
  std::filesystem::create_directories(std::filesystem::path(o.out).parent_path().empty()
                                          ? std::filesystem::path(".")
                                          : std::filesystem::path(o.out).parent_path());
  (void)mend::InitLogging("warn", "bench");
  std::atomic<bool> interrupted{false};
  mend::cli::SignalThread signals({SIGINT, SIGTERM}, [&interrupted](int) { interrupted = true; });
  mend::bench::Bench bench(o, interrupted);
  std::stringstream suites(o.suites);
  std::string suite;
  while (std::getline(suites, suite, ',')) {
    mend::Status status = suite == "delay"         ? bench.Delay()
                          : suite == "convergence" ? bench.Convergence()
                          : suite == "overhead"    ? bench.Overhead()
                          : suite == "heal"
                              ? bench.Heal()
                              : mend::InvalidArgumentError("unknown suite '" + suite + "'");
    if (!status.ok()) {
      fmt::print(stderr, "mend_training_bench: {}: {}\n", suite, status.message());
      return 1;
    }
  }
  return 0;
}
