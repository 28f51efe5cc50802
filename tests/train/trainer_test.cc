// The training example and the DDP baseline: the model is causal, training
// lowers the held-out loss, DataParallel averages gradients across learners
// exactly, and learners that train with the reducer (or DDP) end with the
// same model, so they report the same held-out loss bit for bit.
#include "train/trainer.h"

#include <cmath>
#include <filesystem>
#include <functional>
#include <thread>

#include "fmt/format.h"
#include "gtest/gtest.h"
#include "mend/data_parallel.h"
#include "mend/lighthouse.h"
#include "test_util/job_config.h"
#include "test_util/synthetic_corpus.h"
#include "test_util/wait.h"
#include "torch/nn/modules/linear.h"
#include "train/model.h"

namespace mend::train {
namespace {

constexpr char kToken[] = "trainer-test-token-0123456789";

TEST(GptTest, OutputAtAPositionDependsOnlyOnEarlierBytes) {
  GptOptions options{.vocab = 256, .context = 12, .dim = 16, .layers = 2, .heads = 2};
  Gpt model(options);
  InitGpt(model, 1);
  at::Tensor bytes = at::randint(0, 256, {1, 12}, at::kLong);
  at::Tensor changed = bytes.clone();
  changed[0][8] = (bytes[0][8].item<int64_t>() + 1) % 256;
  at::NoGradGuard no_grad;
  at::Tensor a = model->forward(bytes), b = model->forward(changed);
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{1, 12, 256}));
  EXPECT_TRUE(at::equal(a.slice(1, 0, 8), b.slice(1, 0, 8)));
  EXPECT_FALSE(at::allclose(a.slice(1, 8, 12), b.slice(1, 8, 12)));
}

TEST(GptTest, BadSizesNameTheOption) {
  EXPECT_EQ(CheckGptOptions({.dim = 30, .heads = 4}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(CheckGptOptions({.dim = 30, .heads = 4}).message().find("heads"),
            std::string_view::npos);
  EXPECT_EQ(CheckGptOptions({.layers = 0}).code(), absl::StatusCode::kInvalidArgument);
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::MakeTempDir();
    testing_util::WriteSyntheticFortunes(dir_ + "/corpus");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  TrainOptions Options(const std::string& mode, int shard, int shards) const {
    TrainOptions o;
    o.id = "learner-" + std::to_string(shard);
    o.mode = mode;
    o.corpus = {dir_ + "/corpus", shard, shards, 20};
    o.model = {.vocab = 256, .context = 16, .dim = 16, .layers = 1, .heads = 2};
    o.batch = 4;
    o.steps = 8;
    o.warmup_steps = 2;
    o.eval_windows = 8;
    return o;
  }

  // Two learners side by side with an embedded lighthouse; `change` may
  // alter learner i's options.
  std::vector<StatusOr<TrainResult>> TryTwo(
      const std::string& mode, Config config,
      const std::function<void(int, TrainOptions&)>& change = nullptr) {
    auto server = LighthouseServer::Start(config, kToken, *RealClock());
    EXPECT_TRUE(server.ok()) << server.status();
    config.lighthouse = (*server)->grpc_address();
    std::vector<StatusOr<TrainResult>> results(2, InternalError("not run"));
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i]() {
        TrainOptions o = Options(mode, i, 2);
        if (change) change(i, o);
        results[static_cast<size_t>(i)] = Train(o, config, kToken, *RealClock(), nullptr, nullptr);
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  // TryTwo, both learners succeeding.
  std::vector<TrainResult> RunTwo(const std::string& mode, Config config) {
    std::vector<TrainResult> results;
    for (auto& result : TryTwo(mode, std::move(config))) {
      EXPECT_TRUE(result.ok()) << result.status();
      results.push_back(result.ok() ? *std::move(result) : TrainResult{});
    }
    return results;
  }

  // Two diloco learners whose options `change` makes differ: one trains, the
  // other is refused with INVALID_ARGUMENT (whichever registers first sets
  // the job's settings). The refused one's status, and which it was (0, 1).
  std::pair<Status, int> TheRefusedOfTwo(const std::function<void(int, TrainOptions&)>& change) {
    Config config = testing_util::LoopbackJobConfig(2);
    config.sync_period_steps = 4;
    config.quorum_timeout_ms = 1000;  // the learner left alone waits this for each round
    std::vector<Status> statuses;
    for (const auto& result : TryTwo("diloco", config, change)) statuses.push_back(result.status());
    const int refused = statuses[0].ok() ? 1 : 0;
    EXPECT_TRUE(statuses[1 - refused].ok()) << statuses[1 - refused];
    EXPECT_EQ(statuses[refused].code(), absl::StatusCode::kInvalidArgument) << statuses[refused];
    return {statuses[refused], refused};
  }

  std::string dir_;
};

TEST_F(TrainerTest, LocalTrainingLowersTheHeldOutLoss) {
  TrainOptions o = Options("local", 0, 1);
  o.steps = 60;
  o.lr = 3e-3;
  o.eval_every = 30;
  auto result = Train(o, Config(), "", *RealClock(), nullptr, nullptr);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->eval_curve.size(), 2u);  // step 30 and the end
  EXPECT_EQ(result->tokens, 60u * 4 * 16);
  // An untrained byte model is near uniform: log(256) = 5.55 nats per byte.
  EXPECT_LT(result->eval_curve[0].loss, std::log(256.0) - 1.0);
  EXPECT_LT(result->eval_loss, result->eval_curve[0].loss);
  EXPECT_EQ(result->bytes_sent, 0u);
}

// A stop asked for ends the last evaluation after the batch in hand: the
// result says on how many windows its loss is (all of them otherwise).
TEST_F(TrainerTest, AStoppedEvaluationSaysOnHowManyWindowsItsLossIs) {
  TrainOptions o = Options("local", 0, 1);
  o.steps = 2;
  auto whole = Train(o, Config(), "", *RealClock(), nullptr, nullptr);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->eval_windows, o.eval_windows);
  EXPECT_EQ(whole->ToJson()["eval_windows"], o.eval_windows);
  TrainSignals signals;
  signals.stop = true;
  auto stopped = Train(o, Config(), "", *RealClock(), nullptr, &signals);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->eval_windows, o.batch);  // one batch of the eight windows
  EXPECT_TRUE(std::isfinite(stopped->eval_loss));
}

TEST_F(TrainerTest, DiLoCoLearnersEndWithTheSameModel) {
  Config config = testing_util::LoopbackJobConfig(2);
  config.sync_period_steps = 4;
  config.concurrent_outer_step = false;
  auto results = RunTwo("diloco", config);
  for (const auto& r : results) {
    EXPECT_EQ(r.rounds, 2u);
    EXPECT_EQ(r.failed_rounds, 0u);
    EXPECT_GT(r.bytes_sent, 0u);
    EXPECT_TRUE(std::isfinite(r.eval_loss));
  }
  // The last round ends on the last step: both models are the global one.
  EXPECT_EQ(results[0].eval_loss, results[1].eval_loss);
}

// --steps is the job's total_steps, one of the settings every learner of a
// job shares: a learner of another length is refused, naming it (whichever
// of the two registers first sets the job's).
TEST_F(TrainerTest, ALearnerOfAnotherJobLengthIsRefused) {
  auto [status, refused] = TheRefusedOfTwo([](int i, TrainOptions& o) { o.steps = 8 + i; });
  EXPECT_NE(status.message().find(fmt::format("total_steps = {}", 8 + refused)),
            std::string_view::npos)
      << status;
}

// Learners of two models (another width) are refused at registration,
// naming the parameters of both, instead of every round failing to merge.
TEST_F(TrainerTest, ALearnerOfAnotherModelIsRefusedNamingTheParameters) {
  auto [status, refused] =
      TheRefusedOfTwo([](int i, TrainOptions& o) { o.model.dim = 16 + 8 * i; });
  EXPECT_NE(status.message().find("parameters = "), std::string_view::npos) << status;
  EXPECT_NE(status.message().find("(this job's learners have "), std::string_view::npos) << status;
}

TEST_F(TrainerTest, DdpLearnersStayIdenticalAndSendEveryStep) {
  auto results = RunTwo("ddp", testing_util::LoopbackJobConfig(2));
  EXPECT_EQ(results[0].eval_loss, results[1].eval_loss);
  EXPECT_GT(results[0].bytes_sent, 0u);
  // DDP sends the gradients on every step: more than a DiLoCo round's worth.
  EXPECT_EQ(results[0].steps, 8);
}

TEST_F(TrainerTest, LocalLearnersDiverge) {
  auto a = Train(Options("local", 0, 2), Config(), "", *RealClock(), nullptr, nullptr);
  auto b = Train(Options("local", 1, 2), Config(), "", *RealClock(), nullptr, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->eval_loss, b->eval_loss);
}

TEST_F(TrainerTest, BadOptionsAreRefusedBeforeTraining) {
  TrainOptions o = Options("nonsense", 0, 1);
  auto result = Train(o, Config(), "", *RealClock(), nullptr, nullptr);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("nonsense"), std::string_view::npos);
  o = Options("local", 0, 1);
  o.corpus.dir = dir_ + "/missing";
  EXPECT_EQ(Train(o, Config(), "", *RealClock(), nullptr, nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

// DataParallel on its own: a 2-member job whose learners start from
// different parameters and have different gradients.
TEST(DataParallelTest, StartsFromRankZerosParametersAndAveragesGradientsByTokens) {
  Config config = testing_util::LoopbackJobConfig(2);
  auto server = LighthouseServer::Start(config, kToken, *RealClock());
  ASSERT_TRUE(server.ok()) << server.status();
  config.lighthouse = (*server)->grpc_address();
  std::vector<std::vector<float>> weights(2), grads(2);
  std::vector<uint64_t> bytes(2);
  auto learner = [&](int i) {
    auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                     {"learner-" + std::to_string(i), "", "", ""}, *RealClock());
    ASSERT_TRUE(agent.ok()) << agent.status();
    torch::manual_seed(static_cast<uint64_t>(i) + 10);
    torch::nn::Linear model(4, 2);
    auto dp = DataParallel::Create(config, *model, **agent);
    ASSERT_TRUE(dp.ok()) << dp.status();
    const float* w = model->weight.data_ptr<float>();
    weights[static_cast<size_t>(i)].assign(w, w + 8);
    // Gradient 1 everywhere on learner 0 (1 token), 3 on learner 1 (3 tokens);
    // the bias gets none on learner 0 (counts as 0).
    model->weight.mutable_grad() = at::full({2, 4}, i == 0 ? 1.0f : 3.0f);
    if (i == 1) model->bias.mutable_grad() = at::full({2}, 4.0f);
    ASSERT_TRUE((*dp)->AverageGradients(i == 0 ? 1 : 3).ok());
    const float* g = model->weight.grad().data_ptr<float>();
    grads[static_cast<size_t>(i)].assign(g, g + 8);
    grads[static_cast<size_t>(i)].push_back(model->bias.grad()[0].item<float>());
    bytes[static_cast<size_t>(i)] = (*dp)->stats().bytes_sent;
    ASSERT_TRUE((*dp)->shutdown().ok());
  };
  std::thread a(learner, 0), b(learner, 1);
  a.join();
  b.join();
  EXPECT_EQ(weights[0], weights[1]) << "both start from rank 0's parameters";
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 8; ++k)
      EXPECT_EQ(grads[static_cast<size_t>(i)][static_cast<size_t>(k)], 2.5f);
    EXPECT_EQ(grads[static_cast<size_t>(i)][8], 3.0f);  // (0 * 1 + 4 * 3) / 4
    EXPECT_GT(bytes[static_cast<size_t>(i)], 0u);
  }
}

}  // namespace
}  // namespace mend::train
