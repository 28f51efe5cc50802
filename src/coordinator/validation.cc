#include "coordinator/validation.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>

#include "core/status_format.h"
#include "core/text.h"
#include "fmt/format.h"
#include "wire/protocol_rules.h"

namespace mend::coordinator {
namespace {

using store::CheckTimeout;

Status Invalid(std::string_view field, std::string_view why) {
  return InvalidArgumentError(fmt::format("{}: {}", field, why));
}

Status CheckCounter(uint64_t value, std::string_view field) {
  if (value > kMaxCounter) {
    return Invalid(field, fmt::format("{} is above the bound 2^62", value));
  }
  return OkStatus();
}

// Every request names its learner in the field `learner` (constant names:
// this runs for every heartbeat).
StatusOr<std::pair<std::string, uint64_t>> ParseLearnerRef(const v1::LearnerRef& ref) {
  MEND_RETURN_IF_ERROR(
      CheckIdentifier(ref.learner_id(), "learner.learner_id", /*allow_empty=*/false));
  if (ref.session_id() == 0) return Invalid("learner.session_id", "must be set");
  return std::make_pair(ref.learner_id(), ref.session_id());
}

}  // namespace

bool IsLoopbackHost(std::string_view address) {
  std::string host(address);
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) != 1 && CheckHostPort(address, "address").ok()) {
    host = SplitHostPort(address).first;
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

std::string PeerHost(std::string_view peer, const std::vector<std::string>& local_hosts) {
  if (peer.starts_with("unix")) return "local";
  std::string_view address;
  if (peer.starts_with("ipv4:")) {
    address = peer.substr(5);
  } else if (peer.starts_with("ipv6:")) {
    address = peer.substr(5);
  } else {
    return "";
  }
  if (!CheckHostPort(address, "peer").ok()) return "";
  std::string host = SplitHostPort(address).first;
  // An IPv4 peer of a dual-stack socket may read ::ffff:a.b.c.d.
  if (host.starts_with("::ffff:") && host.find('.') != std::string::npos) host = host.substr(7);
  if (IsLoopbackHost(host)) return "local";
  if (std::find(local_hosts.begin(), local_hosts.end(), host) != local_hosts.end()) return "local";
  return host;
}

std::vector<std::string> LocalHosts() {
  std::vector<std::string> hosts;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return hosts;
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const int family = entry->ifa_addr->sa_family;
    const void* where = nullptr;
    if (family == AF_INET) {
      where = &reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr;
    } else if (family == AF_INET6) {
      where = &reinterpret_cast<const sockaddr_in6*>(entry->ifa_addr)->sin6_addr;
    } else {
      continue;
    }
    if (inet_ntop(family, where, text, sizeof text) != nullptr) hosts.emplace_back(text);
  }
  freeifaddrs(list);
  return hosts;
}

StatusOr<RegisterArgs> ParseRegister(const v1::RegisterRequest& request) {
  RegisterArgs args;
  MEND_RETURN_IF_ERROR(CheckIdentifier(request.learner_id(), "learner_id", false));
  MEND_RETURN_IF_ERROR(CheckIdentifier(request.job_id(), "job_id", true));
  MEND_RETURN_IF_ERROR(CheckIdentifier(request.rack(), "rack", true));
  if (!request.address().empty()) {
    if (request.address().size() > kMaxAddressLength) {
      return Invalid("address", fmt::format("longer than {} characters", kMaxAddressLength));
    }
    MEND_RETURN_IF_ERROR(CheckHostPort(request.address(), "address"));
  }
  MEND_RETURN_IF_ERROR(CheckCounter(request.step(), "step"));
  MEND_RETURN_IF_ERROR(CheckCounter(request.last_round_id(), "last_round_id"));
  args.learner_id = request.learner_id();
  args.job_id = request.job_id();
  args.rack = request.rack();
  args.address = request.address();
  args.step = request.step();
  args.last_round_id = request.last_round_id();
  if (request.group_size() > kMaxGroupSize) {
    return Invalid("group_size",
                   fmt::format("{} is above {}", request.group_size(), kMaxGroupSize));
  }
  args.group_size = std::max<uint32_t>(1, request.group_size());
  if (request.rank_addresses_size() != 0 &&
      static_cast<uint32_t>(request.rank_addresses_size()) != args.group_size) {
    return Invalid("rank_addresses",
                   fmt::format("{} addresses for group_size = {}: one per rank, or none",
                               request.rank_addresses_size(), args.group_size));
  }
  for (int r = 0; r < request.rank_addresses_size(); ++r) {
    const std::string& address = request.rank_addresses(r);
    const std::string field = fmt::format("rank_addresses[{}]", r);
    if (address.empty() || address.size() > kMaxAddressLength) {
      return Invalid(field, fmt::format("must have 1 to {} characters", kMaxAddressLength));
    }
    // HOST, or HOST:PORT: a data plane listens on ports of its own choosing.
    if (!CheckHostPort(address, field).ok())
      MEND_RETURN_IF_ERROR(CheckHostPort(address + ":0", field));
    args.rank_addresses.push_back(address);
    if (IsLoopbackHost(address)) args.loopback_host = address;
  }
  if (!args.address.empty() && IsLoopbackHost(args.address)) args.loopback_host = args.address;
  if (request.job_settings_size() > kMaxJobSettings) {
    return Invalid("job_settings", fmt::format("{} entries, above {}", request.job_settings_size(),
                                               kMaxJobSettings));
  }
  for (int i = 0; i < request.job_settings_size(); ++i) {
    const std::string& setting = request.job_settings(i);
    const size_t equals = setting.find('=');
    if (setting.size() > kMaxJobSettingLength || equals == 0 || equals == std::string::npos) {
      return Invalid(fmt::format("job_settings[{}]", i),
                     fmt::format("must be key=value, at most {} characters", kMaxJobSettingLength));
    }
    args.job_settings.push_back(setting);
  }
  return args;
}

StatusOr<HeartbeatArgs> ParseHeartbeat(const v1::HeartbeatRequest& request) {
  MEND_ASSIGN_OR_RETURN(auto ref, ParseLearnerRef(request.learner()));
  return ParseHeartbeatOf(std::move(ref.first), ref.second, request);
}

StatusOr<HeartbeatArgs> ParseHeartbeatOf(std::string learner_id, uint64_t session_id,
                                         const v1::HeartbeatRequest& request) {
  HeartbeatArgs args;
  MEND_RETURN_IF_ERROR(CheckCounter(request.step(), "step"));
  MEND_RETURN_IF_ERROR(CheckCounter(request.tokens_total(), "tokens_total"));
  MEND_RETURN_IF_ERROR(CheckCounter(request.tokens_since_last_round(), "tokens_since_last_round"));
  if (static_cast<size_t>(request.step_time_us_size()) > wire::kMaxHeartbeatStepTimes) {
    return Invalid("step_time_us",
                   fmt::format("{} entries, at most {}", request.step_time_us_size(),
                               wire::kMaxHeartbeatStepTimes));
  }
  args.step_ms.reserve(static_cast<size_t>(request.step_time_us_size()));
  for (uint32_t us : request.step_time_us()) {
    if (us == 0 || us > kMaxStepTimeUs) {
      return Invalid("step_time_us", fmt::format("{} is outside [1, {}]", us, kMaxStepTimeUs));
    }
    args.step_ms.push_back(us / 1000.0);
  }
  args.learner_id = std::move(learner_id);
  args.session_id = session_id;
  args.step = request.step();
  args.tokens_total = request.tokens_total();
  args.tokens_since_last_round = request.tokens_since_last_round();
  return args;
}

StatusOr<QuorumArgs> ParseQuorum(const v1::QuorumRequest& request) {
  QuorumArgs args;
  MEND_ASSIGN_OR_RETURN(auto ref, ParseLearnerRef(request.learner()));
  MEND_RETURN_IF_ERROR(CheckCounter(request.last_round_id(), "last_round_id"));
  MEND_RETURN_IF_ERROR(CheckCounter(request.step(), "step"));
  MEND_RETURN_IF_ERROR(CheckCounter(request.tokens_since_last_round(), "tokens_since_last_round"));
  MEND_RETURN_IF_ERROR(CheckTimeout(request.timeout_ms(), "timeout_ms", false));
  args.learner_id = std::move(ref.first);
  args.session_id = ref.second;
  args.last_round_id = request.last_round_id();
  args.step = request.step();
  args.tokens_since_last_round = request.tokens_since_last_round();
  args.timeout = Micros{request.timeout_ms()} * kMicrosPerMilli;
  args.give_up_short_of_quorum = request.give_up_short_of_quorum();
  return args;
}

Status CheckLeave(const v1::LeaveRequest& request) {
  MEND_RETURN_IF_ERROR(ParseLearnerRef(request.learner()).status());
  if (request.reason().size() > kMaxReasonLength) {
    return Invalid("reason", fmt::format("longer than {} characters", kMaxReasonLength));
  }
  return OkStatus();
}

Status CheckGetStatus(const v1::GetStatusRequest& request) {
  if (request.max_learners() > kMaxStatusItems || request.max_rounds() > kMaxStatusItems) {
    return Invalid("max_learners/max_rounds", fmt::format("at most {}", kMaxStatusItems));
  }
  return OkStatus();
}

}  // namespace mend::coordinator
