// `mend checkpoint inspect` and `verify` with authenticated checkpoints:
// verify checks an authenticated one's MAC under the job token (from
// --token-file or MEND_JOB_TOKEN) and refuses it without the token, or when
// it was altered; one without authentication is verified by its SHA-256
// and said to be so.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "gtest/gtest.h"
#include "mend/checkpoint.h"
#include "test_util/checkpoint_edit.h"
#include "test_util/wait.h"

namespace mend::cli {
namespace {

constexpr char kToken[] = "checkpoint-command-token-0123456789";

struct Outcome {
  int status = -1;
  std::string out, err;
};

Outcome Mend(std::vector<std::string> args) {
  CLI::App app{"test", "mend"};
  int exit_code = kExitOk;
  AddCheckpointCommand(app, &exit_code);
  args.insert(args.begin(), "mend");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  Outcome run;
  run.status = RunCommandLine(app, static_cast<int>(argv.size()), argv.data(), exit_code);
  run.out = testing::internal::GetCapturedStdout();
  run.err = testing::internal::GetCapturedStderr();
  return run;
}

class CheckpointCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("MEND_JOB_TOKEN");
    dir_ = testing_util::MakeTempDir();
    token_file_ = dir_ + "/token";
    std::ofstream(token_file_) << kToken << "\n";
    Checkpoint checkpoint;
    checkpoint.meta.round_id = 4;
    checkpoint.tensors.push_back({"global/w", {2}, {1, 2}});
    ASSERT_TRUE(WriteCheckpoint(plain_ = dir_ + "/plain.mend", checkpoint).ok());
    ASSERT_TRUE(WriteCheckpoint(sealed_ = dir_ + "/sealed.mend", checkpoint, kToken).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_, token_file_, plain_, sealed_;
};

TEST_F(CheckpointCommandTest, VerifyChecksAnAuthenticatedCheckpointUnderTheJobToken) {
  Outcome both = Mend({"checkpoint", "verify", plain_, sealed_, "--token-file", token_file_});
  EXPECT_EQ(both.status, kExitOk) << both.err;
  EXPECT_NE(both.out.find(sealed_ + ": ok (round 4, 1 tensors, every checksum verified, "
                                    "authenticated by the job token)"),
            std::string::npos)
      << both.out;
  EXPECT_NE(both.out.find(plain_ + ": ok (round 4, 1 tensors, every checksum verified; not "
                                   "authenticated: written without a job token)"),
            std::string::npos)
      << both.out;
  // The token from the environment, as every other command takes it.
  setenv("MEND_JOB_TOKEN", kToken, 1);
  EXPECT_EQ(Mend({"checkpoint", "verify", sealed_}).status, kExitOk);
  unsetenv("MEND_JOB_TOKEN");
  Outcome inspect = Mend({"checkpoint", "inspect", sealed_});
  EXPECT_EQ(inspect.status, kExitOk);
  EXPECT_NE(inspect.out.find("format version 2"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("authenticated yes (HMAC-SHA256"), std::string::npos) << inspect.out;
}

TEST_F(CheckpointCommandTest, VerifyRefusesAnAuthenticatedCheckpointWithoutItsTokenOrAltered) {
  Outcome without = Mend({"checkpoint", "verify", sealed_});
  EXPECT_EQ(without.status, kExitFailure);
  EXPECT_NE(without.err.find(sealed_ + ": BAD: authenticated by a job token, and no job token"),
            std::string::npos)
      << without.err;
  std::ofstream(token_file_, std::ios::trunc) << "another-jobs-token-0123456789\n";
  Outcome other = Mend({"checkpoint", "verify", sealed_, "--token-file", token_file_});
  EXPECT_EQ(other.status, kExitFailure);
  EXPECT_NE(other.err.find("authentication failed"), std::string::npos) << other.err;
  std::ofstream(token_file_, std::ios::trunc) << kToken << "\n";
  testing_util::AlterCheckpointValue(sealed_, "global/w", 1, 7.0f);
  Outcome altered = Mend({"checkpoint", "verify", sealed_, "--token-file", token_file_});
  EXPECT_EQ(altered.status, kExitFailure);
  EXPECT_NE(altered.err.find("authentication failed"), std::string::npos) << altered.err;
}

}  // namespace
}  // namespace mend::cli
