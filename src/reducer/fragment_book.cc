#include "reducer/fragment_book.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/buffer_pool.h"
#include "fmt/format.h"
#include "openssl/evp.h"
#include "reducer/healing.h"
#include "spdlog/spdlog.h"
#include "xxhash.h"

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

namespace {

// Maps `values`' pages writable without changing a value: MADV_POPULATE_WRITE
// (Linux 5.14), else each page's first value written back as it was read
// (nothing else touches the buffers until AwaitPrefault).
void FaultIn(std::span<float> values) {
  if (values.empty()) return;
  static const auto kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(values.data()) & ~(kPage - 1);
  const auto end =
      (reinterpret_cast<uintptr_t>(values.data() + values.size()) + kPage - 1) & ~(kPage - 1);
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the page that holds the first value
  if (madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE) == 0) return;
  const size_t page_values = kPage / sizeof(float);
  for (size_t i = 0; i < values.size(); i += page_values) {
    volatile float* value = values.data() + i;
    *value = *value;
  }
}

}  // namespace

FragmentBook::FragmentBook(FlatParameters& parameters, const FragmentSchedule& schedule,
                           uint64_t* copies, ThreadPool& pool)
    : parameters_(parameters), copies_(copies), pool_(pool), period_(FragmentPeriod(schedule)) {
  fragments_.resize(static_cast<size_t>(schedule.fragments()));
  for (size_t l = 0; l < parameters_.count(); ++l) {
    const int64_t f =
        FragmentOfLayer(static_cast<int64_t>(parameters_.layer(l)), schedule.fragments());
    fragments_[static_cast<size_t>(f)].parameters.push_back(l);
  }
  for (Fragment& fragment : fragments_) {
    size_t values = 0;
    for (size_t l : fragment.parameters) {
      fragment.starts.push_back(values);
      values += parameters_.numel(l);
    }
    // theta_g = theta_i, copied on every processor (the training waits for
    // mend_init); the momentum's zeros are untouched until StartPrefault.
    fragment.state = std::make_unique<FragmentState>(values);
  }
  ThreadPool everyone(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  for (Fragment& fragment : fragments_) {
    float* global = fragment.state->mutable_global().data();
    ForEachChunk(fragment, /*writes=*/false, everyone,
                 [&](size_t, size_t offset, std::span<float> theta) {
                   std::memcpy(global + offset, theta.data(), theta.size_bytes());
                 });
  }
}

FragmentBook::~FragmentBook() {
  if (prefault_.joinable()) prefault_.join();
}

void FragmentBook::StartPrefault(bool own, bool step) {
  if (prefault_.joinable()) return;
  std::vector<std::span<float>> buffers;
  for (Fragment& fragment : fragments_) {
    const size_t n = fragment.state->size();
    if (fragment.spare.empty()) fragment.spare = ZeroedFloats(n);
    if (own && fragment.spare_own.empty()) fragment.spare_own = ZeroedFloats(n);
    if (step && fragment.spare_step.empty()) fragment.spare_step = ZeroedFloats(n);
    for (std::span<float> buffer : std::initializer_list<std::span<float>>{
             fragment.spare, fragment.spare_own, fragment.spare_step,
             fragment.state->mutable_momentum()})
      buffers.push_back(buffer);
  }
  // On every processor (page faults scale with them), the values left as
  // they are: the momentum may be a resumed checkpoint's.
  prefault_started_ = std::chrono::steady_clock::now();
  prefault_ = std::thread([buffers = std::move(buffers)]() {
    constexpr size_t kChunk = size_t{16} << 20;  // values: 64 MiB
    std::vector<std::span<float>> chunks;
    for (std::span<float> buffer : buffers) {
      for (size_t at = 0; at < buffer.size(); at += kChunk)
        chunks.push_back(buffer.subspan(at, std::min(kChunk, buffer.size() - at)));
    }
    ThreadPool everyone(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    everyone.ParallelFor(chunks.size(), [&](size_t c) { FaultIn(chunks[c]); });
  });
}

void FragmentBook::AwaitPrefault() {
  if (!prefault_.joinable()) return;
  const auto waited_from = std::chrono::steady_clock::now();
  prefault_.join();
  const auto now = std::chrono::steady_clock::now();
  const double waited = std::chrono::duration<double>(now - waited_from).count();
  // (Once per learner: a first round, export or import that came sooner
  // than the buffers were mapped, back to back with mend_init, pays the
  // rest here.)
  if (waited > 0.05) {
    spdlog::info(
        "waited {:.2f} s for mend's round buffers to be mapped (in the background since "
        "mend_init: {:.2f} s in all)",
        waited, std::chrono::duration<double>(now - prefault_started_).count());
  }
}

// Every copy between the parameters and the flat fragment state goes
// through Gather and Scatter or the fused passes, each counted (a step that
// neither starts nor applies a round makes none).
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

namespace {
// A chunk of the fused passes: 1 MiB of fp32 values (a few chunks stay in a
// core's cache while they are worked on).
constexpr size_t kChunkValues = size_t{1} << 18;
}  // namespace

bool FragmentBook::InPlace(const Fragment& fragment) {
  for (size_t l : fragment.parameters) {
    if (parameters_.numel(l) > 0 && parameters_.Values(l).size() != parameters_.numel(l))
      return false;
  }
  return true;
}

size_t FragmentBook::ChunkCount(const Fragment& fragment) const {
  const size_t n = fragment.state->size();
  return std::max((n + kChunkValues - 1) / kChunkValues, fragment.parameters.size());
}

namespace {

// part(p, at, hi) for each parameter p that [begin, end) of a fragment
// overlaps: values [at, hi) of the fragment, which parameter p (starting
// at starts[p]; the last ends at `total`) holds. Empty parameters are
// skipped.
template <typename Part>
void ForEachPart(const std::vector<size_t>& starts, size_t total, size_t begin, size_t end,
                 Part&& part) {
  // The last parameter that starts at or before `begin`.
  size_t p =
      static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin()) -
      1;
  for (size_t at = begin; at < end; ++p) {
    const size_t hi = std::min(end, p + 1 < starts.size() ? starts[p + 1] : total);
    if (hi > at) part(p, at, hi);
    at = std::max(at, hi);
  }
}

}  // namespace

template <typename Body>
void FragmentBook::ForEachChunk(const Fragment& fragment, bool writes, ThreadPool& pool,
                                Body&& body) {
  const size_t n = fragment.state->size();
  if (InPlace(fragment)) {
    const size_t chunks = (n + kChunkValues - 1) / kChunkValues;
    pool.ParallelFor(chunks, [&](size_t c) {
      const size_t begin = c * kChunkValues;
      const size_t end = std::min(n, begin + kChunkValues);
      ForEachPart(fragment.starts, n, begin, end, [&](size_t p, size_t at, size_t hi) {
        body(c, at,
             parameters_.Values(fragment.parameters[p]).subspan(at - fragment.starts[p], hi - at));
      });
    });
    if (writes) {
      for (size_t l : fragment.parameters) parameters_.Wrote(l);
    }
    return;
  }
  // One parameter at a time, through a copy, on this thread.
  std::vector<float> scratch;
  for (size_t p = 0; p < fragment.parameters.size(); ++p) {
    const size_t l = fragment.parameters[p];
    scratch.resize(parameters_.numel(l));
    parameters_.CopyOut(l, scratch);
    body(p, fragment.starts[p], std::span<float>(scratch));
    if (writes) parameters_.CopyIn(l, scratch);
  }
}

double FragmentBook::EndPass(const std::vector<double>& squares) {
  ++*copies_;
  double total = 0;
  for (double s : squares) total += s;
  return total;
}

double FragmentBook::Snapshot(const Fragment& fragment, std::span<float> delta,
                              std::span<float> copy, std::span<float> step,
                              const OuterOptions& outer) {
  const float* global = fragment.state->global().data();
  const float* momentum = fragment.state->momentum().data();
  std::vector<double> squares(ChunkCount(fragment), 0.0);
  ForEachChunk(fragment, /*writes=*/!step.empty(), pool_,
               [&](size_t c, size_t offset, std::span<float> theta) {
                 float* d = delta.data() + offset;
                 squares[c] += kernels::Difference(global + offset, theta.data(), d, theta.size());
                 if (!copy.empty()) std::memcpy(copy.data() + offset, d, theta.size_bytes());
                 // The provisional outer step (this learner's pseudo-gradient as
                 // the merge): theta_i <- p, step <- theta_g - p.
                 if (!step.empty()) {
                   kernels::ProvisionalStep(global + offset, momentum + offset, d, theta.data(),
                                            step.data() + offset, theta.size(), outer.lr,
                                            outer.momentum);
                 }
               });
  return EndPass(squares);
}

std::optional<DeferredSnapshot> FragmentBook::DeferSnapshot(const Fragment& fragment,
                                                            std::span<float> delta) {
  if (!InPlace(fragment)) return std::nullopt;
  DeferredSnapshot deferred;
  deferred.pool_ = &pool_;
  deferred.global_ = fragment.state->global().data();
  deferred.delta_ = delta.data();
  deferred.size_ = fragment.state->size();
  for (size_t p = 0; p < fragment.parameters.size(); ++p) {
    deferred.theta_.push_back(parameters_.Values(fragment.parameters[p]).data());
    deferred.starts_.push_back(fragment.starts[p]);
  }
  return deferred;
}

double DeferredSnapshot::Make(size_t begin, size_t end) const {
  end = std::min(end, size_);
  if (begin >= end) return 0;
  // A segment's piece (1 MiB at the data plane's default) in parts of 256
  // KiB, so that a few threads share it.
  constexpr size_t kPartValues = size_t{1} << 16;
  const size_t parts = (end - begin + kPartValues - 1) / kPartValues;
  if (parts == 1 || pool_->threads() == 1) return MakePart(begin, end);
  std::vector<double> squares(parts, 0.0);
  pool_->ParallelFor(parts, [&](size_t c) {
    const size_t from = begin + c * kPartValues;
    squares[c] = MakePart(from, std::min(end, from + kPartValues));
  });
  double total = 0;
  for (double s : squares) total += s;
  return total;
}

double DeferredSnapshot::MakePart(size_t begin, size_t end) const {
  double squares = 0;
  ForEachPart(starts_, size_, begin, end, [&](size_t p, size_t at, size_t hi) {
    squares +=
        kernels::Difference(global_ + at, theta_[p] + (at - starts_[p]), delta_ + at, hi - at);
  });
  return squares;
}

double FragmentBook::CommitOuter(Fragment& fragment, const OuterCommit& commit) {
  float* global = fragment.state->mutable_global().data();
  float* momentum = fragment.state->mutable_momentum().data();
  kernels::CommitArgs args;
  args.average = commit.average;
  args.lr = commit.outer.lr;
  args.mu = commit.outer.momentum;
  args.local = commit.local;
  args.alpha = commit.alpha;
  // kExact adds the provisional step's shift where one was taken, else this
  // learner's own pseudo-gradient.
  const std::span<const float> add = !commit.eager.empty() ? commit.eager : commit.own;
  std::vector<double> squares(ChunkCount(fragment), 0.0);
  ForEachChunk(
      fragment, /*writes=*/true, pool_, [&](size_t c, size_t offset, std::span<float> theta) {
        squares[c] += kernels::Commit(args, commit.merged.data() + offset, global + offset,
                                      momentum + offset, theta.data(),
                                      add.empty() ? nullptr : add.data() + offset, theta.size());
      });
  return EndPass(squares);
}

void FragmentBook::KeepLocalProgress(Fragment& fragment, std::span<const float> new_base) {
  std::vector<float> local = TakeFloats(fragment.state->size());
  Gather(fragment, local);
  std::span<const float> old_base = fragment.state->global();
  for (size_t i = 0; i < local.size(); ++i) local[i] += new_base[i] - old_base[i];
  Scatter(local, fragment);
  GiveBack(std::move(local));
}

void FragmentBook::BaseFromParameters() {
  for (Fragment& fragment : fragments_) {
    Gather(fragment, fragment.state->mutable_global());
    std::span<float> momentum = fragment.state->mutable_momentum();
    std::fill(momentum.begin(), momentum.end(), 0.0f);
    fragment.state->AssignResidual({});
  }
}

uint64_t FragmentBook::StateStep(uint64_t restored_step) const {
  uint64_t step = restored_step;
  for (const Fragment& fragment : fragments_) step = std::max(step, fragment.last_round_boundary);
  return step;
}

std::string FragmentBook::AgreementDigest() const {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  for (const Fragment& fragment : fragments_) {
    XXH3_128bits_update(state, fragment.state->global().data(),
                        fragment.state->global().size_bytes());
    XXH3_128bits_update(state, fragment.state->momentum().data(),
                        fragment.state->momentum().size_bytes());
  }
  const XXH128_hash_t hash = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}{:016x}", hash.high64, hash.low64);
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

size_t TotalValues(const FlatParameters& values) {
  size_t total = 0;
  for (size_t i = 0; i < values.count(); ++i) total += values.numel(i);
  return total;
}

std::vector<float> ReadAll(const FlatParameters& values) {
  std::vector<float> all(TotalValues(values));
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

void ApplyHeal(FragmentBook& book, const Outcome& outcome, const Fragment* exchanging,
               std::span<float> exchanging_own) {
  std::vector<Fragment>& fragments = book.fragments();
  // (Empty: written in place as it arrived, a fresh join's; its progress
  // is dropped below.)
  for (size_t f = 0; f < fragments.size() && !outcome.healed_state.empty(); ++f) {
    Fragment& fragment = fragments[f];
    auto [global, momentum] = HealSlice(fragments, outcome.healed_state, f);
    if (&fragment != exchanging) {
      book.KeepLocalProgress(fragment, global);
    } else if (!exchanging_own.empty()) {
      // Its commit adds (theta_g' - theta_g) + own to the parameters, with
      // theta_g the healed base now: own takes the base's change.
      std::span<const float> old = fragment.state->global();
      for (size_t i = 0; i < exchanging_own.size(); ++i) exchanging_own[i] += global[i] - old[i];
    }
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

void UndoEager(FragmentBook& book, InFlight& flight) {
  if (flight.eager.empty()) return;
  // theta_i - p (what was trained since) + theta_i(boundary) = theta_i +
  // (theta_g - p) - (theta_g - theta_i(boundary)) = theta_i + step - own.
  Fragment& fragment = book.at(flight.fragment);
  std::vector<float> local = TakeFloats(fragment.state->size());
  book.Gather(fragment, local);
  for (size_t i = 0; i < local.size(); ++i) local[i] += flight.eager[i] - flight.own[i];
  book.Scatter(local, fragment);
  GiveBack(std::move(local));
  GiveBackBuffer(fragment.spare_step, flight.eager);  // (empty: undone)
}

std::span<const float> Merged(const Outcome& outcome, const InFlight& flight) {
  if (outcome.fragment != flight.fragment) return outcome.adopted_merged;
  return flight.delta;
}

void CommitRound(FragmentBook& book, Outcome& outcome, InFlight& flight, uint64_t step,
                 OuterApply mode, float mixing_alpha, const OuterOptions& outer) {
  Fragment& fragment = book.at(flight.fragment);
  OuterCommit commit;
  commit.merged = Merged(outcome, flight);
  commit.average = outcome.result.average;
  commit.outer = outer;
  Fragment* target = &fragment;
  if (outcome.fragment != flight.fragment) {
    UndoEager(book, flight);
    target = &book.at(outcome.fragment);
    outcome.result.residual.clear();  // it sent nothing: its error feedback stays
    commit.local = OuterCommit::Local::kProgress;
    if (!outcome.fresh_join) fragment.tokens_since_round += flight.tokens;
  } else if (step == flight.boundary_step || outcome.final_merge) {
    // Nothing trained since the boundary (synchronous): exactly theta_g'. So
    // too in the job's last round (the final merge): every member ends with
    // the merged model, one that trained on past its boundary (it joined
    // from a boundary behind the others' last step) dropping those steps.
    if (step != flight.boundary_step) UndoEager(book, flight);  // (its buffer back)
    commit.local = OuterCommit::Local::kReplace;
  } else if (mode == OuterApply::kMix) {
    commit.local = OuterCommit::Local::kMix;
    commit.alpha = mixing_alpha;
  } else {
    // The provisional step (outer_apply = eager) is replaced by the result:
    // theta_i <- theta_g' + what was trained since it.
    commit.local = OuterCommit::Local::kExact;
    commit.own = flight.own;
    commit.eager = flight.eager;
  }
  outcome.result.merged_norm = std::sqrt(book.CommitOuter(*target, commit));
  if (!outcome.result.residual.empty()) target->state->AssignResidual(outcome.result.residual);
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
  const bool healed = !outcome.healed_moments[0].empty() && !outcome.healed_moments[1].empty();
  MomentsApplied applied;
  for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
    // The members' average (DES-LOC) where this round took one: what every
    // member takes, one healed in it too (it added nothing of its own:
    // RoundRunner::AverageMoments); else the source's of a heal.
    const bool averaged =
        !outcome.averaged_moments[which].empty() && (healed || !flight.moments[which].empty());
    if (averaged) {
      bring(which, outcome.averaged_moments[which]);
      applied.synced++;
      applied.changed = true;
    } else if (healed) {
      bring(which, outcome.healed_moments[which]);
    }
  }
  if (!healed) return applied;
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
  // count are those since the round formed (the source, or the member of
  // the largest step, was at its boundary then): a learner passed over
  // trained on meanwhile.
  const uint64_t job_step = JobStep(outcome);
  // The job's last round: the merged model is the job's at its last step
  // (the steps trained since were dropped: CommitRound).
  if (outcome.final_merge && job_step > flight.boundary_step) return job_step;
  const bool far_behind = job_step >= flight.boundary_step + period;
  if (!(far_behind || (outcome.healed && first_round)) || job_step == flight.boundary_step) {
    return std::nullopt;
  }
  return job_step + (step - std::min(step, flight.formed_step));
}

size_t FragmentBook::values() const { return TotalValues(parameters_); }

namespace {

// Where each parameter begins in the parameters' order of all values.
std::vector<size_t> Starts(const FlatParameters& parameters) {
  std::vector<size_t> at(parameters.count() + 1, 0);
  for (size_t i = 0; i < parameters.count(); ++i) at[i + 1] = at[i] + parameters.numel(i);
  return at;
}

}  // namespace

void FragmentBook::CopyStateOut(std::span<float> global, std::span<float> momentum) const {
  const std::vector<size_t> at = Starts(parameters_);
  for (const Fragment& fragment : fragments_) {
    ForEachPiece(fragment, [&](size_t i, size_t from, size_t n) {
      std::copy_n(fragment.state->global().begin() + static_cast<long>(from), n,
                  global.begin() + static_cast<long>(at[i]));
      std::copy_n(fragment.state->momentum().begin() + static_cast<long>(from), n,
                  momentum.begin() + static_cast<long>(at[i]));
    });
  }
}

void FragmentBook::AssignState(std::span<const float> global, std::span<const float> momentum) {
  const std::vector<size_t> at = Starts(parameters_);
  for (Fragment& fragment : fragments_) {
    std::vector<float> g(fragment.state->global().size()), m(g.size());
    ForEachPiece(fragment, [&](size_t i, size_t from, size_t n) {
      std::copy_n(global.begin() + static_cast<long>(at[i]), n,
                  g.begin() + static_cast<long>(from));
      std::copy_n(momentum.begin() + static_cast<long>(at[i]), n,
                  m.begin() + static_cast<long>(from));
    });
    fragment.state->Assign(g, m);
  }
}

}  // namespace mend::reducer
