// A small corpus in the fortunes format (fortunes separated by "%" lines,
// several files), for tests that must not depend on the Debian package:
// pseudo-English sentences over a small vocabulary, fixed by `seed`.
#pragma once

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace mend::testing_util {

inline void WriteSyntheticFortunes(const std::string& dir, int fortunes = 800, uint64_t seed = 7) {
  static const char* const kWords[] = {"the", "cat",  "sat",  "on",  "a",   "mat",
                                       "and", "dog",  "ran",  "to",  "see", "it",
                                       "was", "very", "good", "day", "for", "all"};
  std::filesystem::create_directories(dir);
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
  std::ofstream files[2] = {std::ofstream(dir + "/alpha"), std::ofstream(dir + "/beta")};
  std::ofstream(dir + "/alpha.dat") << "index, not text\n";  // skipped like the package's
  for (int f = 0; f < fortunes; ++f) {
    std::ofstream& out = files[f % 2];
    for (int sentence = 0; sentence < 4; ++sentence) {
      std::string text = "The";
      for (int w = 0; w < 8; ++w) text += std::string(" ") + kWords[word(random)];
      out << text << ".\n";
    }
    out << "%\n";
  }
}

}  // namespace mend::testing_util
