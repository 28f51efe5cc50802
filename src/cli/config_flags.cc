#include "cli/config_flags.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>

#include "core/status_format.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace mend::cli {

ConfigFlags::ConfigFlags(CLI::App* app) : app_(app) {
  app_->add_option("--config", file_, "TOML configuration file (keys: 'mend config keys')")
      ->check(CLI::ExistingFile);
  app_->add_option_function<std::vector<std::string>>(
          "--set",
          [this](const std::vector<std::string>& items) {
            for (const std::string& item : items) overrides_.push_back(SetFlagOverride(item));
          },
          "Set any configuration key: --set KEY=VALUE (repeatable)")
      ->trigger_on_parse();  // each as it comes: command-line order
}

void ConfigFlags::Map(const std::string& flag, std::string_view key) {
  const ConfigKey* entry = FindConfigKey(key);
  std::string default_text = entry ? FormatConfigValue(Config{}, *entry) : "";
  std::string help = fmt::format("{} [{}; default: {}]", entry ? entry->help : "", key,
                                 default_text.empty() ? "\"\"" : default_text);
  app_->add_option_function<std::string>(
          flag,
          [this, flag, key = std::string(key)](const std::string& value) {
            overrides_.push_back({key, value, fmt::format("flag {}", flag)});
          },
          help)
      ->trigger_on_parse();
}

void ConfigFlags::Retired(const std::string& flag, std::string_view key) {
  app_->add_option_function<std::string>(
          flag,
          [this, flag, key = std::string(key)](const std::string& value) {
            overrides_.push_back({key, value, fmt::format("flag {}", flag)});
          })
      ->trigger_on_parse()
      ->group("");  // hidden
}

StatusOr<ValidConfig> ConfigFlags::Load() const {
  // A key given twice with different values: the later wins, said aloud (a
  // named flag and a --set of its key, as a launcher's flags and a user's
  // --set after them).
  std::map<std::string_view, const ConfigSources::Override*> last;
  for (const ConfigSources::Override& set : overrides_) {
    const ConfigSources::Override*& earlier = last[set.key];
    if (earlier != nullptr && earlier->text != set.text) {
      spdlog::warn("{} = \"{}\" ({}) overrides \"{}\" ({}) given before it on the command line",
                   set.key, set.text, set.source, earlier->text, earlier->source);
    }
    earlier = &set;
  }
  ConfigSources sources;
  sources.file = file_;
  sources.environ = environ;
  sources.overrides = overrides_;
  return LoadConfig(sources);
}

StatusOr<std::string> JobToken(const Config& config) { return ReadJobToken(config, environ); }

Status CheckWritableFile(const std::string& path, std::string_view flag) {
  namespace fs = std::filesystem;
  auto refuse = [&](const std::string& why) {
    return InvalidArgumentError(fmt::format("{} {}: {}", flag, path, why));
  };
  std::error_code error;
  const fs::path file(path);
  const fs::file_status status = fs::status(file, error);
  if (fs::exists(status)) {
    if (fs::is_directory(status)) return refuse("is a directory");
    if (::access(path.c_str(), W_OK) != 0) return refuse(std::strerror(errno));
    return OkStatus();
  }
  if (error && error != std::errc::no_such_file_or_directory) return refuse(error.message());
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  if (!fs::is_directory(dir, error)) {
    return refuse(error && error != std::errc::no_such_file_or_directory
                      ? error.message()
                      : fmt::format("no directory {} to write it in", dir.string()));
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return refuse(
        fmt::format("cannot create a file in {}: {}", dir.string(), std::strerror(errno)));
  }
  return OkStatus();
}

}  // namespace mend::cli
