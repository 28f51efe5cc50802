#include "train/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/status_format.h"
#include "fmt/format.h"

namespace mend::train {
namespace {

namespace fs = std::filesystem;

// The fortune files of `dir`: regular files without the .dat index or the
// .u8 links, in name order.
std::vector<fs::path> FortuneFiles(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const fs::path& path = entry.path();
    if (path.extension() == ".dat" || path.extension() == ".u8") continue;
    if (!entry.is_regular_file(error) || entry.is_symlink(error)) continue;
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Splits a fortune file at its "%" lines.
std::vector<std::string> SplitFortunes(const std::string& text) {
  std::vector<std::string> fortunes;
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    if (line == "%") {
      if (!current.empty()) fortunes.push_back(std::move(current));
      current.clear();
    } else {
      current += line;
      current += '\n';
    }
  }
  if (!current.empty()) fortunes.push_back(std::move(current));
  return fortunes;
}

}  // namespace

StatusOr<Corpus> Corpus::Load(const CorpusOptions& options) {
  if (options.shards < 1 || options.shard < 0 || options.shard >= options.shards) {
    return InvalidArgumentError(fmt::format("corpus: shard {} of {}: need 0 <= shard < shards",
                                            options.shard, options.shards));
  }
  if (options.eval_every < 2) {
    return InvalidArgumentError(
        fmt::format("corpus: eval_every = {}: must be at least 2", options.eval_every));
  }
  std::vector<fs::path> files = FortuneFiles(options.dir);
  if (files.empty()) {
    return NotFoundError(fmt::format(
        "corpus: no fortune files in {} (install the Debian package: apt-get install fortunes)",
        options.dir));
  }
  Corpus corpus;
  size_t index = 0;     // over all fortunes
  size_t training = 0;  // over training fortunes
  for (const fs::path& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return NotFoundError(fmt::format("corpus: cannot read {}", path.string()));
    std::stringstream text;
    text << in.rdbuf();
    corpus.files_.push_back(path.string());
    for (std::string& fortune : SplitFortunes(text.str())) {
      fortune += "%\n";
      if (index++ % static_cast<size_t>(options.eval_every) ==
          static_cast<size_t>(options.eval_every - 1)) {
        corpus.eval_ += fortune;
      } else if (training++ % static_cast<size_t>(options.shards) ==
                 static_cast<size_t>(options.shard)) {
        corpus.train_ += fortune;
      }
    }
  }
  corpus.fortunes_ = index;
  constexpr size_t kMinBytes = 4096;
  if (corpus.train_.size() < kMinBytes || corpus.eval_.size() < kMinBytes) {
    return InvalidArgumentError(fmt::format(
        "corpus: {} gives shard {} of {} only {} training and {} held-out bytes (need {} each)",
        options.dir, options.shard, options.shards, corpus.train_.size(), corpus.eval_.size(),
        kMinBytes));
  }
  return corpus;
}

WindowSampler::WindowSampler(const std::string& text, int64_t context, uint64_t seed)
    : random_(seed), limit_(text.size() - static_cast<size_t>(context)) {}

std::vector<size_t> WindowSampler::Next(int64_t batch) {
  std::uniform_int_distribution<size_t> start(0, limit_ - 1);
  std::vector<size_t> starts(static_cast<size_t>(batch));
  for (size_t& s : starts) s = start(random_);
  return starts;
}

std::vector<size_t> EvalWindowStarts(const std::string& text, int64_t context, int64_t count) {
  const size_t limit = text.size() - static_cast<size_t>(context);
  std::vector<size_t> starts;
  for (int64_t i = 0; i < count; ++i) {
    starts.push_back(static_cast<size_t>(i) * limit / static_cast<size_t>(count));
  }
  return starts;
}

}  // namespace mend::train
