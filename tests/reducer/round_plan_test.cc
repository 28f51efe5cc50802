// The round's state machine (reducer/round_plan.h), table by table: each row
// of docs/architecture.md's table ("The round as a state machine") is a case
// here. No network, no threads, no clock.
#include "reducer/round_plan.h"

#include <string>
#include <vector>

#include "fmt/format.h"
#include "gtest/gtest.h"

namespace mend::reducer {
namespace {

struct Row {
  Phase phase;
  Event event;
  Decision expected;
  bool group = false;
  uint64_t step = 10;
  uint64_t apply_at = 12;
  bool concurrent = true;
  bool launch_blocked = true;  // (as one round at a time: anything in flight blocks)
  bool join_waits = false;
};

Event Make(Event::Kind kind) { return Event{kind}; }
void ExpectRows(const std::vector<Row>& rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    RoundView view;
    view.phase = row.phase;
    view.step = row.step;
    view.apply_at_step = row.apply_at;
    view.group = row.group;
    view.concurrent = row.concurrent;
    view.launch_blocked = row.launch_blocked;
    view.join_waits = row.join_waits;
    const Decision got = Next(view, row.event);
    EXPECT_EQ(got, row.expected) << fmt::format(
        "row {}: {} (group {}, step {}, apply at {}): got {} -> {}, expected {} -> {}", i,
        PhaseName(row.phase), row.group, row.step, row.apply_at, ActionName(got.action),
        PhaseName(got.next), ActionName(row.expected.action), PhaseName(row.expected.next));
  }
}

using enum Phase;
using enum Action;

TEST(RoundPlanTest, AStepAppliesWhatArrivedAndWaitsAtBoundaryPlusTau) {
  ExpectRows({
      {kIdle, Make(Event::kStep), {kNone, kIdle}},
      {kJoining, Make(Event::kStep), {kNone, kJoining}, false, 11, 12},
      {kJoining, Make(Event::kStep), {kAwait, kJoining}, false, 12, 12},
      {kExchanging, Make(Event::kStep), {kNone, kExchanging}, false, 11, 12},
      {kExchanging, Make(Event::kStep), {kAwait, kExchanging}, false, 13, 12},
      // One rank applies a round as soon as it arrived, before boundary + tau.
      {kArrived, Make(Event::kStep), {kApply, kIdle}, false, 11, 12},
      {kFailed, Make(Event::kStep), {kApply, kIdle}, false, 11, 12},
      // A passed-over join trains on; it is applied once it arrives (kArrived).
      {kPassedOver, Make(Event::kStep), {kNone, kPassedOver}, false, 20, 12},
      {kCatchingUp, Make(Event::kStep), {kNone, kCatchingUp}, false, 20, 12},
  });
}

TEST(RoundPlanTest, AGroupAppliesAtBoundaryPlusTauOnlyAndAsksItsRanksOnceTrainingOn) {
  ExpectRows({
      {kIdle, Make(Event::kStep), {kNone, kIdle}, true},
      {kArrived, Make(Event::kStep), {kNone, kArrived}, true, 11, 12},
      {kFailed, Make(Event::kStep), {kNone, kFailed}, true, 11, 12},
      {kArrived, Make(Event::kStep), {kAwait, kArrived}, true, 12, 12},
      {kJoining, Make(Event::kStep), {kAwait, kJoining}, true, 12, 12},
      {kPassedOver, Make(Event::kStep), {kAskGroup, kPassedOver}, true, 20, 12},
      {kCatchingUp, Make(Event::kStep), {kAskGroup, kCatchingUp}, true, 20, 12},
  });
}

TEST(RoundPlanTest, AWaitEndsInTheRoundOrInTrainingOnOrAtTheEndInCallingItOff) {
  for (bool group : {false, true}) {
    ExpectRows({
        {kJoining, VerdictEvent(Verdict::kDone), {kApply, kIdle}, group},
        {kJoining, VerdictEvent(Verdict::kPassedOver), {kTrainOn, kPassedOver}, group},
        {kJoining, VerdictEvent(Verdict::kLighthouseLost), {kTrainOn, kPassedOver}, group},
        {kJoining, VerdictEvent(Verdict::kShortOfQuorum), {kTrainOn, kPassedOver}, group},
        {kJoining, VerdictEvent(Verdict::kDone, true), {kApply, kIdle}, group},
        {kJoining, VerdictEvent(Verdict::kPassedOver, true), {kCallOff, kIdle}, group},
        {kPassedOver, VerdictEvent(Verdict::kShortOfQuorum, true), {kCallOff, kIdle}, group},
    });
  }
}

TEST(RoundPlanTest, AGroupsAnswerAppliesWhenEverySliceArrived) {
  ExpectRows({
      {kPassedOver, GroupAnswerEvent(true, true), {kApply, kIdle}, true},
      {kPassedOver, GroupAnswerEvent(false, true), {kNone, kCatchingUp}, true},
      {kPassedOver, GroupAnswerEvent(false, false), {kNone, kPassedOver}, true},
      {kCatchingUp, GroupAnswerEvent(true, true), {kApply, kIdle}, true},
  });
}

TEST(RoundPlanTest, ABoundaryAppliesWhatIsInFlightThenLaunches) {
  ExpectRows({
      {kIdle, BoundaryEvent(false, true), {kLaunch, kJoining}},
      {kIdle, BoundaryEvent(false, true), {kLaunchAndApply, kIdle}, false, 10, 12, false},
      {kIdle, BoundaryEvent(false, false), {kSkipNotDue, kIdle}},
      {kIdle, BoundaryEvent(true, true), {kSkipFinalPeriod, kIdle}},
      {kJoining, BoundaryEvent(false, true), {kApply, kIdle}},
      {kExchanging, BoundaryEvent(false, true), {kApply, kIdle}},
      {kArrived, BoundaryEvent(false, true), {kApply, kIdle}},
      {kFailed, BoundaryEvent(false, true), {kApply, kIdle}},
      {kCatchingUp, BoundaryEvent(false, true), {kApply, kIdle}},
      {kPassedOver, BoundaryEvent(false, true), {kSkipJoinWaits, kPassedOver}},
      {kPassedOver, BoundaryEvent(true, true), {kSkipFinalPeriod, kPassedOver}},
      {kExchanging, BoundaryEvent(true, true), {kSkipFinalPeriod, kExchanging}},
  });
}

// Rounds in flight (rounds_in_flight): a boundary launches beside the
// oldest unless the driver found the launch blocked; a newer join passed
// over skips the boundary as the oldest's would.
TEST(RoundPlanTest, ABoundaryLaunchesBesideTheRoundsInFlightUnlessBlocked) {
  // A row whose rounds in flight do not block the launch.
  auto beside = [](Phase phase, Event event, Decision expected, bool group = false,
                   bool join_waits = false) {
    Row row{phase, event, expected, group};
    row.launch_blocked = false;
    row.join_waits = join_waits;
    return row;
  };
  ExpectRows({
      beside(kExchanging, BoundaryEvent(false, true), {kLaunch, kExchanging}),
      beside(kArrived, BoundaryEvent(false, true), {kLaunch, kArrived}),
      {kJoining, BoundaryEvent(false, true), {kApply, kIdle}},
      beside(kExchanging, BoundaryEvent(false, false), {kSkipNotDue, kExchanging}),
      beside(kExchanging, BoundaryEvent(true, true), {kSkipFinalPeriod, kExchanging}),
      beside(kExchanging, BoundaryEvent(false, true), {kSkipJoinWaits, kExchanging}, false, true),
      beside(kExchanging, BoundaryEvent(false, true), {kLaunch, kExchanging}, true),
  });
}

TEST(RoundPlanTest, ShutdownWaitsForTheLastRoundOrMergesFinally) {
  ExpectRows({
      {kIdle, Make(Event::kShutdown), {kFinalMerge, kIdle}},
      {kJoining, Make(Event::kShutdown), {kAwaitLast, kJoining}},
      {kPassedOver, Make(Event::kShutdown), {kAwaitLast, kPassedOver}},
      {kArrived, Make(Event::kShutdown), {kAwaitLast, kArrived}},
  });
}

TEST(RoundPlanTest, ThePhaseOfAFlightFollowsWhatItsThreadReported) {
  struct Case {
    FlightStatus flight;
    bool group;
    Phase expected;
  };
  const std::vector<Case> cases = {
      {{}, false, kIdle},
      {{true, false, false, false, false}, false, kJoining},
      {{true, true, false, false, false}, false, kExchanging},
      {{true, true, true, true, false}, false, kArrived},
      {{true, false, true, false, false}, false, kFailed},
      {{true, false, false, false, true}, false, kPassedOver},
      {{true, true, false, false, true}, false, kCatchingUp},
      // One rank applies a passed-over round that arrived; a group waits for its ranks.
      {{true, true, true, true, true}, false, kArrived},
      {{true, true, true, true, true}, true, kCatchingUp},
      {{true, false, true, false, true}, true, kCatchingUp},
      {{true, false, false, false, true}, true, kPassedOver},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(PhaseOf(cases[i].flight, cases[i].group), cases[i].expected)
        << "case " << i << ": got " << PhaseName(PhaseOf(cases[i].flight, cases[i].group));
  }
}

// Every phase and event kind has a decision, and a round's life from
// launch to apply runs through the phases in the documented order.
TEST(RoundPlanTest, ARoundsLifeRunsThroughThePhasesInOrder) {
  RoundView view;
  view.step = 100;
  view.apply_at_step = 102;
  Decision d = Next(view, BoundaryEvent(false, true));
  ASSERT_EQ(d, (Decision{kLaunch, kJoining}));
  view.phase = d.next;
  view.step = 101;
  EXPECT_EQ(Next(view, Make(Event::kStep)), (Decision{kNone, kJoining}));
  view.phase = kExchanging;  // the lighthouse formed it
  view.step = 102;
  d = Next(view, Make(Event::kStep));
  ASSERT_EQ(d.action, kAwait);
  d = Next(view, VerdictEvent(Verdict::kDone));
  EXPECT_EQ(d, (Decision{kApply, kIdle}));
}

// The driver works out launch_blocked only where the table says it reads it
// (ReadsLaunchBlocked): everywhere else the decision must not depend on it.
TEST(RoundPlanTest, TheDecisionDependsOnLaunchBlockedOnlyWhereTheTableSaysItReadsIt) {
  const std::vector<Event> events = {Make(Event::kStep),
                                     VerdictEvent(Verdict::kDone),
                                     VerdictEvent(Verdict::kPassedOver, true),
                                     GroupAnswerEvent(true, true),
                                     GroupAnswerEvent(false, false),
                                     BoundaryEvent(false, true),
                                     BoundaryEvent(false, false),
                                     BoundaryEvent(true, true),
                                     Make(Event::kShutdown)};
  int read = 0;
  for (Phase phase : {kIdle, kJoining, kExchanging, kArrived, kFailed, kPassedOver, kCatchingUp}) {
    for (const Event& event : events) {
      for (bool group : {false, true}) {
        for (bool concurrent : {false, true}) {
          for (bool join_waits : {false, true}) {
            RoundView view;
            view.phase = phase;
            view.group = group;
            view.concurrent = concurrent;
            view.join_waits = join_waits;
            view.launch_blocked = true;
            const Decision blocked = Next(view, event);
            view.launch_blocked = false;
            const Decision free = Next(view, event);
            if (ReadsLaunchBlocked(view, event)) {
              ++read;
            } else {
              EXPECT_EQ(blocked, free) << PhaseName(phase) << " event " << event.kind;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(read, 0);  // (and where it is read, the boundary tests above show it matters)
}

}  // namespace
}  // namespace mend::reducer
