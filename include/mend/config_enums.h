// The values of the configuration's enumerated keys (mend/config.h), on
// their own so that the parts that take them (codecs, the outer step,
// logging, the data plane) need not include the whole configuration.
//
// Thread-safety: plain enums.
#pragma once

#include <string_view>

#include "mend/status.h"

namespace mend {

// The enum keys' values, each in the order of its key's choices in the key
// table, which is their one parser and printer (SetConfigValue,
// FormatConfigValue, EnumText).
// The control plane's channel for heartbeats and quorum joins (registration,
// the store and status are always gRPC):
enum class ControlPlane {
  kGrpc,  // gRPC streams and calls only
  kUdp,   // the lighthouse serves the datagram channel too, and learners use it
};
// How a late round's result meets local progress (ApplyOuterResult):
enum class OuterApply {
  kEager,  // as kExact, after a provisional outer step at the boundary with the learner's own
           // pseudo-gradient in place of the average, which the result then replaces exactly
  kExact,  // keep the local progress made since the boundary exactly once
  kMix,    // Streaming DiLoCo: theta_i <- alpha theta_i + (1 - alpha) theta_g'
};
enum class CodecKind { kFp32, kBf16, kInt8, kInt4, kTopK };
enum class HostStaging { kAuto, kAlways };
enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// An enum key's text for `value` ("udp", "int8", "warn"): the key table's.
std::string_view EnumText(std::string_view key, int value);
template <typename E>
std::string_view EnumText(std::string_view key, E value) {
  return EnumText(key, static_cast<int>(value));
}
// `text` as a value of enum key `key`; INVALID_ARGUMENT naming the choices.
[[nodiscard]] StatusOr<int> ParseEnumText(std::string_view key, std::string_view text);

}  // namespace mend
