// mend chaos: the chaos harness (see chaos.h) on the example GPT. Prints
// the faults as they happen and a summary at the end; writes the full report
// as JSON (--report) and appends a CSV row (--csv). Exit status 0 when every
// invariant held, 1 when one did not (the summary says which).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "cli/chaos.h"
#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/signals.h"
#include "core/status_format.h"
#include "core/subprocess.h"
#include "fmt/format.h"
#include "mend/logging.h"

namespace mend::cli {
namespace {

struct ChaosFlags {
  ChaosOptions options;
  int64_t batch = 16;
  int64_t dim = 64;
  int64_t layers = 2;
  double lr = 0;  // the learners' peak inner learning rate (0: mend train's default)
  std::string faults = "kill,stop,slow,lighthouse";
  std::vector<std::string> settings;
  std::string corpus;
  std::string work_dir;
  std::string report_file;
  std::string csv_file;
  int64_t timeout_s = 3600;
  bool no_reference = false;
};

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The faults of a report, counted by kind, and the kills' healing times.
struct FaultTally {
  explicit FaultTally(const std::vector<FaultRecord>& faults) {
    for (const FaultRecord& f : faults) {
      by_kind[f.kind]++;
      if (f.kind != "kill") continue;
      if (f.restart_to_healed_s >= 0) healed.push_back(f.restart_to_healed_s);
      if (f.heal_transfer_s >= 0) {
        transfer.push_back(f.heal_transfer_s);
        heal_bytes = std::max(heal_bytes, static_cast<double>(f.heal_bytes));
      }
    }
  }
  double max_healed() const {
    return healed.empty() ? 0.0 : *std::max_element(healed.begin(), healed.end());
  }

  std::map<std::string, int> by_kind;
  std::vector<double> healed;    // restart -> first completed round, s
  std::vector<double> transfer;  // heal transfer, s
  double heal_bytes = 0;         // the largest heal
};

// The faults and the state's invariants.
void PrintInvariants(const ChaosReport& r, const ChaosOptions& o, const FaultTally& tally) {
  std::string kinds;
  for (const auto& [kind, n] : tally.by_kind)
    kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", kind, n);
  fmt::print(
      "\nchaos: {} learners{}, {} steps, seed {}: {}\n", o.job.learners,
      o.job.ranks_per_learner > 1 ? fmt::format(" of {} ranks", o.job.ranks_per_learner) : "",
      o.steps, o.seed, r.passed ? "every invariant held" : "INVARIANT VIOLATED");
  fmt::print("  faults injected   {} ({})\n", r.faults.size(), kinds);
  const auto& set = o.job.settings;
  fmt::print("  data plane        {}\n",
             std::find(set.begin(), set.end(), "dataplane_encrypt=false") != set.end()
                 ? "in the clear (dataplane_encrypt=false)"
                 : "secure (AES-256-GCM, keys from the job token)");
  fmt::print("  rounds completed  {} ({} with 2+ members: global state digests {})\n", r.rounds,
             r.rounds_checked,
             r.digest_mismatches == 0 ? "identical in every one"
                                      : fmt::format("DIFFER in {}", r.digest_mismatches));
  if (o.job.ranks_per_learner > 1) {
    fmt::print("  ranks             {} (round, learner) pairs: the ranks' parameters {}\n",
               r.rank_rounds_checked,
               r.rank_digest_mismatches == 0
                   ? "identical in every one"
                   : fmt::format("DIFFER in {}", r.rank_digest_mismatches));
  }
  fmt::print(
      "  training state    {} job steps taken by 2+ learners: learning rates {}, step counts {}\n",
      r.training_steps_checked,
      r.lr_mismatch_steps == 0 ? "identical" : fmt::format("DIFFER at {}", r.lr_mismatch_steps),
      r.optimizer_step_mismatch_steps == 0
          ? "identical"
          : fmt::format("DIFFER at {}", r.optimizer_step_mismatch_steps));
}

// The waits: stalls, the longest steps, restarts and heals.
void PrintWaits(const ChaosReport& r, const FaultTally& tally) {
  fmt::print(
      "  stalls            {} (healthy learners' longest step during a learner fault {:.2f} s; "
      "bound {:.2f} s)\n",
      r.stalls, r.max_wait_learner_fault_s, r.stall_bound_s);
  fmt::print(
      "  no fault on       longest step of a learner {:.2f} s; {} join(s) passed over (trained "
      "on)\n",
      r.max_wait_no_fault_s, r.passed_over);
  fmt::print("  lighthouse down   longest step of a learner during a restart {:.2f} s\n",
             r.max_wait_lighthouse_s);
  if (!tally.healed.empty()) {
    fmt::print("  restarts          restart -> first round done: median {:.1f} s, max {:.1f} s",
               Median(tally.healed), tally.max_healed());
    if (!tally.transfer.empty()) {
      fmt::print("; heal transfer median {:.3f} s for {:.2f} MB", Median(tally.transfer),
                 tally.heal_bytes / 1e6);
    }
    fmt::print("\n");
  }
  if (r.json.contains("heal_target") && r.json["heal_target"]["heals"].get<int>() > 0) {
    const nlohmann::json& t = r.json["heal_target"];
    fmt::print(
        "  heal target       under 1.5 x bytes / link + 2 s: transfer {} of {}, restart -> first "
        "round {} of {}\n",
        t["transfer_met"].get<int>(), t["heals"].get<int>(), t["restart_to_round_met"].get<int>(),
        t["heals"].get<int>());
  }
}

void PrintSummary(const ChaosReport& r, const ChaosOptions& o) {
  const FaultTally tally(r.faults);
  PrintInvariants(r, o, tally);
  PrintWaits(r, tally);
  fmt::print("  losses            {}\n", r.losses_finite ? "all finite" : "NOT ALL FINITE");
  if (r.reference_eval_loss > 0) {
    fmt::print(
        "  final eval loss   {:.4f} vs {:.4f} fault-free ({:+.2f}%); wall {:.0f} s vs {:.0f} s\n",
        r.eval_loss, r.reference_eval_loss, 100 * (r.eval_loss / r.reference_eval_loss - 1),
        r.wall_s, r.reference_wall_s);
  } else {
    fmt::print("  final eval loss   {:.4f} (no fault-free run); wall {:.0f} s\n", r.eval_loss,
               r.wall_s);
  }
  for (const std::string& v : r.violations) fmt::print("  VIOLATION: {}\n", v);
}

// False when the row could not be written.
bool AppendCsv(const std::string& path, const ChaosReport& r, const ChaosOptions& o) {
  const bool fresh = !std::filesystem::exists(path);
  std::ofstream out(path, std::ios::app);
  if (fresh) {
    out << "seed,learners,steps,faults,kill,stop,slow,lighthouse,rounds,rounds_checked,digest_"
           "mismatches,stalls,"
           "stall_bound_s,max_wait_learner_fault_s,max_wait_lighthouse_s,restart_to_healed_median_"
           "s,"
           "restart_to_healed_max_s,heal_transfer_median_s,eval_loss,reference_eval_loss,wall_s,"
           "reference_wall_s,"
           "passed,max_wait_no_fault_s,passed_over,ranks_per_learner,rank_rounds_checked,"
           "rank_digest_mismatches,training_steps_checked,lr_mismatch_steps,"
           "optimizer_step_mismatch_steps\n";
  }
  FaultTally tally(r.faults);
  std::map<std::string, int>& by_kind = tally.by_kind;
  out << fmt::format(
      "{},{},{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.4f},{:.5f},{:.5f},"
      "{:.1f},{:.1f},{},{:.3f},{},{},{},{},{},{},{}\n",
      o.seed, o.job.learners, o.steps, r.faults.size(), by_kind["kill"], by_kind["stop"],
      by_kind["slow"], by_kind["lighthouse"], r.rounds, r.rounds_checked, r.digest_mismatches,
      r.stalls, r.stall_bound_s, r.max_wait_learner_fault_s, r.max_wait_lighthouse_s,
      Median(tally.healed), tally.max_healed(), Median(tally.transfer), r.eval_loss,
      r.reference_eval_loss, r.wall_s, r.reference_wall_s, r.passed ? 1 : 0, r.max_wait_no_fault_s,
      r.passed_over, o.job.ranks_per_learner, r.rank_rounds_checked, r.rank_digest_mismatches,
      r.training_steps_checked, r.lr_mismatch_steps, r.optimizer_step_mismatch_steps);
  out.close();
  return static_cast<bool>(out);
}

// The run's options from the flags (the faults' list, the job of `mend
// train` learners); an exit code when they are refused, else nullopt.
std::optional<int> ConfigureChaos(ChaosFlags& flags) {
  ChaosOptions& o = flags.options;
  std::stringstream list(flags.faults);
  o.faults.clear();
  for (std::string kind; std::getline(list, kind, ',');) {
    if (!kind.empty()) o.faults.push_back(kind);
  }
  TrainingJobSpec& job = o.job;
  job.name = "chaos";
  job.mode = "diloco";
  job.min_learners = job.learners - 1;  // one learner may be down at a time
  job.timeout = flags.timeout_s * kMicrosPerSecond;
  job.train_args = ExampleTrainArgs({o.steps, flags.batch, flags.dim, flags.layers, flags.corpus});
  if (flags.lr > 0)
    job.train_args.insert(job.train_args.end(), {"--lr", fmt::format("{}", flags.lr)});
  job.settings = {fmt::format("sync_period_steps={}", o.sync_period_steps)};
  if (Status settings = CheckSettings(flags.settings); !settings.ok()) {
    fmt::print(stderr, "mend chaos: {}\n", settings.message());
    return kExitBadConfig;
  }
  job.settings.insert(job.settings.end(), flags.settings.begin(), flags.settings.end());
  o.reference = !flags.no_reference;
  for (const auto& [path, flag] :
       {std::pair{flags.report_file, "--report"}, std::pair{flags.csv_file, "--csv"}}) {
    if (path.empty()) continue;
    if (Status writable = CheckWritableFile(path, flag); !writable.ok()) {
      fmt::print(stderr, "mend chaos: {}\n", writable.message());
      return kExitBadConfig;
    }
  }
  return std::nullopt;
}

// The report (JSON, and a row of --csv); its exit code.
int WriteChaosReport(const ChaosReport& report, const ChaosFlags& flags, const std::string& dir) {
  const std::string report_file =
      flags.report_file.empty() ? dir + "/chaos-report.json" : flags.report_file;
  std::ofstream out(report_file);
  out << report.json.dump(2) << "\n";
  out.close();
  if (!out) {
    fmt::print(stderr, "mend chaos: cannot write the report to {}\n", report_file);
    return kExitFailure;
  }
  fmt::print("  report            {}\n", report_file);
  if (!flags.csv_file.empty() && !AppendCsv(flags.csv_file, report, flags.options)) {
    fmt::print(stderr, "mend chaos: cannot append to {}\n", flags.csv_file);
    return kExitFailure;
  }
  return report.passed ? kExitOk : kExitFailure;
}

int RunChaosCommand(ChaosFlags& flags) {
  if (std::optional<int> refused = ConfigureChaos(flags)) return *refused;
  const ChaosOptions& o = flags.options;
  const TrainingJobSpec& job = o.job;
  auto dir = MakeWorkDir(flags.work_dir, "/tmp/mend-chaos-XXXXXX");
  if (!dir.ok()) {
    fmt::print(stderr, "mend chaos: {}\n", dir.status().message());
    return kExitFailure;
  }
  fmt::print(
      "mend chaos: {} learners{} train the example GPT (dim {}, {} layers) for {} steps, H = {}, "
      "while\n"
      "            faults ({}) hit them at seeded random times (seed {}, mean gap {:.0f} s).\n"
      "            Logs, diagnostics and the report in {}\n",
      job.learners,
      job.ranks_per_learner > 1 ? fmt::format(" of {} ranks", job.ranks_per_learner) : "",
      flags.dim, flags.layers, o.steps, o.sync_period_steps, flags.faults, o.seed, o.mean_gap_s,
      *dir);
  std::fflush(stdout);
  std::atomic<bool> interrupted{false};
  SignalThread signals({SIGINT, SIGTERM}, [&interrupted](int) { interrupted = true; });
  const auto start = std::chrono::steady_clock::now();
  auto report = RunChaos(
      o, SelfExecutable(), *dir,
      [start](const std::string& line) {
        fmt::print("[{:7.1f} s] {}\n",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                   line);
        std::fflush(stdout);
      },
      interrupted);
  if (!report.ok()) {
    fmt::print(stderr, "mend chaos: {}\n", report.status().message());
    return ExitCodeOf(report.status());
  }
  PrintSummary(*report, o);
  return WriteChaosReport(*report, flags, *dir);
}

}  // namespace

void AddChaosCommand(CLI::App& app, int* exit_code) {
  CLI::App* command = app.add_subcommand("chaos",
                                         "Train the example GPT with N learners while killing, "
                                         "stopping, throttling and restarting them "
                                         "and the lighthouse at seeded random times; check every "
                                         "round and compare with a fault-free run.");
  auto flags = std::make_shared<ChaosFlags>();
  ChaosOptions& o = flags->options;
  // Defaults for a run of a few minutes that shows every kind of fault: one
  // round of the four (with their recoveries) takes about 30 s here, the
  // faults come in the first 85% of about 60 s of training.
  o.job.learners = 3;
  o.steps = 2000;
  o.mean_gap_s = 4;
  o.slow_s = 6;
  o.stop_min_s = 3;
  o.stop_max_s = 6;
  o.sync_period_steps = 20;
  o.job.grace_window_ms = 1000;
  o.job.heartbeat_timeout_ms = 2000;
  command->add_option("--learners", o.job.learners, "Learners")
      ->capture_default_str()
      ->check(CLI::Range(2, 32));
  command
      ->add_option("--ranks-per-learner", o.job.ranks_per_learner,
                   "Processes (ranks) per learner; faults hit single ranks")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  command->add_option("--steps", o.steps, "Inner steps of the job")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{100'000'000}));
  command->add_option("--sync-every", o.sync_period_steps, "H: inner steps between rounds")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{100'000}));
  command->add_option("--batch", flags->batch, "Sequences per inner step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  command->add_option("--dim", flags->dim, "Model width")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{8}, int64_t{8192}));
  command->add_option("--layers", flags->layers, "Transformer blocks")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  command->add_option("--lr", flags->lr, "Peak inner AdamW learning rate (default: mend train's)")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--step-time-ms", o.step_time_ms,
                   "The fault run's learners take at least this per inner step (0: as fast as "
                   "the machine goes): the faults need a job that lasts, not one that computes")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{60000}));
  command->add_option("--seed", o.seed, "Seed of the fault times, kinds and targets")
      ->capture_default_str();
  command->add_option("--faults", flags->faults, "Comma-separated: kill, stop, slow, lighthouse")
      ->capture_default_str();
  command->add_option("--mean-gap-s", o.mean_gap_s, "Mean seconds between faults (exponential)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  command->add_option("--min-gap-s", o.min_gap_s, "Least seconds between faults")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  command
      ->add_option("--restart-delay-s", o.restart_delay_s, "A killed learner restarts after this")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  command->add_option("--stop-min-s", o.stop_min_s, "Shortest SIGSTOP")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  command->add_option("--stop-max-s", o.stop_max_s, "Longest SIGSTOP (at least --stop-min-s)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  command->add_option("--slow-s", o.slow_s, "How long a learner is throttled")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  command
      ->add_option("--slow-duty", o.slow_duty, "Share of the time a throttled learner is stopped")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 0.95));
  command->add_option("--lighthouse-down-s", o.lighthouse_down_s, "How long the lighthouse is down")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  command->add_option("--grace-window-ms", o.job.grace_window_ms, "Lighthouse: quorum grace window")
      ->capture_default_str();
  command
      ->add_option("--heartbeat-timeout-ms", o.job.heartbeat_timeout_ms,
                   "Lighthouse: silence after which a learner is declared dead")
      ->capture_default_str();
  command
      ->add_option("--stall-slack-s", o.stall_slack_s,
                   "Stall bound = grace window + heartbeat timeout + this")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  command->add_flag("--no-reference", flags->no_reference, "Skip the fault-free run");
  command
      ->add_option("--loss-tolerance", o.loss_tolerance,
                   "Invariant: the final eval loss may exceed the fault-free run's by this share")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  command->add_option("--set", flags->settings,
                      "KEY=VALUE configuration for every learner (repeatable)");
  command->add_option("--corpus", flags->corpus, "Directory of fortune files");
  command->add_option("--work-dir", flags->work_dir,
                      "Where logs go (default: a new directory under /tmp)");
  command->add_option("--report", flags->report_file, "Write the report as JSON here");
  command->add_option("--csv", flags->csv_file, "Append the summary as a CSV row here");
  command->add_option("--timeout-s", flags->timeout_s, "Give up after this long")
      ->capture_default_str()
      ->check(CLI::Range(1, 7 * 86400));
  command->callback([flags, exit_code]() {
    // The embedded lighthouse's errors only: the harness reports the faults.
    (void)InitLogging(LogLevel::kError, "chaos");
    *exit_code = RunChaosCommand(*flags);
  });
}

}  // namespace mend::cli
