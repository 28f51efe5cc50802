// Keys the lighthouse and the learners agree on inside a round's rendezvous
// prefix ("<job>/round/<lighthouse instance>/<id>/").
#pragma once

namespace mend {

// Set by the lighthouse (to the reason) when the round cannot complete
// because a member died or restarted after it closed; the learners'
// rendezvous (LighthouseRendezvousStore) watches it and gives up at once.
inline constexpr char kRoundAbortKey[] = "abort";

// <prefix>unreachable/<learner id>: set by a member whose connect failed, to
// the ids (one a line) of the members its error named
// (reducer/unreachable_peers.h), each followed by kRoundUnauthenticatedTag
// where its pieces failed the secure data plane's authentication (not a
// connect that timed out); the lighthouse reads it at that learner's next
// join and leaves out a learner that several others could not reach.
inline constexpr char kRoundUnreachablePrefix[] = "unreachable/";
inline constexpr char kRoundUnauthenticatedTag[] = "\tauthentication";

}  // namespace mend
