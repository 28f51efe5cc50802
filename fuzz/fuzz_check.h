// MEND_FUZZ_CHECK(condition): the fuzz targets' invariant check. On failure it
// prints the condition and its place and crashes, so libFuzzer records the
// input as a crash. Active in every build type (unlike assert).
#pragma once

#include <cstdio>

#define MEND_FUZZ_CHECK(condition)                                                           \
  do {                                                                                       \
    if (!(condition)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #condition); \
      __builtin_trap();                                                                      \
    }                                                                                        \
  } while (false)
