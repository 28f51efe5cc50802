// Time source for everything that waits or measures: the quorum rules, the
// fail-slow detector, timeouts. Injected so that tests run those rules against
// a FakeClock, deterministically, in microseconds.
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace mend {

// Microseconds on a monotonic clock with an arbitrary epoch.
using Micros = int64_t;

inline constexpr Micros kMicrosPerMilli = 1000;
inline constexpr Micros kMicrosPerSecond = 1000 * 1000;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual Micros NowMicros() const = 0;
};

// The process's monotonic clock (std::chrono::steady_clock). Never destroyed.
Clock* RealClock();

// A clock that moves only when told to.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(Micros start = 1'000'000) : now_(start) {}
  Micros NowMicros() const override { return now_.load(std::memory_order_acquire); }
  void Advance(Micros delta) { now_.fetch_add(delta, std::memory_order_acq_rel); }
  void AdvanceMillis(int64_t ms) { Advance(ms * kMicrosPerMilli); }

 private:
  std::atomic<Micros> now_;
};

}  // namespace mend
