// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with
// the capability attributes of clang's thread-safety analysis
// (absl/base/thread_annotations.h), so that ABSL_GUARDED_BY(mu_) and
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) are checked at compile time
// (scripts/thread-safety.sh: -DMEND_THREAD_SAFETY_ANALYSIS=ON). libstdc++'s
// std::mutex carries no such attributes, so the analysis cannot see it. The
// wrappers add no state and no cost; a std::mutex stays underneath, so
// ThreadSanitizer sees the usual pthread calls (absl::Mutex's slow path, in
// a library built without TSan, would be invisible to it).
//
// Waiting: the analysis does not look into lambdas, so a predicate wait would
// read guarded members unchecked. Wait in a loop instead, which it checks:
//
//   MutexLock lock(mu_);
//   while (!done_) changed_.Wait(mu_);
//
// Thread-safety: Mutex and CondVar are shared between threads; a MutexLock
// belongs to the thread that made it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace mend {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction, except between Unlock() and
// Lock() (a stretch that must not hold it: a blocking call, a callback).
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() ABSL_UNLOCK_FUNCTION() {
    mu_.Unlock();
    held_ = false;
  }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.Lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A condition variable over Mutex. Every wait releases `mu` while blocked and
// holds it again on return; any wait may also return spuriously.
class CondVar {
 public:
  void Wait(Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted adopted(mu);
    cv_.wait(adopted.lock);
  }
  // False once `timeout` has passed.
  template <typename Rep, typename Period>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted adopted(mu);
    return cv_.wait_for(adopted.lock, timeout) == std::cv_status::no_timeout;
  }
  // False once `deadline` has passed.
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted adopted(mu);
    return cv_.wait_until(adopted.lock, deadline) == std::cv_status::no_timeout;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  // The caller's lock of `mu` as a std::unique_lock for the wait, given back
  // (not unlocked) afterwards, also if the wait throws.
  struct Adopted {
    explicit Adopted(Mutex& mu) : lock(mu.mu_, std::adopt_lock) {}
    ~Adopted() { lock.release(); }
    std::unique_lock<std::mutex> lock;
  };

  std::condition_variable cv_;
};

}  // namespace mend
