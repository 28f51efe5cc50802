// The reducer end to end in one process: an embedded lighthouse, learners on
// threads (each with its own agent, model, data and inner optimizer), real
// quorum rounds and Gloo communicators. Checks bit-identical global
// parameters after every shared round, and a learner that misses a round
// healing and rejoining.
#include "mend/reducer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "fmt/format.h"
#include "gtest/gtest.h"
#include "mend/checkpoint.h"
#include "mend/lighthouse.h"
#include "nlohmann/json.hpp"
#include "test_util/checkpoint_edit.h"
#include "test_util/job_config.h"
#include "test_util/lighthouse_outage.h"
#include "test_util/wait.h"
#include "torch/nn/modules/linear.h"
#include "torch/optim/adamw.h"
#include "torch/optim/sgd.h"

namespace mend {
namespace {

constexpr char kToken[] = "reducer-test-token-0123456789";
constexpr int kPeriod = 4;

Config BaseConfig() {
  // Synchronous; the concurrent tests turn concurrent_outer_step on.
  return testing_util::SynchronousJobConfig(1, kPeriod);
}

// What one learner saw: its global parameters after each round it completed.
struct LearnerLog {
  std::map<uint64_t, std::vector<float>> global_by_round;
  ReducerStats stats;
  std::vector<float> first_moment;  // AdamW's exp_avg of the weight at the end (AdamW runs)
  std::optional<std::vector<float>> final_global;  // after shutdown
  std::vector<float> initial_global;               // right after Create (a resume shows here)
  uint64_t registrations = 0;                      // with the lighthouse (1 + re-registrations)
  std::atomic<uint64_t> steps{0};                  // the reducer's step, live
  const Reducer* reducer = nullptr;     // while Learn trains: for its gates (on the same thread)
  uint64_t quiet_steps = 0;             // steps that neither started nor applied a round
  bool shutdown_may_fail = false;       // (else Learn asserts that shutdown() succeeded)
  bool foreign_data_plane_key = false;  // its data plane sealed under another key (ForeignKeyAgent)
  Status shutdown_status;
};

// A learner's agent whose data plane seals under another secret than the
// job token (everything else is its own agent's): a stand-in for a member
// whose pieces are forged, or altered on the way.
class ForeignKeyAgent final : public LearnerAgent {
 public:
  explicit ForeignKeyAgent(std::unique_ptr<LearnerAgent> agent) : agent_(std::move(agent)) {}
  std::string data_plane_secret() const override { return "not-the-job-token-0123456789"; }
  std::string checkpoint_secret() const override { return agent_->checkpoint_secret(); }
  void RecordStep(uint64_t step, uint64_t tokens, Micros time) override {
    agent_->RecordStep(step, tokens, time);
  }
  StatusOr<QuorumResult> Quorum(uint64_t last_round_id, uint64_t tokens, Micros timeout,
                                bool include_members, uint64_t boundary_step) override {
    return agent_->Quorum(last_round_id, tokens, timeout, include_members, boundary_step);
  }
  void Interrupt() override { agent_->Interrupt(); }
  Status Leave(const std::string& reason) override { return agent_->Leave(reason); }
  void Stop() override { agent_->Stop(); }
  void WithholdHeartbeats(bool withhold) override { agent_->WithholdHeartbeats(withhold); }
  const std::string& id() const override { return agent_->id(); }
  bool slow() const override { return agent_->slow(); }
  double slow_zscore() const override { return agent_->slow_zscore(); }
  uint64_t latest_round_id() const override { return agent_->latest_round_id(); }
  uint64_t latest_round_step() const override { return agent_->latest_round_step(); }
  bool lighthouse_lost() const override { return agent_->lighthouse_lost(); }
  bool short_of_quorum() const override { return agent_->short_of_quorum(); }
  uint64_t registrations() const override { return agent_->registrations(); }
  Status fatal_status() const override { return agent_->fatal_status(); }
  const Clock& clock() const override { return agent_->clock(); }
  LighthouseClient& client() override { return agent_->client(); }
  StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupStore() override {
    return agent_->OpenGroupStore();
  }

 private:
  std::unique_ptr<LearnerAgent> agent_;
};

// Trains a linear regression on the learner's own shard for `boundaries`
// sync periods; before boundary b, waits for `gate(b)`, and before its
// inner step s (1-based, counted here), for `step_gate(s)`.
void Learn(const Config& config, const std::string& id, int seed, int boundaries, LearnerLog* log,
           const std::function<void(int)>& gate = nullptr,
           const std::function<void(int)>& step_gate = nullptr) {
  auto started = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                     {id, "", "", ""}, *RealClock());
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<LearnerAgent> agent = std::move(*started);
  if (log->foreign_data_plane_key) agent = std::make_unique<ForeignKeyAgent>(std::move(agent));
  torch::manual_seed(seed);  // different initial parameters on purpose
  torch::nn::Linear model(8, 1);
  std::unique_ptr<torch::optim::Optimizer> inner;
  if (config.desloc || config.heal_inner_optimizer) {
    inner = std::make_unique<torch::optim::AdamW>(model->parameters(),
                                                  torch::optim::AdamWOptions(0.01));
  } else {
    inner =
        std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.05));
  }
  auto reducer = Reducer::Create(config, *model, *inner, *agent);
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  log->initial_global.assign((*reducer)->global(0).begin(), (*reducer)->global(0).end());
  log->reducer = reducer->get();
  torch::Tensor true_w = torch::arange(8, torch::kFloat).reshape({1, 8}) / 8;
  for (int b = 0; b < boundaries; ++b) {
    if (gate) gate(b);
    for (int s = 0; s < kPeriod; ++s) {
      if (step_gate) step_gate(b * kPeriod + s + 1);
      torch::Tensor x = torch::randn({16, 8});
      torch::Tensor y = torch::matmul(x, true_w.t()) + 0.1 * static_cast<float>(seed);
      inner->zero_grad();
      torch::Tensor loss = torch::mse_loss(model->forward(x), y);
      loss.backward();
      inner->step();
      const ReducerStats previous = (*reducer)->stats();
      const uint64_t before = previous.rounds;
      ASSERT_TRUE((*reducer)->step(16).ok());
      ReducerStats stats = (*reducer)->stats();
      log->steps = stats.steps;
      if (stats.rounds_started == previous.rounds_started && stats.rounds == previous.rounds &&
          stats.failed_rounds == previous.failed_rounds) {
        // A step that neither starts nor applies a round copies no parameters.
        EXPECT_EQ(stats.parameter_copies, previous.parameter_copies) << "step " << stats.steps;
        log->quiet_steps++;
      }
      if (stats.rounds > before) {
        auto global = (*reducer)->global(0);
        log->global_by_round[stats.last_round_id].assign(global.begin(), global.end());
      }
    }
  }
  log->reducer = nullptr;
  log->shutdown_status = (*reducer)->shutdown();  // finishes a round still in flight
  if (!log->shutdown_may_fail) {
    ASSERT_TRUE(log->shutdown_status.ok()) << log->shutdown_status;
  }
  log->stats = (*reducer)->stats();
  log->registrations = agent->registrations();
  auto global = (*reducer)->global(0);
  log->final_global.emplace(global.begin(), global.end());
  if (config.desloc || config.heal_inner_optimizer) {
    auto& state = inner->state().at(c10::guts::to_string(model->weight.unsafeGetTensorImpl()));
    auto& adamw = static_cast<torch::optim::AdamWParamState&>(*state);
    log->first_moment.assign(adamw.exp_avg().data_ptr<float>(),
                             adamw.exp_avg().data_ptr<float>() + 8);
  }
}

std::unique_ptr<LighthouseServer> StartLighthouse(const Config& config) {
  auto server = LighthouseServer::Start(config, kToken, *RealClock());
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(*server);
}

// Starts a lighthouse for `config` and runs learner-a (seed 1) and learner-b
// (seed 2) for `boundaries` sync periods each, side by side.
void RunPair(Config config, int boundaries, LearnerLog* a, LearnerLog* b) {
  auto server = StartLighthouse(config);
  config.lighthouse = server->grpc_address();
  std::thread ta([&]() { Learn(config, "learner-a", 1, boundaries, a); });
  std::thread tb([&]() { Learn(config, "learner-b", 2, boundaries, b); });
  ta.join();
  tb.join();
}

// Every round in `subset` is in `all` with the same global parameters, bit
// for bit. Returns how many rounds were compared.
size_t ExpectSameGlobals(const LearnerLog& subset, const LearnerLog& all) {
  for (const auto& [round, global] : subset.global_by_round) {
    auto it = all.global_by_round.find(round);
    EXPECT_TRUE(it != all.global_by_round.end()) << "round " << round;
    if (it == all.global_by_round.end()) continue;
    EXPECT_EQ(global.size(), it->second.size());
    EXPECT_EQ(std::memcmp(global.data(), it->second.data(), global.size() * sizeof(float)), 0)
        << "global parameters differ after round " << round;
  }
  return subset.global_by_round.size();
}

TEST(ReducerTest, LearnersHoldBitIdenticalGlobalParametersAfterEveryRound) {
  Config config = BaseConfig();
  config.quorum_min_learners = 2;
  config.diagnostics_dir = testing_util::MakeTempDir();
  LearnerLog a, b;
  RunPair(config, 4, &a, &b);
  EXPECT_EQ(a.stats.rounds, 4u);
  EXPECT_EQ(b.stats.rounds, 4u);
  EXPECT_EQ(ExpectSameGlobals(a, b), 4u);
  EXPECT_GE(a.quiet_steps, 4u * (kPeriod - 1));  // checked in Learn: no parameter copies on them
  EXPECT_GT(a.stats.parameter_copies, 0u);
  // Diagnostics: a line per inner step and per round.
  auto lines = [&](const std::string& name) {
    std::vector<nlohmann::json> records;
    std::ifstream in(config.diagnostics_dir + "/" + name);
    for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
    return records;
  };
  EXPECT_EQ(lines("learner-a.steps.jsonl").size(), 4u * kPeriod);
  auto rounds = lines("learner-b.rounds.jsonl");
  ASSERT_EQ(rounds.size(), 4u);
  for (const auto& round : rounds) {
    EXPECT_TRUE(round["ok"].get<bool>()) << round.dump();
    EXPECT_EQ(round["members"], 2) << round.dump();
    EXPECT_GT(round["bytes_sent"].get<uint64_t>(), 0u) << round.dump();
  }
  EXPECT_TRUE(rounds[0]["healed"].get<bool>());  // learner-b took learner-a's start
  std::filesystem::remove_all(config.diagnostics_dir);
  // The learners started from different parameters: the first round gave
  // learner-b learner-a's (rank 0's) global state.
  EXPECT_EQ(a.stats.heals + b.stats.heals, 1u);
}

class HealedFragmentsTest : public ::testing::TestWithParam<bool> {};

TEST_P(HealedFragmentsTest, KeepOnlyTheLearnersOwnProgress) {
  // Two fragments, two learners with different initial parameters that do
  // not train at all. The first round (fragment 1's) gives learner-b
  // learner-a's state for both fragments; fragment 0's local parameters move
  // with its base, so its later pseudo-gradient is zero (up to rounding), and
  // the global parameters stay learner-a's initial ones.
  Config config = BaseConfig();
  config.quorum_min_learners = 2;
  config.fragments = 2;
  config.concurrent_outer_step = GetParam();  // synchronous, and applied a step late
  auto server = StartLighthouse(config);
  config.lighthouse = server->grpc_address();
  std::vector<std::vector<float>> initial(2), final_global(2);
  auto learner = [&](const std::string& id, int seed, int index) {
    auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                     {id, "", "", ""}, *RealClock());
    ASSERT_TRUE(agent.ok()) << agent.status();
    torch::manual_seed(seed);
    torch::nn::Linear model(8, 1);  // parameter 0 (weight) -> fragment 0, 1 (bias) -> 1
    torch::optim::SGD inner(model->parameters(), torch::optim::SGDOptions(0.05));
    initial[index].assign(model->weight.data_ptr<float>(), model->weight.data_ptr<float>() + 8);
    auto reducer = Reducer::Create(config, *model, inner, **agent);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    for (int s = 0; s < 2 * kPeriod; ++s) ASSERT_TRUE((*reducer)->step(1).ok());
    ASSERT_TRUE((*reducer)->shutdown().ok());
    EXPECT_EQ((*reducer)->stats().rounds, 4u);  // steps 2, 4, 6, 8
    auto global = (*reducer)->global(0);
    final_global[index].assign(global.begin(), global.end());
  };
  std::thread ta([&]() { learner("learner-a", 1, 0); });
  std::thread tb([&]() { learner("learner-b", 2, 1); });
  ta.join();
  tb.join();
  ASSERT_NE(initial[0], initial[1]);
  EXPECT_EQ(final_global[0], final_global[1]);
  // Rank 0 is the first learner in id order: learner-a. Equal up to the
  // rounding of b + (a - b) in fp32; without the shift the difference would
  // be the initial parameters' (about 0.1-0.5).
  for (size_t i = 0; i < initial[0].size(); ++i) {
    EXPECT_NEAR(final_global[0][i], initial[0][i], 1e-6) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, HealedFragmentsTest, ::testing::Values(false, true));

TEST(ReducerTest, ConcurrentRoundsAreAppliedLateAndStayBitIdentical) {
  // The exchange runs in the background while two more inner steps train;
  // every round is still applied (and the global state stays the same on
  // both learners).
  Config config = BaseConfig();
  config.quorum_min_learners = 2;
  config.concurrent_outer_step = true;
  config.overlap_steps = 2;
  LearnerLog a, b;
  RunPair(config, 4, &a, &b);
  // Rounds at steps 4, 8, 12 are applied two steps later inside the loop;
  // the one at 16 when the reducer shuts down.
  EXPECT_EQ(a.stats.rounds, 4u);
  EXPECT_EQ(b.stats.rounds, 4u);
  EXPECT_EQ(ExpectSameGlobals(a, b), 3u);
}

TEST(ReducerTest, DeslocAveragesTheInnerAdamMoments) {
  // AdamW inner optimizers on different data; with DES-LOC both moments are
  // averaged every round (K_u = K_v = H), so after the last (synchronous)
  // round the learners' first moments are bit-identical; without it they
  // are not.
  for (bool desloc : {true, false}) {
    Config config = BaseConfig();
    config.quorum_min_learners = 2;
    config.desloc = true;  // AdamW in Learn()
    config.momentum_sync_period_steps = desloc ? kPeriod : 1000 * kPeriod;
    config.second_moment_sync_period_steps = desloc ? kPeriod : 1000 * kPeriod;
    LearnerLog a, b;
    RunPair(config, 3, &a, &b);
    ASSERT_EQ(a.first_moment.size(), 8u);
    if (desloc) {
      EXPECT_EQ(a.stats.moment_syncs, 6u);  // 3 rounds x 2 moments
      EXPECT_EQ(a.first_moment, b.first_moment);
    } else {
      EXPECT_EQ(a.stats.moment_syncs, 0u);
      EXPECT_NE(a.first_moment, b.first_moment);
    }
  }
}

// The status of Reducer::Create for a learner of its own (a fresh
// lighthouse) with a one-layer model, `inputs` -> 1, and SGD.
Status CreateAlone(Config config, int64_t inputs) {
  auto server = StartLighthouse(config);
  config.lighthouse = server->grpc_address();
  auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {"learner-a", "", "", ""}, *RealClock());
  if (!agent.ok()) return agent.status();
  torch::nn::Linear model(inputs, 1);
  torch::optim::SGD inner(model->parameters(), torch::optim::SGDOptions(0.1));
  auto reducer = Reducer::Create(config, *model, inner, **agent);
  (void)(*agent)->Leave("test over");
  return reducer.status();
}

TEST(ReducerTest, DeslocNeedsAnAdamOptimizer) {
  Config config = BaseConfig();
  config.desloc = true;
  const Status created = CreateAlone(config, 2);
  ASSERT_FALSE(created.ok());
  EXPECT_NE(std::string(StatusMessage(created)).find("Adam"), std::string::npos);
}

// Every codec, synchronous and concurrent: after every round both learners
// hold the same global parameters, bit for bit.
class CodecModeTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(CodecModeTest, GlobalParametersStayBitIdentical) {
  Config config = BaseConfig();
  config.quorum_min_learners = 2;
  ASSERT_TRUE(SetConfigValue(config, "codec", std::get<0>(GetParam()), "test").ok());
  config.concurrent_outer_step = std::get<1>(GetParam());
  config.codec_block_size = 8;
  config.topk_chunk_size = 64;
  config.topk_k = 2;
  LearnerLog a, b;
  RunPair(config, 3, &a, &b);
  EXPECT_EQ(a.stats.rounds, 3u);
  EXPECT_EQ(b.stats.rounds, 3u);
  // Synchronous: every round inside the loop; concurrent: the last one is
  // applied at shutdown.
  EXPECT_EQ(ExpectSameGlobals(a, b), config.concurrent_outer_step ? 2u : 3u);
  EXPECT_EQ(std::memcmp((*a.final_global).data(), (*b.final_global).data(), 9 * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Codecs, CodecModeTest,
                         ::testing::Combine(::testing::Values("fp32", "bf16", "int8", "int4",
                                                              "topk"),
                                            ::testing::Bool()),
                         [](const auto& test) {
                           return std::get<0>(test.param) +
                                  (std::get<1>(test.param) ? "_concurrent" : "_sync");
                         });

// A parameter whose loss is c . p: with SGD at lr 1 every inner step moves
// it by exactly -c, so what the rounds do can be computed by hand.
class ConstantSlope : public torch::nn::Module {
 public:
  ConstantSlope() : p(register_parameter("p", torch::zeros({4}))) {}
  torch::Tensor p;
};

// Concurrent rounds with exact application keep the progress made while a
// round was in flight exactly once: with outer lr 1 and momentum 0 each
// round moves the global parameters by the mean of H c_i, and nothing else
// (progress counted twice, or lost, would change the numbers).
TEST(ReducerTest, ConcurrentModeAppliesEachUpdateExactlyOnce) {
  Config config = BaseConfig();
  config.quorum_min_learners = 2;
  config.concurrent_outer_step = true;
  config.overlap_steps = 3;
  config.outer_lr = 1.0;
  config.outer_momentum = 0.0;
  auto server = StartLighthouse(config);
  config.lighthouse = server->grpc_address();
  constexpr int kRounds = 5;
  std::vector<float> final_local[2], final_global[2];
  std::vector<std::vector<float>> locals_after_round[2];
  auto learner = [&](int i) {
    auto agent =
        LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                            {i == 0 ? "learner-a" : "learner-b", "", "", ""}, *RealClock());
    ASSERT_TRUE(agent.ok()) << agent.status();
    auto model = std::make_shared<ConstantSlope>();
    torch::optim::SGD inner(model->parameters(), torch::optim::SGDOptions(1.0));
    auto reducer = Reducer::Create(config, *model, inner, **agent);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    const float slope = i == 0 ? 1.0f : 3.0f;
    for (int step = 0; step < kRounds * kPeriod; ++step) {
      inner.zero_grad();
      (model->p * slope).sum().backward();
      inner.step();
      ASSERT_TRUE((*reducer)->step(16).ok());
    }
    ASSERT_TRUE((*reducer)->shutdown().ok());
    EXPECT_EQ((*reducer)->stats().rounds, static_cast<uint64_t>(kRounds));
    final_local[i].assign(model->p.data_ptr<float>(), model->p.data_ptr<float>() + 4);
    final_global[i].assign((*reducer)->global(0).begin(), (*reducer)->global(0).end());
  };
  std::thread a(learner, 0), b(learner, 1);
  a.join();
  b.join();
  // Each round: the mean of H * 1 and H * 3 is 2H.
  const float expected = -2.0f * kPeriod * kRounds;
  for (int i = 0; i < 2; ++i) {
    for (float v : final_global[i]) EXPECT_EQ(v, expected) << "learner " << i;
    // The last round ends on the last step: the local model is the global one.
    for (float v : final_local[i]) EXPECT_EQ(v, expected) << "learner " << i;
  }
}

// Two learners write checkpoints every second round; three learners (one of
// them new) resume from the newest with a fresh lighthouse, start from its
// global state and stay bit-identical.
TEST(ReducerTest, CheckpointsResumeWithADifferentNumberOfLearners) {
  const std::string dir = testing_util::MakeTempDir();
  Config config = BaseConfig();
  config.quorum_min_learners = 2;
  config.checkpoint_dir = dir;
  config.checkpoint_every_rounds = 2;
  LearnerLog a, b;
  RunPair(config, 4, &a, &b);
  ASSERT_EQ(a.stats.rounds, 4u);
  EXPECT_EQ(a.stats.checkpoints + b.stats.checkpoints, 2u);  // rounds 2 and 4, by rank 0
  EXPECT_EQ(a.stats.checkpoint_failures + b.stats.checkpoint_failures, 0u);
  CheckpointDirectory directory(dir, 3, kToken);  // authenticated by the job token
  auto saved = directory.LoadLatest();
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->meta.round_id, a.stats.last_round_id);
  // The checkpoint holds the global state by parameter name.
  std::vector<float> from_file = saved->Find("global/weight")->values;
  from_file.push_back(saved->Find("global/bias")->values[0]);
  EXPECT_EQ(from_file, *a.final_global);

  config.quorum_min_learners = 3;
  config.checkpoint_every_rounds = 0;
  auto server = StartLighthouse(config);  // a new lighthouse: round ids start over
  config.lighthouse = server->grpc_address();
  LearnerLog logs[3];
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back(
        [&, i]() { Learn(config, "learner-" + std::to_string(i), i + 1, 1, &logs[i]); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(logs[i].initial_global, *a.final_global)
        << "learner " << i << " resumed the global state";
    EXPECT_EQ(logs[i].stats.resumed_from_round, saved->meta.round_id);
    EXPECT_EQ(logs[i].stats.heals, 0u) << "everyone had the checkpoint: nobody heals";
    EXPECT_EQ(logs[i].stats.rounds, 1u);
    EXPECT_GT(logs[i].stats.last_round_id, saved->meta.round_id)
        << "round ids go on above the checkpoint's";
  }
  EXPECT_EQ(ExpectSameGlobals(logs[0], logs[1]), 1u);
  EXPECT_EQ(ExpectSameGlobals(logs[0], logs[2]), 1u);
  std::filesystem::remove_all(dir);
}

TEST(ReducerTest, ACheckpointOfAnotherModelIsRefused) {
  const std::string dir = testing_util::MakeTempDir();
  Checkpoint other;
  other.meta.round_id = 3;
  other.tensors.push_back({"global/weight", {1, 4}, {1, 2, 3, 4}});
  other.tensors.push_back({"outer_momentum/weight", {1, 4}, {0, 0, 0, 0}});
  ASSERT_TRUE(CheckpointDirectory(dir, 3, kToken).Save(other).ok());
  Config config = BaseConfig();
  config.checkpoint_dir = dir;
  const Status reducer = CreateAlone(config, 8);
  ASSERT_EQ(reducer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(reducer.message().find("'global/weight' has shape [1, 4], the model's is [1, 8]"),
            std::string_view::npos)
      << reducer;
  std::filesystem::remove_all(dir);
}

// A checkpoint_dir whose checkpoints are all damaged is refused (DATA_LOSS
// naming each), not taken for a fresh start, and its files are kept.
TEST(ReducerTest, ACheckpointDirOfOnlyDamagedCheckpointsIsRefusedAndKept) {
  const std::string dir = testing_util::MakeTempDir();
  Checkpoint saved;
  saved.meta.round_id = 3;
  saved.tensors.push_back({"global/weight", {1, 8}, std::vector<float>(8, 1)});
  saved.tensors.push_back({"global/bias", {1}, {0}});
  ASSERT_TRUE(CheckpointDirectory(dir, 3, kToken).Save(saved).ok());
  const std::vector<std::string> files = CheckpointDirectory(dir, 3).List();
  ASSERT_EQ(files.size(), 1u);
  std::filesystem::resize_file(files[0], std::filesystem::file_size(files[0]) - 4);
  Config config = BaseConfig();
  config.checkpoint_dir = dir;
  const Status reducer = CreateAlone(config, 8);
  ASSERT_EQ(reducer.code(), absl::StatusCode::kDataLoss) << reducer;
  EXPECT_NE(reducer.message().find("none of its 1 checkpoint(s) verifies"), std::string_view::npos)
      << reducer;
  EXPECT_NE(reducer.message().find("truncated"), std::string_view::npos) << reducer;
  EXPECT_TRUE(std::filesystem::exists(files[0]));
  std::filesystem::remove_all(dir);
}

// A learner whose pieces do not authenticate (sealed under another key than
// the job token's) fails the rounds it joins, named by the others; they
// report it, the lighthouse leaves it out saying why, and the other two go
// on with rounds of their own, bit-identical, none of its pieces merged.
TEST(ReducerTest, ALearnerWhosePiecesDoNotAuthenticateIsLeftOutAndTheOthersGoOn) {
  Config config = BaseConfig();
  config.quorum_min_learners = 2;
  auto server = StartLighthouse(config);
  config.lighthouse = server->grpc_address();
  LearnerLog logs[3];
  logs[2].foreign_data_plane_key = true;
  logs[2].shutdown_may_fail = true;
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i]() {
      Learn(config, std::string("learner-") + static_cast<char>('a' + i), i + 1, 12, &logs[i]);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(logs[2].stats.rounds, 0u) << "no round of the foreign learner completes";
  EXPECT_GT(logs[2].stats.failed_rounds, 0u);
  EXPECT_GT(logs[0].stats.rounds, 0u);
  EXPECT_GT(logs[0].stats.failed_rounds, 0u) << "it was in a round with them";
  EXPECT_EQ(ExpectSameGlobals(logs[0], logs[1]), logs[0].stats.rounds);
  // Left out each time it is let back in, for 1, then 2 rounds, ...
  size_t left_out = 0;
  const nlohmann::json status = nlohmann::json::parse(server->StatusJson());
  for (const auto& event : status["events"]) {
    if (event["kind"] != "unreachable") continue;
    EXPECT_EQ(event["learner"], "learner-c") << event;
    EXPECT_EQ(event["message"].get<std::string>(),
              fmt::format("learner-a, learner-b could not authenticate the pieces of it; left out "
                          "of {} round(s)",
                          1 << left_out));
    ++left_out;
  }
  EXPECT_GE(left_out, 2u) << status.dump();
}

// With a job token a learner resumes only from checkpoints that token
// authenticates: one written without authentication, one of another job's
// token, and an authenticated one altered after it was written (a value
// changed with its tensor's SHA-256 made to match) are each refused like a
// damaged one, and none of them is resumed. With checkpoint_authenticate =
// false the unauthenticated one is.
TEST(ReducerTest, ACheckpointTheJobTokenDoesNotAuthenticateIsRefusedAsDamaged) {
  Checkpoint saved;
  saved.meta.round_id = 3;
  saved.tensors.push_back({"global/weight", {1, 8}, std::vector<float>(8, 1)});
  saved.tensors.push_back({"global/bias", {1}, {0}});
  saved.tensors.push_back({"outer_momentum/weight", {1, 8}, std::vector<float>(8, 0)});
  saved.tensors.push_back({"outer_momentum/bias", {1}, {0}});
  const struct {
    const char* secret;
    bool alter;
    const char* why;
  } cases[] = {{"", false, "not authenticated (format version 1"},
               {"another-jobs-token-0123456789", false, "authentication failed"},
               {kToken, true, "authentication failed"}};
  for (const auto& c : cases) {
    const std::string dir = testing_util::MakeTempDir();
    auto written = CheckpointDirectory(dir, 3, c.secret).Save(saved);
    ASSERT_TRUE(written.ok()) << written.status();
    if (c.alter) testing_util::AlterCheckpointValue(*written, "global/weight", 0, 5.0f);
    Config config = BaseConfig();
    config.checkpoint_dir = dir;
    const Status reducer = CreateAlone(config, 8);
    ASSERT_EQ(reducer.code(), absl::StatusCode::kDataLoss) << c.why << ": " << reducer;
    EXPECT_NE(reducer.message().find(c.why), std::string_view::npos) << reducer;
    if (c.secret[0] == '\0') {
      config.checkpoint_authenticate = false;
      const Status resumed = CreateAlone(config, 8);
      EXPECT_TRUE(resumed.ok()) << "resumed without authentication: " << resumed;
    }
    std::filesystem::remove_all(dir);
  }
}

// Frozen parameters (requires_grad = false) are the learner's own unless
// exchange_frozen_parameters: the reducer's state holds only the others,
// and a model with nothing trainable is refused naming the key.
TEST(ReducerTest, FrozenParametersAreLeftOutUnlessAskedFor) {
  Config config = BaseConfig();
  auto server = StartLighthouse(config);
  config.lighthouse = server->grpc_address();
  torch::nn::Linear model(8, 2);  // weight 16 values, bias 2
  model->weight.set_requires_grad(false);
  torch::optim::SGD inner(model->parameters(), torch::optim::SGDOptions(0.1));
  for (const bool include : {false, true}) {
    config.exchange_frozen_parameters = include;
    auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                     {include ? "with" : "without", "", "", ""}, *RealClock());
    ASSERT_TRUE(agent.ok());
    auto reducer = Reducer::Create(config, *model, inner, **agent);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    EXPECT_EQ((*reducer)->global(0).size(), include ? 18u : 2u);
    ASSERT_TRUE((*reducer)->shutdown().ok());
  }
  model->bias.set_requires_grad(false);
  config.exchange_frozen_parameters = false;
  auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {"none", "", "", ""}, *RealClock());
  ASSERT_TRUE(agent.ok());
  auto none = Reducer::Create(config, *model, inner, **agent);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("exchange_frozen_parameters"), std::string_view::npos)
      << none.status();
}

// The lighthouse is killed and restarted (same address, no state) between
// two rounds while the learners train: they register again, rounds resume
// above the old round ids, and every round is shared with identical global
// parameters: nothing is lost.
TEST(ReducerTest, LearnersRideOverALighthouseRestart) {
  Config config = BaseConfig();
  config.quorum_min_learners = 2;
  config.concurrent_outer_step = true;
  config.overlap_steps = 3;
  auto server = StartLighthouse(config);
  const std::string address = server->grpc_address();
  config.lighthouse = address;
  std::mutex mu;
  std::atomic<bool> restarted{false};
  uint64_t rounds_before_restart = 0;
  auto gate = [&](int boundary) {
    if (boundary != 2) return;
    std::lock_guard lock(mu);
    if (restarted) return;
    auto status = nlohmann::json::parse(server->StatusJson());
    rounds_before_restart = status["rounds"].size();
    server->Shutdown(0);
    server.reset();
    Config again = config;
    again.bind = address;
    server = StartLighthouse(again);
    restarted = true;
  };
  LearnerLog a, b;
  std::thread ta([&]() { Learn(config, "learner-a", 1, 5, &a, gate); });
  std::thread tb([&]() { Learn(config, "learner-b", 2, 5, &b, gate); });
  ta.join();
  tb.join();
  ASSERT_TRUE(restarted);
  EXPECT_GE(rounds_before_restart, 1u);
  EXPECT_GE(a.registrations, 2u);
  EXPECT_GE(b.registrations, 2u);
  // Rounds that were in flight across the restart may fail; every round
  // either learner completed was completed by both, with the same state.
  EXPECT_EQ(a.stats.rounds, b.stats.rounds);
  EXPECT_GE(a.stats.rounds, 4u);
  ExpectSameGlobals(a, b);
  EXPECT_EQ(std::memcmp(a.final_global->data(), b.final_global->data(), 9 * sizeof(float)), 0);
}

// The state of `id` on the lighthouse's status page ("" when unknown), and
// how many learners are alive.
std::string LearnerState(LighthouseServer& server, const std::string& id) {
  auto status = nlohmann::json::parse(server.StatusJson());
  for (const auto& learner : status["learners"]) {
    if (learner["id"] == id) return learner["state"];
  }
  return "";
}

// Waits until every one of `ids` has registered with the lighthouse.
void AwaitRegistered(LighthouseServer& server, std::initializer_list<const char*> ids) {
  EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
    return std::all_of(ids.begin(), ids.end(),
                       [&](const char* id) { return LearnerState(server, id) != ""; });
  }));
}

// Minimum quorum 1. learner-b holds back its second boundary until
// learner-a's second round has closed without it (after the grace window);
// learner-a then waits for learner-b to be waiting before its third join, so
// the third round has both: learner-b is behind and heals from learner-a.
void MissedRound(Config config, LearnerLog& a, LearnerLog& b) {
  config.grace_window_ms = 5000;
  auto server = StartLighthouse(config);
  config.lighthouse = server->grpc_address();
  auto both_alive = [&]() { AwaitRegistered(*server, {"learner-a", "learner-b"}); };
  std::atomic<size_t> a_rounds{0};
  std::thread ta([&]() {
    Learn(config, "learner-a", 1, 3, &a, [&](int boundary) {
      a_rounds = a.global_by_round.size();
      if (boundary == 0) both_alive();
      if (boundary == 2) {
        EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
          return LearnerState(*server, "learner-b") == "waiting";
        }));
      }
    });
  });
  std::thread tb([&]() {
    Learn(config, "learner-b", 2, 2, &b, [&](int boundary) {
      if (boundary == 0) both_alive();
      if (boundary == 1) {
        EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() { return a_rounds >= 2; }));
      }
    });
  });
  ta.join();
  tb.join();
}

TEST(ReducerTest, LearnerThatMissesARoundHealsAndRejoins) {
  LearnerLog a, b;
  MissedRound(BaseConfig(), a, b);
  // learner-a: rounds 1 (both), 2 (alone), 3 (both); learner-b: 1 and 3.
  EXPECT_EQ(a.stats.rounds, 3u);
  EXPECT_EQ(b.stats.rounds, 2u);
  EXPECT_GE(b.stats.heals, 1u);
  EXPECT_EQ(ExpectSameGlobals(b, a), 2u);  // rounds 1 and 3
}

TEST(ReducerTest, HealBringsTheInnerOptimizerStateByOption) {
  // The same missed round with AdamW and heal_inner_optimizer. Both
  // learners' last step is their last boundary (the heal round for
  // learner-b), so afterwards learner-b's Adam moments are learner-a's, bit
  // for bit, though learner-b trained on other data (other moments) until
  // then.
  Config config = BaseConfig();
  config.heal_inner_optimizer = true;
  LearnerLog a, b;
  MissedRound(config, a, b);
  EXPECT_GE(b.stats.heals, 1u);
  ASSERT_EQ(a.first_moment.size(), 8u);
  EXPECT_EQ(a.first_moment, b.first_moment);
}

// Concurrent rounds with tau = 1, for the passed-over tests.
Config ConcurrentConfig(int64_t grace_window_ms, int64_t quorum_timeout_ms) {
  Config config = BaseConfig();
  config.concurrent_outer_step = true;
  config.overlap_steps = 1;
  config.grace_window_ms = grace_window_ms;
  config.quorum_timeout_ms = quorum_timeout_ms;
  return config;
}

// learner-b (seed 2) for three sync periods, in a thread: after its first
// boundary it holds back until the lighthouse has closed round `round`.
std::thread LateLearnerB(const Config& config, LighthouseServer& server, uint64_t round,
                         LearnerLog* b) {
  return std::thread([&config, &server, round, b]() {
    Learn(config, "learner-b", 2, 3, b, [&](int boundary) {
      if (boundary == 0) AwaitRegistered(server, {"learner-a", "learner-b"});
      if (boundary != 1) return;
      EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
        return nlohmann::json::parse(server.StatusJson())["summary"]["latest_round_id"]
                   .get<uint64_t>() >= round;
      }));
    });
  });
}

TEST(ReducerTest, ALearnerPassedOverTrainsOnAndJoinsTheNextRound) {
  // Concurrent rounds (tau = 1). learner-b reaches its second boundary
  // (step 8) after learner-a's round for it closed alone. It must not wait
  // at step 9 for the next round: learner-a holds back its third boundary
  // until learner-b is past step 10 with its join waiting, so a learner-b
  // that waited would leave both stuck until the quorum timeout (a failed
  // round). Then the third round has both; learner-b heals and takes the
  // job's step, and launches no second round for step 12.
  Config config = ConcurrentConfig(/*grace_window_ms=*/5000, /*quorum_timeout_ms=*/30000);
  auto server = StartLighthouse(config);
  config.lighthouse = server->grpc_address();
  LearnerLog a, b;
  auto both_alive = [&]() { AwaitRegistered(*server, {"learner-a", "learner-b"}); };
  std::thread ta([&]() {
    Learn(config, "learner-a", 1, 3, &a, [&](int boundary) {
      if (boundary == 0) both_alive();
      if (boundary == 2) {
        EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
          return b.steps >= 10 && LearnerState(*server, "learner-b") == "waiting";
        }));
      }
    });
  });
  std::thread tb = LateLearnerB(config, *server, /*round=*/2, &b);
  ta.join();
  tb.join();
  EXPECT_EQ(b.stats.passed_over, 1u);
  EXPECT_EQ(b.stats.failed_rounds, 0u);
  EXPECT_EQ(a.stats.failed_rounds, 0u);
  EXPECT_EQ(a.stats.rounds, 3u);
  EXPECT_EQ(b.stats.rounds, 2u);          // rounds 1 and 3
  EXPECT_EQ(b.stats.rounds_started, 2u);  // steps 4 and 8; step 12 was round 3's
  EXPECT_GE(b.stats.heals, 1u);
  // Round 1 as both logged it; round 3 was both learners' last step (learner-b
  // skipped its boundary there, its join still waiting), finished by their
  // shutdown().
  ASSERT_TRUE(a.final_global.has_value() && b.final_global.has_value());
  EXPECT_EQ(*b.final_global, *a.final_global);
  EXPECT_EQ(ExpectSameGlobals(b, a), 1u);
}

TEST(ReducerTest, AJoinPassedOverInStreamingModeTakesPartInTheOthersFragmentsRound) {
  // Streaming DiLoCo with tau = 1: fragment 0 (the weight) has its
  // boundaries at steps 4, 8, 12, fragment 1 (the bias) at 2, 6, 10.
  // learner-b holds back after step 4 until learner-a's round for step 6
  // (fragment 1) closed without it: round 3, after the 5 s grace window.
  // learner-b's join for step 6 is then passed over; learner-a waits for
  // it to be waiting before its step 8, so that it forms round 4 with
  // learner-a's join for step 8: fragment 0's. learner-b was behind, heals,
  // takes part without a pseudo-gradient, and holds learner-a's global
  // state after the round. (Before, the two exchanged different fragments,
  // 1 and 8 values long.)
  Config config = ConcurrentConfig(/*grace_window_ms=*/5000, /*quorum_timeout_ms=*/30000);
  config.fragments = 2;
  auto server = StartLighthouse(config);
  config.lighthouse = server->grpc_address();
  LearnerLog a, b;
  auto both_alive = [&]() { AwaitRegistered(*server, {"learner-a", "learner-b"}); };
  std::thread ta([&]() {
    Learn(
        config, "learner-a", 1, 3, &a,
        [&](int boundary) {
          if (boundary == 0) both_alive();
        },
        [&](int step) {
          if (step != 8) return;
          EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
            return LearnerState(*server, "learner-b") == "waiting";
          }));
        });
  });
  std::thread tb = LateLearnerB(config, *server, /*round=*/3, &b);
  ta.join();
  tb.join();
  EXPECT_EQ(a.stats.failed_rounds, 0u);
  EXPECT_EQ(b.stats.failed_rounds, 0u);
  EXPECT_EQ(a.global_by_round.count(3), 1u);
  EXPECT_EQ(b.global_by_round.count(3), 0u);
  EXPECT_GE(b.stats.heals, 2u);  // the first round's, and round 4's
  // learner-b applied round 4 while it trained, or (it trained through its
  // last step before the round formed) in shutdown(): either way with
  // learner-a's global weight after it, bit for bit.
  auto a4 = a.global_by_round.find(4);
  ASSERT_NE(a4, a.global_by_round.end());
  const std::vector<float>* b4 = nullptr;
  if (b.global_by_round.count(4) != 0) {
    b4 = &b.global_by_round.at(4);
  } else if (b.stats.last_round_id == 4 && b.final_global.has_value()) {
    b4 = &*b.final_global;
  }
  ASSERT_NE(b4, nullptr) << "learner-b's join for step 6 did not take part in round 4";
  EXPECT_EQ(*b4, a4->second);
  // So did every other round both logged (1 and 2, and any after 4).
  size_t common = 0;
  for (const auto& [round, global] : b.global_by_round) {
    auto it = a.global_by_round.find(round);
    if (it == a.global_by_round.end()) continue;
    common++;
    EXPECT_EQ(global, it->second) << "round " << round;
  }
  EXPECT_GE(common, 2u);
}

TEST(ReducerTest, AJoinPassedOverNearTheJobsEndIsCalledOffAtShutdown) {
  // Three learners, quorum of two, three periods each; learner-b reaches
  // step 8 after learner-a and learner-c finished (rounds for steps 8 and 12
  // without it) and left. No round can come: learner-b trains on at step 9,
  // does not wait for its join at its boundary at step 12 either, and its
  // shutdown() calls the join off instead of waiting the quorum timeout (ten
  // minutes here: a learner that waited would hang the test).
  // With the job's length known (12) nobody launches a round at step 12, the
  // last period's boundary: the round for step 8 is then the job's last
  // launched one, and learner-a and learner-c end with the final merge at
  // step 12 (without it: final_merge = false), which learner-b does not join:
  // that round waits for learner-b (alive, held in its hook) only half its
  // joins' timeout (the job's last round, final_wait), 10 s in that case.
  // learner-b then reaches the job's end after its final round closed: it
  // does not end with a model of its own as if it were the job's. Its
  // shutdown() fails saying so, or, with checkpoint_dir, it takes the job's
  // final model from that round's checkpoint.
  struct Case {
    int64_t total;
    bool final_merge;
    bool checkpoints = false;
  };
  for (Case job : {Case{0, true}, Case{3 * kPeriod, false}, Case{3 * kPeriod, true},
                   Case{3 * kPeriod, true, true}}) {
    const int64_t total = job.total;
    SCOPED_TRACE(testing::Message() << "total_steps = " << total << ", final_merge = "
                                    << job.final_merge << ", checkpoints = " << job.checkpoints);
    Config config =
        ConcurrentConfig(/*grace_window_ms=*/1000,
                         /*quorum_timeout_ms=*/total != 0 && job.final_merge ? 20000 : 600000);
    config.quorum_min_learners = 2;
    config.total_steps = total;
    config.final_merge = job.final_merge;
    if (job.checkpoints) {
      config.checkpoint_dir = testing_util::MakeTempDir();
      config.checkpoint_every_rounds = 1000;  // (the final round's only)
    }
    auto server = StartLighthouse(config);
    config.lighthouse = server->grpc_address();
    LearnerLog a, b, c;
    b.shutdown_may_fail = true;
    auto all_alive = [&]() { AwaitRegistered(*server, {"learner-a", "learner-b", "learner-c"}); };
    std::atomic<int> done{0};
    auto other = [&](const char* id, int seed, LearnerLog* log) {
      return std::thread([&, id, seed, log]() {
        Learn(config, id, seed, 3, log, [&](int boundary) {
          if (boundary == 0) all_alive();
        });
        done++;
      });
    };
    std::thread ta = other("learner-a", 1, &a);
    std::thread tc = other("learner-c", 3, &c);
    std::thread tb([&]() {
      Learn(config, "learner-b", 2, 3, &b, [&](int boundary) {
        if (boundary == 0) all_alive();
        if (boundary == 1) {
          EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() { return done == 2; }));
        }
      });
    });
    ta.join();
    tc.join();
    tb.join();
    const bool merged = total != 0 && job.final_merge;
    EXPECT_EQ(a.stats.rounds, total == 0 || merged ? 3u : 2u);
    EXPECT_EQ(a.stats.final_rounds, merged ? 1u : 0u);
    EXPECT_EQ(c.stats.final_rounds, merged ? 1u : 0u);
    EXPECT_EQ(b.stats.final_rounds, 0u);
    EXPECT_EQ(b.stats.rounds, 1u);
    EXPECT_EQ(b.stats.rounds_started, 2u);  // steps 4 and 8; step 12 was skipped
    EXPECT_EQ(b.stats.passed_over, 1u);
    EXPECT_EQ(b.stats.failed_rounds, 0u);  // called off at the end: passed over, not failed
    if (!merged) {
      EXPECT_TRUE(b.shutdown_status.ok()) << b.shutdown_status;  // no job's final model to have
    } else if (!job.checkpoints) {
      EXPECT_EQ(b.shutdown_status.code(), StatusCode::kFailedPrecondition) << b.shutdown_status;
      EXPECT_NE(std::string(b.shutdown_status.message())
                    .find("its model is its own, not the job's final model"),
                std::string::npos)
          << b.shutdown_status;
    } else {
      EXPECT_TRUE(b.shutdown_status.ok()) << b.shutdown_status;
      ASSERT_TRUE(a.final_global.has_value() && b.final_global.has_value());
      EXPECT_EQ(*b.final_global, *a.final_global);  // the job's final model
      EXPECT_EQ(b.stats.steps, static_cast<uint64_t>(total));
    }
  }
}

// As above with the job's length known (12): the round for step 8 is the
// job's last launched one (none at step 12). learner-a and learner-c hold
// before their step 9 until it has closed, so that its step is 8 (their
// joins' step). learner-c is then still registered and training (held
// before its step 12) while learner-b, passed over at step 8, shuts down: b
// must call its join off once the round for step 8 has closed, not wait for
// a round of a later step, which nobody launches (its join would wait for
// the quorum timeout, ten minutes here, since c never joins: c gives up
// holding after 60 s, and the test fails).
// No final merge here: learner-a's would wait for a second member, and
// learner-c, its only possible one, is held until learner-b is done, which
// waits for learner-a (the test above has the final merge with a join
// passed over).
TEST(ReducerTest, AJoinPassedOverAtTheLastLaunchedBoundaryIsCalledOffWhileOthersTrainOn) {
  Config config = ConcurrentConfig(/*grace_window_ms=*/1000, /*quorum_timeout_ms=*/600000);
  config.quorum_min_learners = 2;
  config.total_steps = 3 * kPeriod;
  config.final_merge = false;
  auto server = StartLighthouse(config);
  config.lighthouse = server->grpc_address();
  LearnerLog a, b, c;
  auto all_alive = [&]() { AwaitRegistered(*server, {"learner-a", "learner-b", "learner-c"}); };
  auto second_round_closed = [&]() {
    EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
      return nlohmann::json::parse(server->StatusJson())["summary"]["latest_round_id"]
                 .get<uint64_t>() >= 2;
    }));
  };
  std::atomic<bool> a_done{false}, c_held{false}, b_done{false};
  auto start_together = [&](int boundary) {
    if (boundary == 0) all_alive();
  };
  // learner-a and learner-c: before step 9, until the round for step 8 closed.
  auto hold_before_9 = [&](int step) {
    if (step == 2 * kPeriod + 1) second_round_closed();
  };
  std::thread ta([&]() {
    Learn(config, "learner-a", 1, 3, &a, start_together, hold_before_9);
    a_done = true;
  });
  std::thread tc([&]() {
    Learn(config, "learner-c", 3, 3, &c, start_together, [&](int step) {
      hold_before_9(step);
      if (step != 3 * kPeriod) return;
      c_held = true;
      EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() { return b_done.load(); }))
          << "learner-b's shutdown waited for a round nobody launches";
    });
  });
  std::thread tb([&]() {
    Learn(config, "learner-b", 2, 3, &b, [&](int boundary) {
      if (boundary == 0) all_alive();
      if (boundary == 1) {
        EXPECT_TRUE(
            testing_util::WaitFor(60 * kMicrosPerSecond, [&]() { return a_done && c_held; }));
      }
    });
    b_done = true;
  });
  ta.join();
  tb.join();
  tc.join();
  EXPECT_EQ(a.stats.rounds, 2u);  // steps 4 and 8
  EXPECT_EQ(c.stats.rounds, 2u);
  EXPECT_EQ(b.stats.rounds, 1u);
  EXPECT_EQ(b.stats.rounds_started, 2u);
  EXPECT_EQ(b.stats.passed_over, 1u);
  EXPECT_EQ(b.stats.failed_rounds, 0u);  // called off at the end: passed over, not failed
}

// Two learners that train through lighthouse outages (heartbeat timeout
// 1 s, no quorum timeout to wait out), and the registration gate of their
// first boundary.
Config OutageConfig(int64_t fragments) {
  Config config = ConcurrentConfig(/*grace_window_ms=*/1000, /*quorum_timeout_ms=*/600000);
  config.fragments = fragments;
  config.quorum_min_learners = 2;
  config.heartbeat_timeout_ms = 1000;
  config.train_through_lighthouse_outage = true;
  return config;
}
void AwaitBothRegistered(testing_util::LighthouseOutage& outage) {
  outage.WithServer([](LighthouseServer* server) {
    AwaitRegistered(*server, {"learner-a", "learner-b"});
  });
}

// The lighthouse goes down after both learners launched their join for step
// 8, and comes back once both have trained past step 16 (or after 60 s: a
// learner that waited for it at boundary + tau would hold both below step 16,
// and the test fails then instead of waiting out the quorum timeout). Once
// it is back, the joins still pending form a round: both learners end with
// the same global parameters and a round id above the old lighthouse's.
TEST(ReducerTest, LearnersTrainOnWhileTheLighthouseIsDown) {
  Config config = OutageConfig(1);
  testing_util::LighthouseOutage outage(config, kToken);
  LearnerLog a, b;
  auto gate = [&](int boundary) {
    if (boundary == 0) AwaitBothRegistered(outage);
    if (boundary != 2) return;
    EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond,
                                      [&]() { return a.steps >= 8 && b.steps >= 8; }));
    outage.TakeDown([&]() { return a.steps >= 16 && b.steps >= 16; });
  };
  std::thread ta([&]() { Learn(config, "learner-a", 1, 6, &a, gate); });
  std::thread tb([&]() { Learn(config, "learner-b", 2, 6, &b, gate); });
  ta.join();
  tb.join();
  ASSERT_TRUE(outage.taken_down());
  outage.Join();
  const uint64_t last_round_before = outage.last_round_before();
  EXPECT_TRUE(outage.trained_on()) << "a learner waited for the lighthouse at boundary + tau";
  EXPECT_GE(a.stats.passed_over, 1u);
  EXPECT_GE(b.stats.passed_over, 1u);
  EXPECT_GE(a.registrations, 2u);
  EXPECT_GE(b.registrations, 2u);
  // Rounds resumed on the new lighthouse: it closed some, and both learners
  // ended with its latest (the last may have finished in shutdown()). Its
  // ids go on from the learners' last completed round: above the old
  // lighthouse's, unless the outage failed the old one's last round (under
  // load: then the new lighthouse gives that id again), and every round
  // either learner logged, the other completed with the same state.
  const size_t resumed = outage.WithServer([](LighthouseServer* server) -> size_t {
    return server ? nlohmann::json::parse(server->StatusJson())["rounds"].size() : 0;
  });
  EXPECT_GE(resumed, 1u);
  EXPECT_GE(a.stats.last_round_id, last_round_before);
  EXPECT_EQ(a.stats.last_round_id, outage.LatestRoundId());
  EXPECT_EQ(a.stats.last_round_id, b.stats.last_round_id);
  ExpectSameGlobals(a, b);
  ExpectSameGlobals(b, a);
  ASSERT_TRUE(a.final_global.has_value() && b.final_global.has_value());
  EXPECT_EQ(*a.final_global, *b.final_global);
}

// Two fragments (the weight and the bias: pieces of different sizes), a
// round every 2 steps (fragment 0 at steps 4, 8, ..., fragment 1 at 2, 6,
// ...). The lighthouse goes down before step 8 and both learners train on
// with their joins for step 8 waiting: learner-a to step 15, learner-b to 9.
// Once it is back those joins form a round; then learner-b joins for step
// 10 (fragment 1) and learner-a, held at 15 until then, for step 16
// (fragment 0): one round of members at two fragments' boundaries, neither
// behind in rounds (no heal). Both exchange the fragment of the round's
// step (16), learner-b without a pseudo-gradient, and learner-b takes the
// job's step, where the two exchanged pieces of different sizes (the data
// plane's receive overran: Gloo aborted the process).
TEST(ReducerTest, AMemberAtAnotherFragmentsBoundaryTakesPartInTheRoundsFragment) {
  Config config = OutageConfig(2);
  testing_util::LighthouseOutage outage(config, kToken);
  LearnerLog a, b;
  auto gate = [&](int boundary) {
    if (boundary == 0) AwaitBothRegistered(outage);
  };
  // Before step 8 (the second learner's call does nothing).
  auto take_down = [&]() {
    EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond,
                                      [&]() { return a.steps >= 7 && b.steps >= 7; }));
    outage.TakeDown([&]() { return a.steps >= 15 && b.steps >= 9; });
  };
  // The lighthouse is back and has formed the round of the joins for step 8.
  auto formed_again = [&]() {
    return outage.taken_down() && outage.LatestRoundId() > outage.last_round_before();
  };
  std::thread ta([&]() {
    Learn(config, "learner-a", 1, 8, &a, gate, [&](int step) {
      if (step == 8) take_down();
      // (learner-b has joined for step 10)
      if (step == 16) {
        EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() { return b.steps >= 10; }));
      }
    });
  });
  std::thread tb([&]() {
    Learn(config, "learner-b", 2, 8, &b, gate, [&](int step) {
      if (step == 8) take_down();
      // (and learner-b's join has its answer: a boundary reached before it
      // would train on and skip its round)
      if (step == 10) {
        EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
          return formed_again() && b.reducer->NewestJoinFormed();
        }));
      }
    });
  });
  ta.join();
  tb.join();
  ASSERT_TRUE(outage.taken_down());
  outage.Join();
  EXPECT_TRUE(outage.trained_on());
  EXPECT_EQ(a.stats.failed_rounds, 0u);
  EXPECT_EQ(b.stats.failed_rounds, 0u);
  EXPECT_EQ(a.stats.steps_moved, 0);
  EXPECT_GE(b.stats.steps_moved, 2);  // (at least a fragment period)
  EXPECT_EQ(a.stats.heals, 0u);
  EXPECT_EQ(b.stats.heals, 1u);  // (only its first round's: the learners start from two seeds)
  EXPECT_EQ(a.stats.last_round_id, b.stats.last_round_id);
  // (a's last round is taken up in its shutdown, after its loop: b logs it, a does not)
  EXPECT_GE(ExpectSameGlobals(a, b), 8u);
  ASSERT_TRUE(a.final_global.has_value() && b.final_global.has_value());
  EXPECT_EQ(*a.final_global, *b.final_global);
}

}  // namespace
}  // namespace mend
