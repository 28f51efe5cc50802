// The training corpus: a fixed held-out split, disjoint shards, clear errors.
#include "train/corpus.h"

#include <filesystem>
#include <set>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util/synthetic_corpus.h"
#include "test_util/wait.h"

namespace mend::train {
namespace {

using ::testing::HasSubstr;

std::multiset<std::string> Fortunes(const std::string& text) {
  std::multiset<std::string> out;
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    if (line == "%") {
      out.insert(current);
      current.clear();
    } else {
      current += line + "\n";
    }
  }
  return out;
}

class CorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::MakeTempDir();
    testing_util::WriteSyntheticFortunes(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(CorpusTest, ShardsPartitionTheTrainingTextAndNeverSeeTheHeldOutSet) {
  const int shards = 3;
  std::multiset<std::string> union_of_shards;
  std::string eval;
  for (int s = 0; s < shards; ++s) {
    auto corpus = Corpus::Load({dir_, s, shards, 20});
    ASSERT_TRUE(corpus.ok()) << corpus.status();
    EXPECT_EQ(corpus->fortunes(), 800u);
    EXPECT_EQ(corpus->files().size(), 2u);  // alpha and beta, not alpha.dat
    if (s == 0) eval = corpus->eval();
    EXPECT_EQ(corpus->eval(), eval) << "every learner evaluates on the same text";
    for (const auto& f : Fortunes(corpus->train())) union_of_shards.insert(f);
  }
  std::multiset<std::string> held_out = Fortunes(eval);
  EXPECT_EQ(held_out.size(), 800u / 20);
  EXPECT_EQ(union_of_shards.size() + held_out.size(), 800u);
  for (const auto& f : held_out) EXPECT_EQ(union_of_shards.count(f), 0u) << f;
}

TEST_F(CorpusTest, TheSplitIsTheSameOnEveryLoad) {
  auto a = Corpus::Load({dir_, 1, 2, 20});
  auto b = Corpus::Load({dir_, 1, 2, 20});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->train(), b->train());
  EXPECT_EQ(a->eval(), b->eval());
}

TEST_F(CorpusTest, BadInputNamesWhatIsWrong) {
  auto missing = Corpus::Load({dir_ + "/nowhere", 0, 1, 20});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("apt-get install fortunes"));
  auto shard = Corpus::Load({dir_, 2, 2, 20});
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shard.status().message(), HasSubstr("shard 2 of 2"));
  auto tiny = Corpus::Load({dir_, 0, 400, 20});
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tiny.status().message(), HasSubstr("training"));
}

TEST(WindowsTest, WindowsStayInsideTheTextAndEvalWindowsAreFixed) {
  std::string text(1000, 'x');
  WindowSampler sampler(text, 64, 3);
  for (int i = 0; i < 100; ++i) {
    for (size_t start : sampler.Next(8)) EXPECT_LE(start + 64 + 1, text.size());
  }
  auto starts = EvalWindowStarts(text, 64, 10);
  ASSERT_EQ(starts.size(), 10u);
  EXPECT_EQ(starts.front(), 0u);
  EXPECT_LE(starts.back() + 64 + 1, text.size());
  EXPECT_EQ(starts, EvalWindowStarts(text, 64, 10));
}

}  // namespace
}  // namespace mend::train
