// The fields of the JSON that learners write (progress lines, diagnostics,
// result files), read without trusting it: a field that is absent or of
// another type never throws. JSON has no NaN or Inf (a non-finite number is
// written as null), so a floating-point field that is there but holds no
// number reads as NaN: a failed value, not a missing one.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "nlohmann/json.hpp"

namespace mend::cli {

// object[key] as a T (a floating-point or integer type, bool or
// std::string); `absent` when object has no such key, or (but for
// floating-point types) when it holds another type or an integer out of T's range.
template <typename T>
T Field(const nlohmann::json& object, std::string_view key, T absent) {
  if (!object.is_object()) return absent;
  const auto it = object.find(key);
  if (it == object.end()) return absent;
  if constexpr (std::is_same_v<T, bool>) {
    return it->is_boolean() ? it->template get<bool>() : absent;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return it->is_string() ? it->template get<std::string>() : absent;
  } else if constexpr (std::is_floating_point_v<T>) {
    return it->is_number() ? it->template get<T>() : std::numeric_limits<T>::quiet_NaN();
  } else {
    static_assert(std::is_integral_v<T>);
    if (it->is_number_unsigned()) {
      const uint64_t value = it->template get<uint64_t>();
      return value <= static_cast<uint64_t>(std::numeric_limits<T>::max()) ? static_cast<T>(value)
                                                                           : absent;
    }
    if (it->is_number_integer()) {
      const int64_t value = it->template get<int64_t>();
      if (std::is_unsigned_v<T> && value < 0) return absent;
      return static_cast<T>(value);
    }
    return absent;
  }
}

// The objects of a JSON-lines file, in order: a line that is not one (the
// last, still being written; a torn one) is passed over. None when the file
// cannot be read.
inline std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) lines.push_back(std::move(parsed));
  }
  return lines;
}

}  // namespace mend::cli
