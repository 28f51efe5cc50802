// The C ABI's configuration calls: the key table with its checks.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "capi/capi_common.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

extern char** environ;

using mend::capi::CopyOut;
using mend::capi::Guarded;
using mend::capi::NullArgument;
using mend::capi::Return;

namespace {

// *out = a copy of `text`, or INVALID_ARGUMENT when out is NULL.
mend_status Hand(std::string_view function, char** out, std::string_view text) {
  if (out == nullptr) return NullArgument(function, "out");
  *out = CopyOut(text);
  return MEND_OK;
}

}  // namespace

extern "C" {

mend_status mend_config_new(mend_config** out) {
  return Guarded([&] {
    if (out == nullptr) return NullArgument("mend_config_new", "out");
    *out = new mend_config();
    return MEND_OK;
  });
}

mend_status mend_config_copy(const mend_config* config, mend_config** out) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_copy", "config");
    if (out == nullptr) return NullArgument("mend_config_copy", "out");
    *out = new mend_config(*config);
    return MEND_OK;
  });
}

void mend_config_free(mend_config* config) { delete config; }

mend_status mend_config_set(mend_config* config, const char* key, const char* value,
                            const char* source) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_set", "config");
    if (key == nullptr) return NullArgument("mend_config_set", "key");
    if (value == nullptr) return NullArgument("mend_config_set", "value");
    if (mend::FindConfigKey(key) == nullptr) {
      const std::string suggestion = mend::SuggestConfigKey(key);
      return mend::capi::Fail(mend::NotFoundError(
          fmt::format("unknown configuration key '{}'{}", key,
                      suggestion.empty() ? "" : fmt::format("; did you mean '{}'?", suggestion))));
    }
    return Return(mend::SetConfigValue(config->value, key, value,
                                       source != nullptr ? source : "mend_config_set"));
  });
}

mend_status mend_config_load_file(mend_config* config, const char* path) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_load_file", "config");
    if (path == nullptr) return NullArgument("mend_config_load_file", "path");
    std::ifstream in(path);
    if (!in) {
      return mend::capi::Fail(mend::NotFoundError(
          fmt::format("config file '{}': cannot be read: {}", path, std::strerror(errno))));
    }
    std::ostringstream text;
    text << in.rdbuf();
    return Return(mend::ApplyConfigToml(config->value, text.str(), path));
  });
}

mend_status mend_config_apply_environment(mend_config* config) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_apply_environment", "config");
    return Return(mend::ApplyConfigEnvironment(config->value, environ));
  });
}

mend_status mend_config_check(const mend_config* config) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_check", "config");
    return Return(mend::ValidConfig::Check(config->value).status());
  });
}

mend_status mend_config_get(const mend_config* config, const char* key, char** value) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_get", "config");
    if (key == nullptr) return NullArgument("mend_config_get", "key");
    const mend::ConfigKey* row = mend::FindConfigKey(key);
    if (row == nullptr) {
      return mend::capi::Fail(
          mend::NotFoundError(fmt::format("unknown configuration key '{}'", key)));
    }
    return Hand("mend_config_get", value, mend::FormatConfigValue(config->value, *row));
  });
}

mend_status mend_config_to_toml(const mend_config* config, char** toml) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_to_toml", "config");
    return Hand("mend_config_to_toml", toml, mend::ConfigToToml(config->value));
  });
}

mend_status mend_config_add_job_setting(mend_config* config, const char* key, const char* value) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_add_job_setting", "config");
    if (key == nullptr) return NullArgument("mend_config_add_job_setting", "key");
    if (value == nullptr) return NullArgument("mend_config_add_job_setting", "value");
    const std::string_view name(key);
    const bool word = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
    if (!word || mend::FindConfigKey(name) != nullptr) {
      return mend::capi::Fail(mend::InvalidArgumentError(fmt::format(
          "mend_config_add_job_setting: key '{}' must be letters, digits and '_', and not a "
          "configuration key",
          name)));
    }
    std::string setting = fmt::format("{}={}", name, value);
    constexpr size_t kMaxLength = 500;  // (the lighthouse takes 512)
    if (setting.size() > kMaxLength) {
      return mend::capi::Fail(mend::InvalidArgumentError(
          fmt::format("mend_config_add_job_setting: '{}' and its value are {} characters, above {}",
                      name, setting.size(), kMaxLength)));
    }
    auto same_key = [&](const std::string& other) {
      return other.compare(0, name.size() + 1, setting, 0, name.size() + 1) == 0;
    };
    std::erase_if(config->job_settings, same_key);
    config->job_settings.push_back(std::move(setting));
    return MEND_OK;
  });
}

mend_status mend_config_set_json(mend_config* config, const char* json, const char* source) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_set_json", "config");
    if (json == nullptr) return NullArgument("mend_config_set_json", "json");
    const std::string from = source != nullptr ? source : "mend_config_set_json";
    const nlohmann::ordered_json keys = nlohmann::ordered_json::parse(json, nullptr, false);
    if (keys.is_discarded() || !keys.is_object()) {
      return mend::capi::Fail(mend::InvalidArgumentError(
          fmt::format("{}: the keys must be a JSON object of key -> text", from)));
    }
    mend::Config changed = config->value;  // all or nothing
    for (const auto& [key, value] : keys.items()) {
      if (mend::FindConfigKey(key) == nullptr && !mend::IsRetiredConfigKey(key)) {
        const std::string suggestion = mend::SuggestConfigKey(key);
        return mend::capi::Fail(mend::NotFoundError(fmt::format(
            "{}: unknown configuration key '{}'{}", from, key,
            suggestion.empty() ? "" : fmt::format("; did you mean '{}'?", suggestion))));
      }
      if (!value.is_string()) {
        return mend::capi::Fail(mend::InvalidArgumentError(
            fmt::format("{} {}: the value must be text, not {}", from, key, value.dump())));
      }
      const mend::Status set = mend::SetConfigValue(changed, key, value.get<std::string>(),
                                                    fmt::format("{} {}", from, key));
      if (!set.ok()) return Return(set);
    }
    mend::ImplyFromGivenKeys(changed, [&](std::string_view name) { return keys.contains(name); });
    config->value = std::move(changed);
    return MEND_OK;
  });
}

mend_status mend_config_to_json(const mend_config* config, char** json) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_to_json", "config");
    nlohmann::ordered_json values = nlohmann::ordered_json::object();
    for (const mend::ConfigKey& key : mend::ConfigKeys()) {
      values[std::string(key.name)] = mend::FormatConfigValue(config->value, key);
    }
    return Hand("mend_config_to_json", json, values.dump());
  });
}

mend_status mend_config_keys_json(char** json) {
  return Guarded([&] {
    static const char* const kTypes[] = {"int", "float", "bool", "str", "enum"};
    const mend::Config defaults;
    nlohmann::json keys = nlohmann::json::array();
    for (const mend::ConfigKey& key : mend::ConfigKeys()) {
      nlohmann::json row = {{"name", std::string(key.name)},
                            {"type", kTypes[static_cast<int>(key.type)]},
                            {"default", mend::FormatConfigValue(defaults, key)},
                            {"help", std::string(key.help)}};
      if (key.type == mend::ConfigType::kInt || key.type == mend::ConfigType::kDouble) {
        row["min"] = key.min;
        row["max"] = key.max;
      }
      nlohmann::json choices = nlohmann::json::array();
      for (std::string_view choice : key.choices) choices.push_back(std::string(choice));
      row["choices"] = choices;
      keys.push_back(std::move(row));
    }
    return Hand("mend_config_keys_json", json, keys.dump());
  });
}

mend_status mend_config_suggest_key(const char* unknown, char** suggestion) {
  return Guarded([&] {
    if (unknown == nullptr) return NullArgument("mend_config_suggest_key", "unknown");
    return Hand("mend_config_suggest_key", suggestion, mend::SuggestConfigKey(unknown));
  });
}

mend_status mend_config_read_token(const mend_config* config, char** token) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_config_read_token", "config");
    mend::StatusOr<std::string> read = mend::ReadJobToken(config->value, environ);
    if (!read.ok()) return Return(read.status());
    return Hand("mend_config_read_token", token, *read);
  });
}

}  // extern "C"
