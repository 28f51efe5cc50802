#include "reducer/fragment_book.h"

#include <algorithm>
#include <cmath>

#include "fmt/format.h"
#include "openssl/evp.h"
#include "reducer/healing.h"

namespace mend::reducer {
namespace {

// SHA-256 of float runs, as hex (the diagnostics' state digests).
class Sha256 {
 public:
  Sha256() : context_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(context_, EVP_sha256(), nullptr); }
  ~Sha256() { EVP_MD_CTX_free(context_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(std::span<const float> values) {
    EVP_DigestUpdate(context_, values.data(), values.size_bytes());
  }
  std::string Hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_DigestFinal_ex(context_, digest, &length);
    std::string hex;
    for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
    return hex;
  }

 private:
  EVP_MD_CTX* context_;
};

}  // namespace

uint64_t FragmentPeriod(const FragmentSchedule& schedule) {
  return static_cast<uint64_t>(std::max<int64_t>(1, schedule.period() / schedule.fragments()));
}

FragmentBook::FragmentBook(FlatParameters& parameters, const FragmentSchedule& schedule,
                           uint64_t* copies)
    : parameters_(parameters), copies_(copies), period_(FragmentPeriod(schedule)) {
  fragments_.resize(static_cast<size_t>(schedule.fragments()));
  for (size_t l = 0; l < parameters_.count(); ++l) {
    const int64_t f =
        FragmentOfLayer(static_cast<int64_t>(parameters_.layer(l)), schedule.fragments());
    fragments_[static_cast<size_t>(f)].parameters.push_back(l);
  }
  for (Fragment& fragment : fragments_) {
    size_t values = 0;
    for (size_t l : fragment.parameters) values += parameters_.numel(l);
    std::vector<float> initial(values);
    Gather(fragment, initial);
    fragment.state = std::make_unique<FragmentState>(initial);
  }
}

// Every copy between the parameters and the flat fragment state goes
// through Gather and Scatter, each counted (a step that neither starts nor
// applies a round makes none).
void FragmentBook::Gather(const Fragment& fragment, std::span<float> out) {
  ForEachPiece(fragment, [&](size_t l, size_t offset, size_t n) {
    parameters_.CopyOut(l, out.subspan(offset, n));
  });
  ++*copies_;
}

void FragmentBook::Scatter(std::span<const float> in, const Fragment& fragment) {
  ForEachPiece(fragment, [&](size_t l, size_t offset, size_t n) {
    parameters_.CopyIn(l, in.subspan(offset, n));
  });
  ++*copies_;
}

void FragmentBook::KeepLocalProgress(Fragment& fragment, std::span<const float> new_base) {
  std::vector<float> local = TakeFloats(fragment.state->size());
  Gather(fragment, local);
  std::span<const float> old_base = fragment.state->global();
  for (size_t i = 0; i < local.size(); ++i) local[i] += new_base[i] - old_base[i];
  Scatter(local, fragment);
  GiveBack(std::move(local));
}

uint64_t FragmentBook::StateStep(uint64_t restored_step) const {
  uint64_t step = restored_step;
  for (const Fragment& fragment : fragments_) step = std::max(step, fragment.last_round_boundary);
  return step;
}

std::string FragmentBook::GlobalDigest() const {
  Sha256 hash;
  for (const Fragment& fragment : fragments_) {
    hash.Update(fragment.state->global());
    hash.Update(fragment.state->momentum());
  }
  return hash.Hex();
}

std::string ParametersDigest(const FlatParameters& parameters) {
  Sha256 hash;
  std::vector<float> values;
  for (size_t i = 0; i < parameters.count(); ++i) {
    values.resize(parameters.numel(i));
    parameters.CopyOut(i, values);
    hash.Update(values);
  }
  return hash.Hex();
}

std::vector<float> ReadAll(const FlatParameters& values) {
  size_t total = 0;
  for (size_t i = 0; i < values.count(); ++i) total += values.numel(i);
  std::vector<float> all(total);
  size_t at = 0;
  for (size_t i = 0; i < values.count(); ++i) {
    values.CopyOut(i, std::span(all).subspan(at, values.numel(i)));
    at += values.numel(i);
  }
  return all;
}

void WriteAll(FlatParameters& values, std::span<const float> all) {
  size_t at = 0;
  for (size_t i = 0; i < values.count(); ++i) {
    values.CopyIn(i, all.subspan(at, values.numel(i)));
    at += values.numel(i);
  }
}

void ApplyHeal(FragmentBook& book, const Outcome& outcome, const Fragment* exchanging) {
  std::vector<Fragment>& fragments = book.fragments();
  for (size_t f = 0; f < fragments.size(); ++f) {
    Fragment& fragment = fragments[f];
    auto [global, momentum] = HealSlice(fragments, outcome.healed, f);
    if (&fragment != exchanging) book.KeepLocalProgress(fragment, global);
    fragment.state->Assign(global, momentum);
  }
  if (!outcome.fresh_join) return;
  // Nothing it trained is the job's: every other fragment starts from the
  // healed state too (the exchanging one gets the round's result).
  for (Fragment& other : fragments) {
    if (&other == exchanging) continue;
    book.Scatter(other.state->global(), other);
    other.tokens_since_round = 0;
  }
}

void EagerStep(std::span<const float> global, std::span<const float> momentum,
               std::span<const float> delta, const OuterOptions& outer, std::span<float> local,
               std::span<float> shift) {
  // The round's own outer step (OuterNesterovStep) on copies, with `delta`
  // as the merged pseudo-gradient.
  const size_t n = local.size();
  std::vector<float> provisional = TakeFloats(n);
  std::vector<float> scratch_momentum = TakeFloats(n);
  std::copy(global.begin(), global.end(), provisional.begin());
  std::copy(momentum.begin(), momentum.end(), scratch_momentum.begin());
  OuterNesterovStep(provisional, scratch_momentum, delta, outer);
  for (size_t i = 0; i < n; ++i) {
    shift[i] = local[i] - provisional[i];
    local[i] = provisional[i];
  }
  GiveBack(std::move(provisional));
  GiveBack(std::move(scratch_momentum));
}

void UndoEager(FragmentBook& book, InFlight& flight) {
  if (flight.eager.empty()) return;
  Fragment& fragment = book.at(flight.fragment);
  std::vector<float> local = TakeFloats(fragment.state->size());
  book.Gather(fragment, local);
  for (size_t i = 0; i < local.size(); ++i) local[i] += flight.eager[i];
  book.Scatter(local, fragment);
  GiveBack(std::move(local));
  GiveBack(std::move(flight.eager));
  flight.eager.clear();
}

void CommitRound(FragmentBook& book, Outcome& outcome, InFlight& flight, uint64_t step,
                 OuterApply mode, float mixing_alpha) {
  Fragment& fragment = book.at(flight.fragment);
  if (outcome.fragment != flight.fragment) {
    UndoEager(book, flight);
    Fragment& exchanged = book.at(outcome.fragment);
    book.KeepLocalProgress(exchanged, outcome.result.global);
    outcome.result.residual.clear();  // it sent nothing: its error feedback stays
    OuterRound::Commit(*exchanged.state, std::move(outcome.result));
    if (!outcome.fresh_join) fragment.tokens_since_round += flight.tokens;
    return;
  }
  OuterRound::Commit(*fragment.state, std::move(outcome.result));
  if (step == flight.boundary_step) {
    // Nothing trained since the boundary (synchronous): exactly theta_g'.
    book.Scatter(fragment.state->global(), fragment);
    return;
  }
  std::vector<float> local = TakeFloats(fragment.state->size());
  book.Gather(fragment, local);
  ApplyOuterResult(local, fragment.state->global(), flight.base, flight.delta, mode, mixing_alpha);
  // The provisional step (outer_apply = eager) is replaced by the result:
  // theta_i <- theta_g' + what was trained since it.
  for (size_t i = 0; i < flight.eager.size(); ++i) local[i] += flight.eager[i];
  book.Scatter(local, fragment);
  GiveBack(std::move(local));
}

MomentsApplied ApplyMoments(FlatMoments* moments, const Outcome& outcome, InFlight& flight,
                            uint64_t step) {
  // The optimizer's steps since the boundary: its own count where it keeps
  // one, else the reducer's (one optimizer step per reducer step).
  const uint64_t now = moments->step();
  const uint64_t since = flight.moment_step > 0 && now >= flight.moment_step
                             ? now - flight.moment_step
                             : step - flight.boundary_step;
  // Nothing added since the boundary, or nothing to tell it from.
  const bool replace = since == 0 || flight.moments[0].empty() || flight.moments[1].empty();
  // `target` as the moment at the boundary, with the progress since kept.
  auto bring = [&](FlatMoments::Which which, const std::vector<float>& target) {
    if (replace) {
      moments->Replace(which, target);
    } else {
      moments->Adjust(which, target, flight.moments[which],
                      static_cast<float>(std::pow(moments->beta(which), since)));
    }
  };
  MomentsApplied applied;
  for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
    if (outcome.averaged_moments[which].empty() || flight.moments[which].empty()) continue;
    bring(which, outcome.averaged_moments[which]);
    applied.synced++;
    applied.changed = true;
  }
  if (outcome.healed_moments[0].empty() || outcome.healed_moments[1].empty()) return applied;
  for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond})
    bring(which, outcome.healed_moments[which]);
  // The source's step count as of its boundary, plus the steps this
  // learner's moments kept since (none where they were replaced).
  if (outcome.healed_moment_step > 0)
    moments->set_step(outcome.healed_moment_step + (replace ? 0 : since));
  applied.changed = true;
  return applied;
}

std::optional<uint64_t> RebasedStep(const Outcome& outcome, const InFlight& flight, uint64_t step,
                                    uint64_t period, bool first_round) {
  // A lag of a few steps from timing alone is left as it is. The steps that
  // count are those since the round formed (the source was at its boundary
  // then): a learner passed over trained on meanwhile.
  const bool far_behind = outcome.heal_step >= flight.boundary_step + period;
  if (outcome.healed.empty() || !(first_round || far_behind) ||
      outcome.heal_step == flight.boundary_step) {
    return std::nullopt;
  }
  return outcome.heal_step + (step - std::min(step, flight.formed_step));
}

}  // namespace mend::reducer
