#include "store/deadline_timer.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace mend::store {

DeadlineTimer::DeadlineTimer(const Clock& clock, std::function<void()> tick,
                             std::function<Micros()> next_deadline, Micros max_sleep)
    : clock_(clock),
      tick_(std::move(tick)),
      next_deadline_(std::move(next_deadline)),
      max_sleep_(max_sleep),
      thread_([this]() { Run(); }) {}

void DeadlineTimer::Wake() {
  MutexLock lock(mu_);
  woken_ = true;
  wake_.NotifyOne();
}

void DeadlineTimer::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    wake_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
}

void DeadlineTimer::Run() {
  MutexLock lock(mu_);
  while (!stopping_) {
    lock.Unlock();
    tick_();
    const Micros next = next_deadline_();
    lock.Lock();
    const Micros sleep = std::clamp<Micros>(next - clock_.NowMicros(), 0, max_sleep_);
    const auto wake_at = std::chrono::steady_clock::now() + std::chrono::microseconds(sleep);
    while (!stopping_ && !woken_ && wake_.WaitUntil(mu_, wake_at)) {
    }
    woken_ = false;
  }
}

}  // namespace mend::store
