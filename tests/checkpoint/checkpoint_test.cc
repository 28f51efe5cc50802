// Checkpoints: round trip, refusal of damaged files naming the damage, atomic
// replacement, a directory that falls back to the previous good one, and
// authentication by the job token.
#include "mend/checkpoint.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util/checkpoint_edit.h"
#include "test_util/wait.h"

namespace mend {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

Checkpoint Sample(uint64_t round) {
  Checkpoint c;
  c.meta.job_id = "job";
  c.meta.round_id = round;
  c.meta.step = round * 10;
  c.meta.tokens = round * 1000;
  c.meta.fragments = 2;
  c.meta.learners = 3;
  c.meta.written_by = "learner-1";
  c.meta.created_unix_ms = 1234;
  c.meta.config_toml = "sync_period_steps = 10\n";
  c.tensors.push_back({"global/w", {2, 3}, {1, 2, 3, 4, 5, static_cast<float>(round)}});
  c.tensors.push_back({"momentum/w", {2, 3}, {0.5f, 0, 0, 0, 0, -1}});
  c.tensors.push_back({"global/b", {5}, {9, 8, 7, 6, 5}});
  return c;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing_util::MakeTempDir(); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void Put(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  std::string dir_;
};

TEST_F(CheckpointTest, RoundTripsEverything) {
  const std::string path = dir_ + "/a.mend";
  ASSERT_TRUE(WriteCheckpoint(path, Sample(7)).ok());
  auto read = ReadCheckpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  const Checkpoint expected = Sample(7);
  EXPECT_EQ(read->meta.round_id, 7u);
  EXPECT_EQ(read->meta.step, 70u);
  EXPECT_EQ(read->meta.fragments, 2);
  EXPECT_EQ(read->meta.config_toml, expected.meta.config_toml);
  ASSERT_EQ(read->tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(read->tensors[i].name, expected.tensors[i].name);
    EXPECT_EQ(read->tensors[i].shape, expected.tensors[i].shape);
    EXPECT_EQ(read->tensors[i].values, expected.tensors[i].values);
  }
  ASSERT_NE(read->Find("global/b"), nullptr);
  auto summary = InspectCheckpoint(path);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->tensors.size(), 3u);
  EXPECT_EQ(summary->file_bytes, fs::file_size(path));
  // Nothing but the checkpoint is left in the directory.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// A write the host refuses is told by what the host said, not as mend's
// own INTERNAL error (a full disk is RESOURCE_EXHAUSTED, by the same rule).
TEST_F(CheckpointTest, AWriteIntoAMissingDirectoryIsNotFoundNamingThePath) {
  const std::string path = dir_ + "/nowhere/a.mend";
  const Status written = WriteCheckpoint(path, Sample(7));
  EXPECT_EQ(written.code(), absl::StatusCode::kNotFound) << written;
  EXPECT_NE(std::string(written.message()).find(path), std::string::npos) << written;
}

TEST_F(CheckpointTest, TruncatedFilesAreRefusedAtEveryLength) {
  const std::string path = dir_ + "/a.mend";
  ASSERT_TRUE(WriteCheckpoint(path, Sample(1)).ok());
  const std::string whole = Bytes(path);
  for (size_t length : {size_t{0}, size_t{5}, size_t{19}, size_t{40}, whole.size() / 2,
                        whole.size() - 41, whole.size() - 1}) {
    Put(dir_ + "/cut.mend", whole.substr(0, length));
    auto read = ReadCheckpoint(dir_ + "/cut.mend");
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << length;
  }
  Put(dir_ + "/cut.mend", whole.substr(0, whole.size() / 2));
  EXPECT_THAT(ReadCheckpoint(dir_ + "/cut.mend").status().message(), HasSubstr("truncated"));
}

// A directory given for a checkpoint file is refused by name (it used to
// read as a file of unknown size: std::bad_alloc).
TEST_F(CheckpointTest, ADirectoryIsRefusedAsNotACheckpointFile) {
  auto read = ReadCheckpoint(dir_);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
  EXPECT_NE(std::string(read.status().message()).find("is a directory"), std::string::npos)
      << read.status();
  auto inspected = InspectCheckpoint(dir_);
  ASSERT_FALSE(inspected.ok());
  EXPECT_NE(std::string(inspected.status().message()).find("is a directory"), std::string::npos)
      << inspected.status();
}

TEST_F(CheckpointTest, DamageIsNamed) {
  const std::string path = dir_ + "/a.mend";
  ASSERT_TRUE(WriteCheckpoint(path, Sample(1)).ok());
  const std::string whole = Bytes(path);
  // A flipped byte inside the data of the second tensor (each tensor's data
  // starts on a 64-byte boundary; the trailer is 40 bytes).
  std::string damaged = whole;
  const size_t second = whole.size() - 40 - 64 - 64 + 4;  // inside momentum/w's 64-byte slot
  damaged[second] ^= 0x40;
  Put(dir_ + "/bad.mend", damaged);
  auto read = ReadCheckpoint(dir_ + "/bad.mend");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr("momentum/w': checksum mismatch"));
  // Not a checkpoint at all.
  Put(dir_ + "/text.mend", std::string(200, 'x'));
  EXPECT_THAT(ReadCheckpoint(dir_ + "/text.mend").status().message(),
              HasSubstr("not a mend checkpoint"));
  // A format from the future.
  damaged = whole;
  damaged[8] = 9;
  Put(dir_ + "/future.mend", damaged);
  EXPECT_THAT(ReadCheckpoint(dir_ + "/future.mend").status().message(),
              HasSubstr("format version 9"));
  // A changed header byte (the round id) is caught by the file checksum.
  damaged = whole;
  const size_t round = whole.find("\"round_id\":1");
  ASSERT_NE(round, std::string::npos);
  damaged[round + 11] = '2';
  Put(dir_ + "/header.mend", damaged);
  EXPECT_THAT(ReadCheckpoint(dir_ + "/header.mend").status().message(),
              HasSubstr("file checksum mismatch"));
  // A missing file.
  EXPECT_EQ(ReadCheckpoint(dir_ + "/none.mend").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, ShapeAndValuesMustAgree) {
  Checkpoint c = Sample(1);
  c.tensors[0].shape = {4, 4};
  auto status = WriteCheckpoint(dir_ + "/a.mend", c);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("global/w"));
  EXPECT_FALSE(fs::exists(dir_ + "/a.mend"));
}

TEST_F(CheckpointTest, DirectoryKeepsTheNewestAndFallsBackPastADamagedOne) {
  CheckpointDirectory directory(dir_ + "/ckpt", 2);
  for (uint64_t round : {3, 5, 9}) ASSERT_TRUE(directory.Save(Sample(round)).ok());
  auto files = directory.List();
  ASSERT_EQ(files.size(), 2u);  // round 3 was removed
  EXPECT_THAT(files[0], HasSubstr("ckpt-000000000005.mend"));
  // The newest is damaged (truncated): the previous good one is used, and the
  // damaged file is left for inspection.
  const std::string newest = Bytes(files[1]);
  Put(files[1], newest.substr(0, newest.size() - 10));
  std::vector<std::string> skipped;
  auto latest = directory.LoadLatest(&skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->meta.round_id, 5u);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr("ckpt-000000000009.mend"));
  EXPECT_TRUE(fs::exists(files[1]));
  CheckpointDirectory empty(dir_ + "/none", 2);
  EXPECT_EQ(empty.LoadLatest().status().code(), absl::StatusCode::kNotFound);
}

constexpr char kToken[] = "checkpoint-test-token-0123456789";

// With the job token a checkpoint is written as version 2 with a MAC, and
// read back whole with the same token; without a token it is version 1.
TEST_F(CheckpointTest, AnAuthenticatedCheckpointRoundTripsUnderItsToken) {
  const std::string path = dir_ + "/a.mend";
  ASSERT_TRUE(WriteCheckpoint(path, Sample(7), kToken).ok());
  auto read = ReadCheckpoint(path, kToken);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->tensors.size(), 3u);
  EXPECT_EQ(read->tensors[0].values, Sample(7).tensors[0].values);
  auto summary = InspectCheckpoint(path);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->format_version, 2u);
  EXPECT_TRUE(summary->authenticated);
  ASSERT_TRUE(WriteCheckpoint(dir_ + "/plain.mend", Sample(7)).ok());
  EXPECT_EQ(InspectCheckpoint(dir_ + "/plain.mend")->format_version, 1u);
  EXPECT_FALSE(InspectCheckpoint(dir_ + "/plain.mend")->authenticated);
  // The same bytes in memory (an exported state).
  auto bytes = EncodeCheckpoint(Sample(7), kToken);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, Bytes(path));  // the file's bytes (Sample fixes created_unix_ms)
  EXPECT_TRUE(DecodeCheckpoint(*bytes, "(state)", kToken).ok());
}

// Someone without the token can alter a value and fix up every SHA-256 (a
// file without authentication then reads back altered), but not the MAC;
// another job's token, a file without authentication and an authenticated
// one read without the token are each refused, naming why.
TEST_F(CheckpointTest, OnlyTheTokenThatWroteACheckpointReadsIt) {
  const std::string plain = dir_ + "/plain.mend", sealed = dir_ + "/sealed.mend";
  ASSERT_TRUE(WriteCheckpoint(plain, Sample(1)).ok());
  ASSERT_TRUE(WriteCheckpoint(sealed, Sample(1), kToken).ok());
  testing_util::AlterCheckpointValue(plain, "global/w", 2, 42.0f);
  auto altered = ReadCheckpoint(plain);
  ASSERT_TRUE(altered.ok()) << "the alteration fixes up every SHA-256: " << altered.status();
  EXPECT_EQ(altered->tensors[0].values[2], 42.0f);

  auto other = ReadCheckpoint(sealed, "another-jobs-token-0123456789");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(other.status().message(), HasSubstr("authentication failed"));
  auto unauthenticated = ReadCheckpoint(plain, kToken);
  EXPECT_EQ(unauthenticated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(unauthenticated.status().message(), HasSubstr("not authenticated"));
  auto without = ReadCheckpoint(sealed);
  EXPECT_EQ(without.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(without.status().message(), HasSubstr("needs the job's token"));

  testing_util::AlterCheckpointValue(sealed, "global/w", 2, 42.0f);
  auto tampered = ReadCheckpoint(sealed, kToken);
  EXPECT_EQ(tampered.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(tampered.status().message(), HasSubstr("authentication failed"));
  // A byte of the MAC itself.
  ASSERT_TRUE(WriteCheckpoint(sealed, Sample(1), kToken).ok());
  std::string bytes = Bytes(sealed);
  bytes[bytes.size() - 1] ^= 1;
  Put(sealed, bytes);
  EXPECT_THAT(ReadCheckpoint(sealed, kToken).status().message(),
              HasSubstr("authentication failed"));
  // Exported state in memory, the same.
  std::string state = *EncodeCheckpoint(Sample(1), kToken);
  state[100] ^= 1;
  EXPECT_EQ(DecodeCheckpoint(state, "(state)", kToken).status().code(),
            absl::StatusCode::kDataLoss);
}

// A directory with a token skips the checkpoints the token does not
// authenticate, as it skips damaged ones.
TEST_F(CheckpointTest, ADirectoryWithATokenPassesOverWhatItDoesNotAuthenticate) {
  CheckpointDirectory sealed(dir_, 3, kToken);
  ASSERT_TRUE(sealed.Save(Sample(3)).ok());
  ASSERT_TRUE(CheckpointDirectory(dir_, 3).Save(Sample(5)).ok());  // without the token
  std::vector<std::string> skipped;
  auto latest = sealed.LoadLatest(&skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->meta.round_id, 3u);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr("ckpt-000000000005.mend: not authenticated"));
}

}  // namespace
}  // namespace mend
