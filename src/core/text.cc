#include "core/text.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/status_format.h"
#include "fmt/format.h"

namespace mend {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<int64_t> ParseInt64(std::string_view text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

std::optional<double> ParseDouble(std::string_view text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  std::string copy(text);
  char* end = nullptr;
  double value = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<bool> ParseBool(std::string_view text) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  return std::nullopt;
}

bool IsValidUtf8(std::string_view text) {
  // The smallest code point of each sequence length; below it, the form is overlong.
  constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  size_t i = 0;
  while (i < text.size()) {
    auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length = (lead & 0xe0) == 0xc0   ? 2
                    : (lead & 0xf0) == 0xe0 ? 3
                    : (lead & 0xf8) == 0xf0 ? 4
                                            : 0;
    if (length == 0 || text.size() - i < length) return false;
    uint32_t code = lead & (0x7f >> length);
    for (size_t k = 1; k < length; ++k) {
      auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      code = (code << 6) | (next & 0x3f);
    }
    if (code < kSmallest[length] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return false;
    }
    i += length;
  }
  return true;
}

Status CheckHostPort(std::string_view address, std::string_view what) {
  size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return InvalidArgumentError(
        fmt::format("{} = \"{}\": expected HOST:PORT, e.g. 127.0.0.1:29510", what, address));
  }
  std::string_view host = address.substr(0, colon);
  if (host.front() == '[' && host.back() != ']') {
    return InvalidArgumentError(
        fmt::format("{} = \"{}\": unterminated [IPv6] host", what, address));
  }
  for (char c : host) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' ||
              c == '[' || c == ']' || c == '_';
    if (!ok) {
      return InvalidArgumentError(
          fmt::format("{} = \"{}\": host has the character '{}'", what, address, c));
    }
  }
  auto port = ParseInt64(address.substr(colon + 1));
  if (!port || *port < 0 || *port > 65535) {
    return InvalidArgumentError(
        fmt::format("{} = \"{}\": port must be a number in [0, 65535]", what, address));
  }
  return OkStatus();
}

std::pair<std::string, int> SplitHostPort(std::string_view address) {
  size_t colon = address.rfind(':');
  std::string host(address.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return {host, static_cast<int>(*ParseInt64(address.substr(colon + 1)))};
}

std::string JoinHostPort(std::string_view host, int port) {
  return host.find(':') != std::string_view::npos ? fmt::format("[{}]:{}", host, port)
                                                  : fmt::format("{}:{}", host, port);
}

std::string ShowValue(std::string_view value) {
  std::string out;
  for (char c : value.substr(0, 40)) {
    auto byte = static_cast<unsigned char>(c);
    out += std::isprint(byte) ? std::string(1, c) : fmt::format("\\x{:02x}", byte);
  }
  if (value.size() > 40) out += "...";
  return out;
}

Status CheckIdentifier(std::string_view value, std::string_view field, bool allow_empty) {
  if (value.empty()) {
    return allow_empty ? OkStatus()
                       : InvalidArgumentError(fmt::format("{}: must not be empty", field));
  }
  if (value.size() > kMaxIdLength) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is longer than {} characters", field,
                                            ShowValue(value), kMaxIdLength));
  }
  for (char c : value) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
              c == ':' || c == '@' || c == '+';
    if (!ok) {
      return InvalidArgumentError(fmt::format(
          "{}: \"{}\" has a character outside [A-Za-z0-9._:@+-]", field, ShowValue(value)));
    }
  }
  return OkStatus();
}

std::string FormatDouble(double value) {
  std::string text = fmt::format("{}", value);
  return text;
}

}  // namespace mend
