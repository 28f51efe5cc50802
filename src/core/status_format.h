// fmt support for abseil's types, for mend's own sources (not part of the
// installed API): "{}" prints a Status as "CODE: message" and abseil's
// string_view as text.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fmt/format.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(absl::string_view value, Context& context) const {
    return fmt::formatter<std::string_view>::format(std::string_view(value.data(), value.size()),
                                                    context);
  }
};
template <>
struct fmt::formatter<absl::Status> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(const absl::Status& status, Context& context) const {
    return fmt::formatter<std::string_view>::format(status.ToString(), context);
  }
};
