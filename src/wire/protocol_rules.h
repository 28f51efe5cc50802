// The rules of the control protocol that both ends keep, in one place: the
// lighthouse (src/coordinator/) answers and bounds by them, the learner
// (src/learner/) reads and sends by them. Neither end includes the other's
// headers for them.
#pragma once

#include <cstddef>

#include "mend/status.h"

namespace mend::wire {

// The most step times one heartbeat may carry: the lighthouse refuses more
// (coordinator/validation.h), the learner never sends more.
inline constexpr size_t kMaxHeartbeatStepTimes = 1024;

// The lighthouse answers NOT_FOUND or FAILED_PRECONDITION to a call that
// names a learner or session it does not know (it restarted, forgot the
// learner, or the learner left): the learner must register again.
inline bool NeedsRegistration(StatusCode code) {
  return code == StatusCode::kNotFound || code == StatusCode::kFailedPrecondition;
}

// The lighthouse answers ALREADY_EXISTS to a call of a session that a newer
// registration of the same learner id replaced. When that is the caller's
// current session, another process holds its id: registering again would
// only replace that process in turn, so the caller stops.
inline bool Superseded(StatusCode code) { return code == StatusCode::kAlreadyExists; }

}  // namespace mend::wire
