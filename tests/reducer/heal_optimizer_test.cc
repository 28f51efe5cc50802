// heal_inner_optimizer with LibTorch's AdamW, end to end in one process: a
// learner that joins behind takes its source's global state, Adam moments
// and step count, so that its next optimizer step on the same batch is the
// source's, bit for bit; for learners of one rank and of a group of two,
// and with DES-LOC averaging the moments in the round that heals.
#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "fmt/format.h"
#include "gtest/gtest.h"
#include "mend/lighthouse.h"
#include "mend/reducer.h"
#include "nlohmann/json.hpp"
#include "test_util/job_config.h"
#include "test_util/wait.h"
#include "torch/nn/functional/loss.h"
#include "torch/nn/modules/linear.h"
#include "torch/optim/adamw.h"

namespace mend {
namespace {

constexpr char kToken[] = "heal-optimizer-test-token-0123456789";
constexpr int kPeriod = 4;

// What one rank of a learner ends with.
struct RankLog {
  Status error = OkStatus();
  ReducerStats stats;
  bool losses_finite = true;
  int64_t optimizer_step = 0;  // AdamW's step count after the last round
  std::vector<float> moments;  // exp_avg then exp_avg_sq of the weight, after the last round
  std::vector<float> probe;    // weight and bias after one more step on the probe batch
};

// Learner `learner`'s batch at `step`, from neither seed nor generator: a
// group's ranks see the same batches, as DDP's replicas hold the same model.
std::pair<torch::Tensor, torch::Tensor> Batch(int learner, int64_t step) {
  torch::Tensor x = torch::sin(torch::arange(16 * 8, torch::kFloat) * (0.37 * (learner + 1)) + step)
                        .reshape({16, 8});
  torch::Tensor true_w = torch::arange(8, torch::kFloat).reshape({8, 1}) / 8;
  return {x, torch::matmul(x, true_w) + 0.1 * learner};
}

// The weight's AdamW state.
torch::optim::AdamWParamState& WeightState(torch::optim::AdamW& optimizer,
                                           torch::nn::Linear& model) {
  auto& state = optimizer.state().at(c10::guts::to_string(model->weight.unsafeGetTensorImpl()));
  return static_cast<torch::optim::AdamWParamState&>(*state);
}

std::vector<float> Values(const torch::Tensor& t) {
  torch::Tensor flat = t.detach().contiguous().reshape({-1});
  return {flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel()};
}

// One rank of learner `learner` ("learner-<learner>") trains `steps` steps
// (`gate(s)` runs before step s), then records its optimizer's state and
// takes one step on the probe batch.
void Train(Config config, int learner, int rank, int steps, const std::function<void(int)>& gate,
           std::atomic<uint64_t>* rounds, RankLog* log) {
  config.group_rank = rank;
  auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {fmt::format("learner-{}", learner), "", "", ""}, *RealClock());
  if (!agent.ok()) {
    log->error = agent.status();
    return;
  }
  torch::nn::Linear model(8, 1);
  {
    torch::NoGradGuard no_grad;
    model->weight.copy_(torch::linspace(-0.4, 0.4, 8).reshape({1, 8}) * (learner + 1));
    model->bias.fill_(0.1 * learner);
  }
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(0.01).betas({0.9, 0.95}));
  auto reducer = Reducer::Create(config, *model, optimizer, **agent);
  if (!reducer.ok()) {
    log->error = reducer.status();
    return;
  }
  auto step = [&](int64_t data_learner, int64_t s) {
    auto [x, y] = Batch(static_cast<int>(data_learner), s);
    optimizer.zero_grad();
    torch::Tensor loss = torch::nn::functional::mse_loss(model->forward(x), y);
    loss.backward();
    optimizer.step();
    log->losses_finite &= std::isfinite(loss.item<float>());
  };
  for (int s = 1; s <= steps && log->error.ok(); ++s) {
    gate(s);
    step(learner, s);
    log->error = (*reducer)->step(16);
    if (rounds) rounds->store((*reducer)->stats().rounds);
  }
  log->stats = (*reducer)->stats();
  auto& state = WeightState(optimizer, model);
  log->optimizer_step = state.step();
  log->moments = Values(state.exp_avg());
  std::vector<float> second = Values(state.exp_avg_sq());
  log->moments.insert(log->moments.end(), second.begin(), second.end());
  step(/*data_learner=*/99, 0);
  log->probe = Values(model->weight);
  log->probe.push_back(model->bias.item<float>());
  if (Status shut = (*reducer)->shutdown(); log->error.ok()) log->error = shut;
}

// Learner 0 runs round 1 alone; learner 1 starts after it (a new process,
// behind) and joins round 2, where it heals from learner 0: learner 0 is at
// its step 8 then, learner 1 at its step 4 (learner 0 joins once learner 1
// waits in the round, so that it cannot close without it).
// logs[learner][rank].
// With `desloc`, round 2 also averages both moments: the healed learner
// adds none of its own (they are not the job's), and takes the average as
// its source does.
std::vector<std::vector<RankLog>> JoinBehind(int ranks, bool desloc) {
  Config config = testing_util::SynchronousJobConfig(1, kPeriod);
  config.heal_inner_optimizer = true;
  config.group_size = ranks;
  config.desloc = desloc;
  config.momentum_sync_period_steps = 2 * kPeriod;  // (round ids 2, 4, ...)
  config.second_moment_sync_period_steps = 2 * kPeriod;
  auto server = LighthouseServer::Start(config, kToken, *RealClock());
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return {};
  config.lighthouse = (*server)->grpc_address();
  auto state = [&](const std::string& id) -> std::string {
    const nlohmann::json status = nlohmann::json::parse((*server)->StatusJson());
    for (const auto& learner : status["learners"])
      if (learner["id"] == id) return learner["state"];
    return "";
  };
  std::atomic<uint64_t> rounds_of_0{0};
  // Once a rank of learner 0 saw learner 1 waiting in round 2, the round may
  // form and learner 1 stop waiting: the other rank goes on.
  std::atomic<bool> learner_1_waits{false};
  std::vector<std::vector<RankLog>> logs(2, std::vector<RankLog>(static_cast<size_t>(ranks)));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r]() {
      auto gate = [&](int s) {  // round 2 forms once learner 1 waits in it
        if (s == 2 * kPeriod) {
          EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
            return learner_1_waits.load() || state("learner-1") == "waiting";
          }));
          learner_1_waits = true;
        }
      };
      Train(config, 0, r, 2 * kPeriod, gate, r == 0 ? &rounds_of_0 : nullptr, &logs[0][r]);
    });
    threads.emplace_back([&, r]() {
      EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() { return rounds_of_0 >= 1; }));
      Train(
          config, 1, r, kPeriod, [](int) {}, nullptr, &logs[1][r]);
    });
  }
  for (auto& thread : threads) thread.join();
  return logs;
}

void ExpectTheSameNextStep(int ranks, bool desloc = false) {
  const auto logs = JoinBehind(ranks, desloc);
  ASSERT_EQ(logs.size(), 2u);
  const RankLog& source = logs[0][0];
  for (int l = 0; l < 2; ++l) {
    for (int r = 0; r < ranks; ++r) {
      const RankLog& log = logs[static_cast<size_t>(l)][static_cast<size_t>(r)];
      const std::string who = fmt::format("learner {} rank {} of {}", l, r, ranks);
      ASSERT_TRUE(log.error.ok()) << who << ": " << log.error;
      EXPECT_TRUE(log.losses_finite) << who;
      EXPECT_EQ(log.stats.rounds, l == 0 ? 2u : 1u) << who;
      EXPECT_EQ(log.stats.steps, 2u * kPeriod) << who;  // learner 1 took the job's step
      // The source's optimizer, exactly: its step count and moments ...
      EXPECT_EQ(log.optimizer_step, 2 * kPeriod) << who;
      EXPECT_EQ(log.moments, source.moments) << who;
      // ... so the same step on the same batch, bit for bit.
      EXPECT_EQ(log.probe, source.probe) << who;
      // Round 2 averaged both moments on every member.
      if (desloc) {
        EXPECT_EQ(log.stats.moment_syncs, 2u) << who;
      }
    }
  }
  for (const RankLog& log : logs[1]) EXPECT_EQ(log.stats.heals, 1u);
}

TEST(HealOptimizerTest, ALearnerHealedWithItsSourcesMomentsTakesTheSourcesNextStep) {
  ExpectTheSameNextStep(1);
}

TEST(HealOptimizerTest, AGroupHealedWithItsSourcesMomentsTakesTheSourcesNextStepOnEveryRank) {
  ExpectTheSameNextStep(2);
}

TEST(HealOptimizerTest, ALearnerHealedInARoundThatAveragesTheMomentsEndsWithTheSourcesMoments) {
  ExpectTheSameNextStep(1, /*desloc=*/true);
}

TEST(HealOptimizerTest, AGroupHealedInARoundThatAveragesTheMomentsEndsWithTheSourcesMoments) {
  ExpectTheSameNextStep(2, /*desloc=*/true);
}

}  // namespace
}  // namespace mend
