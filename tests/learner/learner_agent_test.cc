// LearnerAgentImpl's judgements of time, lighthouse_lost() and
// short_of_quorum(), on a FakeClock against a fake lighthouse client: no
// network, and to the microsecond.
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "learner/learner_agent_impl.h"
#include "mend/clock.h"
#include "mend/config.h"
#include "test_util/job_config.h"
#include "test_util/wait.h"

namespace mend {
namespace {

// What the lighthouse tells the agent at registration.
constexpr Micros kInterval = 10 * kMicrosPerMilli;
constexpr Micros kTimeout = kMicrosPerSecond;
// How long a test waits for the agent's heartbeat thread (real time).
constexpr Micros kAwait = 30 * kMicrosPerSecond;

// A heartbeat stream that the test ends and acknowledges through its client.
class FakeStream final : public HeartbeatStream {
 public:
  struct Shared {
    std::atomic<bool> ended{false};
    std::atomic<int>* sends = nullptr;
  };
  FakeStream(std::shared_ptr<Shared> shared, Micros opened_at)
      : shared_(std::move(shared)), opened_at_(opened_at) {}

  void Send(v1::HeartbeatRequest) override { shared_->sends->fetch_add(1); }
  bool done() const override { return shared_->ended.load(); }
  Status status() const override { return UnavailableError("the fake lighthouse went away"); }
  // No acknowledgement is timed by the stream here: the agent's silence
  // check sees none since the stream opened.
  Micros last_ack_at() const override { return opened_at_; }
  void Cancel() override {}

 private:
  const std::shared_ptr<Shared> shared_;
  const Micros opened_at_;
};

// A lighthouse that registers the learner, hands out heartbeat streams and
// ends every join at once with DEADLINE_EXCEEDED.
class FakeLighthouseClient final : public LighthouseClient {
 public:
  StatusOr<Registration> Register(const LearnerIdentity&, uint64_t, uint64_t) override {
    Registration registration;
    registration.session_id = 1;
    registration.lighthouse_instance = 7;
    registration.heartbeat_interval = kInterval;
    registration.heartbeat_timeout = kTimeout;
    return registration;
  }
  Status Leave(const LearnerRef&, const std::string&) override { return OkStatus(); }
  StatusOr<QuorumResult> Quorum(const v1::QuorumRequest&) override {
    return DeadlineExceededError("no round in the fake lighthouse");
  }
  // At once, or, once HoldJoins() was called, when the join is cancelled.
  void QuorumAsync(const v1::QuorumRequest& request, CallCanceller& cancel,
                   std::function<void(StatusOr<QuorumResult>)> done) override {
    {
      std::lock_guard lock(mu_);
      if (hold_joins_) {
        ++joins_in_flight_;
        auto shared = std::make_shared<std::function<void(StatusOr<QuorumResult>)>>(done);
        if (cancel.Hold([this, shared]() {
              {
                std::lock_guard held(mu_);
                --joins_in_flight_;
              }
              (*shared)(CancelledError("the fake join was cancelled"));
            })) {
          return;
        }
        --joins_in_flight_;
        done(CancelledError("the fake join was cancelled before it started"));
        return;
      }
    }
    done(Quorum(request));
  }
  Status StoreSet(const std::string&, const std::string&) override { return Unsupported(); }
  StatusOr<std::string> StoreGet(const std::string&, Micros) override { return Unsupported(); }
  StatusOr<std::string> StoreGetCancellable(const std::string&, Micros, CallCanceller&) override {
    return Unsupported();
  }
  StatusOr<int64_t> StoreAdd(const std::string&, int64_t) override { return Unsupported(); }
  Status StoreWait(const std::vector<std::string>&, Micros) override { return Unsupported(); }
  StatusOr<uint64_t> StoreDelete(const std::string&, bool) override { return Unsupported(); }
  StatusOr<std::string> StatusJson(uint32_t, uint32_t) override { return Unsupported(); }

  std::unique_ptr<HeartbeatStream> OpenHeartbeat(
      const LearnerRef&, const Clock& clock,
      std::function<void(const HeartbeatAck&)> on_ack) override {
    auto shared = std::make_shared<FakeStream::Shared>();
    shared->sends = &sends_;
    std::lock_guard lock(mu_);
    streams_.push_back(shared);
    on_ack_ = std::move(on_ack);
    return std::make_unique<FakeStream>(std::move(shared), clock.NowMicros());
  }

  // Heartbeats sent so far, on every stream.
  int sends() const { return sends_.load(); }
  // An acknowledgement on the newest stream.
  void Ack(const HeartbeatAck& ack) {
    std::function<void(const HeartbeatAck&)> on_ack;
    {
      std::lock_guard lock(mu_);
      on_ack = on_ack_;
    }
    on_ack(ack);
  }
  // From now on a join is answered only when it is cancelled.
  void HoldJoins() {
    std::lock_guard lock(mu_);
    hold_joins_ = true;
  }
  // Joins sent and not yet answered.
  int joins_in_flight() {
    std::lock_guard lock(mu_);
    return joins_in_flight_;
  }
  // Every stream open so far ends (UNAVAILABLE): a call that failed.
  void EndStreams() {
    std::lock_guard lock(mu_);
    for (const auto& stream : streams_) stream->ended = true;
  }

 private:
  static Status Unsupported() { return FailedPreconditionError("not in the fake lighthouse"); }

  std::atomic<int> sends_{0};
  std::mutex mu_;
  std::vector<std::shared_ptr<FakeStream::Shared>> streams_;
  std::function<void(const HeartbeatAck&)> on_ack_;
  bool hold_joins_ = false;
  int joins_in_flight_ = 0;
};

class LearnerAgentTest : public ::testing::Test {
 protected:
  LearnerAgentTest() {
    auto client = std::make_unique<FakeLighthouseClient>();
    client_ = client.get();
    Config config;
    config.lighthouse = "lighthouse.invalid:1";
    agent_ = std::make_unique<LearnerAgentImpl>(testing_util::AgentOptionsFor(config), "token",
                                                LearnerIdentity{"learner-a", "", "", ""}, clock_,
                                                std::move(client), nullptr);
  }

  // Registers; returns once the heartbeat thread has sent its first beat.
  void Register() {
    ASSERT_TRUE(agent_->FirstRegistration(0).ok());
    ASSERT_TRUE(testing_util::WaitFor(kAwait, [&] { return client_->sends() >= 1; }));
  }

  // Moves the clock by `by` (at least a heartbeat interval) and waits for
  // the heartbeat thread's one beat that it brings: the agent has seen it.
  void AdvanceOneBeat(Micros by) {
    ASSERT_GE(by, kInterval);
    const int before = client_->sends();
    clock_.Advance(by);
    ASSERT_TRUE(testing_util::WaitFor(kAwait, [&] { return client_->sends() > before; }));
  }

  FakeClock clock_;
  FakeLighthouseClient* client_ = nullptr;  // owned by agent_
  std::unique_ptr<LearnerAgentImpl> agent_;
};

TEST_F(LearnerAgentTest, TheLighthouseIsLostOnceAFailedCallFollowsAHeartbeatTimeoutOfSilence) {
  Register();
  EXPECT_FALSE(agent_->lighthouse_lost());
  // A silence alone is not a lost lighthouse (a learner resumed after
  // SIGSTOP heard nothing for as long).
  AdvanceOneBeat(2 * kTimeout);
  EXPECT_FALSE(agent_->lighthouse_lost());

  client_->Ack(HeartbeatAck{});
  const Micros heard = clock_.NowMicros();
  // The heartbeat stream ends: a failed call, one interval after the
  // lighthouse last answered.
  client_->EndStreams();
  AdvanceOneBeat(kInterval);
  EXPECT_FALSE(agent_->lighthouse_lost());
  AdvanceOneBeat(heard + kTimeout - clock_.NowMicros());
  EXPECT_FALSE(agent_->lighthouse_lost()) << "silent for exactly the heartbeat timeout";
  clock_.Advance(1);
  EXPECT_TRUE(agent_->lighthouse_lost());

  // It answers again.
  client_->Ack(HeartbeatAck{});
  EXPECT_FALSE(agent_->lighthouse_lost());
}

// A lighthouse lost for longer than a join's timeout (the join before it
// waited that long): the join fails at once, without asking it, so a job
// whose lighthouse is gone for good does not wait out the quorum timeout at
// every boundary. Lost for less, the join asks it (the fake says no round).
TEST_F(LearnerAgentTest, AJoinFailsAtOnceWhenTheLighthouseWasLostForLongerThanItsTimeout) {
  Register();
  client_->Ack(HeartbeatAck{});
  client_->EndStreams();  // (a failed call at the next beat)
  AdvanceOneBeat(kInterval);
  AdvanceOneBeat(kTimeout);
  ASSERT_TRUE(agent_->lighthouse_lost());
  StatusOr<QuorumResult> asked = agent_->Quorum(0, 0, 100 * kTimeout, false, 0);
  EXPECT_EQ(asked.status().code(), StatusCode::kDeadlineExceeded) << asked.status();
  EXPECT_NE(std::string(asked.status().message()).find("no round in the fake lighthouse"),
            std::string::npos);
  AdvanceOneBeat(2 * kTimeout);
  StatusOr<QuorumResult> refused = agent_->Quorum(0, 0, 2 * kTimeout, false, 0);
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status();
  EXPECT_NE(std::string(refused.status().message()).find("longer than the quorum timeout"),
            std::string::npos)
      << refused.status();
}

TEST_F(LearnerAgentTest, AJoinIsShortOfQuorumAfterAHeartbeatTimeoutOfAcknowledgementsSayingSo) {
  Register();
  HeartbeatAck short_of_quorum;
  short_of_quorum.set_short_of_quorum(true);
  client_->Ack(short_of_quorum);
  EXPECT_FALSE(agent_->short_of_quorum());
  clock_.Advance(kTimeout - 1);
  // Later acknowledgements saying so keep the first one's time.
  client_->Ack(short_of_quorum);
  EXPECT_FALSE(agent_->short_of_quorum());
  clock_.Advance(1);
  EXPECT_TRUE(agent_->short_of_quorum());
  // One that does not say so ends it.
  client_->Ack(HeartbeatAck{});
  EXPECT_FALSE(agent_->short_of_quorum());
}

TEST_F(LearnerAgentTest, EachJoinStartsTheShortOfQuorumTimeAfresh) {
  Register();
  HeartbeatAck short_of_quorum;
  short_of_quorum.set_short_of_quorum(true);
  client_->Ack(short_of_quorum);
  clock_.Advance(kTimeout);
  ASSERT_TRUE(agent_->short_of_quorum());
  // The news was of the join before this one.
  StatusOr<QuorumResult> round = agent_->Quorum(0, 0, kMicrosPerSecond, false, 0);
  EXPECT_EQ(round.status().code(), StatusCode::kDeadlineExceeded) << round.status();
  EXPECT_FALSE(agent_->short_of_quorum());
  client_->Ack(short_of_quorum);
  clock_.Advance(kTimeout - 1);
  EXPECT_FALSE(agent_->short_of_quorum());
  clock_.Advance(1);
  EXPECT_TRUE(agent_->short_of_quorum());
}

// A join that Interrupt() ends is cancelled and its answer awaited, not
// left in flight: an abandoned call would complete on a gRPC thread while
// the learner's process shuts down.
TEST_F(LearnerAgentTest, AnInterruptedJoinIsCancelledNotLeftInFlight) {
  Register();
  client_->HoldJoins();
  StatusOr<QuorumResult> round = AbortedError("not run");
  std::thread join([&]() { round = agent_->Quorum(0, 0, 600 * kMicrosPerSecond, false, 0); });
  ASSERT_TRUE(testing_util::WaitFor(kAwait, [&] { return client_->joins_in_flight() == 1; }));
  agent_->Interrupt();
  join.join();
  EXPECT_EQ(round.status().code(), StatusCode::kAborted) << round.status();
  EXPECT_EQ(client_->joins_in_flight(), 0);
  // And a join after it does not reach the lighthouse.
  StatusOr<QuorumResult> later = agent_->Quorum(0, 0, 600 * kMicrosPerSecond, false, 0);
  EXPECT_EQ(later.status().code(), StatusCode::kAborted) << later.status();
  EXPECT_EQ(client_->joins_in_flight(), 0);
}

}  // namespace
}  // namespace mend

namespace mend {
namespace {

// The data plane is sealed, and checkpoints authenticated, with the job
// token unless dataplane_encrypt (checkpoint_authenticate) is off (the
// communicators' secret: CommunicatorOptions::secret; the checkpoints':
// CheckpointOptions::secret), each on its own.
TEST(LearnerAgentSecretTest, TheDataPlaneIsSecureByDefaultAndInTheClearOnlyWhenTurnedOff) {
  FakeClock clock;
  for (const bool encrypt : {true, false}) {
    Config config;
    config.lighthouse = "lighthouse.invalid:1";
    config.dataplane_encrypt = encrypt;
    config.checkpoint_authenticate = !encrypt;
    LearnerAgentImpl agent(testing_util::AgentOptionsFor(config), "the-job-token-0123",
                           LearnerIdentity{"learner-a", "", "", ""}, clock,
                           std::make_unique<FakeLighthouseClient>(), nullptr);
    EXPECT_EQ(agent.data_plane_secret(), encrypt ? "the-job-token-0123" : "");
    EXPECT_EQ(agent.checkpoint_secret(), encrypt ? "" : "the-job-token-0123");
  }
  EXPECT_TRUE(Config{}.dataplane_encrypt);
  EXPECT_TRUE(Config{}.checkpoint_authenticate);
}

}  // namespace
}  // namespace mend
