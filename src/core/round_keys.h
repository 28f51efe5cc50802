// Keys the lighthouse and the learners agree on inside a round's rendezvous
// prefix ("<job>/round/<lighthouse instance>/<id>/").
#pragma once

namespace mend {

// Set by the lighthouse (to the reason) when the round cannot complete
// because a member died or restarted after it closed; the learners'
// rendezvous (LighthouseRendezvousStore) watches it and gives up at once.
inline constexpr char kRoundAbortKey[] = "abort";

}  // namespace mend
