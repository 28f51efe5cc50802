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
//   RebasedStep      the job's step, when a heal showed this learner far behind
//
// Thread-safety: none; see above.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mend/outer.h"
#include "reducer/flat_state.h"
#include "reducer/fragments.h"
#include "reducer/round_flight.h"

namespace mend::reducer {

// Steps between two rounds (of consecutive fragments), from the schedule.
uint64_t FragmentPeriod(const FragmentSchedule& schedule);

class FragmentBook {
 public:
  // Lays `parameters` (not owned) out in the schedule's fragments, each
  // starting from the parameters' values. `*copies` counts every copy.
  FragmentBook(FlatParameters& parameters, const FragmentSchedule& schedule, uint64_t* copies);

  std::vector<Fragment>& fragments() { return fragments_; }
  const std::vector<Fragment>& fragments() const { return fragments_; }
  Fragment& at(int f) { return fragments_[static_cast<size_t>(f)]; }
  const Fragment& at(int f) const { return fragments_[static_cast<size_t>(f)]; }
  size_t size() const { return fragments_.size(); }
  uint64_t period() const { return period_; }
  const FlatParameters& parameters() const { return parameters_; }

  // The fragment's local parameters, flat; and back.
  void Gather(const Fragment& fragment, std::span<float> out);
  void Scatter(std::span<const float> in, const Fragment& fragment);
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
  // The job's step the global state is of: the boundary of the newest round
  // it includes, or `restored_step` (started or restored at) if later.
  uint64_t StateStep(uint64_t restored_step) const;
  // SHA-256 (hex) of every fragment's global parameters and momentum: equal
  // on every member after a shared round.
  std::string GlobalDigest() const;

 private:
  FlatParameters& parameters_;
  uint64_t* const copies_;
  const uint64_t period_;
  std::vector<Fragment> fragments_;
};

// SHA-256 (hex) of a model's values, parameter by parameter.
std::string ParametersDigest(const FlatParameters& parameters);
// All of `values`, flat in order; and back.
std::vector<float> ReadAll(const FlatParameters& values);
void WriteAll(FlatParameters& values, std::span<const float> all);

// The appliers: `flight` is the joined round, `outcome` its result, `step`
// the learner's step now.

// A heal: every fragment's base becomes the source's; each fragment other
// than the one the round's result goes to (`exchanging`, nullptr: none)
// keeps the learner's progress on top. A fresh join's progress is none of
// the job's: every fragment but that one starts from the healed state.
void ApplyHeal(FragmentBook& book, const Outcome& outcome, const Fragment* exchanging);

// The round's theta_g' and momentum into the fragment it exchanged. Its own
// fragment's local parameters get the result (exact: plus the progress
// since the boundary); a round of another fragment (`adopted`, see
// Outcome::fragment) moves that fragment's parameters by the base change.
void CommitRound(FragmentBook& book, Outcome& outcome, InFlight& flight, uint64_t step,
                 OuterApply mode, float mixing_alpha);

// outer_apply = eager, at a round's launch: the outer Nesterov step the
// round would take if every member's pseudo-gradient were this learner's
// (`delta`, from `global` with the fragment's `momentum`), taken on the
// fragment's gathered `local` parameters; `shift` gets local - provisional,
// what CommitRound (or UndoEager) adds back.
void EagerStep(std::span<const float> global, std::span<const float> momentum,
               std::span<const float> delta, const OuterOptions& outer, std::span<float> local,
               std::span<float> shift);
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

// After a heal: the learner's new step when the heal puts it on the job's
// step: in a process's first round (`first_round`: a new or restarted
// learner) and when it fell a fragment period or more behind; the steps
// since the round formed still count. nullopt: it stays.
std::optional<uint64_t> RebasedStep(const Outcome& outcome, const InFlight& flight, uint64_t step,
                                    uint64_t period, bool first_round);

}  // namespace mend::reducer
