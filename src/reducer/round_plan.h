// The round's life as the training thread sees it: a phase, the events that
// happen to it at a step, and the action each calls for. With several rounds
// in flight (rounds_in_flight), the phase is the oldest's: rounds are taken
// up in the order they were launched. One pure function,
// Next(), decides; the round driver observes the round, asks Next() and
// carries out the action. docs/architecture.md ("The round as a state
// machine") has the same table; tests/reducer/round_plan_test.cc checks it
// row by row, without a network or a thread.
//
//   Idle --boundary--> Joining --formed--> Exchanging --ended--> Arrived | Failed
//                          \ at boundary + tau, not formed: PassedOver
//   Arrived | Failed --apply--> Idle  (the result committed, or the failure counted)
//
// Joining, Exchanging and PassedOver end on the round's own thread
// (quorum, exchange); the training thread sees where it got with PhaseOf.
#pragma once

#include <cstdint>
#include <string_view>

namespace mend::reducer {

enum class Phase {
  kIdle,        // no round in flight
  kJoining,     // launched at a boundary: waiting for the lighthouse to form its round
  kExchanging,  // formed: the members heal or agree, then exchange
  kArrived,     // the round's thread ended with a result, not applied yet
  kFailed,      // the round's thread ended with an error, not counted yet
  kPassedOver,  // not formed at boundary + tau: training on, the join waits for a round
  kCatchingUp,  // passed over, then formed: its exchange runs, applied when it ends
};
std::string_view PhaseName(Phase phase);

// What the round's thread has reported, as the training thread reads it.
struct FlightStatus {
  bool launched = false;     // a round is in flight
  bool formed = false;       // the lighthouse answered its join
  bool done = false;         // its thread ended
  bool ok = false;           // ... with a result (else an error)
  bool passed_over = false;  // the training thread gave up waiting for it
  bool may_heal = false;     // formed with a member that may heal (or be healed)
  uint64_t round_id = 0;     // the round it formed
};

// The phase of the flight. A group (`group`) acts on its ranks' joint view
// only: a passed-over join stays PassedOver or CatchingUp until the ranks
// agree that every slice arrived (Event::kGroupAnswer).
Phase PhaseOf(const FlightStatus& flight, bool group);

// How a wait for the round at boundary + tau ended (RoundDriver's
// AwaitRound): it arrived, or the learner trains on because its round closed
// without it, the lighthouse is unreachable, or too few learners are alive.
enum class Verdict { kDone, kPassedOver, kLighthouseLost, kShortOfQuorum };

struct Event {
  enum Kind {
    kStep,         // an inner step ended (before any boundary of this step)
    kVerdict,      // the wait asked for by kAwait ended with `verdict`
    kGroupAnswer,  // a group's ranks answered kAskGroup: `all_arrived`, `formed`
    kBoundary,     // a fragment's boundary at this step
    kShutdown,     // the job ends (after its last step)
  };
  Kind kind = kStep;
  Verdict verdict = Verdict::kDone;
  bool ending = false;        // kVerdict: the wait was at shutdown or for the final merge
  bool all_arrived = false;   // kGroupAnswer: every rank's slice of the round ended
  bool formed = false;        // kGroupAnswer: rank 0's join formed a round
  bool final_period = false;  // kBoundary: in the job's last fragment period
  bool still_due = true;      // kBoundary: the step is still on the fragment's boundary and
                              // the fragment has no round of this boundary yet (a heal moves it)
};

// The events that carry values.
Event VerdictEvent(Verdict verdict, bool ending = false);
Event GroupAnswerEvent(bool all_arrived, bool formed);
Event BoundaryEvent(bool final_period, bool still_due);

// The flight and the step, as the decision needs them.
struct RoundView {
  Phase phase = Phase::kIdle;
  uint64_t step = 0;           // the learner's step now
  uint64_t apply_at_step = 0;  // the flight's boundary + tau
  bool group = false;          // a learner of several ranks
  bool concurrent = true;      // rounds overlap the steps (else: synchronous DiLoCo)
  // With rounds in flight: whether a boundary must apply the oldest before it
  // launches (one round at a time; or too many, one of the same fragment, a
  // join not formed yet, or a round that heals in flight), and whether the
  // newest join was passed over and still waits for a round.
  bool launch_blocked = true;
  bool join_waits = false;
};

enum class Action {
  kNone,             // train on
  kAwait,            // wait for the round here (then Event::kVerdict)
  kApply,            // join the round's thread, commit its result or count its failure
  kTrainOn,          // count the join as passed over and train on; it waits for a round
  kAskGroup,         // ask the group's ranks whether all slices arrived (then kGroupAnswer)
  kSkipFinalPeriod,  // no round at this boundary: it could not be applied before the end
  kSkipJoinWaits,    // no round at this boundary: the join passed over still waits
  kSkipNotDue,       // no round at this boundary: a heal moved the step off it
  kLaunch,           // snapshot the fragment and start its round in the background
  kLaunchAndApply,   // synchronous: start it and wait for it at once
  kFinalMerge,       // shutdown with nothing in flight: the job's final merge, if any
  kAwaitLast,        // shutdown: wait for the round of the job's last boundary
  kCallOff,          // shutdown: give up a join whose round will not come
};
std::string_view ActionName(Action action);

struct Decision {
  Action action = Action::kNone;
  Phase next = Phase::kIdle;  // the phase the action leaves the flight in
  bool operator==(const Decision&) const = default;
};

// The transition function: what `event` calls for in `view`. Pure.
Decision Next(const RoundView& view, const Event& event);

// Whether Next reads view.launch_blocked for `event` (a boundary): the
// driver works that out only when it is read, since it may ask a group's
// ranks. Elsewhere Next decides the same whatever launch_blocked says.
bool ReadsLaunchBlocked(const RoundView& view, const Event& event);

}  // namespace mend::reducer
