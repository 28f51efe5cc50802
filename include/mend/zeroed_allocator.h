// ZeroedAllocator: model-sized buffers of zeros that cost nothing until
// they are written (FragmentState's global state and momentum).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

namespace mend {

// An allocator of zeros that leaves the memory untouched: calloc (which
// takes a large block straight from mmap: zero pages, faulted in at the
// first write) and no element-by-element value initialisation (the bytes
// are zeros already). A model-sized buffer then costs nothing until it is
// written. Only for types whose zero bytes are their value-initialised
// value, and only grown from empty: a vector shrunk and grown again keeps
// its old values where it would have zeros.
template <typename T>
struct ZeroedAllocator {
  using value_type = T;
  ZeroedAllocator() = default;
  template <typename U>
  ZeroedAllocator(const ZeroedAllocator<U>&) {}  // NOLINT: allocators convert implicitly
  T* allocate(size_t n) {
    void* memory = std::calloc(n, sizeof(T));
    if (memory == nullptr) throw std::bad_alloc();
    return static_cast<T*>(memory);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  void construct(U*) noexcept {}  // value-initialised: calloc's zeros
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  friend bool operator==(const ZeroedAllocator&, const ZeroedAllocator&) { return true; }
};
using ZeroedFloats = std::vector<float, ZeroedAllocator<float>>;

}  // namespace mend
