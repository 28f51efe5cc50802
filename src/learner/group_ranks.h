// What the ranks of a multi-rank learner share before they have any
// connection of their own: a value each, through the group's store; and the
// agent of a rank other than 0, which speaks to the lighthouse only through
// that store.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mend/clock.h"
#include "mend/communicator.h"
#include "mend/config.h"
#include "mend/learner_agent.h"
#include "mend/lighthouse_client.h"
#include "mend/status.h"

namespace mend {

// Every rank of learner `learner_id`'s group sets `mine` at
// <prefix><group_rank>; then every rank (with `only_rank0_waits`, rank 0
// only) waits up to quorum_timeout_ms, on `clock`, for all the ranks' values
// and gets them by rank. The others get an empty list at once. A store that
// fails at once (a lighthouse not up yet) is tried again. The error names
// the rank that did not come: "group rank <r>" followed by `missing`, e.g.
// " did not start"; or, when that rank told why it could not start
// (TellGroupRanks), its error.
[[nodiscard]] StatusOr<std::vector<std::string>> ShareWithGroupRanks(
    RendezvousStore& store, const Clock& clock, const Config& config, const std::string& learner_id,
    const std::string& prefix, const std::string& mine, bool only_rank0_waits,
    std::string_view missing);

// Tells the other ranks of learner `learner_id`'s group that this rank
// (config.group_rank) could not start, and why, at
// <GroupStorePrefix>failed/<group_rank>: a rank waiting for this one in
// ShareWithGroupRanks ends its wait with `why` (its code and message)
// instead of at quorum_timeout_ms. Opens the group's store (or the
// lighthouse's, with `token`) for it: best effort, each call bounded by
// rpc_timeout_ms. Returns `why`; does nothing for a learner of one rank.
Status TellGroupRanks(const Config& config, const std::string& token, const Clock& clock,
                      const GroupStoreOpener& group_store, const std::string& learner_id,
                      Status why);

// A new connection to where the ranks of a group meet: the group's own store
// when `group_store` is set, else the lighthouse's store over `client`
// (which, like `clock`, must outlive it).
[[nodiscard]] StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupOrLighthouseStore(
    const GroupStoreOpener& group_store, LighthouseClient& client, const Clock& clock);

// The agent of group rank `rank` > 0 of learner `id`: it neither registers
// nor heartbeats (group rank 0 speaks for the group) and learns the rounds
// from its group (reducer/learner_group.h); it keeps `client` for the store,
// where the rounds' communicators rendezvous. `clock` must outlive it.
std::unique_ptr<LearnerAgent> NewGroupRankAgent(std::string id, int64_t rank, const Clock& clock,
                                                std::unique_ptr<LighthouseClient> client,
                                                GroupStoreOpener group_store);

}  // namespace mend
