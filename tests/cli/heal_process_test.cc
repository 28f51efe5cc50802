// Live healing with real processes: a `mend lighthouse`, learner a training
// on, learner b SIGKILLed mid-run and started again with the same id. The
// new b is behind, heals from a inside its first round (checksummed
// chunks), and from then on both hold bit-identical global state after
// every round they share (compared through the digests in the round
// diagnostics). The killed b's round is called off by the lighthouse once b
// is declared dead (heartbeat timeout 1 s), so a does not wait for it.
#include <sys/wait.h>

#include <fstream>
#include <map>

#include "cli/process_fixture.h"
#include "gmock/gmock.h"
#include "test_util/synthetic_corpus.h"

namespace mend {
namespace {

using json = nlohmann::json;

constexpr Micros kWait = 120 * kMicrosPerSecond;

class HealProcessTest : public testing_util::ProcessFixture {
 protected:
  std::unique_ptr<Subprocess> Train(const std::string& id, int shard, int64_t steps) {
    std::vector<std::string> argv = {
        MEND_BINARY, "train", "--mode", "diloco", "--id", id, "--shard", std::to_string(shard), "--shards", "2",
        "--steps", std::to_string(steps), "--dim", "16", "--layers", "1", "--batch", "4", "--corpus",
        dir_ + "/corpus", "--lighthouse", grpc_address_, "--token-file", token_file_, "--sync-every", "5",
        "--diagnostics-dir", dir_ + "/diagnostics", "--progress-json", "--progress-every", "1", "--set",
        "overlap_steps=2", "--set", "heartbeat_timeout_ms=1000", "--set", "collective_timeout_ms=5000"};
    auto child = Subprocess::Spawn({argv, {}, "pipe", dir_ + "/" + id + ".log", false});
    EXPECT_TRUE(child.ok()) << child.status();
    return std::move(*child);
  }

  // Reads progress lines until one reports `field` (step, rounds) at
  // `value` or more.
  static bool AwaitProgress(Subprocess& learner, const char* field, int64_t value) {
    while (true) {
      auto line = learner.ReadLine(kWait);
      if (!line.ok()) return false;
      json progress = json::parse(*line, nullptr, false);
      if (progress.is_object() && progress.value(field, int64_t{0}) >= value) return true;
    }
  }

  std::vector<json> Rounds(const std::string& id) {
    std::vector<json> rounds;
    std::ifstream in(dir_ + "/diagnostics/" + id + ".rounds.jsonl");
    for (std::string line; std::getline(in, line);) rounds.push_back(json::parse(line));
    return rounds;
  }
};

TEST_F(HealProcessTest, RestartedLearnerHealsAndMatchesBitForBit) {
  testing_util::WriteSyntheticFortunes(dir_ + "/corpus");
  StartLighthouse({"--min-learners", "1", "--grace-window-ms", "1000", "--heartbeat-timeout-ms", "1000"});
  auto a = Train("a", 0, 1'000'000);  // trains until told to stop
  auto b = Train("b", 1, 1'000'000);
  // Both hold the job's state before b dies: on a loaded machine b can run
  // rounds alone before a has even started (min-learners 1), and killing it
  // then would take the job's only copy of its state with it.
  ASSERT_TRUE(AwaitProgress(*a, "rounds", 1));
  ASSERT_TRUE(AwaitProgress(*b, "step", 20));
  b->Kill();
  const size_t b_rounds_before = Rounds("b").size();
  // The new b continues the job's schedule: after its heal it is on a's
  // step. Three rounds after that both are stopped.
  auto b2 = Train("b", 1, 1'000'000);
  ASSERT_TRUE(AwaitProgress(*b2, "rounds", 3));
  ASSERT_TRUE(b2->Signal(SIGTERM).ok());
  auto exited = b2->Wait(kWait);
  ASSERT_TRUE(exited.ok());
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0);
  ASSERT_TRUE(a->Signal(SIGTERM).ok());
  exited = a->Wait(kWait);
  ASSERT_TRUE(exited.ok());
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0);

  std::map<uint64_t, std::string> a_digest;
  for (const json& round : Rounds("a")) {
    if (round["ok"].get<bool>()) a_digest[round["round_id"].get<uint64_t>()] = round["global_sha256"];
  }
  std::vector<json> b_rounds = Rounds("b");
  ASSERT_GT(b_rounds.size(), b_rounds_before);
  bool healed = false;
  size_t shared = 0;
  for (size_t i = b_rounds_before; i < b_rounds.size(); ++i) {
    const json& round = b_rounds[i];
    if (!round["ok"].get<bool>()) continue;
    if (!healed) {
      // The new b's first completed round is a heal from a.
      ASSERT_TRUE(round["healed"].get<bool>()) << round.dump();
      EXPECT_EQ(round["heal_source"], "a");
      EXPECT_GT(round["heal_bytes"].get<uint64_t>(), 0u);
      // It started with nothing of the job's state: it took part with
      // weight 0 and went on from a's step.
      EXPECT_TRUE(round["fresh_join"].get<bool>());
      EXPECT_GE(round["heal_step"].get<uint64_t>(), 20u);
      healed = true;
    }
    // With a minimum quorum of 1 a round may go on without a (a heals in its
    // next one); every round both completed leaves them bit-identical.
    auto it = a_digest.find(round["round_id"].get<uint64_t>());
    if (it == a_digest.end()) continue;
    EXPECT_EQ(round["global_sha256"], it->second) << "round " << round["round_id"];
    ++shared;
  }
  EXPECT_TRUE(healed);
  EXPECT_GE(shared, 2u);
}

}  // namespace
}  // namespace mend
