// The fragment book: the model's fragments (which parameters each holds,
// its global state, its tokens since its last round), every copy between
// them and the parameters, and the small appliers that bring a round's
// outcome in. The round driver keeps one; the round's thread reads the
// fragments' global state while the training thread leaves it alone.
//
// The appliers, in the order the driver calls them for a round that
// succeeded:
//   ApplyHeal        the healed state into every fragment (this learner was behind)
//   CommitRound      theta_g' and momentum committed, the local parameters rebased on them
//   ApplyMoments     DES-LOC's averaged moments, or the healed source's
//   RebasedStep      the job's step, when a heal or the round showed this learner far behind
//
// Thread-safety: none; see above.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "mend/outer.h"
#include "outer/round_kernels.h"
#include "reducer/flat_state.h"
#include "reducer/fragments.h"
#include "reducer/round_flight.h"

namespace mend::reducer {

// Steps between two rounds (of consecutive fragments), from the schedule.
uint64_t FragmentPeriod(const FragmentSchedule& schedule);

// The outer step of a round, fused with what it does to the local
// parameters (FragmentBook::CommitOuter).
struct OuterCommit {
  std::span<const float> merged;  // the members' pseudo-gradient
  bool average = false;           // theta_g <- theta_g - merged, the momentum kept
  OuterOptions outer;             // else Nesterov's step with these
  // kReplace: theta_i <- theta_g' (nothing trained since the boundary);
  // kProgress: theta_i += theta_g' - theta_g (a round of another fragment,
  // adopted); kExact: theta_i += (theta_g' - theta_g) + own [+ eager];
  // kMix: theta_i <- alpha theta_i + (1 - alpha) theta_g'.
  using Local = kernels::LocalUpdate;
  Local local = Local::kReplace;
  std::span<const float> own;    // kExact: this learner's pseudo-gradient at the boundary
  std::span<const float> eager;  // kExact: outer_apply = eager's shift (empty: none)
  float alpha = 0;               // kMix
};

class FragmentBook {
 public:
  // Lays `parameters` (not owned) out in the schedule's fragments, each
  // starting from the parameters' values (copied here on every processor;
  // the rest of the fragment's memory is faulted in by StartPrefault).
  // The round's passes run on `pool` (not owned; used from the training
  // thread, and by a deferred snapshot from the round's thread while the
  // training thread waits for that round). `*copies` counts every pass over the parameters.
  FragmentBook(FlatParameters& parameters, const FragmentSchedule& schedule, uint64_t* copies,
               ThreadPool& pool);
  ~FragmentBook();
  FragmentBook(const FragmentBook&) = delete;
  FragmentBook& operator=(const FragmentBook&) = delete;

  // Faults in, on a thread of its own, the memory the first round writes:
  // each fragment's round buffers (Fragment::spare; with `own`, spare_own;
  // with `step`, spare_step) and momentum (zero pages until then), so that
  // the first round costs what the later ones do. AwaitPrefault() before
  // anything else reads or writes them (a round's launch, an export, a
  // checkpoint, a restore).
  void StartPrefault(bool own = false, bool step = false);
  void AwaitPrefault();

  std::vector<Fragment>& fragments() { return fragments_; }
  const std::vector<Fragment>& fragments() const { return fragments_; }
  Fragment& at(int f) { return fragments_[static_cast<size_t>(f)]; }
  const Fragment& at(int f) const { return fragments_[static_cast<size_t>(f)]; }
  size_t size() const { return fragments_.size(); }
  uint64_t period() const { return period_; }
  const FlatParameters& parameters() const { return parameters_; }
  // The parameters' values (every fragment's together).
  size_t values() const;
  // Every fragment's global state and momentum, in the parameters' order
  // (values() each); and back into the fragments' states.
  void CopyStateOut(std::span<float> global, std::span<float> momentum) const;
  void AssignState(std::span<const float> global, std::span<const float> momentum);

  // The fragment's local parameters, flat; and back.
  void Gather(const Fragment& fragment, std::span<float> out);
  void Scatter(std::span<const float> in, const Fragment& fragment);

  // The round's two passes over a fragment, fused and in chunks on the
  // pool (one parameter at a time through a copy where the parameters are
  // not in place: FlatParameters::Values):
  //
  // The boundary snapshot: delta <- theta_g - theta_i (and into `copy`
  // too, unless empty); returns ||delta||^2 (chunks' sums added in order).
  // With `step` (outer_apply = eager), the provisional outer step too: p =
  // the Nesterov step with `outer` that the round would take were every
  // member's pseudo-gradient this one; theta_i <- p, step <- theta_g - p.
  double Snapshot(const Fragment& fragment, std::span<float> delta, std::span<float> copy,
                  std::span<float> step = {}, const OuterOptions& outer = {});
  // The snapshot's pseudo-gradient left to be made into `delta` by the
  // round (DeferredSnapshot); nullopt where the parameters are not in
  // place. Made, it counts as a pass (CountDeferred).
  std::optional<DeferredSnapshot> DeferSnapshot(const Fragment& fragment, std::span<float> delta);
  void CountDeferred() { ++*copies_; }
  // The outer step on the fragment's state in place, and the local
  // parameters with it (OuterCommit::Local); returns ||merged||^2. The
  // state and parameters are written only here, after the round
  // succeeded: a failed round changed nothing.
  double CommitOuter(Fragment& fragment, const OuterCommit& commit);
  // `visit(l, offset, n)` for each of the fragment's parameters: its n
  // values lie at `offset` in the fragment's flat state.
  template <typename Visit>
  void ForEachPiece(const Fragment& fragment, Visit&& visit) const {
    size_t offset = 0;
    for (size_t l : fragment.parameters) {
      const size_t n = parameters_.numel(l);
      visit(l, offset, n);
      offset += n;
    }
  }

  // A fragment whose base is replaced outside its own round: its local
  // parameters move by the same amount (theta_i <- theta_i + new base - old
  // base), so what this learner trained since its old base is still its
  // pseudo-gradient.
  void KeepLocalProgress(Fragment& fragment, std::span<const float> new_base);
  // Every fragment's base becomes its local parameters, its momentum and
  // error feedback none: a state of the learner's own again, after a heal
  // into it failed halfway (HealRound's written_in_place).
  void BaseFromParameters();
  // The job's step the global state is of: the boundary of the newest round
  // it includes, or `restored_step` (started or restored at) if later.
  uint64_t StateStep(uint64_t restored_step) const;
  // SHA-256 (hex) of every fragment's global parameters and momentum: equal
  // on every member after a shared round.
  std::string GlobalDigest() const;
  // The same values' XXH3-128 (hex): a round's members compare their states
  // with it (RoundRunner::StatesAgree), at memory speed rather than
  // SHA-256's (about 2 GB/s: a second per 250 M parameters).
  std::string AgreementDigest() const;

 private:
  // body(chunk, offset, theta): theta are the parameters' values at
  // `offset` in the flat fragment (several calls per chunk where the chunk
  // spans parameters, all on one thread); `writes`: body changes theta.
  // Chunks are fixed ranges of the fragment, whatever the threads.
  template <typename Body>
  void ForEachChunk(const Fragment& fragment, bool writes, ThreadPool& pool, Body&& body);
  size_t ChunkCount(const Fragment& fragment) const;
  // A fused pass ended: counted (`copies`); its chunks' sums added in chunk order.
  double EndPass(const std::vector<double>& squares);
  bool InPlace(const Fragment& fragment);

  FlatParameters& parameters_;
  uint64_t* const copies_;
  ThreadPool& pool_;
  std::thread prefault_;
  std::chrono::steady_clock::time_point prefault_started_;
  const uint64_t period_;
  std::vector<Fragment> fragments_;
};

// SHA-256 (hex) of a model's values, parameter by parameter.
std::string ParametersDigest(const FlatParameters& parameters);
// How many values `values` has, every parameter's together.
size_t TotalValues(const FlatParameters& values);
// All of `values`, flat in order; and back.
std::vector<float> ReadAll(const FlatParameters& values);
void WriteAll(FlatParameters& values, std::span<const float> all);

// The appliers: `flight` is the joined round, `outcome` its result, `step`
// the learner's step now.

// A heal: every fragment's base becomes the source's; each fragment other
// than the one the round's result goes to (`exchanging`, nullptr: none)
// keeps the learner's progress on top. A fresh join's progress is none of
// the job's: every fragment but that one starts from the healed state.
// `exchanging_own`: the exchanging fragment's own pseudo-gradient, which its
// commit adds to the parameters (empty: none), moved with its base.
void ApplyHeal(FragmentBook& book, const Outcome& outcome, const Fragment* exchanging,
               std::span<float> exchanging_own);

// The round's theta_g' and momentum into the fragment it exchanged. Its own
// fragment's local parameters get the result (exact: plus the progress
// since the boundary); a round of another fragment (`adopted`, see
// Outcome::fragment) moves that fragment's parameters by the base change.
// The round's outer step (with `outer`, unless it averages) and the local
// parameters with it, in one fused pass (FragmentBook::CommitOuter).
void CommitRound(FragmentBook& book, Outcome& outcome, InFlight& flight, uint64_t step,
                 OuterApply mode, float mixing_alpha, const OuterOptions& outer);
// The members' merged pseudo-gradient of the round: in the flight's buffer,
// or, for a round of another fragment (adopted), in the outcome's.
std::span<const float> Merged(const Outcome& outcome, const InFlight& flight);

// A round that brings no result for its fragment (it failed, was called off,
// or healed another): its provisional step is taken back.
void UndoEager(FragmentBook& book, InFlight& flight);

// DES-LOC's averaged moments, and a heal's moments with the source's step
// count, into `moments`: as the moments at the boundary, with the progress
// the optimizer made since kept (FlatMoments::Adjust); the number of
// averaged ones, and whether any moment changed.
struct MomentsApplied {
  uint64_t synced = 0;
  bool changed = false;
};
MomentsApplied ApplyMoments(FlatMoments* moments, const Outcome& outcome, InFlight& flight,
                            uint64_t step);

// The job's step as a round showed it: its heal's source's boundary, else
// the round's step (its members' largest boundary).
inline uint64_t JobStep(const Outcome& outcome) {
  return outcome.healed ? outcome.heal_step : outcome.round_step;
}

// After a round: the learner's new step when the round puts it on the job's
// step, its heal's source's boundary or else the round's step (its members'
// largest boundary): after a heal in a process's first round
// (`first_round`: a new or restarted learner), and whenever its own
// boundary was a fragment period or more behind that (it was stopped, or
// trained on while its join waited: without this the learners' boundaries
// would stay that far apart for the rest of the job, and a final merge
// would meet another learner's ordinary round). The steps since the round
// formed still count. nullopt: it stays.
std::optional<uint64_t> RebasedStep(const Outcome& outcome, const InFlight& flight, uint64_t step,
                                    uint64_t period, bool first_round);

}  // namespace mend::reducer
