// What a heal allocates, counted: every allocation of this test binary goes
// through the counting operator new below. A heal streams the source's
// state through one chunk's buffer on the source, and into the healed
// learner's copy of it (8 bytes a parameter: the global state and the
// momentum, applied at once when the round commits) with one chunk's buffer
// more, never a second copy of the whole state on either side; a fresh
// join's heal (in place) writes into its fragments through one chunk's
// buffer, and no copy.
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <optional>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "mend/clock.h"
#include "reducer/heal_stream.h"
#include "reducer/healing.h"
#include "reducer/replay_communicator.h"

namespace {

std::atomic<size_t> live_bytes{0};
std::atomic<size_t> peak_bytes{0};

void* Counted(size_t size) {
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  const size_t now = live_bytes.fetch_add(malloc_usable_size(p)) + malloc_usable_size(p);
  size_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void Uncounted(void* p) {
  if (p == nullptr) return;
  live_bytes.fetch_sub(malloc_usable_size(p));
  std::free(p);
}

}  // namespace

void* operator new(size_t size) { return Counted(size); }
void* operator new[](size_t size) { return Counted(size); }
void operator delete(void* p) noexcept { Uncounted(p); }
void operator delete[](void* p) noexcept { Uncounted(p); }
void operator delete(void* p, size_t) noexcept { Uncounted(p); }
void operator delete[](void* p, size_t) noexcept { Uncounted(p); }

namespace mend::reducer {
namespace {

using testing_util::ReplayCommunicator;

constexpr size_t kValues = 3 << 20;  // 3M parameters: 24 MiB of state and momentum

// A learner's fragments: one of kValues values, its global state and
// momentum set from `seed`.
std::vector<Fragment> Fragments(float seed) {
  std::vector<float> global(kValues), momentum(kValues);
  for (size_t i = 0; i < kValues; ++i) {
    global[i] = seed + static_cast<float>(i % 977);
    momentum[i] = seed - static_cast<float>(i % 331);
  }
  std::vector<Fragment> fragments(1);
  fragments[0].state = std::make_unique<FragmentState>(kValues);
  fragments[0].state->Assign(global, momentum);
  return fragments;
}

QuorumResult RoundWhereBHealsFromA(uint32_t rank) {
  QuorumResult round;
  round.set_round_id(7);
  round.set_rank(rank);
  round.set_world_size(2);
  round.set_heal_round_id(6);
  for (auto [id, step, last_round_id, heal_from] :
       {std::tuple{"a", 60, 6, ""}, std::tuple{"b", 20, 2, "a"}}) {
    RoundMember* member = round.add_members();
    member->set_learner_id(id);
    member->set_step(step);
    member->set_last_round_id(last_round_id);
    member->set_heal_from(heal_from);
  }
  return round;
}

// The peak of the bytes allocated during `run`, above what was allocated before.
template <typename Run>
size_t PeakDuring(Run run) {
  const size_t before = live_bytes.load();
  peak_bytes.store(before);
  run();
  return peak_bytes.load() - before;
}

TEST(HealMemoryTest, AHealAllocatesAChunkOnTheSourceAndOneCopyOfTheStateOnTheHealed) {
  std::vector<Fragment> source = Fragments(1.0f);
  std::vector<Fragment> behind = Fragments(-5.0f);
  std::vector<std::vector<std::byte>> log;
  HealOffer offer;
  offer.boundary_step = 60;
  const size_t at_source = PeakDuring([&]() {
    ReplayCommunicator comm(0, nullptr);  // (keeps nothing it sends)
    StatusOr<Healed> healed =
        HealRound(comm, RoundWhereBHealsFromA(0), source, offer, *RealClock());
    ASSERT_TRUE(healed.ok()) << healed.status();
    EXPECT_TRUE(healed->state.empty());  // (the source heals nobody's state into its own)
  });
  {  // What it sends, for the healed learner's side.
    ReplayCommunicator comm(0, &log);
    ASSERT_TRUE(HealRound(comm, RoundWhereBHealsFromA(0), source, offer, *RealClock()).ok());
  }
  std::optional<Healed> healed;
  offer.boundary_step = 20;
  const size_t at_healed = PeakDuring([&]() {
    ReplayCommunicator comm(1, &log);
    StatusOr<Healed> got = HealRound(comm, RoundWhereBHealsFromA(1), behind, offer, *RealClock());
    ASSERT_TRUE(got.ok()) << got.status();
    healed = std::move(*got);
  });
  ASSERT_TRUE(healed.has_value());
  const size_t state_bytes = 2 * kValues * sizeof(float);
  std::printf("heal of %zu bytes: the source allocated %zu bytes at most, the healed %zu\n",
              state_bytes, at_source, at_healed);
  const size_t chunk = kHealChunkBytes + (64 << 10);  // (a message: a chunk, its digest, a header)
  EXPECT_LE(at_source, 2 * chunk) << "the source allocated " << at_source << " bytes";
  EXPECT_LE(at_healed, state_bytes + 2 * chunk) << "the healed allocated " << at_healed << " bytes";
  // And it holds the source's state, with its step.
  ASSERT_EQ(healed->state.size(), 2 * kValues);
  EXPECT_EQ(healed->step, 60u);
  EXPECT_EQ(healed->source, "a");
  auto [global, momentum] = HealSlice(behind, healed->state, 0);
  EXPECT_TRUE(std::equal(global.begin(), global.end(), source[0].state->global().begin()));
  EXPECT_TRUE(std::equal(momentum.begin(), momentum.end(), source[0].state->momentum().begin()));
}

// The source's messages of a heal from `source` (rank 0) to rank 1.
std::vector<std::vector<std::byte>> SourceLog(std::vector<Fragment>& source) {
  std::vector<std::vector<std::byte>> log;
  HealOffer offer;
  offer.boundary_step = 60;
  ReplayCommunicator comm(0, &log);
  EXPECT_TRUE(HealRound(comm, RoundWhereBHealsFromA(0), source, offer, *RealClock()).ok());
  return log;
}

TEST(HealMemoryTest, AHealInPlaceAllocatesAChunkAndWritesTheFragments) {
  std::vector<Fragment> source = Fragments(1.0f);
  std::vector<Fragment> behind = Fragments(-5.0f);
  const std::vector<std::vector<std::byte>> log = SourceLog(source);
  HealOffer offer;
  offer.boundary_step = 20;
  bool written = false;
  std::optional<Healed> healed;
  std::vector<std::vector<std::byte>> replay = log;
  const size_t at_healed = PeakDuring([&]() {
    ReplayCommunicator comm(1, &replay);
    StatusOr<Healed> got =
        HealRound(comm, RoundWhereBHealsFromA(1), behind, offer, *RealClock(), &written);
    ASSERT_TRUE(got.ok()) << got.status();
    healed = std::move(*got);
  });
  ASSERT_TRUE(healed.has_value());
  std::printf("heal in place of %zu bytes: the healed allocated %zu bytes at most\n",
              2 * kValues * sizeof(float), at_healed);
  const size_t chunk = kHealChunkBytes + (64 << 10);
  EXPECT_LE(at_healed, 2 * chunk) << "the healed allocated " << at_healed << " bytes";
  EXPECT_TRUE(written);
  EXPECT_TRUE(healed->healed);
  EXPECT_TRUE(healed->state.empty());  // (no copy)
  EXPECT_EQ(healed->step, 60u);
  EXPECT_TRUE(std::equal(behind[0].state->global().begin(), behind[0].state->global().end(),
                         source[0].state->global().begin()));
  EXPECT_TRUE(std::equal(behind[0].state->momentum().begin(), behind[0].state->momentum().end(),
                         source[0].state->momentum().begin()));
}

// A chunk that fails its check fails the heal: the chunks before it are
// in the fragments (the caller resets them: Flights::GiveBack), it and
// those after it are not.
TEST(HealMemoryTest, AHealInPlaceThatFailsHalfwaySaysItWroteAndStopsAtTheBadChunk) {
  std::vector<Fragment> source = Fragments(1.0f);
  std::vector<Fragment> behind = Fragments(-5.0f);
  const std::vector<Fragment> before = Fragments(-5.0f);
  std::vector<std::vector<std::byte>> log = SourceLog(source);
  ASSERT_GE(log.size(), 4u);
  HealOffer offer;
  bool written = false;
  ReplayCommunicator comm(1, &log, /*damage=*/2);
  StatusOr<Healed> got =
      HealRound(comm, RoundWhereBHealsFromA(1), behind, offer, *RealClock(), &written);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_TRUE(written);
  const size_t chunk_values = kHealChunkBytes / sizeof(float);
  std::span<const float> global = behind[0].state->global();
  EXPECT_TRUE(std::equal(global.begin(), global.begin() + 2 * chunk_values,
                         source[0].state->global().begin()));
  EXPECT_TRUE(std::equal(global.begin() + 2 * chunk_values, global.end(),
                         before[0].state->global().begin() + 2 * chunk_values));
  EXPECT_TRUE(std::equal(behind[0].state->momentum().begin(), behind[0].state->momentum().end(),
                         before[0].state->momentum().begin()));
}

}  // namespace
}  // namespace mend::reducer
