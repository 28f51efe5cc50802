#include "core/parallel.h"

#include <algorithm>

namespace mend {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this]() { Work(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.NotifyAll();
  for (std::thread& worker : workers_) worker.join();
}

int ThreadPool::DefaultThreads() {
  const int processors = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(processors / 4, 1, 8);
}

void ThreadPool::RunChunks() {
  const std::function<void(size_t)>* body = body_;
  while (next_ < chunks_) {
    const size_t chunk = next_++;
    mu_.Unlock();
    (*body)(chunk);
    mu_.Lock();
    if (++finished_ == chunks_) idle_.NotifyAll();
  }
}

void ThreadPool::Work() {
  MutexLock lock(mu_);
  uint64_t seen = 0;
  while (true) {
    while (!stop_ && job_ == seen) wake_.Wait(mu_);
    if (stop_) return;
    seen = job_;
    RunChunks();
  }
}

void ThreadPool::ParallelFor(size_t chunks, const std::function<void(size_t)>& body) {
  if (chunks == 0) return;
  if (workers_.empty() || chunks == 1) {
    for (size_t c = 0; c < chunks; ++c) body(c);
    return;
  }
  MutexLock lock(mu_);
  body_ = &body;
  chunks_ = chunks;
  next_ = 0;
  finished_ = 0;
  ++job_;
  wake_.NotifyAll();
  RunChunks();
  while (finished_ < chunks_) idle_.Wait(mu_);
  body_ = nullptr;
  chunks_ = 0;
}

}  // namespace mend
