// The training example's corpus: the English text of Debian's `fortunes`
// package (/usr/share/games/fortunes), read as bytes (a byte-level model has
// 256 tokens).
//
// The split is fixed: the files are read in name order, cut into fortunes at
// the "%" lines, and every eval_every-th fortune goes to the held-out set;
// training fortune j goes to shard j mod shards, so each learner reads its
// own part and no learner sees the held-out text.
//
// Thread-safety: a Corpus is immutable after Load; a WindowSampler belongs to
// one thread.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mend/status.h"

namespace mend::train {

inline constexpr const char* kDefaultCorpusDir = "/usr/share/games/fortunes";

struct CorpusOptions {
  std::string dir = kDefaultCorpusDir;
  int shard = 0;
  int shards = 1;
  int eval_every = 20;  // fortune i (from 0) is held out when i % eval_every == eval_every - 1
};

class Corpus {
 public:
  // NOT_FOUND when `dir` holds no fortune files (naming the directory and the
  // package); INVALID_ARGUMENT for a bad shard or a shard too small to train on.
  [[nodiscard]] static StatusOr<Corpus> Load(const CorpusOptions& options);

  const std::string& train() const { return train_; }  // this shard's text
  const std::string& eval() const { return eval_; }    // the held-out text (all shards)
  size_t fortunes() const { return fortunes_; }        // in the whole corpus
  std::vector<std::string> files() const { return files_; }

 private:
  std::string train_;
  std::string eval_;
  size_t fortunes_ = 0;
  std::vector<std::string> files_;
};

// Windows of context + 1 bytes: input bytes [o, o + context), targets
// [o + 1, o + context + 1).
class WindowSampler {
 public:
  WindowSampler(const std::string& text, int64_t context, uint64_t seed);
  // Random window starts for one batch.
  std::vector<size_t> Next(int64_t batch);
  size_t limit() const { return limit_; }

 private:
  std::mt19937_64 random_;
  size_t limit_;  // the number of possible starts
};

// `count` evenly spaced window starts over `text` (the same on every
// learner and in every run): the evaluation set.
std::vector<size_t> EvalWindowStarts(const std::string& text, int64_t context, int64_t count);

}  // namespace mend::train
