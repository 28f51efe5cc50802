// Learners whose model is sharded over their ranks (what FSDP2 and tensor
// parallelism make), without LibTorch: each rank holds its shard of "w"
// and the whole of "b" in plain vectors, in threads, against an in-process
// lighthouse on loopback. The rounds must give each value what a learner of
// one rank holding the whole model gets, bit for bit, and move only what
// each rank owns.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <span>
#include <thread>

#include "core/status_format.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "mend/learner_agent.h"
#include "mend/lighthouse.h"
#include "reducer/round_driver.h"
#include "test_util/driver_options.h"
#include "test_util/group_rank.h"
#include "test_util/job_config.h"
#include "test_util/wait.h"

namespace mend::reducer {
namespace {

constexpr char kShardedToken[] = "sharded-group-test-token-0123456789";
constexpr int64_t kRows = 5;
constexpr int64_t kColumns = 400;  // (a share of "w" dwarfs the ranks' agreements)
constexpr size_t kReplicated = 3;  // "b"

// The model "w" [5, 400] and "b" [3] as group rank `rank` of `ranks` holds
// it: FSDP2's Shard(0) of "w" (ceil(5 / ranks) rows a rank, the last ranks
// fewer or none) and "b" whole, on every rank (a parameter TP leaves whole).
// ranks == 0: the whole model, as every rank of a learner holds it (one
// rank's, or DDP's replicas).
class ShardedVectors final : public FlatParameters {
 public:
  ShardedVectors(int rank, int ranks, float start) : sharded_(ranks > 0), rank_(rank) {
    int64_t first = 0, rows = kRows;
    if (sharded_) {
      const int64_t chunk = (kRows + ranks - 1) / ranks;
      first = std::min<int64_t>(kRows, chunk * rank);
      rows = std::min<int64_t>(kRows, first + chunk) - first;
    }
    w_first_ = static_cast<size_t>(first * kColumns);
    w_rows_ = rows;
    values_[0].assign(static_cast<size_t>(rows * kColumns), start);
    values_[1].assign(kReplicated, start);
  }
  size_t count() const override { return 2; }
  const std::string& name(size_t i) const override { return names_[i]; }
  std::vector<int64_t> shape(size_t i) const override {
    return i == 0 ? std::vector<int64_t>{w_rows_, kColumns}
                  : std::vector<int64_t>{static_cast<int64_t>(kReplicated)};
  }
  size_t numel(size_t i) const override { return values_[i].size(); }
  uint64_t replica_key(size_t i) const override {
    return i == 0 && sharded_ ? static_cast<uint64_t>(rank_) + 1 : 0;
  }
  void CopyOut(size_t i, std::span<float> out) const override {
    if (!out.empty()) std::memcpy(out.data(), values_[i].data(), out.size_bytes());
  }
  void CopyIn(size_t i, std::span<const float> in) override {
    if (!in.empty()) std::memcpy(values_[i].data(), in.data(), in.size_bytes());
  }
  // One inner step of learner `learner` at step `s`, by each value's place
  // in the whole model, so that a shard trains as its part of the whole.
  void Train(int learner, int s) {
    for (size_t i = 0; i < 2; ++i) {
      const size_t first = i == 0 ? w_first_ : static_cast<size_t>(kRows * kColumns);
      for (size_t k = 0; k < values_[i].size(); ++k) {
        const int at = static_cast<int>(first + k);
        values_[i][k] += 0.01f * static_cast<float>((learner + 1) * ((at * 7 + s * 3) % 11) - 4);
      }
    }
  }
  // This rank's values of "w", with where they begin in the whole "w".
  const std::vector<float>& w() const { return values_[0]; }
  size_t w_first() const { return w_first_; }
  const std::vector<float>& b() const { return values_[1]; }

 private:
  const bool sharded_;
  const int rank_;
  size_t w_first_ = 0;
  int64_t w_rows_ = 0;
  std::vector<float> values_[2];
  std::vector<std::string> names_{"w", "b"};
};

struct ShardRun {
  Status error = OkStatus();
  ReducerStats stats;
  std::vector<float> w, b;
  size_t w_first = 0;
  std::vector<std::vector<float>> after_round;             // w then b, after each applied round
  std::map<uint64_t, std::vector<float>> by_round;         // the same, by round id
  std::map<uint64_t, std::vector<float>> global_by_round;  // every fragment's global slice
  std::vector<float> own_global, own_momentum;             // ExportOwn's, where a hook took them
  std::string described;
};

// Called with the driver, the learner and rank, before step s, and with s =
// steps before shutdown.
using DriverHook = std::function<void(RoundDriver&, int, int, int, ShardRun*)>;

// `before_step(s)`, when given, runs before step s.
void TrainShard(Config config, int learner, int rank, int ranks, int steps, ShardRun* run,
                const std::function<void(int)>& before_step = {}, const DriverHook& hook = {}) {
  config.group_rank = rank;
  auto agent = testing_util::StartGroupRank(config, kShardedToken, learner, rank);
  if (!agent.ok()) {
    run->error = agent.status();
    return;
  }
  FakeClock clock;
  auto parameters = std::make_unique<ShardedVectors>(rank, ranks, 1.0f);
  ShardedVectors* view = parameters.get();
  auto driver = RoundDriver::Create(mend::testing_util::DriverOptionsFor(config), **agent, clock,
                                    std::move(parameters), nullptr, 0);
  if (!driver.ok()) {
    run->error = driver.status();
    return;
  }
  for (int s = 0; s < steps && run->error.ok(); ++s) {
    if (before_step) before_step(s);
    if (hook) hook(**driver, learner, rank, s, run);
    clock.AdvanceMillis(50);
    view->Train(learner, s);
    const uint64_t rounds = (*driver)->stats().rounds;
    run->error = (*driver)->step(16);
    if ((*driver)->stats().rounds != rounds) {
      run->after_round.push_back(view->w());
      run->after_round.back().insert(run->after_round.back().end(), view->b().begin(),
                                     view->b().end());
      run->by_round[(*driver)->stats().last_round_id] = run->after_round.back();
      std::vector<float>& global = run->global_by_round[(*driver)->stats().last_round_id];
      for (int f = 0; f < (*driver)->fragments(); ++f) {
        std::span<const float> part = (*driver)->global(f);
        global.insert(global.end(), part.begin(), part.end());
      }
    }
  }
  if (hook && run->error.ok()) hook(**driver, learner, rank, steps, run);
  if (run->error.ok()) run->error = (*driver)->shutdown();
  run->stats = (*driver)->stats();
  run->w = view->w();
  run->b = view->b();
  run->w_first = view->w_first();
}

// Two learners of `group` ranks, each holding its shard of "w" when
// `sharded` (else the whole model); runs[learner][rank].
std::vector<std::vector<ShardRun>> RunShardedJob(Config config, int group, bool sharded, int steps,
                                                 const DriverHook& hook = {}) {
  auto server = LighthouseServer::Start(config, kShardedToken, *RealClock());
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return {};
  config.lighthouse = (*server)->grpc_address();
  config.group_size = group;
  std::vector<std::vector<ShardRun>> runs(2, std::vector<ShardRun>(config.group_size));
  std::vector<std::thread> threads;
  for (int l = 0; l < 2; ++l) {
    for (int r = 0; r < static_cast<int>(config.group_size); ++r) {
      threads.emplace_back([&runs, &hook, config, l, r, group, sharded, steps]() {
        TrainShard(config, l, r, sharded ? group : 0, steps,
                   &runs[static_cast<size_t>(l)][static_cast<size_t>(r)], {}, hook);
      });
    }
  }
  for (auto& thread : threads) thread.join();
  return runs;
}

// Synchronous rounds every 5 steps (an outer warm-up, then Nesterov), fp32:
// each value of a shard ends as the same value of the whole model does on
// a learner of one rank, bit for bit; after every round rank r's shard is
// the same on both learners, and "b" the same on every rank.
TEST(ShardedGroupTest, AShardedLearnersRoundsEqualAWholeModelsBitForBit) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  auto whole = RunShardedJob(config, 1, false, 20);
  ASSERT_EQ(whole.size(), 2u);
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(whole[l][0].error.ok()) << whole[l][0].error;
  for (int ranks : {2, 4}) {  // (4: the last rank's shard of "w" is empty)
    auto sharded = RunShardedJob(config, ranks, true, 20);
    ASSERT_EQ(sharded.size(), 2u);
    for (int l = 0; l < 2; ++l) {
      for (int r = 0; r < ranks; ++r) {
        const ShardRun& run = sharded[l][static_cast<size_t>(r)];
        ASSERT_TRUE(run.error.ok())
            << ranks << " ranks, learner " << l << " rank " << r << ": " << run.error;
        EXPECT_EQ(run.stats.rounds, 4u);
        const std::vector<float>& reference = whole[l][0].w;
        const std::vector<float> part(
            reference.begin() + static_cast<long>(run.w_first),
            reference.begin() + static_cast<long>(run.w_first) + static_cast<long>(run.w.size()));
        EXPECT_EQ(run.w, part) << ranks << " ranks, learner " << l << " rank " << r;
        EXPECT_EQ(run.b, whole[l][0].b) << ranks << " ranks, learner " << l << " rank " << r;
        EXPECT_EQ(run.after_round, sharded[0][static_cast<size_t>(r)].after_round)
            << "rank " << r << "'s pieces differ between the learners after a round";
      }
    }
  }
}

// Takes this rank's own outer state.
void ExportOwn(RoundDriver& driver, ShardRun* run) {
  run->own_global.resize(driver.OwnValues());
  run->own_momentum.resize(driver.OwnValues());
  StatusOr<std::string> described = driver.ExportOwn(run->own_global, run->own_momentum);
  if (!described.ok()) {
    run->error = described.status();
    return;
  }
  run->described = *described;
}

// Each rank's own outer state (what a sharded checkpoint saves, rank by
// rank): its shard of "w" and all of "b" (which it shares with the other
// ranks and holds a slice of), each value what the whole model's learner
// holds; imported into a new job's learners before their first step, the
// job goes on from it: exported again at once, the same values and round.
TEST(ShardedGroupTest, EachRankExportsItsOwnOuterStateAndImportsItBack) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  const DriverHook at_end = [](RoundDriver& driver, int, int, int step, ShardRun* run) {
    if (step == 20) ExportOwn(driver, run);
  };
  auto whole = RunShardedJob(config, 1, false, 20, at_end);
  auto sharded = RunShardedJob(config, 2, true, 20, at_end);
  ASSERT_EQ(whole.size(), 2u);
  ASSERT_EQ(sharded.size(), 2u);
  const ShardRun& reference = whole[0][0];
  ASSERT_TRUE(reference.error.ok()) << reference.error;
  ASSERT_EQ(reference.own_global.size(), static_cast<size_t>(kRows * kColumns) + kReplicated);
  for (int r = 0; r < 2; ++r) {
    const ShardRun& run = sharded[0][static_cast<size_t>(r)];
    ASSERT_TRUE(run.error.ok()) << run.error;
    ASSERT_EQ(run.own_global.size(), run.w.size() + run.b.size());
    for (const auto& [own, all] : {std::pair{&run.own_global, &reference.own_global},
                                   std::pair{&run.own_momentum, &reference.own_momentum}}) {
      const auto w_at = all->begin() + static_cast<long>(run.w_first);
      EXPECT_EQ(std::vector<float>(own->begin(), own->begin() + static_cast<long>(run.w.size())),
                std::vector<float>(w_at, w_at + static_cast<long>(run.w.size())))
          << "rank " << r << "'s shard of w";
      EXPECT_EQ(std::vector<float>(own->begin() + static_cast<long>(run.w.size()), own->end()),
                std::vector<float>(all->end() - static_cast<long>(kReplicated), all->end()))
          << "rank " << r << "'s b";
    }
    // Every value moved: the momentum is not all zero after Nesterov rounds.
    EXPECT_TRUE(std::any_of(run.own_momentum.begin(), run.own_momentum.end(),
                            [](float v) { return v != 0.0f; }));
  }
  // A new job: each rank imports its own state before its first step, and
  // exports it again at once.
  auto again = RunShardedJob(
      config, 2, true, 1, [&](RoundDriver& driver, int learner, int rank, int step, ShardRun* run) {
        if (step != 0) return;
        const ShardRun& saved = sharded[static_cast<size_t>(learner)][static_cast<size_t>(rank)];
        run->error = driver.ImportOwn(saved.described, saved.own_global, saved.own_momentum);
        if (run->error.ok()) ExportOwn(driver, run);
      });
  ASSERT_EQ(again.size(), 2u);
  for (int l = 0; l < 2; ++l) {
    for (int r = 0; r < 2; ++r) {
      const ShardRun& run = again[static_cast<size_t>(l)][static_cast<size_t>(r)];
      const ShardRun& saved = sharded[static_cast<size_t>(l)][static_cast<size_t>(r)];
      ASSERT_TRUE(run.error.ok()) << run.error;
      EXPECT_EQ(run.own_global, saved.own_global);
      EXPECT_EQ(run.own_momentum, saved.own_momentum);
      EXPECT_EQ(run.stats.steps, saved.stats.steps + 1) << "it went on at the exported step";
    }
  }
  // Bad input: buffers of another size are refused, naming the counts.
  auto refused = RunShardedJob(
      config, 2, true, 1, [&](RoundDriver& driver, int, int, int step, ShardRun* run) {
        if (step != 0) return;
        std::vector<float> two(2);
        const Status status = driver.ImportOwn(sharded[0][0].described, two, two);
        if (status.code() != StatusCode::kInvalidArgument ||
            status.message().find("this rank's") == std::string::npos) {
          run->error = InternalError(fmt::format("not refused as expected: {}", status));
        }
      });
  for (const auto& learner : refused) {
    for (const ShardRun& run : learner) EXPECT_TRUE(run.error.ok()) << run.error;
  }
}

// Each rank sends across racks what it owns: together the whole model's
// exchange once, not R times. Inside the group only the slices of "b" (held
// by every rank) travel after a round: no all-gather of the model, where a
// group of replicas (DDP) moves all of "w" after every round.
TEST(ShardedGroupTest, EachRankSendsOnlyWhatItOwnsAndTheGroupSharesOnlyReplicatedPieces) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  auto whole = RunShardedJob(config, 1, false, 20);
  auto replicas = RunShardedJob(config, 2, false, 20);
  auto sharded = RunShardedJob(config, 2, true, 20);
  ASSERT_EQ(whole.size(), 2u);
  ASSERT_EQ(replicas.size(), 2u);
  ASSERT_EQ(sharded.size(), 2u);
  const uint64_t w_bytes = kRows * kColumns * sizeof(float);
  uint64_t sent = 0;
  for (int r = 0; r < 2; ++r) {
    const ShardRun& run = sharded[0][static_cast<size_t>(r)];
    ASSERT_TRUE(run.error.ok()) << run.error;
    ASSERT_TRUE(replicas[0][static_cast<size_t>(r)].error.ok())
        << replicas[0][static_cast<size_t>(r)].error;
    EXPECT_EQ(run.stats.rounds, 4u);
    EXPECT_LT(run.stats.bytes_sent, whole[0][0].stats.bytes_sent);
    sent += run.stats.bytes_sent;
    // A replica's rank sends its half of the model after each of 4 rounds;
    // a shard's, its slice of "b": less than one round's half of "w" over
    // the whole job. (The state bytes leave out the ranks' agreements,
    // whose count depends on how long rank 0 polls for a quorum.)
    const ReducerStats& replica = replicas[0][static_cast<size_t>(r)].stats;
    EXPECT_GE(replica.group_state_bytes_sent, 4 * w_bytes / 2);
    EXPECT_GT(replica.group_bytes_sent, replica.group_state_bytes_sent);
    EXPECT_LT(run.stats.group_state_bytes_sent, w_bytes / 2)
        << "rank " << r << " moved about a copy of its shard or more inside the group";
    EXPECT_GT(run.stats.group_state_bytes_sent, 0u) << "rank " << r << " shared no slice of \"b\"";
  }
  // The two ranks' merges carry the whole model's values once, each with
  // its own headers and weights: less than twice the whole model's bytes.
  EXPECT_GE(sent, whole[0][0].stats.bytes_sent);
  EXPECT_LT(sent, 2 * whole[0][0].stats.bytes_sent);
}

// A learner that joins late, with none of the job's state, heals each rank's
// pieces from the same rank of a learner that has it (all slices at once),
// and from then on holds, rank by rank, what that learner holds after
// every round they share.
TEST(ShardedGroupTest, ALateShardedLearnerHealsEachRankFromTheSameRankOfTheSource) {
  Config config = testing_util::SynchronousJobConfig(1, 5);
  auto server = LighthouseServer::Start(config, kShardedToken, *RealClock());
  ASSERT_TRUE(server.ok()) << server.status();
  config.lighthouse = (*server)->grpc_address();
  config.group_size = 2;
  std::vector<std::vector<ShardRun>> runs(2, std::vector<ShardRun>(2));
  // Learner 0 trains alone for 12 steps, and its ranks wait at step 20
  // until the late learner steps: 8 rounds remain for the two to share.
  std::atomic<int> progress{0};
  std::atomic<bool> late_started{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r]() {
      TrainShard(config, 0, r, 2, 60, &runs[0][static_cast<size_t>(r)], [&](int s) {
        if (r == 0) progress.store(s);
        if (s == 20) {
          EXPECT_TRUE(
              testing_util::WaitFor(60 * kMicrosPerSecond, [&] { return late_started.load(); }));
        }
      });
    });
  }
  ASSERT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&] { return progress.load() >= 12; }));
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r]() {
      TrainShard(config, 1, r, 2, 30, &runs[1][static_cast<size_t>(r)],
                 [&](int) { late_started.store(true); });
    });
  }
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < 2; ++r) {
    const ShardRun& source = runs[0][static_cast<size_t>(r)];
    const ShardRun& late = runs[1][static_cast<size_t>(r)];
    ASSERT_TRUE(source.error.ok()) << source.error;
    ASSERT_TRUE(late.error.ok()) << late.error;
    EXPECT_GE(late.stats.heals, 1u) << "rank " << r;
    size_t shared = 0;
    for (const auto& [round, values] : late.by_round) {
      auto theirs = source.by_round.find(round);
      if (theirs == source.by_round.end()) continue;
      EXPECT_EQ(values, theirs->second) << "rank " << r << ", round " << round;
      shared++;
    }
    EXPECT_GE(shared, 2u) << "rank " << r << ": the two learners shared too few rounds";
  }
}

// A sharded group's checkpoints would gather the whole model on rank 0:
// refused at the start, by name, on every rank.
TEST(ShardedGroupTest, CheckpointDirWithAShardedModelIsRefusedByName) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  config.checkpoint_dir = testing_util::MakeTempDir();
  auto runs = RunShardedJob(config, 2, true, 5);
  ASSERT_EQ(runs.size(), 2u);
  for (const auto& learner : runs) {
    for (const ShardRun& run : learner) {
      EXPECT_EQ(run.error.code(), StatusCode::kFailedPrecondition) << run.error;
      EXPECT_NE(run.error.message().find("checkpoint_dir with a model sharded"), std::string::npos)
          << run.error;
    }
  }
}

// The round's other forms with sharded learners: streaming fragments,
// concurrent rounds, and the lossy codecs (int8's blocks and top-k's error
// feedback are a rank's slice's own). Each rank's global state (of every
// fragment) is the same on both learners after every round; where the
// outer math is elementwise and the codec lossless, every value ends as the
// whole model's does, bit for bit.
struct Variant {
  std::string name;
  std::function<void(Config&)> set;
  bool exact;  // every value is the whole model's learner's
};

class ShardedVariantTest : public testing::TestWithParam<Variant> {};

TEST_P(ShardedVariantTest, EachRanksPiecesAgreeAcrossLearnersAfterEveryRound) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  GetParam().set(config);
  auto sharded = RunShardedJob(config, 2, true, 20);
  ASSERT_EQ(sharded.size(), 2u);
  for (int l = 0; l < 2; ++l) {
    for (int r = 0; r < 2; ++r) {
      const ShardRun& run = sharded[static_cast<size_t>(l)][static_cast<size_t>(r)];
      ASSERT_TRUE(run.error.ok()) << "learner " << l << " rank " << r << ": " << run.error;
      EXPECT_GE(run.stats.rounds, 3u);
      EXPECT_FALSE(run.global_by_round.empty());
      for (const auto& [round, values] : run.global_by_round) {
        const auto& other = sharded[0][static_cast<size_t>(r)].global_by_round;
        if (other.count(round) == 0) continue;
        EXPECT_EQ(values, other.at(round)) << "rank " << r << " after round " << round;
      }
    }
    // "b", which both ranks hold, is the same on both at the end.
    EXPECT_EQ(sharded[static_cast<size_t>(l)][0].b, sharded[static_cast<size_t>(l)][1].b);
  }
  if (!GetParam().exact) return;
  auto whole = RunShardedJob(config, 1, false, 20);
  ASSERT_EQ(whole.size(), 2u);
  ASSERT_TRUE(whole[0][0].error.ok()) << whole[0][0].error;
  for (int r = 0; r < 2; ++r) {
    const ShardRun& run = sharded[0][static_cast<size_t>(r)];
    const auto w_at = whole[0][0].w.begin() + static_cast<long>(run.w_first);
    EXPECT_EQ(run.w, std::vector<float>(w_at, w_at + static_cast<long>(run.w.size())))
        << "rank " << r;
    EXPECT_EQ(run.b, whole[0][0].b) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Forms, ShardedVariantTest,
    testing::Values(Variant{"StreamingFragments", [](Config& c) { c.fragments = 2; }, true},
                    Variant{"ConcurrentRounds",
                            [](Config& c) {
                              c.concurrent_outer_step = true;
                              c.overlap_steps = 2;
                            },
                            true},
                    Variant{"Int8Codec",
                            [](Config& c) {
                              c.codec = CodecKind::kInt8;
                              c.codec_block_size = 64;
                            },
                            false},
                    Variant{"TopKCodec", [](Config& c) { c.codec = CodecKind::kTopK; }, false}),
    [](const testing::TestParamInfo<Variant>& variant) { return variant.param.name; });

}  // namespace
}  // namespace mend::reducer
