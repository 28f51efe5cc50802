#include "mend/config.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "core/job_token.h"
#include "core/status_format.h"
#include "core/text.h"
#include "fmt/format.h"
#include "mend/outer.h"
#include "toml++/toml.h"

namespace mend {
namespace {

constexpr std::string_view kEnvPrefix = "MEND_";
constexpr std::string_view kTokenEnv = kJobTokenVariable;
constexpr size_t kMaxStringValue = 4096;
constexpr size_t kMinTokenLength = 8;

std::string TypeName(ConfigType type) {
  switch (type) {
    case ConfigType::kInt:
      return "an integer";
    case ConfigType::kDouble:
      return "a number";
    case ConfigType::kBool:
      return "true or false";
    case ConfigType::kString:
      return "a string";
    case ConfigType::kEnum:
      return "one of the listed words";
  }
  return "a value";
}

std::string RangeText(const ConfigKey& key) {
  switch (key.type) {
    case ConfigType::kInt:
      return fmt::format("[{}, {}]", static_cast<int64_t>(key.min), static_cast<int64_t>(key.max));
    case ConfigType::kDouble:
      return fmt::format("[{}, {}]", FormatDouble(key.min), FormatDouble(key.max));
    case ConfigType::kBool:
      return "true | false";
    case ConfigType::kEnum:
      return fmt::format("{}", fmt::join(key.choices, " | "));
    case ConfigType::kString:
      return "text";
  }
  return "";
}

Status ValueError(const ConfigKey& key, std::string_view text, std::string_view source,
                  std::string_view why) {
  return InvalidArgumentError(
      fmt::format("{} = \"{}\" (from {}): {}", key.name, text, source, why));
}

// Keys that were replaced: refused with what to set instead.
struct RetiredKey {
  std::string_view name;
  std::string_view instead;
};
constexpr RetiredKey kRetiredKeys[] = {
    {"udp_control",
     "control_plane: \"udp\" (the lighthouse serves datagrams, learners use them) or \"grpc\""},
    {"control_transport",
     "control_plane: \"udp\" or \"grpc\", set alike on the lighthouse and the learners"},
};

Status UnknownKeyError(std::string_view name, std::string_view source) {
  for (const RetiredKey& retired : kRetiredKeys) {
    if (retired.name == name) {
      return InvalidArgumentError(fmt::format("configuration key '{}' (from {}) was replaced by {}",
                                              name, source, retired.instead));
    }
  }
  std::string suggestion = SuggestConfigKey(name);
  std::string hint = suggestion.empty() ? "run 'mend config keys' for the list"
                                        : fmt::format("did you mean '{}'?", suggestion);
  return InvalidArgumentError(
      fmt::format("unknown configuration key '{}' (from {}); {}", name, source, hint));
}

std::string ReadWholeFile(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  *ok = static_cast<bool>(in);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

bool IsRetiredConfigKey(std::string_view name) {
  for (const RetiredKey& retired : kRetiredKeys) {
    if (retired.name == name) return true;
  }
  return false;
}

const ConfigKey* FindConfigKey(std::string_view name) {
  for (const ConfigKey& key : ConfigKeys()) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

std::string SuggestConfigKey(std::string_view unknown) {
  const ConfigKey* best = nullptr;
  size_t best_distance = std::max<size_t>(3, unknown.size() / 3) + 1;
  for (const ConfigKey& key : ConfigKeys()) {
    size_t distance = EditDistance(unknown, key.name);
    bool is_prefix = unknown.size() >= 4 && key.name.substr(0, unknown.size()) == unknown;
    if (is_prefix) distance = std::min<size_t>(distance, 1);
    if (distance < best_distance) {
      best_distance = distance;
      best = &key;
    }
  }
  return best ? std::string(best->name) : std::string();
}

// SetConfigValue of an integer key.
static Status SetIntValue(Config& config, const ConfigKey& key, std::string_view text,
                          std::string_view source) {
  auto value = ParseInt64(text);
  if (!value) {
    // An integer too large for 64 bits is out of range, not "not an integer".
    std::string_view digits = text.starts_with('-') ? text.substr(1) : text;
    const bool integer = !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
      return c >= '0' && c <= '9';
    });
    return ValueError(key, text, source,
                      integer ? "must be in " + RangeText(key) : "expected an integer");
  }
  if (*value < key.min || *value > key.max) {
    return ValueError(key, text, source, "must be in " + RangeText(key));
  }
  config.*std::get<int64_t Config::*>(key.field) = *value;
  return OkStatus();
}

Status SetConfigValue(Config& config, std::string_view name, std::string_view text,
                      std::string_view source) {
  const ConfigKey* key = FindConfigKey(name);
  if (key == nullptr) return UnknownKeyError(name, source);
  switch (key->type) {
    case ConfigType::kInt:
      return SetIntValue(config, *key, text, source);
    case ConfigType::kDouble: {
      auto value = ParseDouble(text);
      if (!value) return ValueError(*key, text, source, "expected a finite number");
      if (*value < key->min || *value > key->max) {
        return ValueError(*key, text, source, "must be in " + RangeText(*key));
      }
      config.*std::get<double Config::*>(key->field) = *value;
      return OkStatus();
    }
    case ConfigType::kBool: {
      auto value = ParseBool(text);
      if (!value) return ValueError(*key, text, source, "expected true or false");
      config.*std::get<bool Config::*>(key->field) = *value;
      return OkStatus();
    }
    case ConfigType::kEnum: {
      for (size_t i = 0; i < key->choices.size(); ++i) {
        if (key->choices[i] == text) {
          std::get<ConfigKey::EnumField>(key->field).set(config, static_cast<int>(i));
          return OkStatus();
        }
      }
      return ValueError(*key, text, source, "must be one of " + RangeText(*key));
    }
    case ConfigType::kString: {
      if (text.size() > kMaxStringValue) {
        return ValueError(*key, text.substr(0, 32), source,
                          fmt::format("longer than {} characters", kMaxStringValue));
      }
      if (text.find('\0') != std::string_view::npos) {
        return ValueError(*key, "...", source, "contains a NUL character");
      }
      if (!IsValidUtf8(text)) return ValueError(*key, "...", source, "is not valid UTF-8");
      config.*std::get<std::string Config::*>(key->field) = std::string(text);
      return OkStatus();
    }
  }
  return InternalError("unhandled configuration type");
}

std::string FormatConfigValue(const Config& config, const ConfigKey& key) {
  switch (key.type) {
    case ConfigType::kInt:
      return std::to_string(config.*std::get<int64_t Config::*>(key.field));
    case ConfigType::kDouble:
      return FormatDouble(config.*std::get<double Config::*>(key.field));
    case ConfigType::kBool:
      return config.*std::get<bool Config::*>(key.field) ? "true" : "false";
    case ConfigType::kEnum:
      return std::string(key.choices.at(
          static_cast<size_t>(std::get<ConfigKey::EnumField>(key.field).get(config))));
    case ConfigType::kString:
      return config.*std::get<std::string Config::*>(key.field);
  }
  return "";
}

std::vector<std::string> SharedSettings(const Config& config) {
  std::vector<std::string_view> keys = {"checkpoint_authenticate",
                                        "dataplane_encrypt",
                                        "exchange_frozen_parameters",
                                        "final_merge",
                                        "fragments",
                                        "outer_lr",
                                        "outer_momentum",
                                        "outer_warmup_steps",
                                        "rack_aware",
                                        "sync_buffers",
                                        "sync_period_steps",
                                        "token_weighted_merge",
                                        "total_steps",
                                        "codec",
                                        "desloc"};
  switch (config.codec) {
    case CodecKind::kInt8:
    case CodecKind::kInt4:
      keys.push_back("codec_block_size");
      break;
    case CodecKind::kTopK:
      keys.push_back("topk_chunk_size");
      keys.push_back("topk_k");
      break;
    default:
      break;
  }
  if (config.desloc) {
    keys.push_back("momentum_sync_period_steps");
    keys.push_back("second_moment_sync_period_steps");
  }
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> settings;
  for (std::string_view name : keys) {
    const ConfigKey* key = FindConfigKey(name);
    if (key == nullptr) continue;  // (ConfigTest counts them: a name that is no key fails it)
    settings.push_back(fmt::format("{}={}", name, FormatConfigValue(config, *key)));
  }
  return settings;
}

std::string_view EnumText(std::string_view key, int value) {
  const ConfigKey* row = FindConfigKey(key);
  if (row == nullptr || row->type != ConfigType::kEnum || value < 0 ||
      static_cast<size_t>(value) >= row->choices.size()) {
    return "?";
  }
  return row->choices[static_cast<size_t>(value)];
}

StatusOr<int> ParseEnumText(std::string_view key, std::string_view text) {
  const ConfigKey* row = FindConfigKey(key);
  if (row == nullptr || row->type != ConfigType::kEnum) {
    return InternalError(fmt::format("'{}' is not an enum key", key));
  }
  for (size_t i = 0; i < row->choices.size(); ++i) {
    if (row->choices[i] == text) return static_cast<int>(i);
  }
  return InvalidArgumentError(
      fmt::format("{} = \"{}\": must be one of {}", key, text, fmt::join(row->choices, " | ")));
}

// DES-LOC's moments travel with a round of the one fragment.
Status CheckDesloc(const Config& config) {
  if (!config.desloc) return OkStatus();
  if (config.fragments != 1) {
    return InvalidArgumentError(fmt::format(
        "desloc = true with fragments = {}: DES-LOC runs with one fragment", config.fragments));
  }
  const int64_t h = config.sync_period_steps;
  const std::pair<const char*, int64_t> periods[] = {
      {"momentum_sync_period_steps", config.momentum_sync_period_steps},
      {"second_moment_sync_period_steps", config.second_moment_sync_period_steps}};
  for (const auto& [key, period] : periods) {
    if (period > 0 && period % h != 0) {
      return InvalidArgumentError(fmt::format(
          "{} = {}: must be a multiple of sync_period_steps = {} (moments travel with a round)",
          key, period, h));
    }
  }
  return OkStatus();
}

// CheckConfig's names and addresses.
static Status CheckNames(const Config& config) {
  // The lighthouse refuses other characters in these; say so at load time.
  MEND_RETURN_IF_ERROR(CheckIdentifier(config.job_id, "job_id", /*allow_empty=*/false));
  MEND_RETURN_IF_ERROR(CheckIdentifier(config.rack, "rack", /*allow_empty=*/true));
  MEND_RETURN_IF_ERROR(CheckHostPort(config.lighthouse, "lighthouse"));
  MEND_RETURN_IF_ERROR(CheckHostPort(config.bind, "bind"));
  if (!config.http.empty()) MEND_RETURN_IF_ERROR(CheckHostPort(config.http, "http"));
  if (!config.group_store.empty())
    MEND_RETURN_IF_ERROR(CheckHostPort(config.group_store, "group_store"));
  return OkStatus();
}

// CheckConfig's rules for a learner of several ranks.
static Status CheckGroup(const Config& config) {
  if (config.group_rank >= config.group_size) {
    return InvalidArgumentError(fmt::format("group_rank = {}: must be below group_size = {}",
                                            config.group_rank, config.group_size));
  }
  if (config.group_size > 1 && config.train_through_lighthouse_outage &&
      config.group_store.empty()) {
    // Refused rather than done wrong: without group_store the other ranks read
    // each round decision from the lighthouse's store, which a restart
    // empties (docs/architecture.md).
    return InvalidArgumentError(
        fmt::format("train_through_lighthouse_outage = true with group_size = {} needs "
                    "group_store: without it the group's "
                    "ranks learn the rounds from the lighthouse's store, which a restart empties",
                    config.group_size));
  }
  return OkStatus();
}

Status CheckConfig(const Config& config) {
  // Every value once more through the per-key checks (a Config may be built in code).
  for (const ConfigKey& key : ConfigKeys()) {
    Config scratch;
    MEND_RETURN_IF_ERROR(
        SetConfigValue(scratch, key.name, FormatConfigValue(config, key), "the configuration"));
  }
  MEND_RETURN_IF_ERROR(CheckNames(config));
  if (config.heartbeat_timeout_ms < 2 * config.heartbeat_ms) {
    return InvalidArgumentError(
        fmt::format("heartbeat_timeout_ms = {}: must be at least 2 x heartbeat_ms = {}",
                    config.heartbeat_timeout_ms, 2 * config.heartbeat_ms));
  }
  if (config.grace_window_min_ms > config.grace_window_ms) {
    return InvalidArgumentError(
        fmt::format("grace_window_min_ms = {}: must not exceed grace_window_ms = {}",
                    config.grace_window_min_ms, config.grace_window_ms));
  }
  if (config.tls_cert_file.empty() != config.tls_key_file.empty()) {
    return InvalidArgumentError(
        "tls_cert_file and tls_key_file: set both to serve TLS, or neither");
  }
  if (config.topk_k > config.topk_chunk_size) {
    return InvalidArgumentError(fmt::format("topk_k = {}: must not exceed topk_chunk_size = {}",
                                            config.topk_k, config.topk_chunk_size));
  }
  MEND_RETURN_IF_ERROR(CheckGroup(config));
  MEND_RETURN_IF_ERROR(FragmentSchedule::Make(config.fragments, config.sync_period_steps).status());
  MEND_RETURN_IF_ERROR(CheckDesloc(config));
  if (config.rounds_in_flight > config.fragments) {
    return InvalidArgumentError(
        fmt::format("rounds_in_flight = {}: must be at most fragments = {} (one round per "
                    "fragment in flight; 0: as many as fragments)",
                    config.rounds_in_flight, config.fragments));
  }
  if (config.overlap_steps >= config.sync_period_steps && config.concurrent_outer_step) {
    return InvalidArgumentError(fmt::format(
        "overlap_steps = {}: must be below sync_period_steps = {} with concurrent_outer_step",
        config.overlap_steps, config.sync_period_steps));
  }
  return OkStatus();
}

void ImplyFromGivenKeys(Config& config, const std::function<bool(std::string_view)>& given) {
  if ((given("momentum_sync_period_steps") || given("second_moment_sync_period_steps")) &&
      !given("desloc")) {
    config.desloc = true;
  }
}

Status ApplyConfigToml(Config& config, std::string_view toml_text, std::string_view source_name) {
  toml::table table;
  try {
    table = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& error) {
    return InvalidArgumentError(fmt::format("{}:{}:{}: {}", source_name, error.source().begin.line,
                                            error.source().begin.column, error.description()));
  }
  for (auto&& [name, node] : table) {
    std::string source = fmt::format("{}:{}", source_name, node.source().begin.line);
    const ConfigKey* key = FindConfigKey(name.str());
    if (key == nullptr) return UnknownKeyError(name.str(), source);
    std::string text;
    bool type_ok = false;
    if (auto v = node.as_integer()) {
      text = std::to_string(v->get());
      type_ok = key->type == ConfigType::kInt || key->type == ConfigType::kDouble;
    } else if (auto d = node.as_floating_point()) {
      text = FormatDouble(d->get());
      // (As the file wrote it: 5.0 for an integer key is a float, not "5".)
      if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
      type_ok = key->type == ConfigType::kDouble;
    } else if (auto b = node.as_boolean()) {
      text = b->get() ? "true" : "false";
      type_ok = key->type == ConfigType::kBool;
    } else if (auto s = node.as_string()) {
      text = s->get();
      type_ok = key->type == ConfigType::kString || key->type == ConfigType::kEnum;
    } else {
      text = "<table or array>";
    }
    if (!type_ok) return ValueError(*key, text, source, "expected " + TypeName(key->type));
    MEND_RETURN_IF_ERROR(SetConfigValue(config, name.str(), text, source));
  }
  ImplyFromGivenKeys(config, [&](std::string_view name) { return table.contains(name); });
  return OkStatus();
}

Status ApplyConfigEnvironment(Config& config, const char* const* environ) {
  if (environ == nullptr) return OkStatus();
  std::set<std::string, std::less<>> given;
  for (const char* const* entry = environ; *entry != nullptr; ++entry) {
    std::string_view line(*entry);
    if (line.substr(0, kEnvPrefix.size()) != kEnvPrefix) continue;
    size_t equals = line.find('=');
    if (equals == std::string_view::npos) continue;
    std::string_view variable = line.substr(0, equals);
    // The token, and the front ends' own variables (the Python package's
    // learner id and library path), are not configuration keys.
    if (variable == kTokenEnv || variable == "MEND_LEARNER_ID" || variable == "MEND_LIBRARY")
      continue;
    std::string name(variable.substr(kEnvPrefix.size()));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string source = fmt::format("environment {}", variable);
    if (FindConfigKey(name) == nullptr && !IsRetiredConfigKey(name)) {
      std::string suggestion = SuggestConfigKey(name);
      for (char& c : suggestion) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      return InvalidArgumentError(fmt::format(
          "unknown environment variable {}{}", variable,
          suggestion.empty() ? "" : fmt::format("; did you mean MEND_{}?", suggestion)));
    }
    MEND_RETURN_IF_ERROR(SetConfigValue(config, name, line.substr(equals + 1), source));
    given.insert(std::move(name));
  }
  ImplyFromGivenKeys(config, [&](std::string_view name) { return given.count(name) > 0; });
  return OkStatus();
}

ConfigSources::Override SetFlagOverride(const std::string& item) {
  const size_t equals = item.find('=');
  return {item.substr(0, equals), equals == std::string::npos ? "" : item.substr(equals + 1),
          fmt::format("flag --set {}", item)};
}

StatusOr<ValidConfig> ValidConfig::Check(Config config) {
  MEND_RETURN_IF_ERROR(CheckConfig(config));
  return ValidConfig(std::move(config));
}

StatusOr<ValidConfig> LoadConfig(const ConfigSources& sources) {
  Config config;
  if (!sources.file.empty()) {
    bool ok = false;
    std::string text = ReadWholeFile(sources.file, &ok);
    if (!ok) {
      return NotFoundError(
          fmt::format("config file '{}': cannot be read: {}", sources.file, std::strerror(errno)));
    }
    MEND_RETURN_IF_ERROR(ApplyConfigToml(config, text, sources.file));
  }
  MEND_RETURN_IF_ERROR(ApplyConfigEnvironment(config, sources.environ));
  for (const auto& item : sources.overrides) {
    MEND_RETURN_IF_ERROR(SetConfigValue(config, item.key, item.text, item.source));
  }
  ImplyFromGivenKeys(config, [&](std::string_view name) {
    return std::any_of(sources.overrides.begin(), sources.overrides.end(),
                       [&](const ConfigSources::Override& item) { return item.key == name; });
  });
  return ValidConfig::Check(std::move(config));
}

std::string ConfigToToml(const Config& config) {
  std::string out;
  for (const ConfigKey& key : ConfigKeys()) {
    std::string value = FormatConfigValue(config, key);
    bool quoted = key.type == ConfigType::kString || key.type == ConfigType::kEnum;
    if (quoted) {
      std::ostringstream quoted_text;
      quoted_text << toml::value<std::string>(value);
      value = quoted_text.str();
    } else if (key.type == ConfigType::kDouble && value.find_first_of(".e") == std::string::npos) {
      value += ".0";
    }
    out += fmt::format("{} = {}\n", key.name, value);
  }
  return out;
}

namespace {

// A markdown table's cell: a '|' in it (true | false) would end the cell.
std::string TableCell(std::string_view text) {
  std::string cell;
  for (char c : text) {
    if (c == '|') cell += '\\';
    cell += c;
  }
  return cell;
}

}  // namespace

std::string ConfigMarkdownTable() {
  Config defaults;
  std::string out = "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
  for (const ConfigKey& key : ConfigKeys()) {
    std::string value = FormatConfigValue(defaults, key);
    if (value.empty()) value = "\"\"";
    std::string type;
    switch (key.type) {
      case ConfigType::kInt:
        type = "int";
        break;
      case ConfigType::kDouble:
        type = "float";
        break;
      case ConfigType::kBool:
        type = "bool";
        break;
      case ConfigType::kString:
        type = "string";
        break;
      case ConfigType::kEnum:
        type = "enum";
        break;
    }
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", key.name, type, value,
                       TableCell(RangeText(key)), TableCell(key.help));
  }
  return out;
}

StatusOr<std::string> ReadJobToken(const Config& config, const char* const* environ) {
  std::string token;
  std::string origin;
  for (const char* const* entry = environ; environ != nullptr && *entry != nullptr; ++entry) {
    std::string_view line(*entry);
    if (line.substr(0, kTokenEnv.size() + 1) == fmt::format("{}=", kTokenEnv)) {
      token = std::string(line.substr(kTokenEnv.size() + 1));
      origin = std::string(kTokenEnv);
    }
  }
  if (origin.empty()) {
    if (config.token_file.empty()) {
      return FailedPreconditionError(
          "no job token: set MEND_JOB_TOKEN or point token_file (--token-file) at a file "
          "holding it");
    }
    bool ok = false;
    token = ReadWholeFile(config.token_file, &ok);
    if (!ok) {
      return NotFoundError(fmt::format("token_file = \"{}\": cannot be read: {}", config.token_file,
                                       std::strerror(errno)));
    }
    origin = fmt::format("token_file \"{}\"", config.token_file);
  }
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  MEND_RETURN_IF_ERROR(CheckJobToken(token, origin));
  return token;
}

Status CheckJobToken(std::string_view token, std::string_view origin) {
  if (token.size() < kMinTokenLength) {
    return InvalidArgumentError(fmt::format("job token from {}: {} characters, need at least {}",
                                            origin, token.size(), kMinTokenLength));
  }
  if (token.size() > 4096) {
    return InvalidArgumentError(
        fmt::format("job token from {}: longer than 4096 characters", origin));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return InvalidArgumentError(
          fmt::format("job token from {}: only printable ASCII without spaces is allowed", origin));
    }
  }
  return OkStatus();
}

}  // namespace mend
