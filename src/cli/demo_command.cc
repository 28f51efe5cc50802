#include "cli/commands.h"

namespace mend::cli {
void AddDemoCommand(CLI::App& app, int* exit_code) {}
}  // namespace mend::cli
