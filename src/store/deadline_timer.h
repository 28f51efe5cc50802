// A thread that calls `tick` when `next_deadline` comes (and at least every
// `max_sleep`), until stopped; Wake() makes it look at the deadline again at
// once (a call moved it earlier). The lighthouse's core and a group's store
// are driven by one each.
//
// Thread-safety: Wake and Stop may be called from any thread.
#pragma once

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"
#include "mend/clock.h"

namespace mend::store {

class DeadlineTimer {
 public:
  // `clock` is not owned and must outlive the timer; the thread starts here.
  DeadlineTimer(const Clock& clock, std::function<void()> tick,
                std::function<Micros()> next_deadline, Micros max_sleep);
  ~DeadlineTimer() { Stop(); }
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  void Wake();
  // Joins the thread; idempotent.
  void Stop();

 private:
  void Run();

  const Clock& clock_;
  const std::function<void()> tick_;
  const std::function<Micros()> next_deadline_;
  const Micros max_sleep_;
  Mutex mu_;
  CondVar wake_;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is made
};

}  // namespace mend::store
