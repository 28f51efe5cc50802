// A learner group's own store (Config::group_store): a c10d TCPStore, the
// kind torchrun serves for its workers, at HOST:PORT. The ranks of a group
// meet there and rank 0 publishes each round's decision there, so only group
// rank 0 talks to the lighthouse about rounds (the lighthouse's store is
// still where the slices of different learners meet).
//
// Group rank 0 serves the store when nothing listens at HOST:PORT yet (a
// `mend train` group); under torchrun its agent already serves it and every
// rank connects. Needs LibTorch (libmend built with MEND_WITH_TORCH).
#pragma once

#include "mend/config.h"
#include "mend/learner_agent.h"
#include "mend/status.h"

namespace mend {

// What LearnerAgent::Start takes for config.group_store: null when it is
// empty (the group's keys then live in the lighthouse's store). Rank 0's
// server, when it serves one, lives as long as the opener or any connection.
// A connection waits up to quorum_timeout_ms for the store to come up; an
// error names the address.
[[nodiscard]] StatusOr<GroupStoreOpener> GroupStoreFromConfig(const Config& config);

}  // namespace mend
