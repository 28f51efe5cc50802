// mend: fault-tolerant, communication-efficient data-parallel training.
#include "CLI/CLI.hpp"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"mend: fault-tolerant, communication-efficient data-parallel training", "mend"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "mend 0.1.0");
  int exit_code = mend::cli::kExitOk;
  mend::cli::AddLighthouseCommand(app, &exit_code);
  mend::cli::AddSimLearnerCommand(app, &exit_code);
  mend::cli::AddDemoCommand(app, &exit_code);
  mend::cli::AddFaultDemoCommand(app, &exit_code);
  mend::cli::AddTrainCommand(app, &exit_code);
  mend::cli::AddChaosCommand(app, &exit_code);
  mend::cli::AddCheckpointCommand(app, &exit_code);
  mend::cli::AddConfigCommand(app, &exit_code);
  mend::cli::AddStatusCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  return exit_code;
}
