// mend fault-demo: a lighthouse in this process and simulated learners in child
// processes, put through a scripted sequence of faults (a learner slows down,
// recovers, crashes and comes back), with a live status line and a summary.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/signals.h"
#include "cli/training_job.h"
#include "core/status_format.h"
#include "core/subprocess.h"
#include "fmt/format.h"
#include "mend/lighthouse.h"
#include "mend/logging.h"
#include "nlohmann/json.hpp"

namespace mend::cli {
namespace {

using json = nlohmann::json;

struct FaultDemoOptions {
  int learners = 3;
  int duration_s = 40;
  double step_ms = 100;
  int sync_every = 10;
  std::string http = "127.0.0.1:0";
  std::string work_dir;
};

// One scripted fault: at `at_s` seconds, `action` on learner `target`.
struct Fault {
  double at_s;
  std::string action;  // slow | recover | kill | restart
  int target;          // index into the learners
  std::string what;
};

std::string LearnerId(int index) { return fmt::format("learner-{}", index + 1); }

class Demo {
 public:
  Demo(FaultDemoOptions options, std::string work_dir)
      : options_(std::move(options)), dir_(std::move(work_dir)) {}

  int Run(std::atomic<bool>& interrupted) {
    if (Status started = StartLighthouse(); !started.ok()) {
      fmt::print(stderr, "mend fault-demo: {}\n", started.message());
      return ExitCodeOf(started);  // a malformed --http: 2
    }
    fmt::print("mend fault-demo: lighthouse on {} (status page: http://{}/)\n",
               server_->grpc_address(), server_->http_address());
    fmt::print(
        "           {} simulated learners, {:.0f} ms inner steps, a round every {} steps; "
        "logs in {}\n\n",
        options_.learners, options_.step_ms, options_.sync_every, dir_);
    for (int i = 0; i < options_.learners; ++i) {
      if (Status spawned = SpawnLearner(i); !spawned.ok()) {
        fmt::print(stderr, "mend fault-demo: {}\n", spawned.message());
        return kExitFailure;
      }
    }
    std::vector<Fault> faults = Script();
    size_t next_fault = 0;
    auto start = std::chrono::steady_clock::now();
    while (!interrupted.load()) {
      double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (elapsed >= options_.duration_s) break;
      while (next_fault < faults.size() && faults[next_fault].at_s <= elapsed) {
        Apply(faults[next_fault++], elapsed);
      }
      Report(elapsed);
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    for (auto& [index, learner] : learners_) (void)learner->Signal(SIGTERM);
    // A learner leaves on SIGTERM and exits 0; one that exited otherwise
    // (refused by the lighthouse, a failure) failed the demo.
    std::vector<std::string> failed;
    for (auto& [index, learner] : learners_) {
      auto exited = learner->Wait(10 * kMicrosPerSecond);
      if (!exited.ok()) {
        learner->Kill();
        failed.push_back(fmt::format("{} did not leave within 10 s of SIGTERM", LearnerId(index)));
      } else if (!WIFEXITED(*exited) || WEXITSTATUS(*exited) != 0) {
        failed.push_back(fmt::format("{} {}", LearnerId(index), DescribeWaitStatus(*exited)));
      }
    }
    Summary();
    server_->Shutdown();
    if (interrupted.load()) {  // as mend demo: an interrupted run is no success
      fmt::print(stderr, "mend fault-demo: interrupted\n");
      return kExitFailure;
    }
    if (rounds_.empty()) failed.insert(failed.begin(), "no round formed");
    if (!failed.empty()) {
      fmt::print(stderr, "mend fault-demo: {} (the learners' logs are in {})\n",
                 fmt::join(failed, "; "), dir_);
      return kExitFailure;
    }
    return kExitOk;
  }

 private:
  Status StartLighthouse() {
    token_file_ = dir_ + "/token";
    Config config;
    config.job_id = "demo";
    config.bind = "127.0.0.1:0";
    config.http = options_.http;
    config.quorum_min_learners = 2;
    config.grace_window_ms = 1000;
    config.heartbeat_ms = 100;
    config.heartbeat_timeout_ms = 1500;
    config.failslow_window_steps = 12;
    config.token_file = token_file_;
    MEND_ASSIGN_OR_RETURN(server_, StartLocalLighthouse(config));
    return OkStatus();
  }

  Status SpawnLearner(int index) {
    std::string id = LearnerId(index);
    SubprocessOptions child;
    child.argv = {SelfExecutable(), "sim-learner",
                  "--id",           id,
                  "--lighthouse",   server_->grpc_address(),
                  "--token-file",   token_file_,
                  "--job-id",       "demo",
                  "--step-ms",      fmt::format("{}", options_.step_ms),
                  "--sync-every",   std::to_string(options_.sync_every),
                  "--seed",         std::to_string(index + 1),
                  "--rack",         fmt::format("rack-{}", index % 2 + 1)};
    child.stdout_to = fmt::format("{}/{}.rounds", dir_, id);
    child.stderr_to = fmt::format("{}/{}.log", dir_, id);
    child.new_process_group = true;  // Ctrl-C reaches the demo, which stops them in order
    child.unset_env = {std::string(kJobTokenVariable)};  // (the token file's, not the caller's)
    MEND_ASSIGN_OR_RETURN(learners_[index], Subprocess::Spawn(child));
    return OkStatus();
  }

  std::vector<Fault> Script() const {
    int last = options_.learners - 1;
    double d = options_.duration_s;
    return {{0.20 * d, "slow", last, "runs 3x slower (fail-slow)"},
            {0.45 * d, "recover", last, "is back to normal speed"},
            {0.60 * d, "kill", 0, "is killed (SIGKILL)"},
            {0.75 * d, "restart", 0, "restarts and rejoins"}};
  }

  void Apply(const Fault& fault, double elapsed) {
    std::string id = LearnerId(fault.target);
    fmt::print("{:>5.1f}s  >>> {} {}\n", elapsed, id, fault.what);
    auto it = learners_.find(fault.target);
    if (fault.action == "slow" && it != learners_.end()) (void)it->second->Signal(SIGUSR1);
    if (fault.action == "recover" && it != learners_.end()) (void)it->second->Signal(SIGUSR2);
    if (fault.action == "kill" && it != learners_.end()) {
      it->second->Kill();
      learners_.erase(it);
    }
    if (fault.action == "restart") {
      if (Status spawned = SpawnLearner(fault.target); !spawned.ok()) {
        fmt::print(stderr, "mend fault-demo: {}\n", spawned.message());
      }
    }
  }

  void Report(double elapsed) {
    json status = json::parse(server_->StatusJson());
    for (const auto& event : status["events"]) {
      uint64_t seq = event["seq"];
      if (seq <= last_event_) continue;
      last_event_ = seq;
      std::string kind = event["kind"];
      fmt::print("{:>5.1f}s  {:<13} {:<10} {}\n", elapsed, kind,
                 event["learner"].get<std::string>(), event["message"].get<std::string>());
    }
    for (const auto& round : status["rounds"]) {
      uint64_t id = round["id"];
      if (id <= last_round_) continue;
      last_round_ = id;
      rounds_.push_back(round);
      std::string members;
      for (const auto& m : round["members"])
        members += (members.empty() ? "" : ",") + m.get<std::string>();
      std::string closed_by = round["closed_by"];
      bool notable =
          closed_by != "fast_path" || round["healing"].get<int>() > 0 || members != last_members_;
      if (notable) {
        fmt::print("{:>5.1f}s  round {:<6} {:<11} waited {:>6.1f} ms  members {}{}\n", elapsed, id,
                   closed_by, round["waited_ms"].get<double>(), members,
                   round["healing"].get<int>() > 0
                       ? fmt::format("  ({} healing to round {})", round["healing"].get<int>(),
                                     round["heal_round_id"].get<uint64_t>())
                       : "");
      }
      last_members_ = members;
    }
  }

  void Summary() {
    json status = json::parse(server_->StatusJson());
    std::map<std::string, int> by_rule;
    double waited = 0;
    for (const auto& round : rounds_) {
      by_rule[round["closed_by"]]++;
      waited += round["waited_ms"].get<double>();
    }
    fmt::print("\nSummary: {} rounds", rounds_.size());
    for (const auto& [rule, count] : by_rule) fmt::print(", {} {}", count, rule);
    if (!rounds_.empty()) fmt::print("; mean wait after quorum {:.1f} ms", waited / rounds_.size());
    fmt::print("\n\n{:<12} {:>9} {:>8} {:>11} {:>12} {:>7}\n", "learner", "state", "step",
               "tokens/s", "rounds", "slow");
    for (const auto& learner : status["learners"]) {
      fmt::print("{:<12} {:>9} {:>8} {:>11.0f} {:>12} {:>7}\n", learner["id"].get<std::string>(),
                 learner["state"].get<std::string>(), learner["step"].get<uint64_t>(),
                 learner["tokens_per_s"].get<double>(), learner["rounds_joined"].get<uint64_t>(),
                 learner["slow"].get<bool>() ? "yes" : "no");
    }
    fmt::print(
        "\nThe same data is at /status.json and /metrics while a lighthouse runs "
        "(mend lighthouse --http HOST:PORT).\n");
  }

  const FaultDemoOptions options_;
  const std::string dir_;
  std::string token_file_;
  std::unique_ptr<LighthouseServer> server_;
  std::map<int, std::unique_ptr<Subprocess>> learners_;
  std::vector<json> rounds_;
  uint64_t last_event_ = 0;
  uint64_t last_round_ = 0;
  std::string last_members_;
};

}  // namespace

void AddFaultDemoCommand(CLI::App& app, int* exit_code) {
  CLI::App* command = app.add_subcommand(
      "fault-demo",
      "Run a lighthouse and simulated learners on this machine through scripted faults "
      "(slow-down, recovery, crash, restart) and show what mend does.");
  auto options = std::make_shared<FaultDemoOptions>();
  command->add_option("--learners", options->learners, "Simulated learners")
      ->capture_default_str()
      ->check(CLI::Range(3, 64));
  command->add_option("--duration-s", options->duration_s, "Length of the demo in seconds")
      ->capture_default_str()
      ->check(CLI::Range(10, 3600));
  command->add_option("--step-ms", options->step_ms, "Inner-step time of each learner")
      ->capture_default_str()
      ->check(CLI::Range(5.0, 10000.0));
  command->add_option("--sync-every", options->sync_every, "Inner steps between rounds")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  command->add_option("--http", options->http, "Status page address (port 0 picks one)")
      ->capture_default_str();
  command->add_option("--work-dir", options->work_dir,
                      "Where logs go (default: a new directory under /tmp)");
  command->callback([options, exit_code]() {
    (void)InitLogging(LogLevel::kError, "demo");  // the demo prints the lighthouse's events itself
    std::atomic<bool> interrupted{false};
    SignalThread signals({SIGINT, SIGTERM}, [&interrupted](int) { interrupted = true; });
    auto dir = MakeWorkDir(options->work_dir, "/tmp/mend-fault-demo-XXXXXX");
    if (!dir.ok()) {
      fmt::print(stderr, "mend fault-demo: {}\n", dir.status().message());
      *exit_code = kExitFailure;
      return;
    }
    *exit_code = Demo(*options, *dir).Run(interrupted);
  });
}

}  // namespace mend::cli
