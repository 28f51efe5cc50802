// A group's pulse: rank 0's verdict on a fake clock, and the threads over an
// in-process store withholding and resuming a (recording) agent's heartbeats.
#include "reducer/group_pulse.h"

#include <cstdlib>
#include <mutex>
#include <vector>

#include "dataplane/dataplane_fixture.h"
#include "gtest/gtest.h"
#include "test_util/fake_agent.h"
#include "test_util/wait.h"

namespace mend::reducer {
namespace {

constexpr Micros kLimit = 2 * kMicrosPerSecond;

StatusOr<std::string> Read(const std::string& value) { return value; }
StatusOr<std::string> Unreadable() { return UnavailableError("store down"); }

TEST(PulseJudgeTest, ARankIsSilentOnlyWhenItsCounterStaysPutForLongerThanTheLimit) {
  PulseJudge judge(3, kLimit, 0);
  EXPECT_EQ(judge.Silent(kLimit), -1);  // at the limit, not past it
  EXPECT_EQ(judge.Silent(kLimit + 1), 1);
  judge.Observe(1, Read("1"), 1'000);
  judge.Observe(2, Read("1"), 1'000);
  EXPECT_EQ(judge.Silent(kLimit + 1'000), -1);
  // Rank 2 moves on; rank 1 reads the same value again and again.
  for (Micros t = 500'000; t <= 3'000'000; t += 500'000) {
    judge.Observe(1, Read("1"), t);
    judge.Observe(2, Read(std::to_string(t)), t);
  }
  EXPECT_EQ(judge.Silent(kLimit + 1'000), -1);
  EXPECT_EQ(judge.Silent(kLimit + 1'001), 1);
  // It beats again.
  judge.Observe(1, Read("2"), 3'100'000);
  judge.Observe(2, Read("x"), 3'100'000);
  EXPECT_EQ(judge.Silent(3'100'000 + kLimit), -1);
  EXPECT_EQ(judge.Silent(3'100'000 + kLimit + 1), 1);
}

TEST(PulseJudgeTest, AKeyNotWrittenYetCountsAsSilence) {
  PulseJudge judge(2, kLimit, 0);
  judge.Observe(1, DeadlineExceededError("store: no key"), kLimit);
  EXPECT_EQ(judge.Silent(kLimit + 1), 1);
}

TEST(PulseJudgeTest, AnUnreadableStoreIsNoEvidenceOfSilence) {
  PulseJudge judge(2, kLimit, 0);
  judge.Observe(1, Read("7"), 0);
  judge.Observe(1, Unreadable(), 1'900'000);
  EXPECT_EQ(judge.Silent(3'000'000), -1);
  // The same value again after the store came back: counted from the failure.
  judge.Observe(1, Read("7"), 3'500'000);
  EXPECT_EQ(judge.Silent(1'900'000 + kLimit), -1);
  EXPECT_EQ(judge.Silent(1'900'000 + kLimit + 1), 1);
}

TEST(PulseJudgeTest, ARankThatSaidItIsDoneIsNeverSilent) {
  PulseJudge judge(2, kLimit, 0);
  judge.Observe(1, Read("done"), 10);
  EXPECT_TRUE(judge.done(1));
  EXPECT_EQ(judge.Silent(100 * kLimit), -1);
  judge.Observe(1, Read("8"), 20);  // nothing after done counts
  EXPECT_TRUE(judge.done(1));
}

TEST(PulseJudgeTest, AOneRankGroupHasNoOneToHear) {
  PulseJudge judge(1, kLimit, 0);
  EXPECT_EQ(judge.Silent(100 * kLimit), -1);
}

// Records WithholdHeartbeats calls; the rest is never called by the pulse.
// The pulse's threads wait in real time: its silences are judged on it too
// (the fake agent's clock).
using RecordingAgent = testing_util::FakeAgent;

constexpr char kBase[] = "job/group/a/1.0/";
constexpr Micros kInterval = 20 * kMicrosPerMilli;
constexpr Micros kSilence = 2 * kMicrosPerSecond;
constexpr Micros kAwait = 60 * kMicrosPerSecond;

std::unique_ptr<GroupPulse> StartPulse(RendezvousStore& store, int rank, RecordingAgent& agent) {
  return std::make_unique<GroupPulse>(std::make_unique<testing_util::StoreConnection>(store), kBase,
                                      rank, 2, agent, kInterval, kSilence);
}

TEST(GroupPulseTest, RankZeroWithholdsHeartbeatsWhileAnotherRankIsSilentAndResumesWhenItBeats) {
  testing_util::InProcessStore store;
  RecordingAgent agent, other;
  auto rank1 = StartPulse(store, 1, other);
  auto rank0 = StartPulse(store, 0, agent);
  // Rank 1 stops beating without saying it is done (a hung or stopped rank).
  rank1->Stop(/*done=*/false);
  ASSERT_TRUE(testing_util::WaitFor(kAwait, [&] { return !agent.withhold_calls().empty(); }));
  EXPECT_EQ(agent.withhold_calls(), std::vector<bool>{true});
  // It beats again (a new pulse, as after SIGCONT its thread runs on).
  rank1 = StartPulse(store, 1, other);
  ASSERT_TRUE(testing_util::WaitFor(kAwait, [&] { return agent.withhold_calls().size() >= 2; }));
  EXPECT_EQ(agent.withhold_calls(), (std::vector<bool>{true, false}));
  // Done: rank 0 does not read the silence that follows as a hang. (The
  // store holds "done" before rank 0's pulse stops; a withholding in
  // between would show as a third call.)
  rank1->Stop(/*done=*/true);
  const StatusOr<std::string> done = store.Get(GroupPulse::Key(kBase, 1), kAwait);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(*done, "done");
  rank0->Stop(/*done=*/true);
  EXPECT_EQ(agent.withhold_calls(), (std::vector<bool>{true, false}));
  EXPECT_TRUE(other.withhold_calls().empty());  // ranks other than 0 never touch the agent
}

TEST(GroupPulseTest, StoppingRankZeroWhileWithholdingSendsHeartbeatsAgain) {
  testing_util::InProcessStore store;
  RecordingAgent agent;
  auto rank0 = StartPulse(store, 0, agent);  // rank 1 never beats
  ASSERT_TRUE(testing_util::WaitFor(kAwait, [&] { return !agent.withhold_calls().empty(); }));
  rank0->Stop(/*done=*/false);
  EXPECT_EQ(agent.withhold_calls(), (std::vector<bool>{true, false}));
}

}  // namespace
}  // namespace mend::reducer
