#include <cstdio>
#include <string>
#include <string_view>

#include "cli/commands.h"
#include "fmt/format.h"

namespace mend::cli {
namespace {

int ReportEscaped(const CLI::App& app, std::string_view what) {
  std::string command = app.get_name();
  for (const CLI::App* sub : app.get_subcommands()) command += " " + sub->get_name();
  const std::string_view line = what.substr(0, what.find('\n'));
  fmt::print(stderr, "{}: internal error: {} (a bug in mend: please report it)\n", command,
             line.empty() ? "an exception without a message" : line);
  std::fflush(stderr);
  return kExitInternal;
}

}  // namespace

int RunCommandLine(
    CLI::App& app, int argc, char** argv, const int& exit_code,
    const std::function<std::optional<std::string>(const std::exception&)>& message) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version exit 0; a command line CLI11 cannot parse (an
    // unknown flag, a bad value, a --config file that is not there) is a bad
    // argument, exit 2, whatever CLI11's own code for it.
    const int code = app.exit(error);
    return code == kExitOk ? kExitOk : kExitBadConfig;
  } catch (const std::exception& error) {
    std::optional<std::string> text = message ? message(error) : std::nullopt;
    return ReportEscaped(app, text ? *text : error.what());
  } catch (...) {
    return ReportEscaped(app, "an exception that is not a std::exception");
  }
  return exit_code;
}

}  // namespace mend::cli
