// The subcommands of the `mend` tool. Each Add*Command registers its
// subcommand on `app`; when chosen, its callback stores the process exit code
// in *exit_code.
#pragma once

#include "CLI/CLI.hpp"

namespace mend::cli {

void AddLighthouseCommand(CLI::App& app, int* exit_code);
void AddSimLearnerCommand(CLI::App& app, int* exit_code);
void AddDemoCommand(CLI::App& app, int* exit_code);
void AddFaultDemoCommand(CLI::App& app, int* exit_code);
void AddTrainCommand(CLI::App& app, int* exit_code);
void AddChaosCommand(CLI::App& app, int* exit_code);
void AddCheckpointCommand(CLI::App& app, int* exit_code);
void AddConfigCommand(CLI::App& app, int* exit_code);
void AddStatusCommand(CLI::App& app, int* exit_code);

// Exit codes shared by the commands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadConfig = 2;
inline constexpr int kExitRefused = 3;

}  // namespace mend::cli
