// In-process data-plane fixtures: a rendezvous store shared by threads, and
// a helper that runs one thread per member, each with its own communicator.
#pragma once

#include <dirent.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "mend/communicator.h"

namespace mend::testing_util {

class InProcessStore final : public RendezvousStore {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    std::lock_guard lock(mu_);
    values_[key] = value;
    changed_.notify_all();
    return OkStatus();
  }
  StatusOr<std::string> Get(const std::string& key, Micros timeout) override {
    std::unique_lock lock(mu_);
    bool found = changed_.wait_for(lock, std::chrono::microseconds(timeout),
                                   [&]() { return values_.count(key) > 0; });
    if (!found) return DeadlineExceededError("store: no key " + key);
    return values_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

// A connection to a store shared by threads (each rank opens its own, as
// with a real store); does not own it.
class StoreConnection final : public RendezvousStore {
 public:
  explicit StoreConnection(RendezvousStore& store) : store_(store) {}
  Status Set(const std::string& key, const std::string& value) override {
    return store_.Set(key, value);
  }
  StatusOr<std::string> Get(const std::string& key, Micros timeout) override {
    return store_.Get(key, timeout);
  }

 private:
  RendezvousStore& store_;
};

inline CommunicatorOptions MemberOptions(int rank, int size, const std::string& prefix,
                                         Micros timeout = 20 * kMicrosPerSecond) {
  CommunicatorOptions options;
  options.prefix = prefix;
  options.round_id = 7;
  options.rank = rank;
  options.world_size = size;
  for (int r = 0; r < size; ++r) options.member_ids.push_back("learner-" + std::to_string(r));
  options.timeout = timeout;
  // The pairs' connections too: a loaded machine (a sanitizer, stress-ng
  // beside the suite) may take seconds to connect threads of one process.
  options.connect_timeout = timeout;
  return options;
}

// Connects `size` members (one thread each) and runs `body(rank, comm)` on
// each; returns when all threads are done.
inline void RunMembers(int size, const std::function<void(int, Communicator&)>& body,
                       const std::string& prefix = "job/round/7/",
                       const std::function<void(CommunicatorOptions&)>& tweak = nullptr) {
  InProcessStore store;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank]() {
      CommunicatorOptions options = MemberOptions(rank, size, prefix);
      if (tweak) tweak(options);
      auto comm = Communicator::Connect(store, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(rank, **comm);
    });
  }
  for (auto& thread : threads) thread.join();
}

// `n` standard normal floats from `seed`: a member's data in the tests.
inline std::vector<float> NormalValues(uint64_t seed, size_t n) {
  std::mt19937_64 random(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = normal(random);
  return values;
}

// Entries in a /proc directory (this process's threads or open files).
inline size_t CountEntries(const char* path) {
  size_t count = 0;
  if (DIR* dir = opendir(path)) {
    while (readdir(dir) != nullptr) ++count;
    closedir(dir);
  }
  return count;
}

}  // namespace mend::testing_util
