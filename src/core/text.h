// Small text helpers shared by the core: edit distance, number parsing,
// HOST:PORT checks. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "mend/status.h"

namespace mend {

// Levenshtein distance between a and b (insert, delete, substitute cost 1).
size_t EditDistance(std::string_view a, std::string_view b);

// Whole-string parses; std::nullopt when `text` is not exactly one number.
std::optional<int64_t> ParseInt64(std::string_view text);
std::optional<double> ParseDouble(std::string_view text);  // finite values only
std::optional<bool> ParseBool(std::string_view text);      // true/false/1/0/yes/no/on/off

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or
// code points above U+10FFFF), as TOML and protobuf strings require.
bool IsValidUtf8(std::string_view text);

// Checks "HOST:PORT" ("[v6]:PORT" too) with PORT in [0, 65535]; `what` names
// the value in the error.
[[nodiscard]] Status CheckHostPort(std::string_view address, std::string_view what);

// Splits "HOST:PORT"; requires CheckHostPort to pass.
std::pair<std::string, int> SplitHostPort(std::string_view address);
// SplitHostPort's inverse: "HOST:PORT", an IPv6 host in brackets.
std::string JoinHostPort(std::string_view host, int port);

inline constexpr size_t kMaxIdLength = 128;

// Learner ids, job ids and racks: 1..128 of [A-Za-z0-9._:@+-] (empty too
// when `allow_empty`). INVALID_ARGUMENT names `field` and the value.
[[nodiscard]] Status CheckIdentifier(std::string_view value, std::string_view field,
                                     bool allow_empty);

// At most 40 characters of `value`, non-printable bytes escaped, for messages.
std::string ShowValue(std::string_view value);

// Formats a double so that ParseDouble gives back the same value.
std::string FormatDouble(double value);

}  // namespace mend
