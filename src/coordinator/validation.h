// Checks every field of every lighthouse request against its bounds and turns
// the request into the core's plain arguments. A request out of bounds gets
// INVALID_ARGUMENT naming the field, the value and the bound; nothing in a
// request can make the lighthouse allocate without limit or misbehave.
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "coordinator/lighthouse_core.h"
#include "core/text.h"
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

// Whether `address` (HOST or HOST:PORT, an IPv6 host bare or in brackets)
// names this host's loopback: localhost, 127.0.0.0/8, ::1 (names other than
// localhost are not resolved).
bool IsLoopbackHost(std::string_view address);
// The host a gRPC call came from (`peer` as grpc::ServerContext::peer()
// writes it: "ipv4:10.0.0.5:41234", "ipv6:[::1]:41234", "unix:..."):
// "local" for the lighthouse's own host (loopback, a Unix socket, or one of
// `local_hosts`, its interfaces' addresses), else the address; "" when it
// cannot be told.
std::string PeerHost(std::string_view peer, const std::vector<std::string>& local_hosts);
// The addresses of this host's interfaces (getifaddrs), for PeerHost.
std::vector<std::string> LocalHosts();
[[nodiscard]] StatusOr<HeartbeatArgs> ParseHeartbeat(const v1::HeartbeatRequest& request);
// The same for a heartbeat whose learner the channel already knows (a
// datagram's session): every field but `learner`.
[[nodiscard]] StatusOr<HeartbeatArgs> ParseHeartbeatOf(std::string learner_id, uint64_t session_id,
                                                       const v1::HeartbeatRequest& request);
[[nodiscard]] StatusOr<QuorumArgs> ParseQuorum(const v1::QuorumRequest& request);
[[nodiscard]] Status CheckLeave(const v1::LeaveRequest& request);
[[nodiscard]] Status CheckGetStatus(const v1::GetStatusRequest& request);

}  // namespace mend::coordinator
