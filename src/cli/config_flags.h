// Command-line flags that set configuration keys, on CLI11. Every command
// takes --config FILE (TOML) and --set KEY=VALUE; Map() adds a named flag for
// a key, whose help shows the key's meaning and default.
// Thread-safety: used from main() only.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "mend/config.h"

namespace mend::cli {

class ConfigFlags {
 public:
  explicit ConfigFlags(CLI::App* app);

  // Adds `flag` (e.g. "--min-learners") as a setter of config key `key`.
  void Map(const std::string& flag, std::string_view key);
  // Keeps the flag of a replaced key (IsRetiredConfigKey), out of the help:
  // Load() refuses it with what to set instead.
  void Retired(const std::string& flag, std::string_view key);
  // defaults < --config file < MEND_* environment < flags, in command-line
  // order: of a key given twice (a named flag and --set KEY=, or --set
  // twice), the later wins, with a warning when their values differ.
  [[nodiscard]] StatusOr<ValidConfig> Load() const;

 private:
  CLI::App* app_;
  std::string file_;
  std::vector<ConfigSources::Override> overrides_;
};

// An output file this process can create or write: its directory exists
// and is writable, and it is no directory (an existing file, /dev/stdout or
// a FIFO must be writable). Checked before a long run (after its work dir
// is made), so that run does not end unable to write its result.
// INVALID_ARGUMENT naming `flag` and the path.
[[nodiscard]] Status CheckWritableFile(const std::string& path, std::string_view flag);

// Reads the job token (MEND_JOB_TOKEN, else token_file) from this process's environment.
[[nodiscard]] StatusOr<std::string> JobToken(const Config& config);

}  // namespace mend::cli
