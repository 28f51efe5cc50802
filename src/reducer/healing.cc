#include "reducer/healing.h"

#include <algorithm>
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
  for (size_t r = 0; r < round.members.size(); ++r)
    rank_of[round.members[r].id] = static_cast<int>(r);
  std::map<int, std::vector<int>> healees;  // source rank -> ranks healing from it
  if (round.heal_round_id == 0) {
    for (int r = 1; r < comm.world_size(); ++r) healees[0].push_back(r);  // a fresh start
  } else {
    for (size_t r = 0; r < round.members.size(); ++r) {
      const std::string& source = round.members[r].heal_from;
      if (!source.empty() && rank_of.count(source))
        healees[rank_of[source]].push_back(static_cast<int>(r));
    }
  }
  return healees;
}

// Every fragment's global state and momentum into `buffer`, in the healing
// buffer's layout (HealStateOffset).
void PackState(const std::vector<Fragment>& fragments, std::vector<float>& buffer) {
  for (size_t f = 0; f < fragments.size(); ++f) {
    const FragmentState& state = *fragments[f].state;
    auto out = buffer.begin() + static_cast<long>(HealStateOffset(fragments, f));
    out = std::copy(state.global().begin(), state.global().end(), out);
    std::copy(state.momentum().begin(), state.momentum().end(), out);
  }
}

// By option the source's inner optimizer moments (as of its boundary)
// follow the state, with a flag that says whether it had any yet: both
// moments back to back, then 1.0f when they are there. Empty without the
// option.
StatusOr<std::vector<float>> StreamMoments(Communicator& comm, const HealOffer& offer, int source,
                                           const std::string& source_id) {
  std::vector<float> moments;
  if (!offer.send_moments) return moments;
  const size_t m = offer.moment_values;
  moments.assign(2 * m + 1, 0.0f);
  if (comm.rank() == source && offer.moments[0] && offer.moments[1] && !offer.moments[0]->empty() &&
      !offer.moments[1]->empty()) {
    std::copy(offer.moments[0]->begin(), offer.moments[0]->end(), moments.begin());
    std::copy(offer.moments[1]->begin(), offer.moments[1]->end(),
              moments.begin() + static_cast<long>(m));
    moments[2 * m] = 1.0f;
  }
  MEND_RETURN_IF_ERROR(
      StreamState(comm, std::as_writable_bytes(std::span(moments)), source, source_id));
  return moments;
}

}  // namespace

StatusOr<Healed> HealRound(Communicator& comm, const QuorumResult& round,
                           const std::vector<Fragment>& fragments, const HealOffer& offer,
                           const Clock& clock) {
  const std::map<int, std::vector<int>> healees = HealeesBySource(comm, round);
  Healed healed;
  if (healees.empty()) return healed;
  const Micros started = clock.NowMicros();
  std::vector<float> buffer(HealStateOffset(fragments, fragments.size()));
  for (const auto& [source, ranks] : healees) {
    if (comm.rank() == source) PackState(fragments, buffer);
    const std::string& source_id = round.members[static_cast<size_t>(source)].id;
    // With the state: the source's step at its boundary (the healed learner
    // continues the job's schedule, learning rate and fragment boundaries,
    // from there), the fragment the source exchanges in this round, and
    // its optimizer's step count (with the moments, when they follow).
    uint64_t boundary[3] = {offer.boundary_step, static_cast<uint64_t>(offer.fragment),
                            offer.moment_step};
    MEND_RETURN_IF_ERROR(StreamState(comm, std::as_writable_bytes(std::span(buffer)), source,
                                     source_id, kHealChunkBytes,
                                     std::as_writable_bytes(std::span(boundary))));
    MEND_ASSIGN_OR_RETURN(std::vector<float> moments,
                          StreamMoments(comm, offer, source, source_id));
    if (std::find(ranks.begin(), ranks.end(), comm.rank()) != ranks.end()) {
      healed.state = buffer;
      healed.bytes = (buffer.size() + moments.size()) * sizeof(float) + sizeof(boundary);
      healed.source = source_id;
      healed.step = boundary[0];
      if (boundary[1] >= fragments.size()) {
        return InvalidArgumentError(
            fmt::format("round {}: heal source {} exchanges fragment {}; this job has {}",
                        round.round_id, source_id, boundary[1], fragments.size()));
      }
      healed.fragment = static_cast<int>(boundary[1]);
      if (!moments.empty() && moments.back() == 1.0f) {
        const long m = static_cast<long>(offer.moment_values);
        healed.moments[0].assign(moments.begin(), moments.begin() + m);
        healed.moments[1].assign(moments.begin() + m, moments.begin() + 2 * m);
        healed.moment_step = boundary[2];
      }
    }
  }
  healed.seconds = static_cast<double>(clock.NowMicros() - started) / kMicrosPerSecond;
  return healed;
}

}  // namespace mend::reducer
