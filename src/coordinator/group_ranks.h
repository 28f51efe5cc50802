// What the ranks of a multi-rank learner share before they have any
// connection of their own: a value each, through the group's store.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mend/communicator.h"
#include "mend/config.h"
#include "mend/status.h"

namespace mend {

// Every rank of learner `learner_id`'s group sets `mine` at
// <prefix><group_rank>; then every rank (with `only_rank0_waits`, rank 0
// only) waits up to quorum_timeout_ms for all the ranks' values and gets
// them by rank. The others get an empty list at once. A store that fails at
// once (a lighthouse not up yet) is tried again. The error names the rank
// that did not come: "group rank <r>" followed by `missing`, e.g. " did not
// start".
[[nodiscard]] StatusOr<std::vector<std::string>> ShareWithGroupRanks(
    RendezvousStore& store, const Config& config, const std::string& learner_id,
    const std::string& prefix, const std::string& mine, bool only_rank0_waits,
    std::string_view missing);

}  // namespace mend
