// Fuzz target: configuration parsing. The input is used three ways:
//   1. as a TOML document: ApplyConfigToml, then CheckConfig;
//   2. line by line as "key = value" overrides: SetConfigValue;
//   3. line by line as "MEND_KEY=value" environment entries: ApplyConfigEnvironment.
// Beyond "no crash, no sanitizer report", it checks the promises of
// mend/config.h: a value SetConfigValue accepted formats back to text it
// accepts again with the same result, and a Config that passes CheckConfig,
// whichever source set its values, survives ConfigToToml -> ApplyConfigToml
// unchanged.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "mend/config.h"

namespace {

std::string_view Trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  return text;
}

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    size_t end = text.find('\n');
    lines.push_back(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return lines;
}

bool SameConfig(const mend::Config& a, const mend::Config& b) {
  for (const mend::ConfigKey& key : mend::ConfigKeys()) {
    if (mend::FormatConfigValue(a, key) != mend::FormatConfigValue(b, key)) return false;
  }
  return true;
}

// A value SetConfigValue accepted must format to text it accepts again, to
// the same value.
void CheckValueRoundTrip(const mend::Config& config, std::string_view name) {
  const mend::ConfigKey* key = mend::FindConfigKey(name);
  MEND_FUZZ_CHECK(key != nullptr);
  std::string formatted = mend::FormatConfigValue(config, *key);
  mend::Config again;
  MEND_FUZZ_CHECK(mend::SetConfigValue(again, name, formatted, "fuzz round trip").ok());
  MEND_FUZZ_CHECK(mend::FormatConfigValue(again, *key) == formatted);
}

// A Config that passes CheckConfig, from whatever source, must come back
// unchanged from ConfigToToml -> ApplyConfigToml (`mend config show`).
void CheckTomlRoundTrip(const mend::Config& config) {
  if (!mend::CheckConfig(config).ok()) return;
  mend::Config reloaded;
  MEND_FUZZ_CHECK(mend::ApplyConfigToml(reloaded, mend::ConfigToToml(config), "round trip").ok());
  MEND_FUZZ_CHECK(SameConfig(config, reloaded));
  MEND_FUZZ_CHECK(mend::CheckConfig(reloaded).ok());
}

void FuzzToml(std::string_view text) {
  mend::Config config;
  if (mend::ApplyConfigToml(config, text, "fuzz.toml").ok()) CheckTomlRoundTrip(config);
}

void FuzzOverrides(std::string_view text) {
  mend::Config config;
  for (std::string_view line : Lines(text)) {
    size_t equals = line.find('=');
    if (equals == std::string_view::npos) continue;
    std::string_view name = Trim(line.substr(0, equals));
    std::string_view value = Trim(line.substr(equals + 1));
    if (mend::SetConfigValue(config, name, value, "fuzz override").ok()) {
      CheckValueRoundTrip(config, name);
    }
  }
  CheckTomlRoundTrip(config);
}

void FuzzEnvironment(std::string_view text) {
  std::vector<std::string> entries;
  for (std::string_view line : Lines(text)) {
    if (line.find('=') == std::string_view::npos) continue;
    entries.emplace_back("MEND_");
    entries.back().append(Trim(line));
  }
  std::vector<const char*> environ;
  for (const std::string& entry : entries) environ.push_back(entry.c_str());
  environ.push_back(nullptr);
  mend::Config config;
  if (mend::ApplyConfigEnvironment(config, environ.data()).ok()) CheckTomlRoundTrip(config);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  FuzzToml(text);
  FuzzOverrides(text);
  FuzzEnvironment(text);
  return 0;
}
