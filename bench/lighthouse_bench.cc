// Lighthouse under load: N simulated learners (in a few client processes)
// heartbeat every 100 ms and join rounds. Measures rounds per second, quorum
// decision latency (last join of a round -> each member's reply, on the
// machine's shared monotonic clock), and the lighthouse's CPU and peak memory.
//
//   mend_lighthouse_bench [--transports grpc,udp] [--learners 100,1000,10000]
//                         [--intervals-ms 1000,0] [--swarms 4] [--rounds 20]
//                         [--warmup-rounds 3] [--csv FILE]
//
// The driver starts `mend-lighthouse` (what `mend lighthouse` runs) and the
// swarm processes (this binary with --swarm), waits until every learner is
// registered and heartbeating,
// then lets every learner join --warmup-rounds + --rounds rounds and collects
// what they measured in the last --rounds (the first rounds of a fresh
// lighthouse also grow its round history and heap, which a long-running one
// has done long before).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "core/lighthouse_line.h"
#include "core/status_format.h"
#include "core/subprocess.h"
#include "fmt/format.h"
#include "lighthouse_swarm.h"
#include "mend/lighthouse_client.h"
#include "nlohmann/json.hpp"

namespace mend::bench {
namespace {

using json = nlohmann::json;

// --------------------------------------------------------------- driver ---

struct ProcessUsage {
  double cpu_s = 0;
  double peak_rss_mib = 0;
};

ProcessUsage ReadUsage(pid_t pid) {
  ProcessUsage usage;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::vector<std::string> parts{std::istream_iterator<std::string>(fields), {}};
  if (parts.size() > 12) {
    double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    usage.cpu_s = (std::stod(parts[11]) + std::stod(parts[12])) / ticks;  // utime + stime
  }
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) usage.peak_rss_mib = std::stod(line.substr(6)) / 1024;
  }
  return usage;
}

double Percentile(std::vector<double>& values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t index = static_cast<size_t>(std::ceil(p / 100 * static_cast<double>(values.size()))) - 1;
  return values[std::min(index, values.size() - 1)];
}

struct Result {
  std::string transport;
  int learners = 0;
  double interval_ms = 0;
  double seconds = 0;
  size_t rounds = 0;
  double rounds_per_s = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
  double mean_members = 0;
  double lighthouse_cpu_pct = 0;
  double lighthouse_peak_mib = 0;
  double swarm_cpu_pct = 0;
  uint64_t errors = 0;
  // How the lighthouse closed its rounds (warm-up ones included), e.g. "fast_path 22 all_joined 1".
  std::string closed_by;
};

// The lighthouse's round counts by close rule, from its status document.
std::string ClosedBy(const std::string& address) {
  auto client = LighthouseClient::Connect({address, kToken, "", 10 * kMicrosPerSecond});
  if (!client.ok()) return "?";
  auto status = (*client)->StatusJson(0, 0);
  if (!status.ok()) return "?";
  const json doc = json::parse(*status, nullptr, /*allow_exceptions=*/false);
  if (!doc.contains("summary") || !doc["summary"].contains("rounds_by_closed_by")) return "?";
  std::string out;
  for (const auto& [rule, count] : doc["summary"]["rounds_by_closed_by"].items()) {
    out += fmt::format("{}{} {}", out.empty() ? "" : " ", rule, count.get<uint64_t>());
  }
  return out;
}

// The lighthouse every run measures, its token in `dir`.
StatusOr<std::unique_ptr<Subprocess>> SpawnLighthouse(const std::string& mend,
                                                      const std::string& dir) {
  std::string token_file = dir + "/token";
  std::ofstream(token_file) << kToken << "\n";
  return Subprocess::Spawn({{mend,
                             "--bind",
                             "127.0.0.1:0",
                             "--http",
                             "",
                             "--token-file",
                             token_file,
                             "--min-learners",
                             "2",
                             "--heartbeat-ms",
                             "100",
                             "--heartbeat-timeout-ms",
                             "10000",
                             "--grace-window-ms",
                             "5000",
                             "--grace-window-adaptive",
                             "false",
                             "--log-level",
                             "warn",
                             "--control-plane",
                             "udp"},  // served in every run, as the gRPC runs were measured
                            {},
                            "pipe",
                            dir + "/lighthouse.log",
                            false});
}

// `swarms` swarm processes of `learners` in all, each ready (its heartbeat
// streams open) when this returns.
StatusOr<std::vector<std::unique_ptr<Subprocess>>> SpawnSwarms(
    const std::string& self, const std::string& transport, const std::string& address, int learners,
    int swarms, Micros interval, int rounds, const std::string& dir) {
  std::vector<std::unique_ptr<Subprocess>> children;
  int per_swarm = (learners + swarms - 1) / swarms;
  for (int s = 0, first = 0; first < learners; ++s, first += per_swarm) {
    int count = std::min(per_swarm, learners - first);
    MEND_ASSIGN_OR_RETURN(
        auto child,
        Subprocess::Spawn(
            {{self, "--swarm", "--transport", transport, "--address", address, "--first",
              std::to_string(first), "--count", std::to_string(count), "--round-interval-ms",
              std::to_string(interval / kMicrosPerMilli), "--rounds", std::to_string(rounds),
              "--out", fmt::format("{}/swarm-{}.json", dir, s), "--seed", std::to_string(s + 1)},
             {},
             "pipe",
             fmt::format("{}/swarm-{}.log", dir, s),
             false}));
    children.push_back(std::move(child));
  }
  for (auto& child : children) {
    MEND_ASSIGN_OR_RETURN(std::string ready, child->ReadLine(300 * kMicrosPerSecond));
    if (ready != "ready") return InternalError("swarm did not get ready: " + ready);
  }
  return children;
}

// The swarms' samples, grouped by round after `warmup` rounds: a round's
// decision latency for each member is its reply time minus the round's
// last join. Fills `result`'s rounds, rates and latencies.
void ReadSamples(const std::string& dir, size_t swarms, int warmup, Result& result) {
  std::map<uint64_t, std::vector<std::pair<Micros, Micros>>> by_round;
  for (size_t s = 0; s < swarms; ++s) {
    std::ifstream in(fmt::format("{}/swarm-{}.json", dir, s));
    json doc = json::parse(in);
    result.errors += doc["errors"].get<uint64_t>();
    for (const auto& row : doc["samples"]) by_round[row[0]].push_back({row[1], row[2]});
  }
  for (int i = 0; i < warmup && !by_round.empty(); ++i) by_round.erase(by_round.begin());
  Micros start = INT64_MAX;
  Micros end = 0;
  std::vector<double> latencies;
  size_t members = 0;
  for (const auto& [id, replies] : by_round) {
    Micros last_join = 0;
    for (const auto& [joined, replied] : replies) last_join = std::max(last_join, joined);
    for (const auto& [joined, replied] : replies) {
      latencies.push_back(static_cast<double>(replied - last_join) / kMicrosPerMilli);
      start = std::min(start, joined);
      end = std::max(end, replied);
    }
    members += replies.size();
  }
  result.seconds = static_cast<double>(end - start) / kMicrosPerSecond;
  result.rounds = by_round.size();
  result.rounds_per_s = static_cast<double>(by_round.size()) / result.seconds;
  result.mean_members = by_round.empty() ? 0 : static_cast<double>(members) / by_round.size();
  result.p50_ms = Percentile(latencies, 50);
  result.p99_ms = Percentile(latencies, 99);
  result.max_ms = latencies.empty() ? 0 : latencies.back();
}

StatusOr<Result> RunOne(const std::string& mend, const std::string& self,
                        const std::string& transport, int learners, int swarms, Micros interval,
                        int rounds, int warmup, const std::string& dir) {
  MEND_ASSIGN_OR_RETURN(auto lighthouse, SpawnLighthouse(mend, dir));
  MEND_ASSIGN_OR_RETURN(const std::string address,
                        AwaitLighthouseAddress(*lighthouse, 30 * kMicrosPerSecond));
  MEND_ASSIGN_OR_RETURN(auto children, SpawnSwarms(self, transport, address, learners, swarms,
                                                   interval, rounds + warmup, dir));
  // Let every heartbeat stream settle before measuring.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ProcessUsage before = ReadUsage(lighthouse->pid());
  std::vector<double> swarm_cpu_before;
  for (auto& child : children) swarm_cpu_before.push_back(ReadUsage(child->pid()).cpu_s);
  Micros t0 = RealClock()->NowMicros();
  for (auto& child : children) MEND_RETURN_IF_ERROR(child->Signal(SIGUSR1));
  double swarm_cpu = 0;
  for (size_t i = 0; i < children.size(); ++i) {
    MEND_ASSIGN_OR_RETURN(
        std::string done,
        children[i]->ReadLine((rounds + warmup) * (interval + 30 * kMicrosPerSecond)));
    if (done != "done") return InternalError("swarm did not finish: " + done);
    swarm_cpu += ReadUsage(children[i]->pid()).cpu_s - swarm_cpu_before[i];
  }
  Micros t1 = RealClock()->NowMicros();
  ProcessUsage after = ReadUsage(lighthouse->pid());
  for (auto& child : children) (void)child->Wait(30 * kMicrosPerSecond);
  std::string closed_by = ClosedBy(address);
  (void)lighthouse->Signal(SIGTERM);
  (void)lighthouse->Wait(30 * kMicrosPerSecond);

  Result result;
  ReadSamples(dir, children.size(), warmup, result);
  result.transport = transport;
  result.learners = learners;
  result.interval_ms = static_cast<double>(interval) / kMicrosPerMilli;
  double wall = static_cast<double>(t1 - t0) / kMicrosPerSecond;
  result.lighthouse_cpu_pct = 100 * (after.cpu_s - before.cpu_s) / wall;
  result.lighthouse_peak_mib = after.peak_rss_mib;
  result.swarm_cpu_pct = 100 * swarm_cpu / wall;
  result.closed_by = closed_by;
  return result;
}

int RunDriver(const std::vector<std::string>& transports, const std::vector<int>& sizes,
              const std::vector<int>& intervals, int swarms, int rounds, int warmup,
              const std::string& csv_path, bool keep_logs) {
  std::string self = SelfExecutable();
  std::string mend =
      (std::filesystem::path(self).parent_path().parent_path() / "mend-lighthouse").string();
  if (!std::filesystem::exists(mend)) {
    fmt::print(stderr, "cannot find the mend-lighthouse binary at {}\n", mend);
    return 1;
  }
  fmt::print(
      "lighthouse bench: heartbeat every 100 ms, {} client processes, {} rounds per run "
      "after {} warm-up rounds, "
      "{} cores\n\n",
      swarms, rounds, warmup, std::thread::hardware_concurrency());
  fmt::print("{:>9} {:>9} {:>11} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>11} {:>10} {:>10}  {}\n",
             "transport", "learners", "interval", "rounds/s", "members", "p50 ms", "p99 ms",
             "max ms", "errors", "lh cpu %", "lh MiB", "swarm cpu%", "rounds closed by");
  std::filesystem::create_directories(std::filesystem::path(csv_path).parent_path());
  std::ofstream csv(csv_path);
  csv << "transport,learners,round_interval_ms,seconds,rounds,rounds_per_s,mean_members,p50_ms,p99_"
         "ms,"
         "max_ms,errors,lighthouse_cpu_pct,lighthouse_peak_mib,swarm_cpu_pct,closed_by\n";
  int exit_code = 0;
  for (const std::string& transport : transports)
    for (int interval : intervals) {
      for (int learners : sizes) {
        std::string pattern = "/tmp/mend-bench-XXXXXX";
        std::string dir = mkdtemp(pattern.data());
        auto result = RunOne(mend, self, transport, learners, std::min(swarms, learners),
                             interval * kMicrosPerMilli, rounds, warmup, dir);
        if (!result.ok()) {
          fmt::print(stderr, "run with {} learners failed: {} (logs in {})\n", learners,
                     result.status(), dir);
          exit_code = 1;
          continue;
        }
        const Result& r = *result;
        fmt::print(
            "{:>9} {:>9} {:>8} ms {:>9.2f} {:>10.1f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9} {:>11.1f} "
            "{:>10.1f} {:>10.1f}  {}\n",
            r.transport, r.learners, r.interval_ms, r.rounds_per_s, r.mean_members, r.p50_ms,
            r.p99_ms, r.max_ms, r.errors, r.lighthouse_cpu_pct, r.lighthouse_peak_mib,
            r.swarm_cpu_pct, r.closed_by);
        std::fflush(stdout);
        csv << fmt::format(
            "{},{},{},{:.2f},{},{:.3f},{:.1f},{:.3f},{:.3f},{:.3f},{},{:.1f},{:.1f},{:.1f},{}\n",
            r.transport, r.learners, r.interval_ms, r.seconds, r.rounds, r.rounds_per_s,
            r.mean_members, r.p50_ms, r.p99_ms, r.max_ms, r.errors, r.lighthouse_cpu_pct,
            r.lighthouse_peak_mib, r.swarm_cpu_pct, r.closed_by);
        if (r.errors == 0 && !keep_logs)
          std::filesystem::remove_all(dir);
        else
          fmt::print("  (logs and every member's join and reply times: {})\n", dir);
      }
    }
  fmt::print("\nCSV: {}\n", csv_path);
  return exit_code;
}

}  // namespace
}  // namespace mend::bench

int main(int argc, char** argv) {
  CLI::App app{"mend lighthouse benchmark"};
  bool swarm = false;
  std::string address;
  std::string out;
  int first = 0;
  int count = 0;
  int interval_ms = 1000;
  int rounds = 20;
  int warmup = 3;
  uint64_t seed = 1;
  std::vector<int> sizes = {100, 1000, 10000};
  std::vector<int> intervals = {1000, 0};
  int swarms = 4;
  std::string csv = "bench-results/lighthouse_bench.csv";
  bool keep_logs = false;
  std::vector<std::string> transports = {"grpc", "udp"};
  std::string transport = "grpc";
  app.add_flag("--swarm", swarm, "Run as a client process (used by the driver)");
  app.add_option("--transport", transport, "(swarm) grpc or udp");
  app.add_option("--transports", transports, "Control transports to measure")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--address", address);
  app.add_option("--first", first);
  app.add_option("--count", count);
  app.add_option("--out", out);
  app.add_option("--seed", seed);
  app.add_option("--round-interval-ms", interval_ms,
                 "(swarm) pause between a reply and the next join");
  app.add_option("--rounds", rounds, "Measured rounds per run")->capture_default_str();
  app.add_option("--warmup-rounds", warmup, "Rounds joined before the measured ones")
      ->capture_default_str();
  app.add_option("--learners", sizes, "Learner counts to run")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--intervals-ms", intervals,
                 "Pauses between a learner's round reply and its next join (0: at once)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--swarms", swarms, "Client processes")->capture_default_str();
  app.add_option("--csv", csv, "CSV output")->capture_default_str();
  app.add_flag("--keep-logs", keep_logs,
               "Keep each run's directory (logs, swarm-N.json with every join and reply time)");
  CLI11_PARSE(app, argc, argv);
  if (swarm) {
    return mend::bench::RunSwarm(
        {address, transport, first, count, interval_ms * mend::kMicrosPerMilli, rounds, out, seed});
  }
  return mend::bench::RunDriver(transports, sizes, intervals, swarms, rounds, warmup, csv,
                                keep_logs);
}
