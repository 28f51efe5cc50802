// What the ranks of a multi-rank learner share before they have any
// connection of their own: a value each, through the group's store; and the
// agent of a rank other than 0, which speaks to the lighthouse only through
// that store.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mend/agent_options.h"
#include "mend/clock.h"
#include "mend/communicator.h"
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
// `told` (optional) is the lighthouse's store, where a rank that could not
// start tells why (TellGroupRanks).
[[nodiscard]] StatusOr<std::vector<std::string>> ShareWithGroupRanks(
    RendezvousStore& store, RendezvousStore* told, const Clock& clock, const AgentOptions& options,
    const std::string& learner_id, const std::string& prefix, const std::string& mine,
    bool only_rank0_waits, std::string_view missing);

// Tells the other ranks of learner `learner_id`'s group that this rank
// (options.group_rank) could not start, and why, at
// <GroupStorePrefix>failed/<group_store>/<group_rank> in the lighthouse's store (the
// group's own store may be gone with rank 0): a rank waiting for this one
// (ShareWithGroupRanks, or a group store that rank 0 never served) ends its
// wait with `why` (its code and message) instead of at quorum_timeout_ms.
// Best effort: one call, bounded by rpc_timeout_ms. Returns `why`; does
// nothing for a learner of one rank.
Status TellGroupRanks(const AgentOptions& options, const std::string& token,
                      const std::string& learner_id, Status why);

// What group rank `rank` of learner `learner_id` told (TellGroupRanks) in
// `told` (the lighthouse's store) since this start of the group could have
// begun (quorum_timeout_ms before `since_unix_ms`): a told failure older
// than that is an earlier start's and is passed over. Null when none.
std::optional<Status> ToldFailure(RendezvousStore& told, const AgentOptions& options,
                                  const std::string& learner_id, int64_t rank,
                                  int64_t since_unix_ms);
// What group rank `rank` told (ToldFailure), as the error of this rank's
// (options.group_rank's) wait for it: "learner '<id>' group rank <mine>:
// group rank <rank> could not start: <its message>", with its code. Null
// when it told nothing.
std::optional<Status> CouldNotStartAsTold(RendezvousStore& told, const AgentOptions& options,
                                          const std::string& learner_id, int64_t rank,
                                          int64_t since_unix_ms);
// Removes what this rank told at an earlier start of its group.
void ForgetToldFailure(RendezvousStore& told, const AgentOptions& options,
                       const std::string& learner_id);
// The wall clock, for ToldFailure.
int64_t UnixMillis();
// Whether a store call's error means the store is not up yet, or went away
// under the call (its server shut down: gRPC answers CANCELLED), so that a
// wait tries again: the rank that serves it may have told why it stopped
// (ToldFailure), or come back.
bool StoreNotUpOrGone(const Status& status);

// A new connection to where the ranks of a group meet: the group's own store
// when `group_store` is set, else the lighthouse's store over `client`
// (which, like `clock`, must outlive it).
[[nodiscard]] StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupOrLighthouseStore(
    const GroupStoreOpener& group_store, LighthouseClient& client, const Clock& clock);

// What a learner seals and authenticates with: the job token where its
// setting is on (the default), else empty.
struct AgentSecrets {
  std::string data_plane;   // LearnerAgent::data_plane_secret (dataplane_encrypt)
  std::string checkpoints;  // LearnerAgent::checkpoint_secret (checkpoint_authenticate)

  static AgentSecrets Of(const AgentOptions& options, const std::string& token) {
    return {options.dataplane_encrypt ? token : "", options.checkpoint_authenticate ? token : ""};
  }
};

// The agent of group rank options.group_rank > 0 of learner `id`: it neither
// registers nor heartbeats (group rank 0 speaks for the group) and learns the
// rounds from its group (reducer/learner_group.h); it keeps `client` for the
// store, where the rounds' communicators rendezvous, and the learner's
// secrets (from `token`). `clock` must outlive it.
std::unique_ptr<LearnerAgent> NewGroupRankAgent(std::string id, const AgentOptions& options,
                                                const std::string& token, const Clock& clock,
                                                std::unique_ptr<LighthouseClient> client,
                                                GroupStoreOpener group_store);

}  // namespace mend
