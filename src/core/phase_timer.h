// Adds the seconds a scope took to a counter (the rounds' phases,
// RoundPhases). Wall time on the steady clock, not the injected Clock:
// phases are measurements, never inputs to a decision.
//
// Thread-safety: the counter belongs to the thread that made the timer.
#pragma once

#include <chrono>

namespace mend {

class PhaseTimer {
 public:
  explicit PhaseTimer(double* seconds)
      : seconds_(seconds), start_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double* const seconds_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace mend
