// mend sim-learner: a learner that trains nothing. It registers, heartbeats,
// reports synthetic inner-step times and joins a round every --sync-every
// steps. SIGUSR1 makes it --slow-factor times slower, SIGUSR2 restores it,
// SIGTERM/SIGINT make it leave the job and exit 0.
#include <signal.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/signals.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "mend/learner_agent.h"
#include "mend/logging.h"
#include "spdlog/spdlog.h"

namespace mend::cli {
namespace {

struct SimOptions {
  std::string id;
  double step_ms = 100;
  int64_t sync_every = 10;
  int64_t steps = 0;
  int64_t rounds = 0;
  int64_t tokens_per_step = 4096;
  double jitter = 0.05;
  double slow_factor = 3.0;
  uint64_t seed = 1;
  std::string address;
};

// Shared between the step loop and the signal thread.
struct SimControl {
  std::mutex mu;
  std::condition_variable wake;
  bool stop = false;
  bool slow = false;
  LearnerAgent* agent = nullptr;  // set while the agent exists

  // The agent a stop interrupts (null: none now); interrupted at once when
  // a stop came first.
  void Attach(LearnerAgent* attached) {
    std::lock_guard lock(mu);
    agent = attached;
    if (agent && stop) agent->Interrupt();
  }
  // Sleeps a step of `ms` (times the slow factor while slowed); false when
  // a stop was asked.
  bool SleepStep(const SimOptions& options, double ms) {
    std::unique_lock lock(mu);
    ms *= slow ? options.slow_factor : 1.0;
    wake.wait_for(lock, std::chrono::microseconds(static_cast<Micros>(ms * 1000)),
                  [this]() { return stop; });
    return !stop;
  }
  bool stopped() {
    std::lock_guard lock(mu);
    return stop;
  }
};

std::string MemberList(const QuorumResult& result) {
  std::string out;
  for (const auto& member : result.members()) out += (out.empty() ? "" : ",") + member.learner_id();
  if (result.members().empty()) out = fmt::format("<{} members>", result.world_size());
  return out;
}

// One line a round, which the lighthouse benchmark and tests read.
void PrintRound(const QuorumResult& result, int64_t step) {
  fmt::print(
      "round={} rank={} world={} closed_by={} waited_ms={} step={} members={} "
      "heal_from={}\n",
      result.round_id(), result.rank(), result.world_size(), result.closed_by(), result.waited_ms(),
      step, MemberList(result), result.heal_from().learner_id());
  std::fflush(stdout);
}

int RunSimLearner(const SimOptions& options, const ValidConfig& config, const std::string& token) {
  SimControl control;
  SignalThread signals({SIGINT, SIGTERM, SIGUSR1, SIGUSR2}, [&control, &options](int signal) {
    std::lock_guard lock(control.mu);
    if (signal == SIGUSR1 || signal == SIGUSR2) {
      control.slow = signal == SIGUSR1;
      spdlog::info("step time now {:.0f} ms",
                   options.step_ms * (control.slow ? options.slow_factor : 1.0));
    } else {
      control.stop = true;
      if (control.agent) control.agent->Interrupt();
    }
    control.wake.notify_all();
  });
  LearnerIdentity identity{options.id, config->job_id, config->rack, options.address};
  auto started = LearnerAgent::Start(AgentOptionsOf(config), token, identity, *RealClock());
  if (!started.ok()) {
    fmt::print(stderr, "mend sim-learner {}: cannot join the job: {}\n", options.id,
               started.status());
    return ExitCodeOf(started.status());
  }
  std::unique_ptr<LearnerAgent> agent = std::move(*started);
  control.Attach(agent.get());
  absl::Cleanup forget_agent = [&control]() { control.Attach(nullptr); };
  std::mt19937_64 random(options.seed);
  std::uniform_real_distribution<double> jitter(1 - options.jitter, 1 + options.jitter);
  uint64_t last_round = 0;
  uint64_t tokens_since_round = 0;
  int64_t rounds = 0;
  Micros quorum_timeout = config->quorum_timeout_ms * kMicrosPerMilli;
  for (int64_t step = 1; options.steps == 0 || step <= options.steps; ++step) {
    Micros started_at = RealClock()->NowMicros();
    if (!control.SleepStep(options, options.step_ms * jitter(random))) break;
    agent->RecordStep(static_cast<uint64_t>(step), static_cast<uint64_t>(options.tokens_per_step),
                      RealClock()->NowMicros() - started_at);
    tokens_since_round += static_cast<uint64_t>(options.tokens_per_step);
    if (step % options.sync_every != 0) continue;
    auto result = agent->Quorum(last_round, tokens_since_round, quorum_timeout,
                                /*include_members=*/true);
    if (!result.ok()) {
      if (control.stopped()) break;
      if (!agent->fatal_status().ok()) {
        fmt::print(stderr, "mend sim-learner {}: the lighthouse ended its membership: {}\n",
                   options.id, agent->fatal_status());
        return ExitCodeOf(agent->fatal_status());
      }
      spdlog::warn("no round at step {}: {}", step, result.status().message());
      continue;
    }
    last_round = result->round_id();
    tokens_since_round = 0;
    ++rounds;
    PrintRound(*result, step);
    if (options.rounds > 0 && rounds >= options.rounds) break;
  }
  Status left = agent->Leave("finished");
  if (!left.ok()) spdlog::warn("leave: {}", left.message());
  return kExitOk;
}

}  // namespace

void AddSimLearnerCommand(CLI::App& app, int* exit_code) {
  CLI::App* command = app.add_subcommand(
      "sim-learner",
      "A learner that trains nothing: registers, heartbeats, reports synthetic step times and "
      "joins a round every few steps. Prints one line per round on stdout. SIGUSR1 slows it "
      "down by --slow-factor, SIGUSR2 restores it, SIGTERM makes it leave.");
  auto options = std::make_shared<SimOptions>();
  command->add_option("--id", options->id, "Learner id, unique in the job")->required();
  command->add_option("--step-ms", options->step_ms, "Synthetic inner-step time in ms")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 3'600'000.0));
  command->add_option("--sync-every", options->sync_every, "Inner steps between rounds")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  command->add_option("--steps", options->steps, "Stop after this many steps (0: run on)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--rounds", options->rounds, "Stop after this many rounds (0: run on)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--tokens-per-step", options->tokens_per_step, "Tokens each step reports")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  command->add_option("--jitter", options->jitter, "Relative random spread of step times")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.9));
  command->add_option("--slow-factor", options->slow_factor, "Slow-down applied on SIGUSR1")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1000.0));
  command->add_option("--seed", options->seed, "Seed of the step-time jitter")
      ->capture_default_str();
  command->add_option("--address", options->address,
                      "This learner's data-plane address HOST:PORT, for peers that heal from it");
  auto flags = std::make_shared<ConfigFlags>(command);
  flags->Map("--lighthouse", "lighthouse");
  flags->Map("--token-file", "token_file");
  flags->Map("--job-id", "job_id");
  flags->Map("--rack", "rack");
  flags->Map("--heartbeat-ms", "heartbeat_ms");
  flags->Map("--heartbeat-timeout-ms", "heartbeat_timeout_ms");
  flags->Map("--quorum-timeout-ms", "quorum_timeout_ms");
  flags->Map("--rpc-timeout-ms", "rpc_timeout_ms");
  flags->Map("--tls-ca-file", "tls_ca_file");
  flags->Map("--control-plane", "control_plane");
  flags->Retired("--control-transport", "control_transport");
  flags->Map("--log-level", "log_level");
  command->callback([options, flags, exit_code]() {
    auto config = flags->Load();
    if (!config.ok()) {
      fmt::print(stderr, "mend sim-learner: {}\n", config.status().message());
      *exit_code = kExitBadConfig;
      return;
    }
    auto token = JobToken(*config);
    if (!token.ok()) {
      fmt::print(stderr, "mend sim-learner: {}\n", token.status().message());
      *exit_code = kExitBadConfig;
      return;
    }
    (void)InitLogging((*config)->log_level, options->id);
    *exit_code = RunSimLearner(*options, *config, *token);
  });
}

}  // namespace mend::cli
