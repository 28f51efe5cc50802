// Live healing with real processes: a `mend lighthouse`, learner a training
// on, learner b SIGKILLed mid-run and started again with the same id. The
// new b is behind, heals from a inside its first round (checksummed
// chunks), and from then on both hold bit-identical global state after
// every round they share (compared through the digests in the round
// diagnostics). The killed b's round is called off by the lighthouse once b
// is declared dead (heartbeat timeout 1 s), so a does not wait for it.
#include <sys/wait.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "cli/process_fixture.h"
#include "core/free_ports.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "mend/checkpoint.h"
#include "test_util/synthetic_corpus.h"

namespace mend {
namespace {

using json = nlohmann::json;

constexpr Micros kWait = 120 * kMicrosPerSecond;

class HealProcessTest : public testing_util::ProcessFixture {
 protected:
  // `group` = {size, rank, generation} for a rank of a multi-rank learner.
  std::unique_ptr<Subprocess> Train(const std::string& id, int shard, int64_t steps,
                                    std::array<int, 3> group = {1, 0, 0},
                                    const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {MEND_BINARY,
                                     "train",
                                     "--mode",
                                     "diloco",
                                     "--id",
                                     id,
                                     "--shard",
                                     std::to_string(shard),
                                     "--shards",
                                     "2",
                                     "--steps",
                                     std::to_string(steps),
                                     "--dim",
                                     "16",
                                     "--layers",
                                     "1",
                                     "--batch",
                                     "4",
                                     "--corpus",
                                     dir_ + "/corpus",
                                     "--lighthouse",
                                     grpc_address_,
                                     "--token-file",
                                     token_file_,
                                     "--sync-every",
                                     "5",
                                     "--diagnostics-dir",
                                     dir_ + "/diagnostics",
                                     "--progress-json",
                                     "--progress-every",
                                     "1",
                                     "--set",
                                     "overlap_steps=2",
                                     "--set",
                                     "heartbeat_timeout_ms=1000",
                                     "--set",
                                     "collective_timeout_ms=5000"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::vector<std::string> env;
    std::string name = id;
    if (group[0] > 1) {
      argv.insert(argv.end(), {"--group-size", std::to_string(group[0]), "--group-rank",
                               std::to_string(group[1])});
      argv.insert(argv.end(), {"--set", fmt::format("group_generation={}", group[2])});
      name = fmt::format("{}.{}.{}", id, group[1], group[2]);
    }
    // Progress goes to a file, read as it grows (AwaitProgress): a pipe
    // that the test does not read while it waits for another learner would
    // fill and stall this one (and its group).
    // A restarted learner appends to its predecessor's file: only what
    // follows is its progress.
    const std::string out = dir_ + "/" + name + ".out";
    std::error_code missing;
    const uintmax_t before = std::filesystem::file_size(out, missing);
    auto child = Subprocess::Spawn({argv, env, out, dir_ + "/" + name + ".log", false});
    EXPECT_TRUE(child.ok()) << child.status();
    if (!child.ok()) return nullptr;
    progress_[child->get()] = {out, missing ? 0 : static_cast<size_t>(before)};
    return std::move(*child);
  }

  // Waits until a progress line of `learner` reports `field` (step, rounds)
  // at `value` or more.
  bool AwaitProgress(Subprocess& learner, const char* field, int64_t value) {
    Progress& progress = progress_.at(&learner);
    return testing_util::WaitFor(kWait, [&]() {
      std::ifstream in(progress.path);
      in.seekg(static_cast<std::streamoff>(progress.offset));
      std::string line;
      while (std::getline(in, line)) {
        if (in.eof()) break;  // a line still being written: read it whole next time
        progress.offset += line.size() + 1;
        json parsed = json::parse(line, nullptr, false);
        if (parsed.is_object() && parsed.value(field, int64_t{0}) >= value) return true;
      }
      return false;
    });
  }

  // A learner's progress file and how much of it was read.
  struct Progress {
    std::string path;
    size_t offset = 0;
  };
  std::map<const Subprocess*, Progress> progress_;

  // A lighthouse that forms rounds of one learner, and learners a and b of
  // two ranks each (a.0, a.1, b.0, b.1); `a_extra`: more flags for a's ranks.
  // a's ranks meet in the lighthouse's store, b's in a store of their own
  // (b_store_, which b's rank 0 serves, again after a restart).
  std::array<std::unique_ptr<Subprocess>, 4> StartTwoGroupsOfTwo(
      const std::vector<std::string>& a_extra = {}) {
    testing_util::WriteSyntheticFortunes(dir_ + "/corpus");
    StartLighthouse(
        {"--min-learners", "1", "--grace-window-ms", "1000", "--heartbeat-timeout-ms", "1000"});
    auto port = FreeLoopbackPorts(1);
    EXPECT_TRUE(port.ok()) << port.status();
    b_store_ = {"--set", fmt::format("group_store=127.0.0.1:{}", port.ok() ? port->front() : 0)};
    return {Train("a", 0, 1'000'000, {2, 0, 0}, a_extra),
            Train("a", 0, 1'000'000, {2, 1, 0}, a_extra),
            Train("b", 1, 1'000'000, {2, 0, 0}, b_store_),
            Train("b", 1, 1'000'000, {2, 1, 0}, b_store_)};
  }

  std::vector<std::string> b_store_;

  // Whether learner a (its rank 0's progress) completes two more rounds.
  bool GoesOnAlone(Subprocess& a0) {
    int64_t done = 0;
    for (const json& round : Rounds("a.rank0")) done += round["ok"].get<bool>() ? 1 : 0;
    return AwaitProgress(a0, "rounds", done + 2);
  }

  // The last whole progress line's `field` of `learner` (-1: none yet).
  int64_t LastProgress(const Subprocess& learner, const char* field) {
    std::ifstream in(progress_.at(&learner).path);
    int64_t value = -1;
    for (std::string line; std::getline(in, line) && !in.eof();) {
      json parsed = json::parse(line, nullptr, false);
      if (parsed.is_object() && parsed.contains(field)) value = parsed[field].get<int64_t>();
    }
    return value;
  }

  // The rounds in `id`'s diagnostics; `growing`: the learner may be writing
  // its last line still, which is left for the next read.
  std::vector<json> Rounds(const std::string& id, bool growing = false) {
    std::vector<json> rounds;
    std::ifstream in(dir_ + "/diagnostics/" + id + ".rounds.jsonl");
    for (std::string line; std::getline(in, line);) {
      if (growing && in.eof()) break;
      rounds.push_back(json::parse(line));
    }
    return rounds;
  }

  // How many of `b`'s completed rounds, from its `from`-th on and at or after
  // its first heal there, `a` completed too (the same round id). With a
  // minimum quorum of 1, a round whose grace window closes before the other
  // learner joins goes on without it: on a loaded host that can be several
  // in a row, so a test awaits shared rounds, not rounds.
  size_t SharedAfterHeal(const std::string& b, size_t from, const std::string& a,
                         bool growing = false) {
    std::set<uint64_t> a_ids;
    for (const json& round : Rounds(a, growing)) {
      if (round["ok"].get<bool>()) a_ids.insert(round["round_id"].get<uint64_t>());
    }
    const std::vector<json> b_rounds = Rounds(b, growing);
    size_t shared = 0;
    bool healed = false;
    for (size_t i = from; i < b_rounds.size(); ++i) {
      if (!b_rounds[i]["ok"].get<bool>()) continue;
      healed = healed || b_rounds[i].value("healed", false);
      if (healed && a_ids.count(b_rounds[i]["round_id"].get<uint64_t>()) > 0) ++shared;
    }
    return shared;
  }

  // Waits until SharedAfterHeal(b, from, a) is `count` or more.
  bool AwaitShared(const std::string& b, size_t from, const std::string& a, size_t count) {
    return testing_util::WaitFor(kWait,
                                 [&]() { return SharedAfterHeal(b, from, a, true) >= count; });
  }
};

TEST_F(HealProcessTest, RestartedLearnerHealsAndMatchesBitForBit) {
  testing_util::WriteSyntheticFortunes(dir_ + "/corpus");
  StartLighthouse(
      {"--min-learners", "1", "--grace-window-ms", "1000", "--heartbeat-timeout-ms", "1000"});
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
  ASSERT_TRUE(AwaitShared("b", b_rounds_before, "a", 2))
      << "the restarted b did not complete two rounds with a after its heal";
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
    if (round["ok"].get<bool>())
      a_digest[round["round_id"].get<uint64_t>()] = round["global_sha256"];
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

// A learner stopped (SIGSTOP) for longer than the heartbeat timeout falls
// behind: the other trains on while its join waits (too few learners alive
// for a round), then both meet in one round, whose members' boundaries are
// far apart. Without a correction the stopped one's boundaries stayed that
// far behind for the rest of the job, the other's final merge met one of
// its ordinary rounds, and the two ended with different models. That round
// puts it on the job's step instead, and both end with the same model.
TEST_F(HealProcessTest, AStoppedLearnerTakesTheJobsStepAndBothEndWithTheSameModel) {
  testing_util::WriteSyntheticFortunes(dir_ + "/corpus");
  StartLighthouse({"--min-learners", "2", "--heartbeat-timeout-ms", "1000"});
  constexpr int64_t kSteps = 500;
  auto a = Train("a", 0, kSteps, {1, 0, 0}, {"--result-file", dir_ + "/a.json"});
  // b once a has registered (a trains from then): b then cannot start ahead
  // of a (on a loaded host b registered first once and trained on alone 40
  // steps, never to be a period behind).
  ASSERT_TRUE(AwaitProgress(*a, "step", 1));
  auto b = Train("b", 1, kSteps, {1, 0, 0}, {"--result-file", dir_ + "/b.json"});
  ASSERT_TRUE(AwaitProgress(*b, "rounds", 1));
  ASSERT_TRUE(b->Signal(SIGSTOP).ok());
  // a trains on without b (declared dead: its join waits) ten sync periods past b.
  const int64_t stopped_at = LastProgress(*b, "step");
  ASSERT_GT(stopped_at, 0);
  ASSERT_LT(stopped_at + 50, kSteps);
  ASSERT_TRUE(AwaitProgress(*a, "step", stopped_at + 50));
  ASSERT_TRUE(b->Signal(SIGCONT).ok());
  for (auto* learner : {&a, &b}) {
    auto exited = (*learner)->Wait(kWait);
    ASSERT_TRUE(exited.ok());
    EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0);
  }
  std::ifstream b_log(dir_ + "/b.log");
  const std::string log((std::istreambuf_iterator<char>(b_log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(log, testing::HasSubstr("becomes the job's step"));
  EXPECT_THAT(log, testing::Not(testing::HasSubstr("not merged")));
  std::map<std::string, json> results;
  for (const std::string id : {"a", "b"}) {
    std::ifstream in(dir_ + "/" + id + ".json");
    results[id] = json::parse(in, nullptr, false);
    ASSERT_TRUE(results[id].is_object()) << id;
  }
  EXPECT_EQ(results["a"]["eval_loss"], results["b"]["eval_loss"]);
  // The last round each completed (the final merge) left the same global state.
  std::string last[2];
  int i = 0;
  for (const std::string id : {"a", "b"}) {
    for (const json& round : Rounds(id)) {
      if (round["ok"].get<bool>()) last[i] = round["global_sha256"];
    }
    ++i;
  }
  EXPECT_FALSE(last[0].empty());
  EXPECT_EQ(last[0], last[1]);
}

// A SIGTERM while the learner waits for a round that cannot form (its
// lighthouse is gone for good) ends the wait at once: the learner stops and
// exits 0, where it waited out quorum_timeout_ms (10 minutes here: the test
// would fail at kWait).
TEST_F(HealProcessTest, ASigtermWhileWaitingForARoundStopsTheLearnerAtOnce) {
  testing_util::WriteSyntheticFortunes(dir_ + "/corpus");
  StartLighthouse({"--min-learners", "2", "--heartbeat-timeout-ms", "1000"});
  const std::vector<std::string> waits = {"--set", "quorum_timeout_ms=600000"};
  auto a = Train("a", 0, 1'000'000, {1, 0, 0}, waits);
  auto b = Train("b", 1, 1'000'000, {1, 0, 0}, waits);
  ASSERT_TRUE(AwaitProgress(*a, "rounds", 1));
  lighthouse_->Kill();
  for (auto* learner : {&a, &b}) {
    ASSERT_TRUE((*learner)->Signal(SIGTERM).ok());
    auto exited = (*learner)->Wait(kWait);
    ASSERT_TRUE(exited.ok()) << "a learner waited on for a round after SIGTERM";
    EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0);
  }
}

// A learner of two ranks loses one (SIGKILL): its other rank stops too (the
// group is the unit of failure) and leaves, learner a goes on alone; the
// group's launcher starts both ranks again, which heal slice by slice from
// a's ranks and from then on hold bit-identical global slices, and each
// group's two replicas the same parameters.
TEST_F(HealProcessTest, AGroupThatLostARankRestartsHealsSliceBySliceAndMatches) {
  auto [a0, a1, b0, b1] = StartTwoGroupsOfTwo();
  ASSERT_TRUE(AwaitProgress(*a0, "rounds", 1));
  ASSERT_TRUE(AwaitProgress(*b0, "step", 20));
  b1->Kill();
  // b's rank 0 notices (its gradient average or the group's round breaks)
  // and exits with an error instead of waiting.
  auto b0_exit = b0->Wait(kWait);
  ASSERT_TRUE(b0_exit.ok()) << "b's rank 0 kept running after b's rank 1 died";
  EXPECT_TRUE(WIFEXITED(*b0_exit) && WEXITSTATUS(*b0_exit) != 0);
  const size_t b_rounds_before[2] = {Rounds("b.rank0").size(), Rounds("b.rank1").size()};
  ASSERT_TRUE(GoesOnAlone(*a0));
  // The launcher restarts the group (a new generation of its keys).
  auto b0_2 = Train("b", 1, 1'000'000, {2, 0, 1}, b_store_);
  auto b1_2 = Train("b", 1, 1'000'000, {2, 1, 1}, b_store_);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(
        AwaitShared(fmt::format("b.rank{}", r), b_rounds_before[r], fmt::format("a.rank{}", r), 2))
        << "b's restarted rank " << r << " did not complete two rounds with a after its heal";
  }
  // Stopping one rank of a group stops the group after the same step.
  ASSERT_TRUE(b0_2->Signal(SIGTERM).ok());
  ASSERT_TRUE(a0->Signal(SIGTERM).ok());
  for (auto* learner : {&b0_2, &b1_2, &a0, &a1}) {
    auto exited = (*learner)->Wait(kWait);
    ASSERT_TRUE(exited.ok());
    EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0) << (learner == &b0_2   ? "b.0"
                                                                     : learner == &b1_2 ? "b.1"
                                                                     : learner == &a0   ? "a.0"
                                                                                        : "a.1")
                                                                 << " " << *exited;
  }
  // By round id: a's ranks' slices and parameters.
  std::map<uint64_t, json> a_rounds_by_id[2];
  for (int r = 0; r < 2; ++r) {
    for (const json& round : Rounds(fmt::format("a.rank{}", r))) {
      if (round["ok"].get<bool>()) a_rounds_by_id[r][round["round_id"].get<uint64_t>()] = round;
    }
  }
  size_t shared = 0;
  for (int r = 0; r < 2; ++r) {
    std::vector<json> b_rounds = Rounds(fmt::format("b.rank{}", r));
    bool healed = false;
    for (size_t i = b_rounds_before[r]; i < b_rounds.size(); ++i) {
      const json& round = b_rounds[i];
      if (!round["ok"].get<bool>()) continue;
      if (!healed && round.value("healed", false)) {
        EXPECT_EQ(round["heal_source"], "a");
        EXPECT_GT(round["heal_bytes"].get<uint64_t>(), 0u);
        healed = true;
      }
      auto it = a_rounds_by_id[r].find(round["round_id"].get<uint64_t>());
      if (!healed || it == a_rounds_by_id[r].end()) continue;
      // Slice r of the global state: the same in a's rank r and b's rank r.
      EXPECT_EQ(round["global_sha256"], it->second["global_sha256"])
          << "rank " << r << " round " << round["round_id"];
      ++shared;
    }
    EXPECT_TRUE(healed) << "rank " << r;
  }
  EXPECT_GE(shared, 4u);
  // Each group's replicas: equal after every round.
  for (const char* id : {"a", "b"}) {
    std::map<uint64_t, std::string> rank0;
    for (const json& round : Rounds(fmt::format("{}.rank0", id))) {
      if (round["ok"].get<bool>())
        rank0[round["round_id"].get<uint64_t>()] = round["parameters_sha256"];
    }
    for (const json& round : Rounds(fmt::format("{}.rank1", id))) {
      if (!round["ok"].get<bool>()) continue;
      auto it = rank0.find(round["round_id"].get<uint64_t>());
      if (it != rank0.end()) {
        EXPECT_EQ(round["parameters_sha256"], it->second) << id << " round " << round["round_id"];
      }
    }
  }
}

// A stopped rank (SIGSTOP: a hung host) takes its group out, not the job:
// the other learner's rounds go on without the group, and the group's other
// rank gives up on it at the collective timeout and leaves. Then a
// checkpoint asked of the other group's rank 1 (SIGUSR1) is written by its
// rank 0: the request rides on the next gradient average, and both ranks
// gather their slices after the same step.
TEST_F(HealProcessTest, AStoppedRankLeavesItsGroupOutNotTheJobStalled) {
  const std::string checkpoints = dir_ + "/a-checkpoints";
  auto [a0, a1, b0, b1] = StartTwoGroupsOfTwo({"--set", "checkpoint_dir=" + checkpoints});
  ASSERT_TRUE(AwaitProgress(*a0, "rounds", 1));
  ASSERT_TRUE(AwaitProgress(*b0, "rounds", 1));
  ASSERT_TRUE(b1->Signal(SIGSTOP).ok());
  auto b0_exit = b0->Wait(kWait);
  ASSERT_TRUE(b0_exit.ok()) << "b's rank 0 waited on for its stopped rank 1";
  EXPECT_TRUE(WIFEXITED(*b0_exit) && WEXITSTATUS(*b0_exit) != 0);
  ASSERT_TRUE(GoesOnAlone(*a0));
  // The lighthouse no longer counts b (it left when its rank 0 gave up).
  AwaitStatus(
      10 * kMicrosPerSecond,
      [](const json& status) {
        const json* b = FindLearner(status, "b");
        return b == nullptr || (*b)["state"] != "alive";
      },
      "learner b is no longer alive");
  b1->Kill();
  ASSERT_TRUE(a1->Signal(SIGUSR1).ok());
  std::string written;
  ASSERT_TRUE(testing_util::WaitFor(kWait,
                                    [&]() {
                                      std::error_code error;
                                      for (const auto& entry : std::filesystem::directory_iterator(
                                               checkpoints, error)) {
                                        if (entry.path().extension() == ".mend")
                                          written = entry.path().string();
                                      }
                                      return !written.empty();
                                    }))
      << "no checkpoint in " << checkpoints;
  auto verified = ReadCheckpoint(written, testing_util::kJobToken);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_NE(verified->Find("global/head.weight"), nullptr) << "the whole model, by parameter name";
  ASSERT_TRUE(a0->Signal(SIGTERM).ok());
  for (auto* learner : {&a0, &a1}) {
    auto exited = (*learner)->Wait(kWait);
    ASSERT_TRUE(exited.ok());
    EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0);
  }
}

}  // namespace
}  // namespace mend
