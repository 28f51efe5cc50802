// A small pool of threads for a round's arithmetic over a model's values:
// ParallelFor(chunks, body) runs body(c) for every chunk c in [0, chunks) on
// the pool's threads and the caller's, and returns when all have run.
//
// Why not OpenMP or TBB: the pool runs inside processes that load PyTorch,
// whose wheels bring their own OpenMP runtime, and ThreadSanitizer (the
// test suite's tsan stage) sees neither runtime's synchronisation. This
// one is a mutex, two condition variables and a counter, which it does see.
//
// Chunks are handed out in order; which thread runs which chunk varies, so
// a body that sums must keep one partial sum per chunk and add the
// partials in chunk order (the same bits whatever the threads).
//
// Thread-safety: ParallelFor from one thread at a time (a round's arithmetic
// is on the training thread or the round's thread, never both at once for
// one pool: see RoundDriverImpl); the body runs on several threads at once.
#pragma once

#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "core/mutex.h"

namespace mend {

class ThreadPool {
 public:
  // `threads` - 1 threads of its own (the caller is the last): 1 runs
  // everything on the caller.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  void ParallelFor(size_t chunks, const std::function<void(size_t)>& body);

  // round_threads = 0: a quarter of the host's processors, at least 1 and
  // at most 8 (the rest are the training's: its data loading, its launch
  // threads, other learners on the host).
  static int DefaultThreads();

 private:
  void Work();
  // Runs chunks of the current job until none is left; whether it ran any.
  void RunChunks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Mutex mu_;
  CondVar wake_;  // a job was posted, or the pool stops
  CondVar idle_;  // a job's last chunk finished
  const std::function<void(size_t)>* body_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t chunks_ ABSL_GUARDED_BY(mu_) = 0;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;      // the next chunk to hand out
  size_t finished_ ABSL_GUARDED_BY(mu_) = 0;  // chunks run to the end
  uint64_t job_ ABSL_GUARDED_BY(mu_) = 0;     // counts the jobs posted
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace mend
