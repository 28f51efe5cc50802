// Multi-rank learners: a round's exchange time and cross-rack bytes per host
// with 1 rank per learner against R ranks per learner (the sharded
// exchange), side by side in one run on the same model; with --hierarchy,
// the flat merge against the rack-aware one (--per-rack learners in each
// of --learners / --per-rack racks, one rank each).
//
//   mend_group_bench [--learners 2] [--ranks 1,2] [--mib 64] [--rounds 5]
//                    [--codec fp32] [--link-rate-mbit 200] [--link-latency-ms 0] [--netns]
//                    [--hierarchy --per-rack 2] [--in-place] [--csv bench-results/group.csv]
//
// Each run starts a lighthouse (mend-lighthouse) and learners x R worker
// processes (this binary with --worker). A worker is one rank: it holds a
// model of --mib MiB in plain vectors (8 parameters), "trains" it by a fixed
// amount per step, and runs the round driver with a synchronous round every
// step (H = 1); a round's time is its step()'s (quorum, the slice's merge
// across racks, the group's agreement and all-gather). The first round is a
// warm-up. The driver prints, per R, the median over rounds of the slowest
// rank's round time and the cross-rack bytes each host sent per round.
//
// With --netns it runs under `scripts/racks.sh --racks L --hosts R --rate X
// -- ...`: learner l's rank r in host namespace (rack of l, its index in
// the rack x R + r + 1), whose cross-rack
// traffic the kernel shapes to X (htb); the lighthouse on the bridge. Without
// it, on loopback with the data plane's link emulation at --link-rate-mbit
// per rank (each host's own link; the group's own connections unshaped).
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "core/lighthouse_line.h"
#include "core/status_format.h"
#include "core/subprocess.h"
#include "fmt/format.h"
#include "mend/logging.h"
#include "nlohmann/json.hpp"
#include "reducer/learner_session.h"
#include "reducer/options_from_config.h"
#include "reducer/vector_parameters.h"

namespace mend::bench {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
constexpr char kToken[] = "group-bench-token-0123456789abcdef";
constexpr int kParameters = 8;

// kParameters tensors "layer<i>.weight" of `values` / kParameters values in
// all. With --in-place the round reads and writes the values where they are
// (as a model's CPU fp32 parameters); else through CopyOut and CopyIn (as
// parameters staged from a GPU).
std::unique_ptr<reducer::VectorParameters> Model(size_t values, bool in_place) {
  std::vector<reducer::VectorParameters::Tensor> tensors;
  for (int i = 0; i < kParameters; ++i)
    tensors.push_back(
        {fmt::format("layer{}.weight", i), {static_cast<int64_t>(values / kParameters)}});
  return std::make_unique<reducer::VectorParameters>(std::move(tensors), 0.01f, in_place);
}

struct WorkerArgs {
  std::string lighthouse;
  std::string host = "127.0.0.1";
  int learner = 0;
  int learners = 2;
  int rank = 0;
  int ranks = 1;
  int mib = 64;
  int rounds = 5;
  std::string codec = "fp32";
  double link_rate_mbit = 0;
  int64_t link_latency_ms = 0;
  std::string rack;
  bool rack_aware = false;
  bool in_place = false;
};

// The worker's learner session, on its configuration checked once.
StatusOr<std::unique_ptr<reducer::LearnerSession>> StartSession(
    const Config& config, reducer::LearnerSessionOptions options) {
  MEND_ASSIGN_OR_RETURN(ValidConfig valid, ValidConfig::Check(config));
  return reducer::StartLearnerSession(valid, std::move(options));
}

StatusOr<Config> WorkerConfig(const WorkerArgs& args) {
  Config config;
  config.job_id = "bench";
  config.lighthouse = args.lighthouse;
  config.log_level = LogLevel::kWarn;
  config.group_size = args.ranks;
  config.group_rank = args.rank;
  config.sync_period_steps = 1;
  config.concurrent_outer_step = false;
  config.quorum_min_learners = args.learners;
  config.quorum_timeout_ms = 300000;
  config.collective_timeout_ms = 300000;
  MEND_RETURN_IF_ERROR(SetConfigValue(config, "codec", args.codec, "--codec"));
  config.dataplane_host = args.host;
  config.link_rate_mbit = args.link_rate_mbit;
  config.link_latency_ms = args.link_latency_ms;
  config.rack = args.rack;
  config.rack_aware = args.rack_aware;
  return config;
}

// Rounds 1..args.rounds (round 0 warms up), each after a step of
// "training": their seconds and bytes, as the worker's line of JSON.
StatusOr<json> TimeRounds(const WorkerArgs& args, reducer::RoundDriver& driver,
                          reducer::VectorParameters& view) {
  json seconds = json::array();
  uint64_t bytes_before = 0;
  uint64_t cross_before = 0;
  for (int round = 0; round <= args.rounds; ++round) {
    for (std::vector<float>& values : view.values()) {
      for (float& v : values) v += 0.001f * static_cast<float>(args.learner + 1);
    }
    if (round == 1) {
      bytes_before = driver.stats().bytes_sent;
      cross_before = driver.stats().cross_rack_bytes_sent;
    }
    const auto begin = SteadyClock::now();
    MEND_RETURN_IF_ERROR(driver.step(1000));
    if (round > 0)
      seconds.push_back(std::chrono::duration<double>(SteadyClock::now() - begin).count());
  }
  const ReducerStats stats = driver.stats();
  (void)driver.shutdown();
  return json{
      {"learner", args.learner},
      {"rank", args.rank},
      {"seconds", seconds},
      {"bytes_per_round", static_cast<double>(stats.bytes_sent - bytes_before) / args.rounds},
      {"cross_rack_bytes_per_round",
       static_cast<double>(stats.cross_rack_bytes_sent - cross_before) / args.rounds},
      {"rounds_ok", stats.rounds},
      {"rounds_failed", stats.failed_rounds}};
}

int RunWorker(const WorkerArgs& args) {
  StatusOr<Config> made = WorkerConfig(args);
  if (!made.ok()) {
    fmt::print(stderr, "{}\n", made.status().message());
    return 2;
  }
  const Config& config = *made;
  (void)InitLogging(config.log_level,
                    fmt::format("learner-{}.{}", args.learner, args.rank));  // to stderr
  auto model = Model(static_cast<size_t>(args.mib) << 18, args.in_place);
  reducer::VectorParameters* view = model.get();
  reducer::LearnerSessionOptions options{
      fmt::format("learner-{}", args.learner), kToken, RealClock(), {}, {}};
  for (size_t i = 0; i < model->count(); ++i) options.parameter_shapes.push_back(model->shape(i));
  auto session = StartSession(config, std::move(options));
  if (!session.ok()) {
    fmt::print(stderr, "worker: {}\n", session.status());
    return 1;
  }
  auto driver = (*session)->CreateDriver(std::move(model), nullptr, 0);
  if (!driver.ok()) {
    fmt::print(stderr, "worker: {}\n", driver.status());
    return 1;
  }
  StatusOr<json> out = TimeRounds(args, **driver, *view);
  if (!out.ok()) {
    fmt::print(stderr, "worker: {}\n", out.status());
    return 1;
  }
  fmt::print("{}\n", out->dump());
  return 0;
}

struct DriverArgs {
  int learners = 2;
  std::vector<int> ranks = {1, 2};
  int mib = 64;
  int rounds = 5;
  std::string codec = "fp32";
  double link_rate_mbit = 200;
  int64_t link_latency_ms = 0;
  bool netns = false;
  bool hierarchy = false;
  bool in_place = false;
  int per_rack = 1;
  std::string csv = "bench-results/group.csv";
};

std::string Env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  return value ? value : "";
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct RunResult {
  double round_s = 0;         // median over rounds of the slowest rank
  double bytes_per_host = 0;  // cross-rack bytes a host sent per round (mean over hosts)
  uint64_t failed = 0;
};

// The command line of learner l's rank r.
StatusOr<std::vector<std::string>> WorkerArgv(const DriverArgs& args, int ranks, bool rack_aware,
                                              const std::string& self, const std::string& address,
                                              int l, int r) {
  const int rack = l / args.per_rack;
  const int in_rack = l % args.per_rack;
  std::vector<std::string> argv = {self,           "--worker",
                                   "--lighthouse", address,
                                   "--learner",    std::to_string(l),
                                   "--learners",   std::to_string(args.learners),
                                   "--rank",       std::to_string(r),
                                   "--ranks",      std::to_string(ranks),
                                   "--mib",        std::to_string(args.mib),
                                   "--rounds",     std::to_string(args.rounds),
                                   "--codec",      args.codec,
                                   "--rack",       fmt::format("rack-{}", rack + 1)};
  if (rack_aware) argv.push_back("--rack-aware");
  if (args.in_place) argv.push_back("--in-place");
  if (args.netns) {
    const std::string host = fmt::format("{}_{}", rack + 1, in_rack * ranks + r + 1);
    const std::string ns = Env("HOST_NS_" + host);
    if (ns.empty()) {
      return FailedPreconditionError(fmt::format(
          "--netns: no HOST_NS_{} (run under scripts/racks.sh --racks {} --hosts {} ...)", host,
          args.learners / args.per_rack, args.per_rack * ranks));
    }
    argv.insert(argv.end(), {"--host", Env("HOST_ADDR_" + host)});
    argv.insert(argv.begin(), {"/usr/bin/env", "ip", "netns", "exec", ns});
  } else {
    argv.insert(argv.end(), {"--link-rate-mbit", fmt::format("{}", args.link_rate_mbit),
                             "--link-latency-ms", fmt::format("{}", args.link_latency_ms)});
  }
  return argv;
}

// The workers' lines: each round's slowest rank, and the bytes per host.
RunResult Summarize(const std::vector<json>& outputs, int rounds) {
  RunResult result;
  std::vector<double> slowest(static_cast<size_t>(rounds), 0.0);
  for (const json& out : outputs) {
    for (size_t i = 0; i < slowest.size(); ++i)
      slowest[i] = std::max(slowest[i], out["seconds"][i].get<double>());
    result.bytes_per_host +=
        out["cross_rack_bytes_per_round"].get<double>() / static_cast<double>(outputs.size());
    result.failed += out["rounds_failed"].get<uint64_t>();
  }
  result.round_s = Median(slowest);
  return result;
}

StatusOr<RunResult> Run(const DriverArgs& args, int ranks, bool rack_aware, const std::string& self,
                        const std::string& lighthouse_bin) {
  const std::string dir = std::filesystem::temp_directory_path() / "mend-group-bench";
  std::filesystem::create_directories(dir);
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << kToken << "\n";
  const std::string bind = args.netns ? Env("RACKS_BRIDGE_ADDR") : "127.0.0.1";
  MEND_ASSIGN_OR_RETURN(
      auto lighthouse,
      Subprocess::Spawn({{lighthouse_bin, "--bind", bind + ":0", "--http", "", "--token-file",
                          token_file, "--job-id", "bench", "--min-learners",
                          std::to_string(args.learners), "--log-level", "warn"},
                         {},
                         "pipe",
                         dir + "/lighthouse.log",
                         false}));
  MEND_ASSIGN_OR_RETURN(const std::string address,
                        AwaitLighthouseAddress(*lighthouse, 30 * kMicrosPerSecond));
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int l = 0; l < args.learners; ++l) {
    for (int r = 0; r < ranks; ++r) {
      MEND_ASSIGN_OR_RETURN(auto argv, WorkerArgv(args, ranks, rack_aware, self, address, l, r));
      MEND_ASSIGN_OR_RETURN(auto worker,
                            Subprocess::Spawn({argv, {}, "pipe", dir + "/worker.log", false}));
      workers.push_back(std::move(worker));
    }
  }
  std::vector<json> outputs;
  Status failure = OkStatus();
  for (auto& worker : workers) {
    auto out = worker->ReadLine(3600 * kMicrosPerSecond);
    if (!out.ok()) {
      failure = InternalError(
          fmt::format("a worker printed no result ({}); see {}/worker.log", out.status(), dir));
      continue;
    }
    outputs.push_back(json::parse(*out));
  }
  for (auto& worker : workers) (void)worker->Wait(60 * kMicrosPerSecond);
  (void)lighthouse->Signal(SIGTERM);
  (void)lighthouse->Wait(10 * kMicrosPerSecond);
  MEND_RETURN_IF_ERROR(failure);
  return Summarize(outputs, args.rounds);
}

// Flat against rack-aware, one rank per learner.
int RunHierarchy(const DriverArgs& args, const std::string& self,
                 const std::string& lighthouse_bin) {
  std::ofstream csv(args.csv);
  csv << "where,learners,per_rack,model_mib,codec,merge,round_s,cross_rack_mb_per_learner_per_"
         "round,"
         "round_ratio_vs_flat,bytes_ratio_vs_flat,failed_rounds\n";
  fmt::print("{:>11} {:>12} {:>25} {:>12} {:>12} {:>7}\n", "merge", "round s",
             "cross-rack MB/learner/round", "time vs flat", "bytes vs flat", "failed");
  std::optional<RunResult> flat;
  int exit_code = 0;
  for (bool rack_aware : {false, true}) {
    auto result = Run(args, 1, rack_aware, self, lighthouse_bin);
    if (!result.ok()) {
      fmt::print(stderr, "{}: {}\n", rack_aware ? "rack-aware" : "flat", result.status());
      exit_code = 1;
      continue;
    }
    if (!rack_aware) flat = *result;
    const std::string time_ratio =
        flat ? fmt::format("{:.3f}", result->round_s / flat->round_s) : "-";
    const std::string bytes_ratio =
        flat ? fmt::format("{:.3f}", result->bytes_per_host / flat->bytes_per_host) : "-";
    const char* merge = rack_aware ? "rack-aware" : "flat";
    fmt::print("{:>11} {:>12.3f} {:>25.2f} {:>12} {:>12} {:>7}\n", merge, result->round_s,
               result->bytes_per_host / 1e6, time_ratio, bytes_ratio, result->failed);
    csv << fmt::format("\"{}\",{},{},{},{},{},{:.4f},{:.3f},{},{},{}\n",
                       args.netns ? "netns" : "emulated", args.learners, args.per_rack, args.mib,
                       args.codec, merge, result->round_s, result->bytes_per_host / 1e6, time_ratio,
                       bytes_ratio, result->failed);
  }
  fmt::print("\nCSV: {}\n", args.csv);
  return exit_code;
}

int RunDriver(const DriverArgs& args) {
  const std::string self = SelfExecutable();
  const std::string lighthouse_bin =
      (std::filesystem::path(self).parent_path().parent_path() / "mend-lighthouse").string();
  if (!std::filesystem::path(args.csv).parent_path().empty()) {
    std::filesystem::create_directories(std::filesystem::path(args.csv).parent_path());
  }
  const std::string where =
      args.netns
          ? fmt::format("a namespace per host, cross-rack traffic shaped to {} per host (htb)",
                        Env("RACK_RATE"))
          : fmt::format("loopback, each rank's cross-rack link emulated at {} Mbit/s, {} ms",
                        args.link_rate_mbit, args.link_latency_ms);
  fmt::print(
      "group bench: {} learners ({} per rack), {} MiB model, codec {}, {} rounds after a "
      "warm-up;\n{}; "
      "{} cores\n\n",
      args.learners, args.per_rack, args.mib, args.codec, args.rounds, where,
      std::thread::hardware_concurrency());
  std::ofstream csv(args.csv);
  csv << "where,learners,ranks_per_learner,model_mib,codec,round_s,cross_rack_mb_per_host_per_"
         "round,"
         "round_ratio_vs_1_rank,bytes_ratio_vs_1_rank,failed_rounds\n";
  if (args.hierarchy) return RunHierarchy(args, self, lighthouse_bin);
  fmt::print("{:>6} {:>12} {:>22} {:>14} {:>14} {:>7}\n", "ranks", "round s",
             "cross-rack MB/host/round", "time vs 1 rank", "bytes vs 1", "failed");
  std::optional<RunResult> one;
  int exit_code = 0;
  for (int ranks : args.ranks) {
    auto result = Run(args, ranks, /*rack_aware=*/false, self, lighthouse_bin);
    if (!result.ok()) {
      fmt::print(stderr, "{} ranks: {}\n", ranks, result.status());
      exit_code = 1;
      continue;
    }
    if (ranks == 1) one = *result;
    const std::string time_ratio =
        one ? fmt::format("{:.3f}", result->round_s / one->round_s) : "-";
    const std::string bytes_ratio =
        one ? fmt::format("{:.3f}", result->bytes_per_host / one->bytes_per_host) : "-";
    fmt::print("{:>6} {:>12.3f} {:>22.2f} {:>14} {:>14} {:>7}\n", ranks, result->round_s,
               result->bytes_per_host / 1e6, time_ratio, bytes_ratio, result->failed);
    csv << fmt::format("\"{}\",{},{},{},{},{:.4f},{:.3f},{},{},{}\n",
                       args.netns ? "netns" : "emulated", args.learners, ranks, args.mib,
                       args.codec, result->round_s, result->bytes_per_host / 1e6,
                       one ? time_ratio : "", one ? bytes_ratio : "", result->failed);
  }
  fmt::print("\nCSV: {}\n", args.csv);
  return exit_code;
}

}  // namespace
}  // namespace mend::bench

int main(int argc, char** argv) {
  CLI::App app{"Multi-rank learners: sharded cross-rack exchange against one rank per learner"};
  mend::bench::WorkerArgs w;
  mend::bench::DriverArgs d;
  bool worker = false;
  app.add_flag("--worker", worker, "(internal) run one rank");
  app.add_option("--lighthouse", w.lighthouse);
  app.add_option("--host", w.host);
  app.add_option("--learner", w.learner);
  app.add_option("--rank", w.rank);
  app.add_option("--learners", d.learners, "Learners (--per-rack in each rack)")
      ->check(CLI::Range(2, 18));
  app.add_option("--ranks", d.ranks, "Ranks per learner, one run each (1 first: the baseline)")
      ->delimiter(',');
  app.add_option("--mib", d.mib, "Model size in MiB")->check(CLI::Range(1, 4096));
  app.add_option("--rounds", d.rounds, "Measured rounds")->check(CLI::Range(1, 1000));
  app.add_option("--codec", d.codec, "The cross-rack codec");
  app.add_option("--link-rate-mbit", d.link_rate_mbit,
                 "Without --netns: each rank's emulated link");
  app.add_option("--link-latency-ms", d.link_latency_ms,
                 "Emulated cross-rack latency (without --netns): each collective's least time")
      ->check(CLI::Range(int64_t{0}, int64_t{60000}));
  app.add_flag("--netns", d.netns, "Place ranks in scripts/racks.sh's host namespaces");
  app.add_flag("--hierarchy", d.hierarchy,
               "Compare the flat merge with the rack-aware one (1 rank per learner)");
  app.add_option("--per-rack", d.per_rack, "Learners per rack")->check(CLI::Range(1, 9));
  app.add_flag("--in-place", d.in_place,
               "The round works on the model's values in place (CPU fp32 parameters), not "
               "through copies (parameters staged from a GPU)");
  app.add_option("--rack", w.rack);
  app.add_flag("--rack-aware", w.rack_aware);
  app.add_option("--csv", d.csv, "Where the CSV goes");
  // A worker gets the run's sizes through the same flags.
  CLI11_PARSE(app, argc, argv);
  if (!worker && d.learners % d.per_rack != 0) {
    fmt::print(stderr, "--learners {} is not a multiple of --per-rack {}\n", d.learners,
               d.per_rack);
    return 2;
  }
  if (worker) {
    w.learners = d.learners;
    w.ranks = d.ranks.empty() ? 1 : d.ranks.front();
    w.mib = d.mib;
    w.rounds = d.rounds;
    w.codec = d.codec;
    w.link_rate_mbit = d.link_rate_mbit;
    w.link_latency_ms = d.link_latency_ms;
    w.in_place = d.in_place;
    return mend::bench::RunWorker(w);
  }
  return mend::bench::RunDriver(d);
}
