// The round at scale, by counting work rather than timing it: the same bits
// whatever the round's threads and whether the parameters are used in place
// or through copies; two passes over a fragment per round; no model-sized
// allocation after the start (no page faults in later rounds); the resident
// memory of the reducer's state; what the start touches. Two learners on
// loopback in this process (round_driver_test.cc's setup).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "fmt/format.h"
#include "gtest/gtest.h"
#include "mend/lighthouse.h"
#include "reducer/fragment_book.h"
#include "reducer/round_driver.h"
#include "reducer/vector_parameters.h"
#include "test_util/driver_options.h"
#include "test_util/job_config.h"

namespace mend::reducer {
namespace {

constexpr char kToken[] = "round-scale-test-token-0123456789";

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // shadow memory: resident sizes say nothing
#else
constexpr bool kSanitized = false;
#endif

// Parameters "p0", "p1", ... of the given sizes; in place (Values) or only
// through CopyOut and CopyIn.
std::unique_ptr<VectorParameters> MakeParameters(const std::vector<size_t>& sizes, bool in_place,
                                                 float start) {
  std::vector<VectorParameters::Tensor> tensors;
  for (size_t i = 0; i < sizes.size(); ++i)
    tensors.push_back({fmt::format("p{}", i), {static_cast<int64_t>(sizes[i])}});
  return std::make_unique<VectorParameters>(std::move(tensors), start, in_place);
}

struct Learner {
  int threads = 1;
  bool in_place = true;
  float slope = 1.0f;
};

struct LearnerRun {
  ReducerStats stats;
  std::vector<float> global;  // every fragment's
  std::vector<float> local;
  // The process's minor faults in the steps after the first round was taken up.
  long faults_after_first_round = 0;
};

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// A learner whose "training" moves value k by slope * ((k % 13) - 6) / 1024
// each step: the same on every run.
void Learn(Config config, const Learner& who, const std::string& id,
           const std::vector<size_t>& sizes, int steps, LearnerRun* run) {
  config.round_threads = who.threads;
  auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {id, "", "", ""}, *RealClock());
  ASSERT_TRUE(agent.ok()) << agent.status();
  FakeClock clock;
  auto parameters = MakeParameters(sizes, who.in_place, 0.5f);
  VectorParameters* view = parameters.get();
  auto driver = RoundDriver::Create(mend::testing_util::DriverOptionsFor(config), **agent, clock,
                                    std::move(parameters), nullptr, 0);
  ASSERT_TRUE(driver.ok()) << driver.status();
  for (int s = 0; s < steps; ++s) {
    clock.AdvanceMillis(50);
    for (std::vector<float>& values : view->values()) {
      for (size_t k = 0; k < values.size(); ++k)
        values[k] += who.slope * static_cast<float>(static_cast<int>(k % 13) - 6) / 1024.0f;
    }
    const bool later = (*driver)->stats().rounds >= 1;
    const long faults = MinorFaults();
    ASSERT_TRUE((*driver)->step(16).ok());
    if (later) run->faults_after_first_round += MinorFaults() - faults;
  }
  ASSERT_TRUE((*driver)->shutdown().ok());
  run->stats = (*driver)->stats();
  for (int f = 0; f < (*driver)->fragments(); ++f) {
    auto global = (*driver)->global(f);
    run->global.insert(run->global.end(), global.begin(), global.end());
  }
  for (const std::vector<float>& values : view->values())
    run->local.insert(run->local.end(), values.begin(), values.end());
}

// Each learner on a thread of its own, with one lighthouse.
std::vector<LearnerRun> RunLearners(Config config, const std::vector<size_t>& sizes, int steps,
                                    const std::vector<Learner>& learners) {
  std::vector<LearnerRun> runs(learners.size());
  auto server = LighthouseServer::Start(config, kToken, *RealClock());
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return runs;
  config.lighthouse = (*server)->grpc_address();
  std::vector<std::thread> threads;
  for (size_t l = 0; l < learners.size(); ++l) {
    threads.emplace_back([&, l]() {
      Learn(config, learners[l], fmt::format("learner-{}", static_cast<char>('a' + l)), sizes,
            steps, &runs[l]);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return runs;
}

void RunPair(Config config, const std::vector<size_t>& sizes, int steps, const Learner& a,
             const Learner& b, LearnerRun* run_a, LearnerRun* run_b) {
  auto runs = RunLearners(config, sizes, steps, {a, b});
  *run_a = std::move(runs[0]);
  *run_b = std::move(runs[1]);
}

bool SameBits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Four chunks and more, parameters that end inside chunks, one that spans several.
const std::vector<size_t> kSizes = {300'001, 7, 700'003, 5, 262'144};

TEST(RoundScaleTest, TheChunkedRoundGivesTheSameBitsOnAnyThreadsInPlaceOrThroughCopies) {
  for (const std::string codec : {"fp32", "int8"}) {
    for (const int fragments : {1, 2}) {
      Config config = testing_util::SynchronousJobConfig(2, 4);
      ASSERT_TRUE(SetConfigValue(config, "codec", codec, "test").ok());
      config.fragments = fragments;
      config.final_merge = true;
      config.total_steps = 14;  // 3 rounds, and the final merge (1 fragment: the 4th's period)
      // The reference: one thread, every pass through copies; then the
      // pool's threads over the parameters in place, the learners mixed.
      LearnerRun a1, b1, a4, b4;
      RunPair(config, kSizes, 14, {1, false, 1.0f}, {1, false, 3.0f}, &a1, &b1);
      RunPair(config, kSizes, 14, {4, true, 1.0f}, {3, false, 3.0f}, &a4, &b4);
      const std::string what = fmt::format("{}, {} fragment(s)", codec, fragments);
      ASSERT_GE(a1.stats.rounds, 3u) << what;
      EXPECT_EQ(a1.stats.final_rounds, 1u) << what;
      EXPECT_TRUE(SameBits(a1.global, b1.global)) << what << ": the members differ";
      EXPECT_TRUE(SameBits(a1.local, b1.local)) << what << ": merged models differ";
      EXPECT_TRUE(SameBits(a1.global, a4.global)) << what << ": the threads changed the bits";
      EXPECT_TRUE(SameBits(a1.local, a4.local)) << what;
      EXPECT_TRUE(SameBits(b1.local, b4.local)) << what;
      // Learner a's fp32 rounds over its parameters in place made the
      // pseudo-gradient in the merge but the first (which compares the
      // states first), int8 its final merge's (in fp32); through copies,
      // the snapshot made it.
      EXPECT_EQ(a4.stats.rounds_made_in_merge,
                codec == "fp32" ? a4.stats.rounds - 1 : a4.stats.final_rounds)
          << what;
      EXPECT_EQ(b4.stats.rounds_made_in_merge, 0u) << what;
    }
  }
}

TEST(RoundScaleTest, WithThreeMembersTheLearnersInPlaceMakeThePseudoGradientInTheMerge) {
  // Three learners, two over their parameters in place and one through
  // copies: the robust rule's norms travel beside the merge, so the
  // learners in place make their pseudo-gradients in it (all rounds but
  // the first), with the bits of every learner snapshotting at the boundary.
  Config config = testing_util::SynchronousJobConfig(3, 4);
  config.final_merge = true;
  config.total_steps = 14;
  const auto copies =
      RunLearners(config, kSizes, 14, {{1, false, 1.0f}, {1, false, 3.0f}, {1, false, -2.0f}});
  const auto mixed =
      RunLearners(config, kSizes, 14, {{2, true, 1.0f}, {1, false, 3.0f}, {2, true, -2.0f}});
  for (size_t l = 0; l < 3; ++l) {
    const std::string what = fmt::format("learner {}", l);
    ASSERT_GE(copies[l].stats.rounds, 3u) << what;
    EXPECT_TRUE(SameBits(copies[l].global, copies[0].global)) << what << ": the members differ";
    EXPECT_TRUE(SameBits(mixed[l].global, copies[l].global)) << what;
    EXPECT_TRUE(SameBits(mixed[l].local, copies[l].local)) << what;
    EXPECT_EQ(copies[l].stats.rounds_made_in_merge, 0u) << what;
    EXPECT_EQ(mixed[l].stats.rounds_made_in_merge, l == 1 ? 0u : mixed[l].stats.rounds - 1) << what;
  }
}

TEST(RoundScaleTest, ConcurrentRoundsStayBitIdenticalAcrossMembersWithDifferentThreads) {
  Config config = testing_util::ConcurrentJobConfig(2, 4, 2);
  LearnerRun a, b;
  RunPair(config, kSizes, 22, {4, true, 1.0f}, {1, false, 3.0f}, &a, &b);
  ASSERT_GE(a.stats.rounds, 3u);
  EXPECT_EQ(a.stats.rounds, b.stats.rounds);
  EXPECT_TRUE(SameBits(a.global, b.global));
}

TEST(RoundScaleTest, ARoundMakesTwoPassesAndLaterRoundsFaultNoModelSizedMemoryIn) {
  // 8 Mi values (32 MiB) per learner: a model-sized buffer allocated in a
  // round would fault in 8192 pages; the rounds after the first fault in
  // none of that size (the pseudo-gradient buffer, the momentum and the
  // data plane's scratch are the start's). Snapshot and commit are the
  // round's two passes over the parameters, in both modes.
  const std::vector<size_t> sizes = {size_t{4} << 20, size_t{4} << 20};
  for (const bool concurrent : {false, true}) {
    Config config = concurrent ? testing_util::ConcurrentJobConfig(2, 4, 2)
                               : testing_util::SynchronousJobConfig(2, 4);
    LearnerRun a, b;
    RunPair(config, sizes, 20, {2, true, 1.0f}, {1, true, 3.0f}, &a, &b);
    const std::string mode = concurrent ? "concurrent" : "synchronous";
    ASSERT_GE(a.stats.rounds, 3u) << mode;
    EXPECT_EQ(a.stats.rounds, a.stats.rounds_started) << mode;
    EXPECT_EQ(a.stats.parameter_copies, 2 * a.stats.rounds) << mode;
    // (Sanitizers' allocators and shadow memory fault pages of their own.)
    if (!kSanitized) {
      EXPECT_LT(a.faults_after_first_round / static_cast<long>(a.stats.rounds - 1), 4096)
          << mode << ": faults per later round, both learners";
    }
  }
}

long ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(RoundScaleTest, TheStartTouchesTheGlobalStateAndTheRestIsFaultedInBeforeTheFirstRound) {
  if (kSanitized) GTEST_SKIP() << "resident sizes under a sanitizer include its shadow memory";
  // 16 Mi values: the global state is 64 MiB. Making the book copies the
  // parameters into it (4 bytes a value); the momentum and the
  // pseudo-gradient buffer (8 more) are faulted in by StartPrefault, in the
  // background; 12 bytes a value in all, beside the model's own 4.
  constexpr size_t kValues = size_t{16} << 20;
  const auto owned = MakeParameters({kValues / 2, kValues / 2}, true, 0.25f);
  VectorParameters& parameters = *owned;
  const FragmentSchedule schedule = *FragmentSchedule::Make(1, 4);
  uint64_t copies = 0;
  ThreadPool pool(2);
  const long before = ResidentBytes();
  FragmentBook book(parameters, schedule, &copies, pool);
  const double started = static_cast<double>(ResidentBytes() - before) / kValues;
  book.StartPrefault();
  book.AwaitPrefault();
  const double prefaulted = static_cast<double>(ResidentBytes() - before) / kValues;
  EXPECT_GT(started, 3.9);
  EXPECT_LT(started, 4.5);
  EXPECT_GT(prefaulted, 11.9);
  EXPECT_LT(prefaulted, 12.5);
  std::span<const float> global = book.at(0).state->global();
  ASSERT_EQ(global.size(), kValues);
  EXPECT_EQ(std::count(global.begin(), global.end(), 0.25f), static_cast<std::ptrdiff_t>(kValues));
  std::span<const float> momentum = book.at(0).state->momentum();
  EXPECT_EQ(std::count(momentum.begin(), momentum.end(), 0.0f),
            static_cast<std::ptrdiff_t>(kValues));
  EXPECT_EQ(book.at(0).spare.size(), kValues);
}

// A learner resumed from a checkpoint holds its momentum before the
// background faulting starts: the faulting leaves every value as it was (a
// zero written into each page lost the resumed momentum's values there, and
// the members' states then differed after the round).
TEST(RoundScaleTest, FaultingInKeepsAResumedMomentum) {
  constexpr size_t kValues = size_t{3} << 20;  // pages of several chunks, and a partial one
  const auto owned = MakeParameters({kValues / 3, kValues - kValues / 3}, true, 0.25f);
  VectorParameters& parameters = *owned;
  const FragmentSchedule schedule = *FragmentSchedule::Make(1, 4);
  uint64_t copies = 0;
  ThreadPool pool(2);
  FragmentBook book(parameters, schedule, &copies, pool);
  std::vector<float> global(kValues), momentum(kValues);
  for (size_t i = 0; i < kValues; ++i) {
    global[i] = 0.5f + static_cast<float>(i % 7);
    momentum[i] = i % 5 == 0 ? -0.0f : 1.0f + static_cast<float>(i % 11);
  }
  book.at(0).state->Assign(global, momentum);
  book.StartPrefault(/*own=*/true, /*step=*/true);
  book.AwaitPrefault();
  std::span<const float> kept = book.at(0).state->momentum();
  ASSERT_EQ(kept.size(), kValues);
  EXPECT_EQ(std::memcmp(kept.data(), momentum.data(), kValues * sizeof(float)), 0)
      << "the momentum changed while its pages were faulted in";
  EXPECT_TRUE(SameBits(
      std::vector<float>(book.at(0).state->global().begin(), book.at(0).state->global().end()),
      global));
}

}  // namespace
}  // namespace mend::reducer
