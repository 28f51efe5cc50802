// The subcommands of the `mend` tool. Each Add*Command registers its
// subcommand on `app`; when chosen, its callback stores the process exit code
// in *exit_code.
#pragma once

#include "CLI/CLI.hpp"

namespace mend::cli {

// In the executable mend-lighthouse, which `mend lighthouse` runs.
void AddLighthouseCommand(CLI::App& app, int* exit_code);
inline constexpr char kLighthouseDescription[] =
    "Run the coordinator: membership, heartbeats, quorum rounds, fail-slow detection, "
    "rendezvous store, status page and /metrics. Prints 'mend lighthouse grpc=HOST:PORT "
    "http=HOST:PORT' on stdout once serving. (The executable mend-lighthouse, which does not "
    "load LibTorch.)";
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
