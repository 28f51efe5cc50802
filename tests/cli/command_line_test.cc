// What a mend executable's main() does with what escapes a command
// (cli/commands.h, RunCommandLine): one line on stderr naming the command
// and the error, and the documented exit status, instead of an abort.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/config_flags.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace mend::cli {
namespace {

struct Outcome {
  int status = -1;
  std::string err;
};

// `mend ARGS` on an app whose "boom" command throws `thrown` and whose "ok"
// command sets the exit code 7.
template <typename Thrown>
Outcome RunApp(
    std::vector<std::string> args, Thrown thrown,
    const std::function<std::optional<std::string>(const std::exception&)>& message = {}) {
  CLI::App app{"test", "mend"};
  int exit_code = kExitOk;
  app.add_subcommand("boom", "throws")->callback([thrown]() { throw thrown; });
  app.add_subcommand("ok", "succeeds")->callback([&exit_code]() { exit_code = 7; });
  args.insert(args.begin(), "mend");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  testing::internal::CaptureStderr();
  Outcome run;
  run.status = RunCommandLine(app, static_cast<int>(argv.size()), argv.data(), exit_code, message);
  run.err = testing::internal::GetCapturedStderr();
  return run;
}

TEST(CommandLineTest, AnEscapedExceptionIsOneLineNamingTheCommandAndExitStatus4) {
  Outcome run = RunApp({"boom"}, std::runtime_error("type must be number, but is null\nmore"));
  EXPECT_EQ(run.status, kExitInternal);
  EXPECT_EQ(run.status, 4);
  EXPECT_EQ(run.err,
            "mend boom: internal error: type must be number, but is null (a bug in mend: please "
            "report it)\n");
}

TEST(CommandLineTest, AnExceptionOfAnotherKindIsReportedToo) {
  Outcome run = RunApp({"boom"}, 42);
  EXPECT_EQ(run.status, kExitInternal);
  EXPECT_NE(run.err.find("mend boom: internal error: an exception that is not a std::exception"),
            std::string::npos)
      << run.err;
}

TEST(CommandLineTest, AFrontEndRendersItsOwnExceptions) {
  Outcome run = RunApp({"boom"}, std::logic_error("with a backtrace"),
                       [](const std::exception& error) -> std::optional<std::string> {
                         if (dynamic_cast<const std::logic_error*>(&error)) return "without it";
                         return std::nullopt;
                       });
  EXPECT_EQ(run.status, kExitInternal);
  EXPECT_NE(run.err.find("mend boom: internal error: without it"), std::string::npos) << run.err;
}

TEST(CommandLineTest, ACommandsOwnExitCodeIsUnchangedAndACommandLineErrorIsExit2) {
  Outcome ok = RunApp({"ok"}, 0);
  EXPECT_EQ(ok.status, 7);
  EXPECT_EQ(ok.err, "");
  Outcome bad = RunApp({"nonsense"}, 0);
  EXPECT_EQ(bad.status, kExitBadConfig);  // CLI11's own code would be 109
  EXPECT_NE(bad.err.find("nonsense"), std::string::npos) << bad.err;
  Outcome flag = RunApp({"ok", "--no-such-flag"}, 0);
  EXPECT_EQ(flag.status, kExitBadConfig);
  Outcome help = RunApp({"--help"}, 0);
  EXPECT_EQ(help.status, kExitOk);
}

// A replaced key's old flag is still understood, to say what replaced it.
TEST(ConfigFlagsTest, AReplacedKeysFlagIsRefusedNamingItsReplacement) {
  CLI::App app{"test", "mend"};
  ConfigFlags flags(&app);
  flags.Map("--control-plane", "control_plane");
  flags.Retired("--udp-control", "udp_control");
  app.parse(std::vector<std::string>{"true", "--udp-control"});  // (CLI11 takes them reversed)
  auto config = flags.Load();
  ASSERT_FALSE(config.ok());
  EXPECT_NE(std::string(config.status().message()).find("replaced by control_plane"),
            std::string::npos)
      << config.status();
  EXPECT_NE(std::string(config.status().message()).find("flag --udp-control"), std::string::npos);
  EXPECT_EQ(app.help().find("--udp-control"), std::string::npos);  // not offered in the help
}

// Flags and --set apply in command-line order: of a key given twice, the
// later wins whichever way it was given, and a warning names both.
TEST(ConfigFlagsTest, OfAKeyGivenTwiceTheLaterWinsAndAWarningSaysSo) {
  auto load = [](std::vector<std::string> args, std::string* warned) {
    CLI::App app{"test", "mend"};
    ConfigFlags flags(&app);
    flags.Map("--min-learners", "quorum_min_learners");
    std::reverse(args.begin(), args.end());  // (CLI11 takes them reversed)
    app.parse(args);
    std::ostringstream log;
    auto logger = std::make_shared<spdlog::logger>(
        "flags-test", std::make_shared<spdlog::sinks::ostream_sink_st>(log));
    const std::shared_ptr<spdlog::logger> before = spdlog::default_logger();
    spdlog::set_default_logger(logger);
    StatusOr<Config> config = flags.Load();
    spdlog::set_default_logger(before);
    *warned = log.str();
    EXPECT_TRUE(config.ok()) << config.status();
    return config.ok() ? config->quorum_min_learners : -1;
  };
  std::string warned;
  EXPECT_EQ(load({"--set", "quorum_min_learners=2", "--min-learners", "3"}, &warned), 3);
  EXPECT_NE(warned.find("quorum_min_learners = \"3\" (flag --min-learners) overrides \"2\" "
                        "(flag --set quorum_min_learners=2)"),
            std::string::npos)
      << warned;
  EXPECT_EQ(load({"--min-learners", "3", "--set", "quorum_min_learners=2"}, &warned), 2);
  EXPECT_NE(warned.find("overrides \"3\" (flag --min-learners)"), std::string::npos) << warned;
  EXPECT_EQ(load({"--set", "quorum_min_learners=4", "--set", "quorum_min_learners=5"}, &warned), 5);
  EXPECT_NE(warned.find("overrides \"4\""), std::string::npos) << warned;
  // The same value twice (a launcher's flag and the user's alike) is no conflict.
  EXPECT_EQ(load({"--min-learners", "3", "--set", "quorum_min_learners=3"}, &warned), 3);
  EXPECT_EQ(warned, "");
}

// An output file is checked before a long run: a path whose directory is
// missing or that is a directory is refused naming the flag; a new file in
// a writable directory, an existing file and /dev/null pass.
TEST(CheckWritableFileTest, RefusesWhatCannotBeWrittenNamingTheFlag) {
  const std::string dir = ::testing::TempDir() + "/check-writable-file";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/existing.json") << "{}\n";
  EXPECT_TRUE(CheckWritableFile(dir + "/new.json", "--report").ok());
  EXPECT_TRUE(CheckWritableFile(dir + "/existing.json", "--report").ok());
  EXPECT_TRUE(CheckWritableFile("/dev/null", "--report").ok());
  auto missing = CheckWritableFile(dir + "/nowhere/r.json", "--report");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(missing.message()),
            "--report " + dir + "/nowhere/r.json: no directory " + dir + "/nowhere to write it in");
  auto directory = CheckWritableFile(dir, "--csv");
  EXPECT_EQ(std::string(directory.message()), "--csv " + dir + ": is a directory");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mend::cli
