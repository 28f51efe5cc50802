// Real crashes and hangs: three member processes reduce back to back through
// a real lighthouse's store; one is SIGKILLed or SIGSTOPped mid-stream. The
// survivors' operation must fail with ABORTED or DEADLINE_EXCEEDED within the
// deadline, naming the round and a peer (at least one survivor names the
// faulty member: the other may see the failure through its fellow survivor
// giving up), and the survivors then reduce together in a fresh round.
#include <signal.h>

#include <sstream>

#include "cli/process_fixture.h"

namespace mend {
namespace {

constexpr int kTimeoutMs = 3000;

struct Outcome {
  std::string code;
  int64_t elapsed_ms = 0;
  std::string message;
  std::string next;  // "next ok <checksum>" or "next error ..."
};

class DataplaneProcessTest : public testing_util::ProcessFixture {
 protected:
  void StartMembers() {
    StartLighthouse({"--log-level", "warn"});
    for (int rank = 0; rank < 3; ++rank) {
      std::vector<std::string> argv = {MEMBER_BINARY,
                                       "--lighthouse",
                                       grpc_address_,
                                       "--token-file",
                                       token_file_,
                                       "--rank",
                                       std::to_string(rank),
                                       "--size",
                                       "3",
                                       "--values",
                                       std::to_string(1 << 20),
                                       "--timeout-ms",
                                       std::to_string(kTimeoutMs),
                                       "--survivors",
                                       "0,1"};
      auto child = Subprocess::Spawn(
          {argv, {}, "pipe", dir_ + "/member-" + std::to_string(rank) + ".log", false});
      ASSERT_TRUE(child.ok()) << child.status();
      members_.push_back(std::move(*child));
    }
    // Let every member complete a few operations first.
    for (auto& member : members_) {
      for (int i = 0; i < 3; ++i) {
        auto line = member->ReadLine(60 * kMicrosPerSecond);
        ASSERT_TRUE(line.ok()) << line.status();
        ASSERT_EQ(line->rfind("ok ", 0), 0u) << *line;
      }
    }
  }

  // Reads `member`'s lines until its error line and the next-round line.
  Outcome AwaitOutcome(Subprocess& member) {
    Outcome outcome;
    while (true) {
      auto line = member.ReadLine((kTimeoutMs + 30'000) * kMicrosPerMilli);
      if (!line.ok()) {
        ADD_FAILURE() << "member printed no error: " << line.status();
        return outcome;
      }
      if (line->rfind("ok ", 0) == 0) continue;
      if (line->rfind("error ", 0) == 0) {
        std::istringstream fields(line->substr(6));
        fields >> outcome.code >> outcome.elapsed_ms;
        std::getline(fields, outcome.message);
        continue;
      }
      outcome.next = *line;
      return outcome;
    }
  }

  void ExpectSurvivorsFailCleanlyAndGoOn() {
    Outcome a = AwaitOutcome(*members_[0]);
    Outcome b = AwaitOutcome(*members_[1]);
    // Shown in the test log: what each survivor reported.
    std::cerr << "member 0: " << a.code << " " << a.elapsed_ms << " ms:" << a.message
              << "\nmember 1: " << b.code << " " << b.elapsed_ms << " ms:" << b.message << "\n";
    for (const Outcome* o : {&a, &b}) {
      EXPECT_TRUE(o->code == "ABORTED" || o->code == "DEADLINE_EXCEEDED") << o->code;
      EXPECT_NE(o->message.find("round 1"), std::string::npos) << o->message;
      EXPECT_NE(o->message.find("member "), std::string::npos) << o->message;
      // Ended by the operation's own deadline, not by a later one: within
      // a few deadlines (slack for a loaded machine; no speed is measured).
      EXPECT_LE(o->elapsed_ms, 4 * kTimeoutMs) << o->message;
    }
    bool named = a.message.find("member 2") != std::string::npos ||
                 b.message.find("member 2") != std::string::npos;
    EXPECT_TRUE(named) << a.message << " | " << b.message;
    // Both survivors reduced together in round 2: (1 + 2) / 2 per value.
    std::string want = "next ok " + std::to_string((1 << 20) * 3 / 2) + ".0";
    EXPECT_EQ(a.next, want);
    EXPECT_EQ(b.next, want);
  }

  void TearDown() override {
    members_.clear();
    ProcessFixture::TearDown();
  }

  std::vector<std::unique_ptr<Subprocess>> members_;
};

TEST_F(DataplaneProcessTest, KilledPeerFailsTheOthersWithinTheDeadline) {
  StartMembers();
  ASSERT_TRUE(members_[2]->Signal(SIGKILL).ok());
  ExpectSurvivorsFailCleanlyAndGoOn();
}

TEST_F(DataplaneProcessTest, StoppedPeerFailsTheOthersWithinTheDeadline) {
  StartMembers();
  ASSERT_TRUE(members_[2]->Signal(SIGSTOP).ok());
  ExpectSurvivorsFailCleanlyAndGoOn();
  ASSERT_TRUE(members_[2]->Signal(SIGCONT).ok());
}

}  // namespace
}  // namespace mend
