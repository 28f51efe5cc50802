// The lighthouse and learners as separate processes on loopback: rounds,
// crashes (SIGKILL), hangs (SIGSTOP), fail-slow, refusal, lighthouse restart.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "cli/process_fixture.h"
#include "fmt/format.h"
#include "gmock/gmock.h"

namespace mend::testing_util {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

constexpr Micros kWait = 30 * kMicrosPerSecond;

// Runs `mend ARGS...` to completion; returns (exit code, stdout + stderr).
std::pair<int, std::string> RunMend(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), MEND_BINARY);
  auto child = Subprocess::Spawn({args, {}, dir + "/run.txt", dir + "/run.txt", false});
  EXPECT_TRUE(child.ok());
  auto status = (*child)->Wait(kWait);
  EXPECT_TRUE(status.ok());
  std::ifstream in(dir + "/run.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove((dir + "/run.txt").c_str());
  return {WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, text};
}

// Learners step every 20 ms and join a round every 5 steps.
const std::vector<std::string> kFastLearner = {"--step-ms", "20",       "--sync-every",
                                               "5",         "--jitter", "0.02"};

std::vector<std::string> LighthouseFlags(const std::string& grace_ms,
                                         const std::string& heartbeat_timeout_ms) {
  return {"--min-learners",          "2",
          "--grace-window-ms",       grace_ms,
          "--grace-window-adaptive", "false",
          "--heartbeat-ms",          "50",
          "--heartbeat-timeout-ms",  heartbeat_timeout_ms,
          "--failslow-window-steps", "8"};
}

class LighthouseProcessTest : public ProcessFixture {
 protected:
  // Starts learners a, b and c with `flags` and waits for a round of all
  // three; returns the newest round id then (0, and a test failure, if none).
  uint64_t StartThreeAndAwaitFullRound(const std::vector<std::string>& flags = kFastLearner) {
    for (const char* id : {"a", "b", "c"}) StartLearner(id, flags);
    uint64_t latest = 0;
    bool full = AwaitStatus(
        kWait,
        [&](const json& s) {
          latest = s["summary"]["latest_round_id"];
          return FindRound(s, {"a", "b", "c"}) != nullptr;
        },
        "a round with a, b, c");
    return full ? latest : 0;
  }
};

TEST_F(LighthouseProcessTest, ThreeLearnersFormRounds) {
  StartLighthouse(LighthouseFlags("2000", "2000"));
  for (const char* id : {"a", "b", "c"}) StartLearner(id, kFastLearner);
  AwaitStatus(
      kWait,
      [](const json& s) {
        int full = 0;
        for (const auto& round : s["rounds"])
          full += Members(round) == std::vector<std::string>{"a", "b", "c"};
        return full >= 3;
      },
      "three rounds with members a, b, c");
}

// `mend lighthouse` runs mend-lighthouse in the same process, which maps no
// LibTorch library: a coordinator of 10,000 learners needs none of its memory.
TEST_F(LighthouseProcessTest, TheLighthouseDoesNotLoadLibTorch) {
  StartLighthouse(LighthouseFlags("2000", "2000"));
  std::ifstream maps("/proc/" + std::to_string(lighthouse_->pid()) + "/maps");
  std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("mend-lighthouse"));  // the exec took place
  EXPECT_THAT(text, Not(HasSubstr("libtorch")));
  EXPECT_THAT(text, Not(HasSubstr("libc10")));
}

TEST_F(LighthouseProcessTest, KilledLearnerIsLeftOutOnceHeartbeatTimeoutPasses) {
  // A grace window far longer than the heartbeat timeout: only the timeout
  // can let the round close without the killed learner.
  StartLighthouse(LighthouseFlags("60000", "1000"));
  uint64_t last_full = StartThreeAndAwaitFullRound();
  ASSERT_GT(last_full, 0u);
  ASSERT_TRUE(learners_["c"]->Signal(SIGKILL).ok());
  ASSERT_TRUE(learners_["c"]->Wait(kWait).ok());
  AwaitStatus(
      kWait,
      [&](const json& s) {
        const json* round = FindRound(s, {"a", "b"}, last_full);
        const json* c = FindLearner(s, "c");
        return round && (*round)["closed_by"] == "all_joined" && c && (*c)["state"] == "dead" &&
               HasEvent(s, "dead", "c");
      },
      "a round of a, b closed once c was declared dead");
}

TEST_F(LighthouseProcessTest, StoppedLearnerRoundsCloseAfterGraceWindow) {
  // A heartbeat timeout far longer than the grace window: the stopped learner
  // still counts as alive, and rounds close by the grace window.
  StartLighthouse(LighthouseFlags("500", "60000"));
  uint64_t last_full = StartThreeAndAwaitFullRound();
  ASSERT_GT(last_full, 0u);
  ASSERT_TRUE(learners_["c"]->Signal(SIGSTOP).ok());
  ASSERT_TRUE(AwaitStatus(
      kWait,
      [&](const json& s) {
        const json* round = FindRound(s, {"a", "b"}, last_full);
        const json* c = FindLearner(s, "c");
        return round && (*round)["closed_by"] == "grace" && c && (*c)["state"] != "dead";
      },
      "a round of a, b closed by the grace window"));
  uint64_t stopped_round = Status()["summary"]["latest_round_id"];
  ASSERT_TRUE(learners_["c"]->Signal(SIGCONT).ok());
  AwaitStatus(
      kWait,
      [&](const json& s) {
        return FindRound(s, {"a", "b", "c"}, stopped_round) != nullptr;
      },
      "c back in a round after SIGCONT");
}

TEST_F(LighthouseProcessTest, ThreeTimesSlowerLearnerIsFlaggedThenCleared) {
  StartLighthouse(LighthouseFlags("2000", "5000"));
  ASSERT_GT(StartThreeAndAwaitFullRound(), 0u);
  ASSERT_TRUE(learners_["c"]->Signal(SIGUSR1).ok());  // 3x slower
  ASSERT_TRUE(AwaitStatus(
      kWait,
      [](const json& s) {
        const json* c = FindLearner(s, "c");
        const json* a = FindLearner(s, "a");
        return c && (*c)["slow"] == true && a && (*a)["slow"] == false && HasEvent(s, "slow", "c");
      },
      "c flagged slow (and a not)"));
  ASSERT_TRUE(learners_["c"]->Signal(SIGUSR2).ok());  // normal speed again
  AwaitStatus(
      kWait,
      [](const json& s) {
        const json* c = FindLearner(s, "c");
        return c && (*c)["slow"] == false && HasEvent(s, "recovered", "c");
      },
      "c cleared after it sped up");
}

// A job id the lighthouse does not serve is the learner's bad
// configuration (2); a lighthouse that never answers is a failure (1), not
// a refusal (3): the exit status says which to fix.
TEST_F(LighthouseProcessTest, AnotherJobsIdIsBadConfigAndNoLighthouseIsAFailure) {
  StartLighthouse(LighthouseFlags("2000", "2000"));
  Subprocess& other = StartLearner("other", {"--job-id", "another-job"});
  auto exited = other.Wait(kWait);
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(DescribeWaitStatus(*exited), "exited with 2");
  std::ifstream log(dir_ + "/other.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("another-job"));

  // A port held bound but not listening: a connection is refused there,
  // and no other test can take it meanwhile.
  const int held = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(held, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(getsockname(held, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string nobody = fmt::format("127.0.0.1:{}", ntohs(address.sin_port));
  auto [code, out] = RunMend(dir_, {"sim-learner", "--id", "alone", "--token-file", token_file_,
                                    "--lighthouse", nobody, "--set", "lighthouse_wait_ms=300"});
  close(held);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr(nobody));
}

TEST_F(LighthouseProcessTest, WrongTokenIsRefusedWithAReason) {
  StartLighthouse(LighthouseFlags("2000", "2000"));
  std::string wrong = dir_ + "/wrong-token";
  std::ofstream(wrong) << "this-is-not-the-job-token\n";
  Subprocess& learner = StartLearner("intruder", kFastLearner, wrong);
  auto exited = learner.Wait(kWait);
  ASSERT_TRUE(exited.ok()) << exited.status();
  ASSERT_TRUE(WIFEXITED(*exited));
  EXPECT_EQ(WEXITSTATUS(*exited), 3);
  std::ifstream log(dir_ + "/intruder.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("wrong job token"));
  json status = Status();
  ASSERT_FALSE(status.is_null()) << "the lighthouse must keep serving";
  bool rejected = false;
  for (const auto& event : status["events"]) rejected |= event["kind"] == "rejected";
  EXPECT_TRUE(rejected);
  EXPECT_TRUE(status["learners"].empty());
}

// Learners on the UDP control channel: the same rounds, and a lighthouse
// restart they ride over.
TEST_F(LighthouseProcessTest, UdpLearnersFormRoundsAndSurviveALighthouseRestart) {
  std::vector<std::string> lighthouse = LighthouseFlags("2000", "2000");
  lighthouse.insert(lighthouse.end(), {"--control-plane", "udp"});
  StartLighthouse(lighthouse);
  std::vector<std::string> flags = kFastLearner;
  flags.insert(flags.end(), {"--control-plane", "udp"});
  uint64_t before = StartThreeAndAwaitFullRound(flags);
  ASSERT_GT(before, 0u);
  std::string address = grpc_address_;
  ASSERT_TRUE(lighthouse_->Signal(SIGKILL).ok());
  ASSERT_TRUE(lighthouse_->Wait(kWait).ok());
  StartLighthouse(lighthouse, address);
  AwaitStatus(
      kWait,
      [&](const json& s) {
        return FindRound(s, {"a", "b", "c"}, before);
      },
      "a full round over UDP after the restart");
}

TEST_F(LighthouseProcessTest, KilledLighthouseRestartsAndRoundsResume) {
  StartLighthouse(LighthouseFlags("2000", "2000"));
  for (const char* id : {"a", "b", "c"}) StartLearner(id, kFastLearner);
  uint64_t before = 0;
  std::string instance;
  ASSERT_TRUE(AwaitStatus(
      kWait,
      [&](const json& s) {
        before = s["summary"]["latest_round_id"];
        instance = s["lighthouse_instance"];
        return before >= 3;
      },
      "three rounds before the restart"));
  std::string address = grpc_address_;
  ASSERT_TRUE(lighthouse_->Signal(SIGKILL).ok());
  ASSERT_TRUE(lighthouse_->Wait(kWait).ok());
  StartLighthouse(LighthouseFlags("2000", "2000"), address);
  AwaitStatus(
      kWait,
      [&](const json& s) {
        return s["lighthouse_instance"] != instance && FindRound(s, {"a", "b", "c"}, before) &&
               HasEvent(s, "registered", "a") && HasEvent(s, "registered", "b") &&
               HasEvent(s, "registered", "c");
      },
      "learners registered again and a full round above the old round ids");
  for (const auto& [id, learner] : learners_) EXPECT_TRUE(learner->running()) << id;
}

TEST_F(LighthouseProcessTest, LearnerLeavesOnSigterm) {
  StartLighthouse(LighthouseFlags("60000", "60000"));
  ASSERT_GT(StartThreeAndAwaitFullRound(), 0u);
  ASSERT_TRUE(learners_["c"]->Signal(SIGTERM).ok());
  auto exited = learners_["c"]->Wait(kWait);
  ASSERT_TRUE(exited.ok());
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0) << DescribeWaitStatus(*exited);
  AwaitStatus(
      kWait,
      [](const json& s) {
        const json* c = FindLearner(s, "c");
        return c && (*c)["state"] == "left" && FindRound(s, {"a", "b"});
      },
      "c left and rounds go on without waiting for it");
}

TEST_F(LighthouseProcessTest, HelpListsEveryOptionWithItsDefault) {
  auto [code, text] = RunMend(dir_, {"lighthouse", "--help"});
  EXPECT_EQ(code, 0);
  for (const char* option : {"--bind", "--http", "--min-learners", "--grace-window-ms",
                             "--heartbeat-timeout-ms", "--token-file", "--config", "--set"}) {
    EXPECT_THAT(text, HasSubstr(option));
  }
  EXPECT_THAT(text, HasSubstr("default: 2000"));
  auto [sim_code, sim_text] = RunMend(dir_, {"sim-learner", "--help"});
  EXPECT_EQ(sim_code, 0);
  for (const char* option : {"--lighthouse", "--id", "--step-ms", "--token-file", "--sync-every"}) {
    EXPECT_THAT(sim_text, HasSubstr(option));
  }
  EXPECT_THAT(sim_text, HasSubstr("=100"));  // --step-ms default
  // --version, from mend and from the lighthouse (mend lighthouse runs it).
  auto [version_code, version_text] = RunMend(dir_, {"--version"});
  EXPECT_EQ(version_code, 0);
  EXPECT_THAT(version_text, HasSubstr("mend 0."));
  auto [lighthouse_code, lighthouse_text] = RunMend(dir_, {"lighthouse", "--version"});
  EXPECT_EQ(lighthouse_code, 0);
  EXPECT_EQ(lighthouse_text, version_text);
}

TEST_F(LighthouseProcessTest, BadArgumentsExitNonZeroNamingTheProblem) {
  auto [code, text] = RunMend(dir_, {"sim-learner", "--id", "x", "--step-ms", "-5"});
  EXPECT_EQ(code, 2);  // a command line CLI11 refuses is a bad argument too
  EXPECT_THAT(text, HasSubstr("--step-ms"));
  auto [file_code, file_text] = RunMend(dir_, {"lighthouse", "--config", dir_ + "/nowhere.toml"});
  EXPECT_EQ(file_code, 2);
  EXPECT_THAT(file_text, HasSubstr("nowhere.toml"));
  auto [key_code, key_text] =
      RunMend(dir_, {"lighthouse", "--token-file", token_file_, "--set", "grace_window=5"});
  EXPECT_EQ(key_code, 2);
  EXPECT_THAT(key_text, HasSubstr("did you mean 'grace_window_ms'?"));
  auto [range_code, range_text] =
      RunMend(dir_, {"lighthouse", "--token-file", token_file_, "--grace-window-ms", "-5"});
  EXPECT_EQ(range_code, 2);
  EXPECT_THAT(range_text, HasSubstr("grace_window_ms = \"-5\""));
  auto [token_code, token_text] = RunMend(dir_, {"lighthouse", "--bind", "127.0.0.1:0"});
  EXPECT_EQ(token_code, 2);
  EXPECT_THAT(token_text, HasSubstr("no job token"));
}

}  // namespace
}  // namespace mend::testing_util
