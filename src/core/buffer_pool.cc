#include "core/buffer_pool.h"

#include <algorithm>

#include "core/mutex.h"

namespace mend {
namespace {

// Buffers below this size come from malloc's own free lists anyway.
constexpr size_t kMinPooledBytes = size_t{1} << 20;
// At most this many of each kind (the largest kept).
constexpr size_t kMaxPooled = 12;

template <typename T>
class Pool {
 public:
  std::vector<T> Take(size_t n) {
    if (n * sizeof(T) >= kMinPooledBytes) {
      MutexLock lock(mu_);
      // The smallest buffer that holds n values.
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->capacity() >= n && (best == free_.end() || it->capacity() < best->capacity()))
          best = it;
      }
      if (best != free_.end()) {
        std::vector<T> buffer = std::move(*best);
        free_.erase(best);
        buffer.resize(n);
        return buffer;
      }
    }
    return std::vector<T>(n);
  }

  void Give(std::vector<T>&& buffer) {
    if (buffer.capacity() * sizeof(T) < kMinPooledBytes) return;
    MutexLock lock(mu_);
    free_.push_back(std::move(buffer));
    if (free_.size() > kMaxPooled) {
      auto smallest = std::min_element(
          free_.begin(), free_.end(),
          [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });
      free_.erase(smallest);
    }
  }

 private:
  Mutex mu_;
  std::vector<std::vector<T>> free_ ABSL_GUARDED_BY(mu_);
};

Pool<float>& Floats() {
  static Pool<float>* pool = new Pool<float>();  // never destroyed: used until exit
  return *pool;
}

Pool<std::byte>& Bytes() {
  static Pool<std::byte>* pool = new Pool<std::byte>();
  return *pool;
}

}  // namespace

std::vector<float> TakeFloats(size_t n) { return Floats().Take(n); }
std::vector<std::byte> TakeBytes(size_t n) { return Bytes().Take(n); }
void GiveBack(std::vector<float>&& buffer) { Floats().Give(std::move(buffer)); }
void GiveBack(std::vector<std::byte>&& buffer) { Bytes().Give(std::move(buffer)); }

}  // namespace mend
