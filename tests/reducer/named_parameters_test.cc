// The C++ reducer over named tensors it does not own (the way any
// non-module training loop uses it): the caller's tensors are written in
// place, never replaced; moments handed over as tensors (an InnerMoments of
// the loop's) are averaged in place by DES-LOC; bad parameters are refused
// by name.
#include <array>
#include <thread>

#include "gtest/gtest.h"
#include "mend/lighthouse.h"
#include "mend/reducer.h"
#include "test_util/job_config.h"
#include "torch/types.h"

namespace mend {
namespace {

constexpr char kToken[] = "named-parameters-test-token-0123";
constexpr int kPeriod = 3;

Config JobConfig() {
  Config config = testing_util::SynchronousJobConfig(2, kPeriod);
  config.desloc = true;
  config.momentum_sync_period_steps = kPeriod;
  config.second_moment_sync_period_steps = kPeriod;
  return config;
}

struct Seen {
  const void* weight_data_before = nullptr;
  const void* weight_data_after = nullptr;
  std::vector<float> weight_after_round;  // the caller's tensor right after the last round
  std::vector<float> global_after_round;  // the reducer's global state then
  std::vector<float> first_moment;        // the caller's moment tensor at the end
  uint64_t rounds = 0;
  uint64_t moment_syncs = 0;
};

// The moments a hand-written loop keeps, shared with the reducer.
class LoopMoments final : public InnerMoments {
 public:
  explicit LoopMoments(std::vector<std::array<at::Tensor, 2>> moments)
      : moments_(std::move(moments)) {}
  at::Tensor Moment(size_t index, Which which) override {
    return index < moments_.size() ? moments_[index][which] : at::Tensor();
  }

 private:
  std::vector<std::array<at::Tensor, 2>> moments_;
};

// A hand-written loop with no torch::nn::Module: "weight" and "bias" tensors,
// plain SGD, and first/second moments kept by the loop (as an optimizer
// would) and handed to the reducer as tensors.
void Learn(const Config& config, const std::string& id, int seed, Seen* seen) {
  auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {id, "", "", ""}, *RealClock());
  ASSERT_TRUE(agent.ok()) << agent.status();
  torch::manual_seed(seed);
  at::Tensor weight = torch::randn({1, 4});
  at::Tensor bias = torch::zeros({1});
  at::Tensor exp_avg[2] = {torch::zeros({1, 4}), torch::zeros({1})};
  at::Tensor exp_avg_sq[2] = {torch::zeros({1, 4}), torch::zeros({1})};
  auto moments = std::make_unique<LoopMoments>(std::vector<std::array<at::Tensor, 2>>{
      {exp_avg[0], exp_avg_sq[0]}, {exp_avg[1], exp_avg_sq[1]}});
  auto reducer =
      Reducer::Create(config, {{"weight", weight}, {"bias", bias}}, std::move(moments), **agent);
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  seen->weight_data_before = weight.data_ptr();
  at::Tensor true_w = torch::arange(4, torch::kFloat).reshape({1, 4});
  for (int step = 1; step <= 3 * kPeriod; ++step) {
    at::Tensor x = torch::randn({8, 4});
    at::Tensor y = torch::matmul(x, true_w.t()) + static_cast<float>(seed);
    at::Tensor err = torch::matmul(x, weight.t()) + bias - y;
    at::Tensor grad_w = 2 * torch::matmul(err.t(), x) / 8;
    at::Tensor grad_b = 2 * err.mean(0);
    weight.sub_(0.05 * grad_w);
    bias.sub_(0.05 * grad_b);
    exp_avg[0].mul_(0.9).add_(0.1 * grad_w);
    exp_avg[1].mul_(0.9).add_(0.1 * grad_b);
    exp_avg_sq[0].mul_(0.99).add_(0.01 * grad_w * grad_w);
    exp_avg_sq[1].mul_(0.99).add_(0.01 * grad_b * grad_b);
    ASSERT_TRUE((*reducer)->step(8).ok());
    if (step % kPeriod == 0) {
      seen->weight_after_round.assign(weight.data_ptr<float>(), weight.data_ptr<float>() + 4);
      auto global = (*reducer)->global(0);
      seen->global_after_round.assign(global.begin(), global.end());
    }
  }
  ASSERT_TRUE((*reducer)->shutdown().ok());
  seen->weight_data_after = weight.data_ptr();
  seen->first_moment.assign(exp_avg[0].data_ptr<float>(), exp_avg[0].data_ptr<float>() + 4);
  seen->rounds = (*reducer)->stats().rounds;
  seen->moment_syncs = (*reducer)->stats().moment_syncs;
}

TEST(NamedParametersTest, TheCallersTensorsAreWrittenInPlaceAndTheirMomentsAveraged) {
  Config config = JobConfig();
  auto server = LighthouseServer::Start(config, kToken, *RealClock());
  ASSERT_TRUE(server.ok()) << server.status();
  config.lighthouse = (*server)->grpc_address();
  Seen a, b;
  std::thread ta([&]() { Learn(config, "learner-a", 1, &a); });
  std::thread tb([&]() { Learn(config, "learner-b", 2, &b); });
  ta.join();
  tb.join();
  for (const Seen* seen : {&a, &b}) {
    EXPECT_EQ(seen->rounds, 3u);
    EXPECT_EQ(seen->moment_syncs, 6u);  // both moments, every round
    // The same memory: never replaced, and holding the round's result.
    EXPECT_EQ(seen->weight_data_before, seen->weight_data_after);
    ASSERT_EQ(seen->global_after_round.size(), 5u);  // weight (4) then bias (1)
    EXPECT_EQ(seen->weight_after_round, std::vector<float>(seen->global_after_round.begin(),
                                                           seen->global_after_round.begin() + 4));
  }
  EXPECT_EQ(a.global_after_round, b.global_after_round);
  // DES-LOC wrote the average into the loop's own moment tensors.
  EXPECT_EQ(a.first_moment, b.first_moment);
}

// A lighthouse and learner-a's agent, for tests of one learner (quorum
// minimum 1, no DES-LOC).
struct OneLearner {
  Config config = JobConfig();
  std::unique_ptr<LighthouseServer> server;
  std::unique_ptr<LearnerAgent> agent;

  Status Start() {
    config.desloc = false;
    config.quorum_min_learners = 1;
    MEND_ASSIGN_OR_RETURN(server, LighthouseServer::Start(config, kToken, *RealClock()));
    config.lighthouse = server->grpc_address();
    MEND_ASSIGN_OR_RETURN(agent,
                          LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                              {"learner-a", "", "", ""}, *RealClock()));
    return OkStatus();
  }
};

TEST(NamedParametersTest, ParametersGivenOtherStorageAreFollowedAndChangedOnesRefusedByName) {
  OneLearner job;
  const Status started = job.Start();
  ASSERT_TRUE(started.ok()) << started;
  Config& config = job.config;
  at::Tensor weight = torch::zeros({1, 4});
  at::Tensor bias = torch::zeros({1});
  auto reducer = Reducer::Create(config, {{"weight", weight}, {"bias", bias}}, nullptr, *job.agent);
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  // New storage of the same kind and size (set_data, as a load does): the
  // round reads and writes the new storage.
  weight.set_data(torch::full({1, 4}, 2.0f));
  for (int step = 1; step <= kPeriod; ++step) ASSERT_TRUE((*reducer)->step(8).ok());
  ASSERT_EQ((*reducer)->stats().rounds, 1u);
  EXPECT_EQ((*reducer)->global(0)[0], 2.0f);
  EXPECT_EQ(weight[0][0].item<float>(), 2.0f);
  // Another size or type: refused by name at the next step that reads the
  // parameters (the next boundary), before any copy; the steps before it
  // copy nothing.
  bias.set_data(torch::zeros({3}));
  Status status = OkStatus();
  int steps = kPeriod;
  while (status.ok() && steps < 3 * kPeriod) {
    status = (*reducer)->step(8);
    ++steps;
  }
  EXPECT_EQ(steps, 2 * kPeriod);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("parameter 'bias' changed after Reducer::Create: it holds 3 "
                                  "values instead of 1"),
            std::string::npos)
      << status;
  bias.set_data(torch::zeros({1}, torch::kDouble));
  status = (*reducer)->shutdown();
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("parameter 'bias' changed after Reducer::Create: it is dense "
                                  "Double on cpu"),
            std::string::npos)
      << status;
  bias.set_data(torch::zeros({1}));
  EXPECT_TRUE((*reducer)->shutdown().ok());
}

TEST(NamedParametersTest, BadParametersAreRefusedByName) {
  OneLearner job;
  const Status started = job.Start();
  ASSERT_TRUE(started.ok()) << started;
  Config& config = job.config;
  auto refused = [&](NamedParameters parameters, const Config& with) {
    auto reducer = Reducer::Create(with, std::move(parameters), nullptr, *job.agent);
    EXPECT_FALSE(reducer.ok());
    return reducer.ok() ? std::string() : std::string(StatusMessage(reducer.status()));
  };
  EXPECT_NE(refused({{"w", torch::zeros({2}, torch::kDouble)}}, config)
                .find("parameter 'w' is dense Double"),
            std::string::npos);
  EXPECT_NE(refused({{"emb", torch::zeros({4, 4}).to_sparse()}}, config).find("'emb' is sparse"),
            std::string::npos);
  EXPECT_NE(refused({{"t", torch::zeros({3, 2}).t()}}, config)
                .find("'t' is dense Float on cpu (not contiguous)"),
            std::string::npos);
  EXPECT_NE(refused({}, config).find("has no parameters"), std::string::npos);
  EXPECT_NE(refused({{"w", torch::zeros({2})}, {"w", torch::zeros({2})}}, config)
                .find("two parameters are named 'w'"),
            std::string::npos);
  Config desloc = config;
  desloc.desloc = true;
  EXPECT_NE(refused({{"w", torch::zeros({2})}}, desloc).find("desloc = true"), std::string::npos);
  (void)job.agent->Leave("test over");
}

}  // namespace
}  // namespace mend
