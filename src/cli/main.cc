// mend: fault-tolerant, communication-efficient data-parallel training.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "c10/util/Exception.h"
#include "cli/commands.h"
#include "core/status_format.h"
#include "fmt/format.h"

namespace {

// `mend lighthouse` is the executable mend-lighthouse beside this one, which
// does not load LibTorch. Returns only when it cannot be run.
int ExecLighthouse(char** argv) {
  std::error_code error;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  std::string path =
      (error ? std::filesystem::path(argv[0]) : self).parent_path() / "mend-lighthouse";
  argv[0] = path.data();
  execv(path.c_str(), argv);
  fmt::print(stderr,
             "mend lighthouse: cannot run {}: {}; the lighthouse is the executable "
             "mend-lighthouse, built and installed beside mend\n",
             path, std::strerror(errno));
  return mend::cli::kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "lighthouse") == 0) return ExecLighthouse(argv);
  CLI::App app{"mend: fault-tolerant, communication-efficient data-parallel training", "mend"};
  app.require_subcommand(1);
  app.set_version_flag("--version", MEND_VERSION_TEXT);
  int exit_code = mend::cli::kExitOk;
  // Listed for --help; main() has run mend-lighthouse before parsing.
  app.add_subcommand("lighthouse", mend::cli::kLighthouseDescription)->allow_extras();
  mend::cli::AddSimLearnerCommand(app, &exit_code);
  mend::cli::AddDemoCommand(app, &exit_code);
  mend::cli::AddFaultDemoCommand(app, &exit_code);
  mend::cli::AddTrainCommand(app, &exit_code);
  mend::cli::AddChaosCommand(app, &exit_code);
  mend::cli::AddCheckpointCommand(app, &exit_code);
  mend::cli::AddConfigCommand(app, &exit_code);
  mend::cli::AddStatusCommand(app, &exit_code);
  // LibTorch's errors without their backtrace.
  return mend::cli::RunCommandLine(
      app, argc, argv, exit_code, [](const std::exception& error) -> std::optional<std::string> {
        if (const auto* torch = dynamic_cast<const c10::Error*>(&error))
          return torch->what_without_backtrace();
        return std::nullopt;
      });
}
