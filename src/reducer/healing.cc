#include "reducer/healing.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/status_format.h"
#include "fmt/format.h"
#include "reducer/heal_stream.h"

namespace mend::reducer {

size_t HealStateOffset(const std::vector<Fragment>& fragments, size_t f) {
  size_t offset = 0;
  for (size_t g = 0; g < f; ++g) offset += 2 * fragments[g].state->size();
  return offset;
}

std::pair<std::span<const float>, std::span<const float>> HealSlice(
    const std::vector<Fragment>& fragments, const std::vector<float>& buffer, size_t f) {
  const size_t offset = HealStateOffset(fragments, f);
  const size_t size = fragments[f].state->size();
  return {std::span(buffer.data() + offset, size), std::span(buffer.data() + offset + size, size)};
}

namespace {

// Who heals from whom in `round`: source rank -> the ranks healing from it.
std::map<int, std::vector<int>> HealeesBySource(const Communicator& comm,
                                                const QuorumResult& round) {
  std::map<std::string, int> rank_of;
  for (int r = 0; r < round.members_size(); ++r) rank_of[round.members(r).learner_id()] = r;
  std::map<int, std::vector<int>> healees;  // source rank -> ranks healing from it
  if (round.heal_round_id() == 0) {
    for (int r = 1; r < comm.world_size(); ++r) healees[0].push_back(r);  // a fresh start
  } else {
    for (int r = 0; r < round.members_size(); ++r) {
      const std::string& source = round.members(r).heal_from();
      if (!source.empty() && rank_of.count(source)) healees[rank_of[source]].push_back(r);
    }
  }
  return healees;
}

// The healing buffer's layout (HealStateOffset) over the fragments: for
// the bytes [offset, offset + size) of every fragment's global state and
// momentum back to back, `copy(state, at, n)` for each run of them that
// lies in one fragment's vector (`state`: where it starts there; `at`: its
// place from `offset`; n bytes).
template <typename Copy>
void ForEachRun(const std::vector<Fragment>& fragments, size_t offset, size_t size, Copy copy) {
  size_t at = 0;  // where the current run starts, in bytes of the layout
  for (const Fragment& fragment : fragments) {
    for (std::span<float> run :
         {fragment.state->mutable_global(), fragment.state->mutable_momentum()}) {
      const std::span<std::byte> bytes = std::as_writable_bytes(run);
      const size_t end = at + bytes.size();
      if (end > offset && at < offset + size) {
        const size_t from = std::max(offset, at);
        copy(bytes.data() + (from - at), from - offset, std::min(offset + size, end) - from);
      }
      at = end;
    }
  }
}

// The source's side: the bytes from `offset` on, read where they lie.
void ReadFragments(const std::vector<Fragment>& fragments, size_t offset,
                   std::span<std::byte> out) {
  ForEachRun(fragments, offset, out.size(), [&](const std::byte* state, size_t at, size_t n) {
    std::memcpy(out.data() + at, state, n);
  });
}

// A receiver's in place (HealRound's written_in_place): `in`, the bytes from `offset` on.
void WriteFragments(const std::vector<Fragment>& fragments, size_t offset,
                    std::span<const std::byte> in) {
  ForEachRun(fragments, offset, in.size(),
             [&](std::byte* state, size_t at, size_t n) { std::memcpy(state, in.data() + at, n); });
}

// Into `into` (resized to `values` floats, on a receiver that keeps them),
// as StreamState hands over the checked chunks.
WriteState WriteInto(std::vector<float>* into, size_t values) {
  if (into == nullptr) return nullptr;
  into->resize(values);
  return [into](size_t offset, std::span<const std::byte> in) {
    std::memcpy(reinterpret_cast<std::byte*>(into->data()) + offset, in.data(), in.size());
  };
}

// By option the source's inner optimizer moments (as of its boundary)
// follow the state, when it had any (`has_moments`, from the state's
// header, so that every member calls alike): each into `healed`'s (a
// receiver that heals) as it arrives.
Status StreamMoments(Communicator& comm, const HealOffer& offer, int source,
                     const std::string& source_id, Healed* healed) {
  const size_t m = offer.moment_values;
  for (int which = 0; which < 2; ++which) {
    const std::vector<float>* mine = offer.moments[which];
    ReadState read = [&](size_t offset, std::span<std::byte> out) {
      std::memcpy(out.data(), reinterpret_cast<const std::byte*>(mine->data()) + offset,
                  out.size());
    };
    MEND_RETURN_IF_ERROR(StreamState(comm, m * sizeof(float), read,
                                     WriteInto(healed ? &healed->moments[which] : nullptr, m),
                                     source, source_id));
  }
  return OkStatus();
}

}  // namespace

StatusOr<Healed> HealRound(Communicator& comm, const QuorumResult& round,
                           std::vector<Fragment>& fragments, const HealOffer& offer,
                           const Clock& clock, bool* written_in_place) {
  const std::map<int, std::vector<int>> healees = HealeesBySource(comm, round);
  Healed healed;
  if (healees.empty()) return healed;
  const Micros started = clock.NowMicros();
  const size_t values = HealStateOffset(fragments, fragments.size());
  for (const auto& [source, ranks] : healees) {
    const bool heals = std::find(ranks.begin(), ranks.end(), comm.rank()) != ranks.end();
    const std::string& source_id = round.members(source).learner_id();
    // With the state: the source's step at its boundary (the healed learner
    // continues the job's schedule, learning rate and fragment boundaries,
    // from there), the fragment the source exchanges in this round, its
    // optimizer's step count, and whether its moments follow.
    const bool has_moments = offer.send_moments && offer.moments[0] && offer.moments[1] &&
                             !offer.moments[0]->empty() && !offer.moments[1]->empty();
    uint64_t boundary[4] = {offer.boundary_step, static_cast<uint64_t>(offer.fragment),
                            offer.moment_step, has_moments ? 1u : 0u};
    std::vector<float> state;
    WriteState write = WriteInto(heals && written_in_place == nullptr ? &state : nullptr, values);
    if (heals && written_in_place != nullptr) {
      *written_in_place = true;
      write = [&](size_t offset, std::span<const std::byte> in) {
        WriteFragments(fragments, offset, in);
      };
    }
    MEND_RETURN_IF_ERROR(StreamState(
        comm, values * sizeof(float),
        [&](size_t offset, std::span<std::byte> out) { ReadFragments(fragments, offset, out); },
        write, source, source_id, kHealChunkBytes, std::as_writable_bytes(std::span(boundary))));
    if (boundary[3] != 0) {
      MEND_RETURN_IF_ERROR(
          StreamMoments(comm, offer, source, source_id, heals ? &healed : nullptr));
    }
    if (!heals) continue;
    healed.healed = true;
    healed.state = std::move(state);
    healed.bytes = (values + (boundary[3] != 0 ? 2 * offer.moment_values : 0)) * sizeof(float) +
                   sizeof(boundary);
    healed.source = source_id;
    healed.step = boundary[0];
    if (boundary[1] >= fragments.size()) {
      return InvalidArgumentError(
          fmt::format("round {}: heal source {} exchanges fragment {}; this job has {}",
                      round.round_id(), source_id, boundary[1], fragments.size()));
    }
    healed.fragment = static_cast<int>(boundary[1]);
    if (boundary[3] != 0) healed.moment_step = boundary[2];
  }
  healed.seconds = static_cast<double>(clock.NowMicros() - started) / kMicrosPerSecond;
  return healed;
}

}  // namespace mend::reducer
