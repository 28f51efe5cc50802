// Which members of a round a learner could not connect to, read from the
// data plane's connect error: Gloo names the peer's address in a connect
// that timed out ("Connect timeout [HOST]:PORT"). The learner publishes the
// ids at <round prefix>unreachable/<its id> (core/round_keys.h), and the
// lighthouse leaves out a learner that several others could not reach
// (coordinator/lighthouse_core.h).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mend/lighthouse_client.h"
#include "mend/rendezvous_store.h"
#include "mend/status.h"

namespace mend::reducer {

// The ids of the members, other than `self`, whose data-plane host
// (RoundMember::address: an address or a name, with or without a port) is
// the host of a timed-out connect in `error`. Only timeouts count: a peer
// that refused or dropped the connection is more likely dead or restarting
// than out of reach, and the lighthouse's liveness rules deal with that. A
// host that several members share names none of them (which one was meant
// cannot be told). A member that failed the secure data plane's
// authentication ("('ID') failed authentication") counts too: a learner
// whose pieces keep failing is left out as an unreachable one is. Sorted
// by id, each once (`unauthenticated`: it failed authentication).
struct UnreachableMember {
  std::string id;
  bool unauthenticated = false;
  bool operator==(const UnreachableMember&) const = default;
};
std::vector<UnreachableMember> UnreachableMembers(std::string_view error,
                                                  const RoundMembers& members,
                                                  const std::string& self);

// Sets <prefix>unreachable/<self> in `store` when `failed` names members,
// each tagged when its pieces failed authentication (core/round_keys.h;
// best effort: a report the lighthouse does not get changes nothing).
void ReportUnreachable(RendezvousStore& store, const std::string& prefix,
                       const RoundMembers& members, const std::string& self, const Status& failed);

}  // namespace mend::reducer
