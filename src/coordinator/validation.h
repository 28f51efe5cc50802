// Checks every field of every lighthouse request against its bounds and turns
// the request into the core's plain arguments. A request out of bounds gets
// INVALID_ARGUMENT naming the field, the value and the bound; nothing in a
// request can make the lighthouse allocate without limit or misbehave.
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "coordinator/lighthouse_core.h"
#include "core/text.h"
#include "mend/lighthouse_client.h"
#include "mend/status.h"
#include "mend/v1/lighthouse.pb.h"
#include "store/store_checks.h"

namespace mend::coordinator {

inline constexpr size_t kMaxAddressLength = 256;
inline constexpr uint32_t kMaxGroupSize = 1024;
inline constexpr size_t kMaxReasonLength = 512;
inline constexpr uint32_t kMaxStepTimeUs = 3'600'000'000u;
inline constexpr uint64_t kMaxCounter = uint64_t{1} << 62;
inline constexpr uint32_t kMaxStatusItems = 100'000;
inline constexpr int kMaxJobSettings = 256;
inline constexpr size_t kMaxJobSettingLength = 512;

// The store's requests are checked by store/store_checks.h.
using store::CheckStoreAdd;
using store::CheckStoreDelete;
using store::CheckStoreGet;
using store::CheckStoreKey;
using store::CheckStoreSet;
using store::CheckStoreWait;
using store::kMaxStoreWaitKeys;
using store::kMaxTimeoutMs;

[[nodiscard]] StatusOr<RegisterArgs> ParseRegister(const v1::RegisterRequest& request);
[[nodiscard]] StatusOr<HeartbeatArgs> ParseHeartbeat(const v1::HeartbeatRequest& request);
// The same for a heartbeat whose learner the channel already knows (a
// datagram's session): every field but `learner`.
[[nodiscard]] StatusOr<HeartbeatArgs> ParseHeartbeatOf(std::string learner_id, uint64_t session_id,
                                                       const v1::HeartbeatRequest& request);
[[nodiscard]] StatusOr<QuorumArgs> ParseQuorum(const v1::QuorumRequest& request);
[[nodiscard]] Status CheckLeave(const v1::LeaveRequest& request);
[[nodiscard]] Status CheckGetStatus(const v1::GetStatusRequest& request);

}  // namespace mend::coordinator
