// Healing inside a round: every member computes the same plan from the
// member list (each member that is behind heals from the source the
// lighthouse named; on a fresh start everyone from rank 0), and each source
// streams every fragment's global state and outer momentum in checked
// chunks (heal_stream.h), then its boundary step, the fragment it
// exchanges and its optimizer's step count, then by option its inner
// optimizer's moments.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mend/clock.h"
#include "mend/communicator.h"
#include "mend/lighthouse_client.h"
#include "mend/status.h"
#include "reducer/fragments.h"

namespace mend::reducer {

// The healing buffer's layout: per fragment, its global state then its
// momentum. Where fragment f starts (f = fragments.size(): the total size).
size_t HealStateOffset(const std::vector<Fragment>& fragments, size_t f);
// Fragment f's (global state, momentum) inside a healing buffer.
std::pair<std::span<const float>, std::span<const float>> HealSlice(
    const std::vector<Fragment>& fragments, const std::vector<float>& buffer, size_t f);

// What this member brings to the round's heals as a possible source.
struct HealOffer {
  uint64_t boundary_step = 0;  // its step at the boundary (the job's step)
  int fragment = 0;            // the fragment it exchanges in this round
  // heal_inner_optimizer: its moments at the boundary (empty: none yet),
  // each of `moment_values` values, and its optimizer's step count then.
  bool send_moments = false;
  size_t moment_values = 0;
  const std::vector<float>* moments[2] = {nullptr, nullptr};
  uint64_t moment_step = 0;
};

// What this member received, when it healed.
struct Healed {
  bool healed = false;       // it took a source's state
  std::vector<float> state;  // ... a copy of it (empty: it was written in place)
  std::string source;
  uint64_t step = 0;              // the source's boundary step
  int fragment = 0;               // the fragment the source exchanges
  uint64_t bytes = 0;             // received
  double seconds = 0;             // in healing (every member takes part)
  std::vector<float> moments[2];  // the source's, when it sent them
  uint64_t moment_step = 0;       // the source's optimizer step count with them (0: none)
};

// Runs the round's heals on `comm` (every member must call it): a source
// reads `fragments`' state. A member that heals puts what it receives into
// a copy (Healed::state), applied when the round commits (ApplyHeal); or,
// given `written_in_place`, straight into `fragments`' global state and
// momentum as each chunk checks out: for a learner whose state is none of
// the job's (a fresh join) and whose training thread waits for the round,
// so that nothing reads the state while it is written. `*written_in_place`
// becomes true before the first byte is: a heal that fails after it leaves
// the state part the source's.
[[nodiscard]] StatusOr<Healed> HealRound(Communicator& comm, const QuorumResult& round,
                                         std::vector<Fragment>& fragments, const HealOffer& offer,
                                         const Clock& clock, bool* written_in_place = nullptr);

}  // namespace mend::reducer
