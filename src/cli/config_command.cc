// mend config keys | show, and mend status.
#include <cstdio>

#include "cli/commands.h"
#include "cli/config_flags.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "mend/lighthouse_client.h"

namespace mend::cli {

void AddConfigCommand(CLI::App& app, int* exit_code) {
  CLI::App* command = app.add_subcommand("config", "Inspect configuration keys and values");
  command->require_subcommand(1);
  CLI::App* keys = command->add_subcommand("keys", "List every configuration key");
  auto markdown = std::make_shared<bool>(false);
  keys->add_flag("--markdown", *markdown, "As a Markdown table (the README's)");
  keys->callback([markdown]() {
    if (*markdown) {
      fmt::print("{}", ConfigMarkdownTable());
      return;
    }
    Config defaults;
    for (const ConfigKey& key : ConfigKeys()) {
      fmt::print("{:<34} {:<14} {}\n", key.name, FormatConfigValue(defaults, key), key.help);
    }
  });
  CLI::App* show = command->add_subcommand(
      "show", "Print the effective configuration (file < MEND_* environment < flags) as TOML");
  auto flags = std::make_shared<ConfigFlags>(show);
  show->callback([flags, exit_code]() {
    auto config = flags->Load();
    if (!config.ok()) {
      fmt::print(stderr, "mend config show: {}\n", config.status().message());
      *exit_code = kExitBadConfig;
      return;
    }
    fmt::print("{}", ConfigToToml(*config));
  });
}

void AddStatusCommand(CLI::App& app, int* exit_code) {
  CLI::App* command =
      app.add_subcommand("status", "Print a lighthouse's status document (JSON) and exit");
  auto flags = std::make_shared<ConfigFlags>(command);
  flags->Map("--lighthouse", "lighthouse");
  flags->Map("--token-file", "token_file");
  flags->Map("--tls-ca-file", "tls_ca_file");
  command->callback([flags, exit_code]() {
    auto config = flags->Load();
    auto token = config.ok() ? JobToken(*config) : StatusOr<std::string>(config.status());
    if (!token.ok()) {
      fmt::print(stderr, "mend status: {}\n", token.status().message());
      *exit_code = kExitBadConfig;
      return;
    }
    LighthouseClientOptions options{(*config)->lighthouse, *token, (*config)->tls_ca_file,
                                    (*config)->rpc_timeout_ms * kMicrosPerMilli};
    auto client = LighthouseClient::Connect(options);
    auto json = client.ok() ? (*client)->StatusJson() : StatusOr<std::string>(client.status());
    if (!json.ok()) {
      fmt::print(stderr, "mend status: {}\n", json.status().message());
      *exit_code = ExitCodeOf(json.status());
      return;
    }
    fmt::print("{}\n", *json);
  });
}

}  // namespace mend::cli
