// Which members of a round a learner could not connect to, read from the
// data plane's connect error: Gloo names the peer's address ("[HOST]:PORT")
// in a connect that timed out or was refused. The learner publishes the ids
// at <round prefix>unreachable/<its id> (core/round_keys.h), and the
// lighthouse leaves out a learner that several others could not reach
// (coordinator/lighthouse_core.h).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mend/lighthouse_client.h"

namespace mend::reducer {

// The ids of the members, other than `self`, whose data-plane host is named
// in `error` as "[HOST]"; a host that several of them share names none of
// them (which one was meant cannot be told). Sorted, each once.
std::vector<std::string> UnreachableMembers(std::string_view error,
                                            const std::vector<RoundMember>& members,
                                            const std::string& self);

}  // namespace mend::reducer
