// Multi-rank learners without LibTorch: groups of ranks in threads, each
// rank a replica of the model in plain vectors that "trains" exactly as its
// group's other ranks do (what DDP inside a group guarantees), against an
// in-process lighthouse on loopback.
#include "reducer/learner_group.h"

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "dataplane/dataplane_fixture.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "learner/group_ranks.h"
#include "learner/lighthouse_rendezvous.h"
#include "mend/checkpoint.h"
#include "mend/lighthouse.h"
#include "nlohmann/json.hpp"
#include "reducer/round_driver.h"
#include "reducer/vector_parameters.h"
#include "test_util/driver_options.h"
#include "test_util/group_rank.h"
#include "test_util/job_config.h"
#include "test_util/lighthouse_outage.h"
#include "test_util/vector_moments.h"
#include "test_util/wait.h"

namespace mend::reducer {
namespace {

constexpr char kToken[] = "learner-group-test-token-0123456789";

// "w" (2 x 5) and "b" (3): 13 values, so that slices cut through "w" and
// are uneven for 2 and 3 ranks.
std::unique_ptr<VectorParameters> WAndB(float start, size_t w = 10) {
  return std::make_unique<VectorParameters>(
      std::vector<VectorParameters::Tensor>{{"w", {2, static_cast<int64_t>(w / 2)}}, {"b", {3}}},
      start);
}

// One inner step of learner `learner` at step `s`: different per value and
// step, so that momentum and slicing mistakes show.
void Train(VectorParameters& parameters, int learner, int s) {
  int k = 0;
  for (auto& values : parameters.values()) {
    for (float& v : values)
      v += 0.01f * static_cast<float>((learner + 1) * ((k++ * 7 + s * 3) % 11) - 4);
  }
}

struct RankRun {
  ReducerStats stats;
  std::vector<float> local;                              // the replica's parameters at the end
  std::vector<float> global;                             // this rank's slice of the global state
  std::vector<std::vector<float>> replicas_after_round;  // the parameters after each applied round
  std::vector<float> moments;                            // both moments at the end (with desloc)
  Status error = OkStatus();
};

// With `save_dir`, every rank asks for a checkpoint on demand after step
// steps / 2 (collective in a group): <save_dir>/learner-<learner>.mend.
// `before_step(s)` runs before the driver's step s + 1; `steps_done`, when
// given, follows the driver's step; every value starts at `start`.
void TrainRank(Config config, int learner, int rank, int steps, RankRun* run, size_t w = 10,
               const std::string& save_dir = "", const std::function<void(int)>& before_step = {},
               std::atomic<uint64_t>* steps_done = nullptr, int step_ms = 50,
               GroupStoreOpener group_store = nullptr, float start = 1.0f) {
  config.group_rank = rank;
  auto agent = testing_util::StartGroupRank(config, kToken, learner, rank, std::move(group_store));
  if (!agent.ok()) {
    run->error = agent.status();
    return;
  }
  FakeClock clock;
  auto parameters = WAndB(start, w);
  VectorParameters* view = parameters.get();
  std::unique_ptr<VectorMoments> moments;
  VectorMoments* moments_view = nullptr;
  if (config.desloc || config.heal_inner_optimizer) {
    moments = std::make_unique<VectorMoments>(w + 3);
    moments_view = moments.get();
  }
  auto driver = RoundDriver::Create(mend::testing_util::DriverOptionsFor(config), **agent, clock,
                                    std::move(parameters), std::move(moments), 0);
  if (!driver.ok()) {
    run->error = driver.status();
    return;
  }
  for (int s = 0; s < steps; ++s) {
    clock.AdvanceMillis(step_ms);
    Train(*view, learner, s);
    if (moments_view) {
      moments_view->Step([learner, s](size_t i) {
        return 0.01f * static_cast<float>((learner + 1) * ((static_cast<int>(i) * 5 + s) % 7) - 3);
      });
    }
    const uint64_t rounds = (*driver)->stats().rounds;
    if (before_step) before_step(s);
    if (Status status = (*driver)->step(16); !status.ok()) {
      run->error = status;
      return;
    }
    if (steps_done) steps_done->store((*driver)->stats().steps);
    if ((*driver)->stats().rounds != rounds) run->replicas_after_round.push_back(view->All());
    if (!save_dir.empty() && s + 1 == steps / 2) {
      if (Status saved =
              (*driver)->SaveCheckpoint(fmt::format("{}/learner-{}.mend", save_dir, learner));
          !saved.ok()) {
        run->error = saved;
        return;
      }
    }
  }
  run->error = (*driver)->shutdown();
  run->stats = (*driver)->stats();
  run->local = view->All();
  if (moments_view) run->moments = moments_view->All();
  auto global = (*driver)->global(0);
  run->global.assign(global.begin(), global.end());
}

// A lighthouse for `config`'s job; `config` then names it, for learners of
// `group_size` ranks.
std::unique_ptr<LighthouseServer> StartGroupJob(Config& config, int group_size) {
  auto server = LighthouseServer::Start(config, kToken, *RealClock());
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  config.lighthouse = (*server)->grpc_address();
  config.group_size = group_size;
  return std::move(*server);
}

// Learner `id`'s entry in the lighthouse's status (null when it has none).
nlohmann::json LearnerStatus(LighthouseServer& server, const std::string& id) {
  auto status = nlohmann::json::parse(server.StatusJson());
  for (const auto& learner : status["learners"]) {
    if (learner["id"] == id) return learner;
  }
  return nullptr;
}

std::string LearnerState(LighthouseServer& server, const std::string& id) {
  nlohmann::json learner = LearnerStatus(server, id);
  return learner.is_null() ? "" : learner["state"].get<std::string>();
}

// `learners` learners of `ranks` ranks each (learner l in racks[l], when
// given, its values starting at 1 + l * spread); runs[learner][rank].
std::vector<std::vector<RankRun>> RunJob(
    Config config, int learners, int ranks, int steps, const std::vector<std::string>& racks = {},
    size_t w = 10, const std::string& save_dir = "", float spread = 0,
    const std::function<void(Config&, int, int)>& adjust = {}) {
  auto server = StartGroupJob(config, ranks);
  std::vector<std::vector<RankRun>> runs(static_cast<size_t>(learners),
                                         std::vector<RankRun>(static_cast<size_t>(ranks)));
  std::vector<std::thread> threads;
  for (int l = 0; l < learners; ++l) {
    for (int r = 0; r < ranks; ++r) {
      Config mine = config;
      if (!racks.empty()) mine.rack = racks[static_cast<size_t>(l)];
      if (adjust) adjust(mine, l, r);
      threads.emplace_back([&runs, mine, l, r, steps, w, save_dir, spread]() {
        TrainRank(mine, l, r, steps, &runs[static_cast<size_t>(l)][static_cast<size_t>(r)], w,
                  save_dir, {}, nullptr, 50, nullptr, 1.0f + static_cast<float>(l) * spread);
      });
    }
  }
  for (auto& thread : threads) thread.join();
  return runs;
}

// A group's own store (what a TCPStore is in a real group), shared by its
// ranks' threads; counts what went through it.
class CountingGroupStore final : public RendezvousStore {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    Count(key, sets_);
    return store_.Set(key, value);
  }
  StatusOr<std::string> Get(const std::string& key, Micros timeout) override {
    Count(key, gets_);
    return store_.Get(key, timeout);
  }
  size_t sets(const std::string& kind) {
    std::lock_guard lock(mu_);
    return sets_[kind];
  }
  size_t gets(const std::string& kind) {
    std::lock_guard lock(mu_);
    return gets_[kind];
  }
  // A connection to it, as LearnerAgent::Start takes one.
  GroupStoreOpener Opener() {
    return [this]() -> StatusOr<std::unique_ptr<RendezvousStore>> {
      return std::make_unique<testing_util::StoreConnection>(*this);
    };
  }

 private:
  // By the part of the key after the group's prefix: "decision", "address", "ctx".
  void Count(const std::string& key, std::map<std::string, size_t>& counts) {
    for (const char* kind : {"decision/", "address/", "ctx/"}) {
      if (key.find(kind) != std::string::npos) {
        std::lock_guard lock(mu_);
        counts[std::string(kind, std::strlen(kind) - 1)]++;
      }
    }
  }
  testing_util::InProcessStore store_;
  std::mutex mu_;
  std::map<std::string, size_t> sets_;
  std::map<std::string, size_t> gets_;
};

// With a store of its own, a group's ranks meet and learn the rounds there:
// rank 0 publishes every decision in it, the others read them from it, and
// the rounds are those of the lighthouse's store.
TEST(LearnerGroupTest, AGroupsOwnStoreCarriesItsAddressesRendezvousAndDecisions) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  auto reference = RunJob(config, 2, 2, 20);
  auto server = StartGroupJob(config, 2);
  ASSERT_NE(server, nullptr);
  CountingGroupStore stores[2];
  std::vector<std::vector<RankRun>> runs(2, std::vector<RankRun>(2));
  std::vector<std::thread> threads;
  for (int l = 0; l < 2; ++l) {
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, l, r]() {
        TrainRank(config, l, r, 20, &runs[static_cast<size_t>(l)][static_cast<size_t>(r)], 10, "",
                  {}, nullptr, 50, stores[l].Opener());
      });
    }
  }
  for (auto& thread : threads) thread.join();
  for (int l = 0; l < 2; ++l) {
    for (int r = 0; r < 2; ++r) {
      const RankRun& run = runs[static_cast<size_t>(l)][static_cast<size_t>(r)];
      ASSERT_TRUE(run.error.ok()) << "learner " << l << " rank " << r << ": " << run.error;
      EXPECT_EQ(run.stats.rounds, 4u);
      EXPECT_EQ(run.local, reference[static_cast<size_t>(l)][static_cast<size_t>(r)].local)
          << l << "/" << r;
    }
    EXPECT_EQ(stores[l].sets("address"), 2u) << l;
    EXPECT_GE(stores[l].gets("address"), 1u) << l;   // rank 0 reads rank 1's
    EXPECT_GE(stores[l].sets("decision"), 4u) << l;  // rank 0's, one per round
    EXPECT_GE(stores[l].gets("decision"), 4u) << l;  // rank 1 reads them
    EXPECT_GE(stores[l].sets("ctx"), 2u) << l;       // the group's own communicator met there
  }
}

// The sharded exchange is the flat one, bit for bit (fp32: each value is
// merged by the same arithmetic, whoever owns its slice), and every replica
// of every group holds the same parameters after every round.
TEST(LearnerGroupTest, ShardedRoundsEqualTheFlatOnesBitForBit) {
  // Round 1 averages (the outer warm-up), rounds 2-4 take outer Nesterov 0.7 /
  // 0.9: every rank must read the round's step from the group's decision.
  Config config = testing_util::SynchronousJobConfig(2, 5);
  auto flat = RunJob(config, 2, 1, 20);
  for (int ranks : {2, 3}) {
    auto grouped = RunJob(config, 2, ranks, 20);
    for (int l = 0; l < 2; ++l) {
      std::vector<float> global;
      for (int r = 0; r < ranks; ++r) {
        const RankRun& run = grouped[static_cast<size_t>(l)][static_cast<size_t>(r)];
        ASSERT_TRUE(run.error.ok())
            << "ranks " << ranks << ", learner " << l << " rank " << r << ": " << run.error;
        EXPECT_EQ(run.stats.rounds, 4u);
        EXPECT_EQ(run.local, flat[static_cast<size_t>(l)][0].local)
            << ranks << " ranks, learner " << l << " rank " << r;
        EXPECT_EQ(run.replicas_after_round, grouped[0][0].replicas_after_round)
            << ranks << " ranks";
        global.insert(global.end(), run.global.begin(), run.global.end());
      }
      // Each rank holds its slice of the global state: together, the flat one.
      EXPECT_EQ(global, flat[static_cast<size_t>(l)][0].global) << ranks << " ranks";
    }
    // A slice's bytes on the wire: each rank sent about 1/R of the flat exchange.
    const uint64_t flat_bytes = flat[0][0].stats.bytes_sent;
    uint64_t group_bytes = 0;
    for (const RankRun& run : grouped[0]) {
      EXPECT_LT(run.stats.bytes_sent, flat_bytes);
      group_bytes += run.stats.bytes_sent;
    }
    EXPECT_GE(group_bytes, flat_bytes);  // each slice's own headers and weights on top
  }
}

// Streaming (2 fragments): a piece of a slice belongs to the fragment of
// the layer it was cut from, so the sharded rounds exchange what the flat
// ones do, bit for bit. With w = 2 (5 values) the second of 2 slices is
// b[1:3] alone: a fragment is empty on one rank and whole on the other.
TEST(LearnerGroupTest, ShardedStreamingRoundsEqualTheFlatOnesBitForBit) {
  Config config = testing_util::SynchronousJobConfig(2, 10);
  config.fragments = 2;
  for (size_t w : {size_t{2}, size_t{10}}) {
    auto flat = RunJob(config, 2, 1, 40, {}, w);
    for (int ranks : {2, 3}) {
      auto grouped = RunJob(config, 2, ranks, 40, {}, w);
      for (int l = 0; l < 2; ++l) {
        for (int r = 0; r < ranks; ++r) {
          const RankRun& run = grouped[static_cast<size_t>(l)][static_cast<size_t>(r)];
          ASSERT_TRUE(run.error.ok()) << "w " << w << ", ranks " << ranks << ", learner " << l
                                      << " rank " << r << ": " << run.error;
          EXPECT_EQ(run.stats.rounds, 8u);
          EXPECT_EQ(run.local, flat[static_cast<size_t>(l)][0].local)
              << "w " << w << ", " << ranks << " ranks, learner " << l << " rank " << r;
        }
      }
    }
  }
}

TEST(LearnerGroupTest, ConcurrentRoundsApplyAtTheSameStepOnEveryRank) {
  Config config = testing_util::ConcurrentJobConfig(
      2, 8, /*overlap_steps=*/0);  // tuned: rank 0's tau is the group's
  auto runs = RunJob(config, 2, 2, 32);
  for (const auto& group : runs) {
    for (const RankRun& run : group) {
      ASSERT_TRUE(run.error.ok()) << run.error;
      EXPECT_EQ(run.stats.rounds, 4u);
      EXPECT_EQ(run.stats.overlap_steps, group[0].stats.overlap_steps);
      EXPECT_EQ(run.local, group[0].local);
      EXPECT_EQ(run.replicas_after_round, group[0].replicas_after_round);
    }
  }
  // Both groups hold the same global state.
  for (size_t r = 0; r < 2; ++r) EXPECT_EQ(runs[0][r].global, runs[1][r].global);
}

// Concurrent rounds (tau = 1, H = 4), two learners of two ranks, quorum
// minimum 1. Learner 1 holds back its second boundary (step 8) until
// learner 0's round for it closed alone (after the grace window): rank 0
// of learner 1 sees that it was passed over and every rank of it trains on
// at step 9 rather than wait (learner 0 holds back its third boundary until
// learner 1 is past step 10 with its join waiting, so a group that waited
// would leave both stuck until the quorum timeout). Then the third round
// has both: learner 1's slices heal from learner 0's and its replicas stay
// equal.
// A rank gone (its driver and agent ended without shutdown, as when its
// process dies) fails the other rank's next group collective: the group is
// broken for good. Every later step and the shutdown return that first
// error, and the rank left waits for nothing more.
TEST(LearnerGroupTest, ARankGoneBreaksItsGroupForGood) {
  Config config = testing_util::SynchronousJobConfig(1, 4);
  auto server = StartGroupJob(config, 2);
  ASSERT_NE(server, nullptr);
  struct Rank {
    std::unique_ptr<LearnerAgent> agent;
    std::unique_ptr<RoundDriver> driver;
    Status error = OkStatus();
  };
  FakeClock clock;
  Rank ranks[2];
  // Both ranks join the group together and take its first round (step 4).
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r]() {
      Config mine = config;
      mine.group_rank = r;
      Rank& rank = ranks[r];
      auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(mine), kToken,
                                       {"learner-0", "", "", ""}, *RealClock());
      if (!agent.ok()) {
        rank.error = agent.status();
        return;
      }
      rank.agent = std::move(*agent);
      auto driver = RoundDriver::Create(mend::testing_util::DriverOptionsFor(mine), *rank.agent,
                                        clock, WAndB(1.0f), nullptr, 0);
      if (!driver.ok()) {
        rank.error = driver.status();
        return;
      }
      rank.driver = std::move(*driver);
      for (int s = 0; s < 4 && rank.error.ok(); ++s) rank.error = rank.driver->step(16);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const Rank& rank : ranks) ASSERT_TRUE(rank.error.ok()) << rank.error;
  ASSERT_EQ(ranks[0].driver->stats().rounds, 1u);
  ranks[1].driver.reset();
  ranks[1].agent.reset();
  // Rank 0's next round (step 8) needs rank 1's slice.
  Status error = OkStatus();
  for (int s = 4; s < 12 && error.ok(); ++s) error = ranks[0].driver->step(16);
  ASSERT_FALSE(error.ok()) << "rank 0 went on without its group's other rank";
  EXPECT_EQ(ranks[0].driver->stats().rounds, 1u);
  const Status again = ranks[0].driver->step(16);
  EXPECT_EQ(again.code(), error.code());
  EXPECT_EQ(again.message(), error.message());
  const Status shutdown = ranks[0].driver->shutdown();
  EXPECT_EQ(shutdown.message(), error.message());
}

TEST(LearnerGroupTest, AGroupPassedOverTrainsOnAsOneAndJoinsTheNextRound) {
  Config config = testing_util::ConcurrentJobConfig(1, 4, /*overlap_steps=*/1);
  config.grace_window_ms = 5000;
  config.quorum_timeout_ms = 30000;
  auto server = StartGroupJob(config, 2);
  ASSERT_NE(server, nullptr);
  std::vector<std::vector<RankRun>> runs(2, std::vector<RankRun>(2));
  std::atomic<uint64_t> steps[2][2] = {};
  auto latest_round = [&]() {
    return nlohmann::json::parse(server->StatusJson())["summary"]["latest_round_id"]
        .get<uint64_t>();
  };
  auto hold = [&](int learner, int s) {
    if (s == 3) {  // both learners alive before the first round
      EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
        return LearnerState(*server, "learner-0") != "" && LearnerState(*server, "learner-1") != "";
      }));
    }
    if (learner == 1 && s == 7) {
      EXPECT_TRUE(
          testing_util::WaitFor(60 * kMicrosPerSecond, [&]() { return latest_round() >= 2; }));
    }
    if (learner == 0 && s == 11) {
      EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
        return steps[1][0] >= 10 && steps[1][1] >= 10 &&
               LearnerState(*server, "learner-1") == "waiting";
      }));
    }
  };
  std::vector<std::thread> threads;
  for (int l = 0; l < 2; ++l) {
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, l, r]() {
        TrainRank(
            config, l, r, 12, &runs[static_cast<size_t>(l)][static_cast<size_t>(r)], 10, "",
            [&, l](int s) { hold(l, s); }, &steps[l][r]);
      });
    }
  }
  for (auto& thread : threads) thread.join();
  for (int l = 0; l < 2; ++l) {
    for (const RankRun& run : runs[static_cast<size_t>(l)]) {
      ASSERT_TRUE(run.error.ok()) << "learner " << l << ": " << run.error;
      EXPECT_EQ(run.stats.failed_rounds, 0u) << "learner " << l;
      EXPECT_EQ(run.local, runs[static_cast<size_t>(l)][0].local) << "learner " << l;
      EXPECT_EQ(run.replicas_after_round, runs[static_cast<size_t>(l)][0].replicas_after_round);
    }
  }
  for (const RankRun& run : runs[1]) {
    EXPECT_EQ(run.stats.passed_over, 1u);
    EXPECT_EQ(run.stats.rounds, 2u);  // rounds 1 and 3
    EXPECT_GE(run.stats.heals, 1u);
  }
  EXPECT_EQ(runs[0][0].stats.rounds, 3u);
  // Round 3 was both learners' last step: the same global state.
  for (size_t r = 0; r < 2; ++r) EXPECT_EQ(runs[1][r].global, runs[0][r].global) << "rank " << r;
}

// Two learners of two ranks, each group with a store of its own, concurrent
// rounds (H = 4, tau = 1) with train_through_lighthouse_outage. The
// lighthouse goes down once every rank is past step 8 and comes back once
// every rank has trained past step 16 (or after 60 s: a group that waited
// for it at boundary + tau would hold its ranks below step 16, and the test
// fails then instead of waiting out the quorum timeout); the ranks wait for
// it at step 20, so that rounds go on with it while they train (40 steps). The ranks learn the
// rounds from their group's store, so no decision is lost with the
// lighthouse's; the new lighthouse's rounds have prefixes of their own, so
// no rank's slice can meet keys of the old one's round of the same id. Once
// it is back, the pending joins form a round: every group's replicas stay
// equal and both groups end with the same global state.
TEST(LearnerGroupTest, AGroupTrainsOnWhileTheLighthouseIsDown) {
  Config config = testing_util::ConcurrentJobConfig(2, 4, /*overlap_steps=*/1);
  config.heartbeat_timeout_ms = 1000;
  config.quorum_timeout_ms = 600000;
  config.train_through_lighthouse_outage = true;
  // What CheckConfig asks for; the ranks use the in-process stores below.
  config.group_store = "127.0.0.1:29500";
  config.group_size = 2;
  testing_util::LighthouseOutage outage(config, kToken);
  CountingGroupStore stores[2];
  std::vector<std::vector<RankRun>> runs(2, std::vector<RankRun>(2));
  std::atomic<uint64_t> steps[2][2] = {};
  auto every_rank_past = [&](uint64_t step) {
    for (auto& learner : steps) {
      for (auto& rank : learner) {
        if (rank.load() < step) return false;
      }
    }
    return true;
  };
  auto hold = [&](int s) {
    if (s == 3) {  // both learners registered before the first round
      EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
        return outage.WithServer([](LighthouseServer* server) {
          return LearnerState(*server, "learner-0") != "" &&
                 LearnerState(*server, "learner-1") != "";
        });
      }));
    }
    if (s == 9) {
      EXPECT_TRUE(
          testing_util::WaitFor(60 * kMicrosPerSecond, [&]() { return every_rank_past(8); }));
      outage.TakeDown([&]() { return every_rank_past(16); });
    }
    if (s == 20) {  // rounds go on with the new lighthouse while they train:
      // the join that waited through the outage forms its round first
      EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
        return outage.up_again() && outage.LatestRoundId() > outage.last_round_before();
      }));
    }
  };
  std::vector<std::thread> threads;
  for (int l = 0; l < 2; ++l) {
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, l, r]() {
        TrainRank(config, l, r, 40, &runs[static_cast<size_t>(l)][static_cast<size_t>(r)], 10, "",
                  hold, &steps[l][r], 50, stores[l].Opener());
      });
    }
  }
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(outage.taken_down());
  outage.Join();
  const uint64_t last_round_before = outage.last_round_before();
  EXPECT_TRUE(outage.trained_on()) << "a group waited for the lighthouse at boundary + tau";
  for (int l = 0; l < 2; ++l) {
    const auto& group = runs[static_cast<size_t>(l)];
    for (const RankRun& run : group) {
      ASSERT_TRUE(run.error.ok()) << "learner " << l << ": " << run.error;
      EXPECT_GE(run.stats.passed_over, 1u) << "learner " << l;
      EXPECT_EQ(run.local, group[0].local) << "learner " << l;
      EXPECT_EQ(run.replicas_after_round, group[0].replicas_after_round) << "learner " << l;
    }
    EXPECT_GE(stores[l].sets("decision"), 1u) << l;
  }
  // Rounds resumed on the new lighthouse (the join that waited through the
  // outage formed one), and both groups hold the last one. A later round
  // is not certain here: these steps take no time, so a group whose rank 0
  // hears of that round only after its ranks passed the remaining
  // boundaries skips them all (it trains on, as it should); the other's
  // join is then called off at the end, as too few learners are left.
  EXPECT_GE(runs[0][0].stats.rounds, last_round_before + 1);
  EXPECT_GE(runs[0][0].stats.last_round_id, last_round_before + 1);
  EXPECT_EQ(runs[0][0].stats.last_round_id, runs[1][0].stats.last_round_id);
  for (size_t r = 0; r < 2; ++r) EXPECT_EQ(runs[0][r].global, runs[1][r].global) << "rank " << r;
}

// A slow rank makes its group slow to the lighthouse, even where nothing
// inside the group waits for it (here the ranks' clocks are their own):
// each round the ranks share their mean step time, and rank 0's
// heartbeats carry the slowest rank's.
TEST(LearnerGroupTest, AGroupReportsItsSlowestRanksStepTime) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  auto server = StartGroupJob(config, 2);
  ASSERT_NE(server, nullptr);
  auto median_step_ms = [&](const std::string& id) {
    nlohmann::json learner = LearnerStatus(*server, id);
    return learner.is_null() ? -1.0 : learner["median_step_ms"].get<double>();
  };
  bool slow_seen = false, fast_seen = false;
  auto check = [&](int s) {
    if (s != 18) return;  // after three rounds, before anyone leaves
    slow_seen = testing_util::WaitFor(30 * kMicrosPerSecond,
                                      [&]() { return median_step_ms("learner-0") >= 300; });
    fast_seen = median_step_ms("learner-1") < 100;
  };
  std::vector<std::vector<RankRun>> runs(2, std::vector<RankRun>(2));
  std::vector<std::thread> threads;
  for (int l = 0; l < 2; ++l) {
    for (int r = 0; r < 2; ++r) {
      std::function<void(int)> hook;
      if (l == 1 && r == 0) hook = check;
      threads.emplace_back([&, l, r, hook]() {
        TrainRank(config, l, r, 20, &runs[static_cast<size_t>(l)][static_cast<size_t>(r)], 10, "",
                  hook, nullptr,
                  l == 0 && r == 1 ? 400 : 50);  // learner 0's rank 1 is 8x slower
      });
    }
  }
  for (auto& thread : threads) thread.join();
  for (const auto& learner : runs) {
    for (const RankRun& run : learner) ASSERT_TRUE(run.error.ok()) << run.error;
  }
  EXPECT_TRUE(slow_seen) << "learner-0's median step: " << median_step_ms("learner-0") << " ms";
  EXPECT_TRUE(fast_seen);
}

// 4 learners in 2 racks: merged inside each rack first, then across racks
// between one learner per rack, then back inside the rack. For fp32 the
// result is the flat merge's bit for bit (the flat sum adds by rack too:
// the same operations in the same order), with racks of one size (the
// cross-rack merge by columns), racks whose name order is not the members'
// order, and uneven racks (one representative each, lone members); every
// member ends with the same bits for a lossy codec too; the cross-rack
// bytes (counted per peer) halve.
TEST(LearnerGroupTest, RackAwareMergeSendsHalfTheCrossRackBytesAndAgreesEverywhere) {
  const std::vector<std::string> racks = {"rack-a", "rack-a", "rack-b", "rack-b"};
  Config config = testing_util::SynchronousJobConfig(4, 5);
  constexpr size_t kValues =
      20000;  // so that the model, not the weights beside it, is what travels
  for (const auto& layout :
       {racks, std::vector<std::string>{"rack-b", "rack-a", "rack-b", "rack-a"},
        std::vector<std::string>{"rack-b", "rack-a", "rack-a", "rack-c"}}) {
    config.rack_aware = false;
    auto flat = RunJob(config, 4, 1, 20, layout, kValues);
    config.rack_aware = true;
    auto hierarchical = RunJob(config, 4, 1, 20, layout, kValues);
    uint64_t flat_cross = 0, hierarchical_cross = 0;
    const std::string which = fmt::format("racks {}", fmt::join(layout, ","));
    for (int l = 0; l < 4; ++l) {
      const RankRun& f = flat[static_cast<size_t>(l)][0];
      const RankRun& h = hierarchical[static_cast<size_t>(l)][0];
      ASSERT_TRUE(f.error.ok()) << which << ": " << f.error;
      ASSERT_TRUE(h.error.ok()) << which << ": " << h.error;
      EXPECT_EQ(h.stats.rounds, 4u);
      EXPECT_EQ(h.global, f.global) << which << ", learner " << l;  // bit for bit
      EXPECT_EQ(h.replicas_after_round, f.replicas_after_round) << which << ", learner " << l;
      flat_cross += f.stats.cross_rack_bytes_sent;
      hierarchical_cross += h.stats.cross_rack_bytes_sent;
    }
    EXPECT_GT(hierarchical_cross, 0u) << which;
    if (layout == racks) {
      // (Less 4 KiB: the rack-aware merge gathers the members' norms
      // directly between all of them, beside its reduction through the
      // racks: 24 bytes to each of the two members in the other rack, a
      // member a round, which the flat merge carries beside its weights;
      // and on the secure data plane each piece carries a 16-byte tag, of
      // which the rack-aware merge sends more, in its two stages.)
      EXPECT_LE(2 * hierarchical_cross, flat_cross + 4096)
          << hierarchical_cross << " vs " << flat_cross;
    }
  }
  config.rack_aware = true;
  // Through a lossy codec too, every member ends with the same bits.
  config.codec = CodecKind::kInt8;
  auto coded = RunJob(config, 4, 1, 20, racks);
  for (const auto& learner : coded) {
    ASSERT_TRUE(learner[0].error.ok()) << learner[0].error;
    EXPECT_EQ(learner[0].global, coded[0][0].global);
  }
  // And with learners of 2 ranks: each slice merges by rack.
  config.codec = CodecKind::kFp32;
  auto grouped = RunJob(config, 4, 2, 20, racks);
  for (const auto& learner : grouped) {
    for (size_t r = 0; r < 2; ++r) {
      ASSERT_TRUE(learner[r].error.ok()) << learner[r].error;
      EXPECT_EQ(learner[r].global, grouped[0][r].global);
      EXPECT_EQ(learner[r].local, learner[0].local);
    }
  }
}

// A learner of 2 ranks writes its checkpoints as one file of the whole
// model (its ranks gather their slices); learners of 3 ranks and of 1 rank
// resume from it, each rank taking its own slice.
TEST(LearnerGroupTest, AGroupsCheckpointIsOneFileThatAnyGroupSizeResumesFrom) {
  const std::string dir = testing_util::MakeTempDir();
  Config config = testing_util::SynchronousJobConfig(2, 5);
  config.checkpoint_dir = dir;
  config.checkpoint_every_rounds = 2;
  auto trained = RunJob(config, 2, 2, 20);
  std::vector<float> global;  // round 4's, the slices together
  for (const RankRun& run : trained[0]) {
    ASSERT_TRUE(run.error.ok()) << run.error;
    EXPECT_EQ(run.stats.rounds, 4u);
    global.insert(global.end(), run.global.begin(), run.global.end());
  }
  uint64_t written = 0;
  for (const auto& learner : trained) {
    for (const RankRun& run : learner) written += run.stats.checkpoints;
  }
  EXPECT_EQ(written, 2u);  // rounds 2 and 4, by one rank of one learner
  for (int ranks : {3, 1}) {
    auto resumed = RunJob(config, 2, ranks, 0);
    for (const auto& learner : resumed) {
      std::vector<float> slices;
      for (const RankRun& run : learner) {
        ASSERT_TRUE(run.error.ok()) << run.error;
        EXPECT_EQ(run.stats.resumed_from_round, 4u);
        EXPECT_EQ(run.local, trained[0][0].local)
            << ranks << " ranks";  // every replica: round 4's model
        slices.insert(slices.end(), run.global.begin(), run.global.end());
      }
      EXPECT_EQ(slices, global) << ranks << " ranks";
    }
  }
  std::filesystem::remove_all(dir);
}

// A synchronous job of 2 learners of 2 ranks (a round every 5 steps) that
// checkpoints every other round into `dir`.
Config CheckpointingJob(const std::string& dir) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  config.checkpoint_dir = dir;
  config.checkpoint_every_rounds = 2;
  return config;
}

// Its first 20 steps: checkpoints of rounds 2 and 4.
void WriteRounds2And4(const Config& config) {
  for (const auto& learner : RunJob(config, 2, 2, 20)) {
    for (const RankRun& run : learner) ASSERT_TRUE(run.error.ok()) << run.error;
  }
}

// A group's ranks list checkpoint_dir at different times, and another
// learner may write a newer checkpoint in between (seen: a restarted group
// failing with "resumed from different states (rank 0: round 46, this
// rank: round 48)"). Every rank resumes from the round rank 0 found. Here
// rank 1 sees round 4, which rank 0 did not (it listed before round 4 was
// written): both resume from round 2.
TEST(LearnerGroupTest, AGroupsRanksResumeFromTheCheckpointRank0Found) {
  const std::string dir = testing_util::MakeTempDir();
  Config config = CheckpointingJob(dir);
  ASSERT_NO_FATAL_FAILURE(WriteRounds2And4(config));
  const std::string before = testing_util::MakeTempDir();  // rank 0's view: round 2 only
  CheckpointDirectory written(dir, 3);
  std::filesystem::copy_file(written.PathOf(2), CheckpointDirectory(before, 3).PathOf(2));
  ASSERT_TRUE(std::filesystem::exists(written.PathOf(4)));
  // Rank 0 found round 2; then none (every rank starts fresh).
  const std::string empty = testing_util::MakeTempDir();
  for (const auto& seen : {std::pair{before, 2u}, std::pair{empty, 0u}}) {
    const std::string& rank0_dir = seen.first;
    const uint64_t round = seen.second;
    auto resumed = RunJob(config, 2, 2, 0, {}, 10, "", 0, [&](Config& mine, int, int rank) {
      if (rank == 0) mine.checkpoint_dir = rank0_dir;
    });
    for (const auto& learner : resumed) {
      for (const RankRun& run : learner) {
        ASSERT_TRUE(run.error.ok()) << run.error;
        EXPECT_EQ(run.stats.resumed_from_round, round) << "rank 0 in " << rank0_dir;
      }
    }
  }
  for (const std::string& d : {dir, before, empty}) std::filesystem::remove_all(d);
}

// Ranks told to resume from different files (resume_from): every rank
// fails, and the error names each rank's round, so that it says which rank
// differed (rank 0's error used to give its own round twice).
TEST(LearnerGroupTest, RanksResumingFromDifferentFilesFailNamingEachRanksRound) {
  const std::string dir = testing_util::MakeTempDir();
  Config config = CheckpointingJob(dir);
  ASSERT_NO_FATAL_FAILURE(WriteRounds2And4(config));
  const CheckpointDirectory written(dir, 3);
  config.checkpoint_dir.clear();
  auto resumed = RunJob(config, 2, 2, 0, {}, 10, "", 0, [&](Config& mine, int, int rank) {
    mine.resume_from = written.PathOf(rank == 0 ? 2 : 4);
  });
  for (const auto& learner : resumed) {
    for (const RankRun& run : learner) {
      EXPECT_EQ(run.error.code(), StatusCode::kFailedPrecondition) << run.error;
      EXPECT_THAT(run.error.message(),
                  testing::HasSubstr("resumed from different states (rank 0: round 2, rank 1: "
                                     "round 4)"));
    }
  }
  std::filesystem::remove_all(dir);
}

// Streaming (2 fragments) with checkpoints: the file a group of 2 ranks
// writes (its ranks put each fragment's pieces back in slice order, then
// gather the slices) holds what a learner of 1 rank writes, tensor for
// tensor; groups of 3 and 1 ranks resume from it.
TEST(LearnerGroupTest, AStreamingGroupsCheckpointEqualsTheFlatOneAndAnyGroupSizeResumesFromIt) {
  Config config = testing_util::SynchronousJobConfig(2, 10);
  config.fragments = 2;
  config.checkpoint_every_rounds = 3;
  std::vector<Checkpoint> written;
  for (int ranks : {1, 2}) {
    const std::string dir = testing_util::MakeTempDir();
    config.checkpoint_dir = dir;
    for (const auto& learner : RunJob(config, 2, ranks, 30)) {
      for (const RankRun& run : learner) ASSERT_TRUE(run.error.ok()) << run.error;
    }
    auto saved = CheckpointDirectory(dir, 3, kToken).LoadLatest();
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_EQ(saved->meta.round_id, 6u);
    written.push_back(*saved);
    if (ranks == 1) std::filesystem::remove_all(dir);
  }
  ASSERT_EQ(written[0].tensors.size(), written[1].tensors.size());
  for (const CheckpointTensor& tensor : written[0].tensors) {
    const CheckpointTensor* grouped = written[1].Find(tensor.name);
    ASSERT_NE(grouped, nullptr) << tensor.name;
    EXPECT_EQ(grouped->values, tensor.values) << tensor.name;
  }
  std::vector<float> model = written[1].Find("global/w")->values;
  const std::vector<float>& b = written[1].Find("global/b")->values;
  model.insert(model.end(), b.begin(), b.end());
  for (int ranks : {3, 1}) {
    for (const auto& learner : RunJob(config, 2, ranks, 0)) {
      for (const RankRun& run : learner) {
        ASSERT_TRUE(run.error.ok()) << run.error;
        EXPECT_EQ(run.stats.resumed_from_round, 6u);
        EXPECT_EQ(run.local, model) << ranks << " ranks";
      }
    }
  }
  std::filesystem::remove_all(config.checkpoint_dir);
}

// A checkpoint on demand is collective in a group: every rank asks for it
// at the same step, and the file group rank 0 writes holds what a learner
// of one rank writes at that step (streaming, so the fragments' pieces are
// put back in order), tensor for tensor.
TEST(LearnerGroupTest, ACheckpointOnDemandIsCollectiveAndEqualsTheFlatOne) {
  Config config = testing_util::SynchronousJobConfig(2, 10);
  config.fragments = 2;
  std::map<int, Checkpoint> saved;
  for (int ranks : {1, 2, 3}) {
    const std::string dir = testing_util::MakeTempDir();
    for (const auto& learner : RunJob(config, 2, ranks, 26, {}, 10, dir)) {
      for (const RankRun& run : learner)
        ASSERT_TRUE(run.error.ok()) << ranks << " ranks: " << run.error;
    }
    auto read = ReadCheckpoint(dir + "/learner-0.mend", kToken);
    ASSERT_TRUE(read.ok()) << read.status();
    // Saved at step 13, it holds the state of the round at step 10 and says so.
    EXPECT_EQ(read->meta.step, 10u);
    EXPECT_EQ(read->meta.round_id, 2u);  // rounds at steps 5 and 10
    saved[ranks] = *read;
    std::filesystem::remove_all(dir);
  }
  for (int ranks : {2, 3}) {
    ASSERT_EQ(saved[ranks].tensors.size(), saved[1].tensors.size());
    for (const CheckpointTensor& tensor : saved[1].tensors) {
      const CheckpointTensor* grouped = saved[ranks].Find(tensor.name);
      ASSERT_NE(grouped, nullptr) << tensor.name;
      EXPECT_EQ(grouped->values, tensor.values) << ranks << " ranks: " << tensor.name;
    }
  }
}

TEST(LearnerGroupTest, RankZeroRegistersEveryRanksDataPlaneAddress) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  auto server = StartGroupJob(config, 3);
  ASSERT_NE(server, nullptr);
  config.quorum_timeout_ms = 300;
  // Rank 0 registers only once every rank's address has come.
  auto alone = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {"learner-0", "", "", ""}, *RealClock());
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), StatusCode::kDeadlineExceeded) << alone.status();
  EXPECT_NE(alone.status().message().find("group rank 1's data-plane address did not come"),
            std::string::npos)
      << alone.status();
  EXPECT_TRUE(LearnerStatus(*server, "learner-0").is_null());

  config.quorum_timeout_ms = 30'000;
  std::vector<std::unique_ptr<LearnerAgent>> agents(3);
  std::vector<std::thread> ranks;
  for (int r = 2; r >= 0; --r) {  // rank 0 first: it waits for the others
    ranks.emplace_back([&, r]() {
      Config mine = config;
      mine.group_rank = r;
      mine.dataplane_host = fmt::format("127.0.0.{}", r + 1);
      auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(mine), kToken,
                                       {"learner-0", "", "", ""}, *RealClock());
      ASSERT_TRUE(agent.ok()) << agent.status();
      agents[static_cast<size_t>(r)] = std::move(*agent);
    });
  }
  for (auto& rank : ranks) rank.join();
  nlohmann::json learner = LearnerStatus(*server, "learner-0");
  ASSERT_FALSE(learner.is_null());
  EXPECT_EQ(learner["ranks"], nlohmann::json::array({"127.0.0.1", "127.0.0.2", "127.0.0.3"}))
      << learner;
}

TEST(LearnerGroupTest, TheLighthouseRefusesALearnerOfAnotherGroupSize) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  auto server = StartGroupJob(config, 2);
  ASSERT_NE(server, nullptr);
  Config rank1 = config;
  rank1.group_rank = 1;
  auto second = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(rank1), kToken,
                                    {"learner-0", "", "", ""}, *RealClock());
  ASSERT_TRUE(second.ok()) << second.status();
  auto first = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {"learner-0", "", "", ""}, *RealClock());
  ASSERT_TRUE(first.ok()) << first.status();
  config.group_size = 1;
  auto other = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {"learner-1", "", "", ""}, *RealClock());
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("group_size = 1: this job's learners are groups of 2"),
            std::string::npos)
      << other.status();
  EXPECT_NE(other.status().message().find("learner-0"), std::string::npos) << other.status();
}

// A rank that cannot start tells the group's other ranks why
// (TellGroupRanks, as the C ABI and `mend train` do on any failure of their
// start): rank 1 ends its wait for rank 0 with rank 0's error, not at
// quorum_timeout_ms (a minute here) with "did not start".
TEST(LearnerGroupTest, ARankThatCannotStartTellsTheOtherRanksWhy) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  auto server = StartGroupJob(config, 2);
  ASSERT_NE(server, nullptr);
  config.quorum_timeout_ms = 60'000;
  Config single = config;
  single.group_size = 1;
  auto other = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(single), kToken,
                                   {"learner-1", "", "", ""}, *RealClock());
  ASSERT_TRUE(other.ok()) << other.status();  // the job's learners are now of one rank

  Config rank1 = config;
  rank1.group_rank = 1;
  Status waited;
  std::thread second([&]() {
    auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(rank1), kToken,
                                     {"learner-0", "", "", ""}, *RealClock());
    ASSERT_TRUE(agent.ok()) << agent.status();  // (rank 1 does not register)
    FakeClock clock;
    waited = RoundDriver::Create(mend::testing_util::DriverOptionsFor(rank1), **agent, clock,
                                 WAndB(1.0f), nullptr, 0)
                 .status();
  });
  auto first = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {"learner-0", "", "", ""}, *RealClock());
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kInvalidArgument) << first.status();
  const Status told = TellGroupRanks(mend::testing_util::AgentOptionsFor(config), kToken,
                                     "learner-0", first.status());
  EXPECT_EQ(told, first.status());
  second.join();
  EXPECT_EQ(waited.code(), StatusCode::kInvalidArgument) << waited;
  EXPECT_NE(waited.message().find("group rank 1: group rank 0 could not start: "),
            std::string::npos)
      << waited;
  EXPECT_NE(waited.message().find(std::string(first.status().message())), std::string::npos)
      << waited;

  // What a rank told at an earlier start of its group (more than
  // quorum_timeout_ms before this one could have begun) is passed over, and
  // the rank forgets it when it starts again.
  auto client = LighthouseClient::Connect({config.lighthouse, kToken, "", kMicrosPerSecond});
  ASSERT_TRUE(client.ok()) << client.status();
  LighthouseRendezvousStore lighthouse(**client, *RealClock());
  const int64_t now = UnixMillis();
  std::optional<Status> fresh =
      ToldFailure(lighthouse, mend::testing_util::AgentOptionsFor(config), "learner-0", 0, now);
  ASSERT_TRUE(fresh.has_value());
  EXPECT_EQ(*fresh, first.status());
  EXPECT_FALSE(ToldFailure(lighthouse, mend::testing_util::AgentOptionsFor(config), "learner-0", 0,
                           now + 61'000)
                   .has_value());
  EXPECT_FALSE(
      ToldFailure(lighthouse, mend::testing_util::AgentOptionsFor(config), "learner-0", 1, now)
          .has_value());
  // A relaunch whose group store is elsewhere (rank 0 picked another port)
  // never reads the launch before it, however soon.
  Config relaunched = config;
  relaunched.group_store = "127.0.0.1:1";
  EXPECT_FALSE(
      ToldFailure(lighthouse, mend::testing_util::AgentOptionsFor(relaunched), "learner-0", 0, now)
          .has_value());
  ForgetToldFailure(lighthouse, mend::testing_util::AgentOptionsFor(config), "learner-0");
  EXPECT_FALSE(
      ToldFailure(lighthouse, mend::testing_util::AgentOptionsFor(config), "learner-0", 0, now)
          .has_value());
}

TEST(LearnerGroupTest, RanksWithDifferentModelsAreRefusedByName) {
  Config config = testing_util::SynchronousJobConfig(1, 5);
  auto server = StartGroupJob(config, 2);
  ASSERT_NE(server, nullptr);
  Status errors[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r]() {
      Config mine = config;
      mine.group_rank = r;
      auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(mine), kToken,
                                       {"learner-0", "", "", ""}, *RealClock());
      ASSERT_TRUE(agent.ok()) << agent.status();
      FakeClock clock;
      auto driver = RoundDriver::Create(mend::testing_util::DriverOptionsFor(mine), **agent, clock,
                                        WAndB(1.0f, r == 0 ? 10 : 12), nullptr, 0);
      errors[r] = driver.status();
    });
  }
  for (auto& rank : ranks) rank.join();
  EXPECT_EQ(errors[0].code(), StatusCode::kInvalidArgument) << errors[0];
  EXPECT_NE(errors[0].message().find(
                "group rank 1's parameters (names and shapes) differ from group rank 0's"),
            std::string::npos)
      << errors[0];
  EXPECT_EQ(errors[1].code(), StatusCode::kInvalidArgument) << errors[1];
}

// DES-LOC in a group: each rank averages its slice of the inner moments
// across learners and the group all-gathers them; the moments and the
// parameters end exactly as with single-rank learners.
TEST(LearnerGroupTest, DeslocMomentsAveragedBySliceEqualTheFlatOnes) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  config.desloc = true;
  config.momentum_sync_period_steps = 5;        // every round
  config.second_moment_sync_period_steps = 10;  // every second one
  auto flat = RunJob(config, 2, 1, 20);
  auto grouped = RunJob(config, 2, 2, 20);
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(flat[static_cast<size_t>(l)][0].error.ok())
        << flat[static_cast<size_t>(l)][0].error;
    EXPECT_GT(flat[static_cast<size_t>(l)][0].stats.moment_syncs, 0u);
    for (const RankRun& run : grouped[static_cast<size_t>(l)]) {
      ASSERT_TRUE(run.error.ok()) << run.error;
      EXPECT_EQ(run.stats.moment_syncs, flat[static_cast<size_t>(l)][0].stats.moment_syncs);
      EXPECT_EQ(run.moments, flat[static_cast<size_t>(l)][0].moments) << "learner " << l;
      EXPECT_EQ(run.local, flat[static_cast<size_t>(l)][0].local) << "learner " << l;
    }
  }
}

// heal_inner_optimizer in a group: the learners start apart, so the first
// round heals learner 1 from rank 0's state (the moments and the step count
// with it), slice by slice; the moments, step counts and parameters end
// exactly as with single-rank learners.
TEST(LearnerGroupTest, HealedMomentsArriveBySliceAsTheFlatOnesDo) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  config.heal_inner_optimizer = true;
  auto flat = RunJob(config, 2, 1, 20, {}, 10, "", /*spread=*/0.5f);
  auto grouped = RunJob(config, 2, 2, 20, {}, 10, "", /*spread=*/0.5f);
  uint64_t heals = 0;
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(flat[static_cast<size_t>(l)][0].error.ok())
        << flat[static_cast<size_t>(l)][0].error;
    heals += flat[static_cast<size_t>(l)][0].stats.heals;
    for (const RankRun& run : grouped[static_cast<size_t>(l)]) {
      ASSERT_TRUE(run.error.ok()) << run.error;
      EXPECT_EQ(run.moments, flat[static_cast<size_t>(l)][0].moments) << "learner " << l;
      EXPECT_EQ(run.local, flat[static_cast<size_t>(l)][0].local) << "learner " << l;
    }
  }
  EXPECT_EQ(heals, 1u);  // learner 1 took learner 0's state and moments
}

TEST(LearnerGroupTest, WhatGroupsCannotDoIsRefusedByName) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  config.group_size = 2;
  config.train_through_lighthouse_outage = true;
  Status status = CheckConfig(config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(
                "train_through_lighthouse_outage = true with group_size = 2 needs group_store"),
            std::string::npos)
      << status;
  config.group_store = "127.0.0.1:29500";
  EXPECT_TRUE(CheckConfig(config).ok()) << CheckConfig(config);
  config.group_store = "";
  config.train_through_lighthouse_outage = false;
  config.group_rank = 2;
  status = CheckConfig(config);
  EXPECT_NE(status.message().find("group_rank = 2: must be below group_size = 2"),
            std::string::npos)
      << status;
}

}  // namespace
}  // namespace mend::reducer
