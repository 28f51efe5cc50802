// mend-lighthouse: the coordinator as an executable of its own, without
// LibTorch (the `mend` tool links it for training; a lighthouse coordinating
// 10,000 learners needs none of it: about 150 MiB and 1 s of start-up less).
// `mend lighthouse ARGS` runs this with the same arguments; `mend-lighthouse
// ARGS` works as well.
#include <cstring>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"mend lighthouse: the coordinator of a mend job", "mend"};
  app.require_subcommand(1);
  int exit_code = mend::cli::kExitOk;
  mend::cli::AddLighthouseCommand(app, &exit_code);
  // On the command, where `mend-lighthouse --version` and `mend lighthouse
  // --version` both arrive.
  app.get_subcommand("lighthouse")->set_version_flag("--version", MEND_VERSION_TEXT);
  // Both `mend-lighthouse lighthouse ARGS` (as `mend lighthouse` runs it) and
  // `mend-lighthouse ARGS`.
  std::vector<char*> args(argv, argv + argc);
  static char kCommand[] = "lighthouse";
  if (argc < 2 || std::strcmp(argv[1], kCommand) != 0) args.insert(args.begin() + 1, kCommand);
  return mend::cli::RunCommandLine(app, static_cast<int>(args.size()), args.data(), exit_code);
}
