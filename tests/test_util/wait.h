// Test helpers: await a condition with a deadline (instead of sleeping for a
// guessed time), and scratch directories.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "mend/clock.h"

namespace mend::testing_util {

// Checks `condition` every 20 ms until it holds (true) or `timeout` passes (false).
inline bool WaitFor(Micros timeout, const std::function<bool()>& condition) {
  Micros deadline = RealClock()->NowMicros() + timeout;
  while (true) {
    if (condition()) return true;
    if (RealClock()->NowMicros() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A new directory under $TMPDIR (or /tmp).
inline std::string MakeTempDir() {
  const char* base = getenv("TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/mend-test-XXXXXX";
  char* made = mkdtemp(pattern.data());
  return made ? std::string(made) : std::string();
}

}  // namespace mend::testing_util
