// `mend train` and `mend demo` as a user runs them: real processes, an
// embedded lighthouse, a small synthetic corpus so that the test does not
// depend on the fortunes package.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "core/status_format.h"
#include "core/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_util/synthetic_corpus.h"
#include "test_util/wait.h"

namespace mend {
namespace {

using ::testing::HasSubstr;

constexpr Micros kWait = 240 * kMicrosPerSecond;

class TrainProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::MakeTempDir();
    corpus_ = dir_ + "/corpus";
    testing_util::WriteSyntheticFortunes(corpus_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `mend ARGS...` to completion; returns (exit code, stdout + stderr).
  // `env`: "NAME=value" added to the test's environment.
  std::pair<int, std::string> RunMend(std::vector<std::string> args,
                                      std::vector<std::string> env = {}) {
    args.insert(args.begin(), MEND_BINARY);
    const std::string out = dir_ + "/run.txt";
    std::filesystem::remove(out);
    auto child = Subprocess::Spawn({args, std::move(env), out, out, false});
    EXPECT_TRUE(child.ok());
    auto status = (*child)->Wait(kWait);
    EXPECT_TRUE(status.ok()) << "mend did not finish";
    std::ifstream in(out);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return {status.ok() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, text};
  }

  std::string dir_, corpus_;
};

TEST_F(TrainProcessTest, DemoTrainsEveryModeAndPrintsTheTable) {
  // With MEND_JOB_TOKEN set (the README has users export it for their own
  // jobs): the demo's learners still take its own job's token.
  auto [code, text] = RunMend(
      {"demo", "--steps", "10", "--dim", "16", "--layers", "1", "--batch", "4", "--sync-every", "5",
       "--delay-ms", "0", "--eval-points", "5", "--corpus", corpus_, "--work-dir", dir_ + "/demo"},
      {"MEND_JOB_TOKEN=the-token-of-another-job"});
  ASSERT_EQ(code, 0) << text;
  for (const char* row : {"DDP (gradients every step)", "mend DiLoCo, H=5, synchronous",
                          "mend streaming, H=5, 4-bit, overlapped", "Local only (no exchange)",
                          "mend DiLoCo, H=5, synchronous, 2x steps"}) {
    EXPECT_THAT(text, HasSubstr(row));
  }
  EXPECT_THAT(text, HasSubstr("held-out loss"));
  EXPECT_THAT(text, HasSubstr("s to DDP loss"));
  // Held-out loss against time: every mode's evaluations and its final one,
  // as CSV and plotted (setup.sh installs gnuplot).
  std::ifstream curve(dir_ + "/demo/loss_vs_time.csv");
  ASSERT_TRUE(curve.good());
  std::map<std::string, int> points;
  std::string line;
  std::getline(curve, line);
  EXPECT_EQ(line, "mode,step,seconds,held_out_loss");
  while (std::getline(curve, line)) points[line.substr(0, line.find("\","))]++;
  EXPECT_EQ(points.size(), 5u);
  for (const auto& [mode, n] : points) EXPECT_EQ(n, 5) << mode;  // steps 2, 4, 6, 8 and the end
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/demo/loss_vs_time.png"));
  // Every learner of every mode left a result and diagnostics.
  // (each folder named after its mode)
  for (const char* job : {"1-ddp", "2-diloco", "3-streaming", "4-local", "5-diloco-2x"}) {
    for (const char* learner : {"learner-1", "learner-2"}) {
      std::ifstream in(fmt::format("{}/demo/{}/{}.result.json", dir_, job, learner));
      ASSERT_TRUE(in.good()) << job << " " << learner;
      auto result = nlohmann::json::parse(in);
      EXPECT_EQ(result["steps"], std::string(job) == "5-diloco-2x" ? 20 : 10) << job;
      EXPECT_TRUE(std::isfinite(result["eval_loss"].get<double>())) << job;
    }
  }
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/demo/2-diloco/diagnostics/learner-1.rounds.jsonl"));
}

// Reads every JSON line of a diagnostics file.
std::vector<nlohmann::json> JsonLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// Two learners of two ranks each (4 `mend train` processes, DDP inside each
// group, the cross-rack rounds sharded): after every round the four
// replicas hold the same parameters (synchronous: each is the global state)
// or, overlapped, each group's two do; and the loss goes down.
TEST_F(TrainProcessTest, LearnersOfTwoRanksKeepTheirReplicasBitIdentical) {
  auto [code, text] = RunMend({"demo",
                               "--ranks-per-learner",
                               "2",
                               "--modes",
                               "diloco,streaming,local",
                               "--steps",
                               "30",
                               "--dim",
                               "16",
                               "--layers",
                               "1",
                               "--batch",
                               "4",
                               "--sync-every",
                               "10",
                               "--delay-ms",
                               "0",
                               "--eval-points",
                               "3",
                               "--corpus",
                               corpus_,
                               "--work-dir",
                               dir_ + "/demo"});
  ASSERT_EQ(code, 0) << text;
  EXPECT_THAT(text, HasSubstr("2 learners of 2 ranks each"));
  EXPECT_THAT(text, HasSubstr("MB/host"));
  for (const char* job : {"1-diloco", "2-streaming"}) {
    const bool synchronous = std::string(job) == "1-diloco";
    // parameters_sha256 by round id, per process.
    std::map<uint64_t, std::map<std::string, std::string>> digests;
    for (const char* process :
         {"learner-1.rank0", "learner-1.rank1", "learner-2.rank0", "learner-2.rank1"}) {
      auto rounds =
          JsonLines(fmt::format("{}/demo/{}/diagnostics/{}.rounds.jsonl", dir_, job, process));
      EXPECT_GE(rounds.size(), 2u) << job << " " << process;
      for (const auto& round : rounds) {
        ASSERT_TRUE(round["ok"].get<bool>()) << job << " " << process << ": " << round.dump();
        digests[round["round_id"].get<uint64_t>()][process] =
            round["parameters_sha256"].get<std::string>();
      }
    }
    for (const auto& [round, by_process] : digests) {
      ASSERT_EQ(by_process.size(), 4u) << job << " round " << round;
      EXPECT_EQ(by_process.at("learner-1.rank0"), by_process.at("learner-1.rank1"))
          << job << " round " << round;
      EXPECT_EQ(by_process.at("learner-2.rank0"), by_process.at("learner-2.rank1"))
          << job << " round " << round;
      if (synchronous) {
        EXPECT_EQ(by_process.at("learner-1.rank0"), by_process.at("learner-2.rank0"))
            << job << " round " << round;
      }
    }
    // Every process's held-out loss fell from its first evaluation to its last.
    for (const char* process : {"learner-1.0", "learner-1.1", "learner-2.0", "learner-2.1"}) {
      std::ifstream in(fmt::format("{}/demo/{}/{}.result.json", dir_, job, process));
      ASSERT_TRUE(in.good()) << job << " " << process;
      auto result = nlohmann::json::parse(in);
      const auto& curve = result["eval_curve"];
      ASSERT_GE(curve.size(), 2u);
      EXPECT_LT(curve.back()[1].get<double>(), curve.front()[1].get<double>())
          << job << " " << process;
      EXPECT_GT(result["bytes_sent"].get<uint64_t>(), 0u);
    }
  }
}

TEST_F(TrainProcessTest, LocalTrainWritesItsResult) {
  auto [code, text] =
      RunMend({"train", "--mode", "local", "--steps", "6", "--dim", "16", "--layers", "1",
               "--batch", "2", "--corpus", corpus_, "--result-file", dir_ + "/r.json"});
  ASSERT_EQ(code, 0) << text;
  EXPECT_THAT(text, HasSubstr("eval loss"));
  std::ifstream in(dir_ + "/r.json");
  auto result = nlohmann::json::parse(in);
  EXPECT_EQ(result["mode"], "local");
  EXPECT_EQ(result["tokens"], 6 * 2 * 64);
}

TEST_F(TrainProcessTest, BadInputIsRefusedWithWhatWasWrong) {
  auto [missing, missing_text] =
      RunMend({"train", "--mode", "local", "--corpus", dir_ + "/nowhere"});
  EXPECT_EQ(missing, 2);
  EXPECT_THAT(missing_text, HasSubstr("apt-get install fortunes"));
  auto [heads, heads_text] =
      RunMend({"train", "--mode", "local", "--dim", "30", "--heads", "4", "--corpus", corpus_});
  EXPECT_EQ(heads, 2);
  EXPECT_THAT(heads_text, HasSubstr("heads"));
  auto [token, token_text] = RunMend({"train", "--mode", "diloco", "--corpus", corpus_});
  EXPECT_EQ(token, 2);
  EXPECT_THAT(token_text, HasSubstr("token"));
  auto [modes, modes_text] = RunMend({"demo", "--modes", "ddp,bogus", "--work-dir", dir_ + "/d"});
  EXPECT_EQ(modes, 2);
  EXPECT_THAT(modes_text, HasSubstr("bogus"));
  auto [start, start_text] = RunMend(
      {"train", "--mode", "local", "--steps", "50", "--start-step", "50", "--corpus", corpus_});
  EXPECT_EQ(start, 2);
  EXPECT_THAT(start_text, HasSubstr("start_step = 50"));
  auto [pace, pace_text] =
      RunMend({"train", "--mode", "local", "--step-time-ms", "-5", "--corpus", corpus_});
  EXPECT_EQ(pace, 2);
  EXPECT_THAT(pace_text, HasSubstr("--step-time-ms"));
  auto [faults, faults_text] =
      RunMend({"chaos", "--faults", "kill,meteor", "--corpus", corpus_, "--work-dir", dir_ + "/c"});
  EXPECT_EQ(faults, 2);
  EXPECT_THAT(faults_text, HasSubstr("meteor"));
  // A bad --set reaches the learners the demo and chaos start: their refusal
  // is the command's bad input too (exit 2), the key named.
  auto [demo_key, demo_key_text] =
      RunMend({"demo", "--modes", "local", "--steps", "10", "--corpus", corpus_, "--set",
               "sync_perod_steps=3", "--work-dir", dir_ + "/dk"});
  EXPECT_EQ(demo_key, 2) << demo_key_text;
  EXPECT_THAT(demo_key_text, HasSubstr("did you mean 'sync_period_steps'?"));
  auto [chaos_key, chaos_key_text] =
      RunMend({"chaos", "--steps", "10", "--no-reference", "--corpus", corpus_, "--set",
               "sync_perod_steps=3", "--work-dir", dir_ + "/ck"});
  EXPECT_EQ(chaos_key, 2) << chaos_key_text;
  EXPECT_THAT(chaos_key_text, HasSubstr("did you mean 'sync_period_steps'?"));
  // A model flag that every learner refuses (exit 2): the demo's bad input.
  auto [dim, dim_text] = RunMend({"demo", "--modes", "local", "--steps", "10", "--corpus", corpus_,
                                  "--dim", "4", "--work-dir", dir_ + "/dd"});
  EXPECT_EQ(dim, 2) << dim_text;
  EXPECT_THAT(dim_text, HasSubstr("refused its configuration or flags"));
  auto [plot, plot_text] = RunMend({"demo", "--modes", "local", "--corpus", corpus_, "--plot",
                                    dir_ + "/nowhere/x.png", "--work-dir", dir_ + "/dp"});
  EXPECT_EQ(plot, 2);
  EXPECT_THAT(plot_text, HasSubstr("no directory"));
  auto [http, http_text] = RunMend({"demo", "--modes", "local", "--corpus", corpus_, "--http",
                                    "notanaddress", "--work-dir", dir_ + "/dh"});
  EXPECT_EQ(http, 2) << http_text;
  EXPECT_THAT(http_text, HasSubstr("--http"));
  auto [stops, stops_text] =
      RunMend({"chaos", "--stop-min-s", "5", "--stop-max-s", "1", "--no-reference", "--corpus",
               corpus_, "--work-dir", dir_ + "/cs"});
  EXPECT_EQ(stops, 2) << stops_text;
  EXPECT_THAT(stops_text, HasSubstr("--stop-min-s 5 is above --stop-max-s 1"));
  // Output files are checked before the run, not found unwritable after it.
  auto [report, report_text] =
      RunMend({"chaos", "--steps", "10", "--no-reference", "--corpus", corpus_, "--report",
               dir_ + "/nowhere/report.json", "--work-dir", dir_ + "/cr"});
  EXPECT_EQ(report, 2) << report_text;
  EXPECT_THAT(report_text, HasSubstr("--report"));
  auto [result, result_text] = RunMend({"train", "--mode", "local", "--corpus", corpus_,
                                        "--result-file", dir_ + "/nowhere/result.json"});
  EXPECT_EQ(result, 2) << result_text;
  EXPECT_THAT(result_text, HasSubstr("--result-file"));
  // Inner-optimizer and size flags out of range: refused (2), not an
  // internal error or an allocation failure.
  for (const char* decay : {"-1", "nan", "inf"}) {
    auto [code, text] =
        RunMend({"train", "--mode", "local", "--corpus", corpus_, "--weight-decay", decay});
    EXPECT_EQ(code, 2) << decay << ": " << text;
    EXPECT_THAT(text, HasSubstr("train: weight_decay = ")) << decay;
  }
  auto [batch, batch_text] =
      RunMend({"train", "--mode", "local", "--corpus", corpus_, "--batch", "100000000"});
  EXPECT_EQ(batch, 2) << batch_text;
  EXPECT_THAT(batch_text, HasSubstr("batch = 100000000: must be at most"));
  auto [rank, rank_text] = RunMend(
      {"train", "--mode", "local", "--group-size", "2", "--group-rank", "2", "--corpus", corpus_});
  EXPECT_EQ(rank, 2);
  EXPECT_THAT(rank_text, HasSubstr("group_rank = 2: must be below group_size = 2"));
  std::ofstream(dir_ + "/token") << "train-process-test-token-0123456789\n";
  std::filesystem::permissions(
      dir_ + "/token", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto [ddp, ddp_text] =
      RunMend({"train", "--mode", "ddp", "--group-size", "2", "--group-rank", "0", "--lighthouse",
               "127.0.0.1:1", "--token-file", dir_ + "/token", "--corpus", corpus_});
  EXPECT_EQ(ddp, 2);
  EXPECT_THAT(ddp_text, HasSubstr("mode ddp with group_size = 2"));
  // A data-plane host that is no address of this host (TEST-NET-1) is bad
  // configuration at the start, before the lighthouse is asked (none
  // listens at port 1): such a learner could connect in no round.
  auto [host, host_text] =
      RunMend({"train", "--mode", "diloco", "--dataplane-host", "192.0.2.1", "--lighthouse",
               "127.0.0.1:1", "--token-file", dir_ + "/token", "--corpus", corpus_});
  EXPECT_EQ(host, 2) << host_text;
  EXPECT_THAT(host_text, HasSubstr("dataplane_host = \"192.0.2.1\": the data plane cannot listen"));
}

}  // namespace
}  // namespace mend
