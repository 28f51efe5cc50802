// A round in flight: what the training thread snapshot at the boundary, the
// background thread that runs the round (round_runner.h), and what that
// thread reports back (Outcome). The training thread does not touch the
// fragments' global state until it has joined the thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mend/clock.h"
#include "mend/outer_sync.h"
#include "mend/reducer_stats.h"
#include "mend/status.h"
#include "reducer/deferred_snapshot.h"
#include "reducer/round_plan.h"

namespace mend::reducer {

// What a round's thread brings back.
struct Outcome {
  RoundResult result;
  // A round of another fragment (adopted; see `fragment`): the members'
  // merged pseudo-gradient (else it is in the flight's `delta`).
  std::vector<float> adopted_merged;
  bool healed = false;  // this learner took a source's state
  // ... a copy of it, every fragment's global + momentum, applied at the
  // commit (empty: it was written into the fragments as it arrived, a fresh
  // join's while its training thread waited: HealRound's written_in_place).
  std::vector<float> healed_state;
  uint64_t round_id = 0;
  uint32_t rank = 0;
  uint32_t members = 0;
  std::vector<float> averaged_moments[2];  // DES-LOC: the members' averages, when synced
  double heal_seconds = 0;                 // time in healing (every member takes part)
  uint64_t heal_bytes = 0;                 // bytes this learner received when it healed
  std::string heal_source;                 // whom it healed from
  uint64_t heal_step = 0;                  // the source's step at its boundary (the job's step)
  uint64_t round_step = 0;  // the round's step: its members' largest boundary (the lighthouse's)
  // The fragment the round exchanged: this learner's own (the flight's),
  // or, for a join passed over in streaming mode that healed into another
  // fragment's round, the source's (this learner then abstained).
  int fragment = 0;
  bool fresh_join = false;    // healed with nothing of the job's state: its progress is dropped
  bool outer_warmup = false;  // an outer warm-up round: averaged, momentum untouched
  bool final_merge = false;   // the job's final merge: averaged (fp32), momentum untouched
  std::vector<float> healed_moments[2];  // heal_inner_optimizer: the source's moments
  uint64_t healed_moment_step = 0;       // ... and its optimizer's step count (0: none)
  // sync_buffers: the members' averages; the first member's.
  std::vector<float> synced_buffers[2];
  uint64_t cross_rack_bytes = 0;  // sent to other racks in this round (healing included)
  RoundPhases phases;             // the round thread's (agree_or_heal .. moments_and_buffers)
};

struct InFlight {
  uint64_t seq = 0;        // its place in the order of launches (1, 2, ...); 0: on its own
  uint64_t in_flight = 1;  // rounds in flight when it was launched, itself included
  int fragment = 0;
  uint64_t boundary_step = 0;
  uint64_t apply_at_step = 0;
  uint64_t tokens = 0;
  uint64_t previous_round_id = 0;  // the learner's last round at launch
  // The training thread waits for it (a synchronous round, not a final
  // merge; a join into a job in progress with none of its state: see
  // Flights::Launch): it reads none of the fragments' state meanwhile.
  bool training_waits = false;
  // Set by the round's thread (read once it was joined): a heal began to
  // write the fragments' state in place; if the round fails, that state is
  // part the source's.
  bool state_written = false;
  Micros launched = 0;
  Micros finished = 0;  // set by the thread before `done`
  // This learner's pseudo-gradient at the boundary (theta_g - theta_i; the
  // fragment's buffer, borrowed), merged in place by the round; its norm.
  ZeroedFloats delta;
  double norm = 0;
  // Or, in a synchronous round, `delta` is made by the round's thread as
  // its merge reaches each piece (norm unset); `made` once it was.
  std::optional<DeferredSnapshot> deferred;
  bool made = false;
  // A copy of it where the result is applied at a later step (concurrent:
  // the parameters then keep what was trained since the boundary).
  ZeroedFloats own;
  // outer_apply = eager: the provisional step taken at the boundary, theta_g
  // - p (the parameters became p; empty: none). The commit adds it where it
  // would add `own`; undoing it adds it less `own`.
  ZeroedFloats eager;
  std::vector<float> moments[2];  // the optimizer's moments at the boundary (when it has them)
  uint64_t moment_step = 0;       // the optimizer's step count at the boundary (0: none)
  std::vector<float> buffers[2];  // sync_buffers: the model's buffers at the boundary
  std::thread thread;
  std::atomic<bool> done{false};  // set by the thread when `outcome` is final
  StatusOr<Outcome> outcome = AbortedError("not finished");
  // Set by the thread when the lighthouse answered (under `mu`; `done`
  // is signalled on `changed`): the round formed at this learner's step
  // `formed_step`.
  std::mutex mu;
  std::condition_variable changed;
  bool formed = false;
  uint64_t formed_step = 0;
  uint64_t round_id = 0;     // the round it formed (under `mu`)
  bool may_heal = false;     // ... may heal a member: no round is launched beside it (under `mu`)
  bool snapped = false;      // the snapshot was taken (under `mu`; see Snapped)
  bool passed_over = false;  // training thread only: not waited for at tau
  bool waited = false;       // training thread only: a step waited for it
  bool final_merge = false;  // launched at shutdown after the job's last step
  bool checkpoint = false;   // write a checkpoint after it, whatever checkpoint_every_rounds says
  bool called_off = false;   // at shutdown: its join was interrupted on purpose

  // What the thread has reported so far (`done` as of `arrived`, when given:
  // the view a planned step took).
  FlightStatus Status(const bool* arrived = nullptr) {
    std::lock_guard lock(mu);
    FlightStatus status;
    status.launched = true;
    status.formed = formed;
    status.done = arrived ? *arrived : done.load(std::memory_order_acquire);
    status.ok = status.done && outcome.ok();
    status.passed_over = passed_over;
    status.may_heal = may_heal;
    status.round_id = round_id;
    return status;
  }
  // The round `id` formed; the learner is at `step`; whether a member of
  // it may heal. From the round's thread.
  void Formed(uint64_t step, uint64_t id, bool heals) {
    std::lock_guard lock(mu);
    formed = true;
    formed_step = step;
    round_id = id;
    may_heal = heals;
  }
  // The round healed no one through this learner and its result rewrites
  // only its own fragment: a round may be launched beside it. From the
  // round's thread.
  void HealedNothing() {
    std::lock_guard lock(mu);
    may_heal = false;
  }
  // The training thread took the boundary's snapshot (delta, norm, own,
  // eager, moments, buffers); the round's thread waits for it before it
  // reads any of them (AwaitSnapped), after its join and connections.
  void Snapped() {
    {
      std::lock_guard lock(mu);
      snapped = true;
    }
    changed.notify_all();
  }
  void AwaitSnapped() {
    std::unique_lock lock(mu);
    changed.wait(lock, [&]() { return snapped; });
  }
  // The thread's last act: `result` is final.
  void Finish(StatusOr<Outcome> result, Micros now) {
    outcome = std::move(result);
    finished = now;
    {
      std::lock_guard lock(mu);
      done.store(true, std::memory_order_release);
    }
    changed.notify_all();
  }
};

}  // namespace mend::reducer
