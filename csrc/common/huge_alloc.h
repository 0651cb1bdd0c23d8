// Allocator for the big construction arrays: blocks of 2 MiB and more come from
// mmap with MADV_HUGEPAGE. Suffix-automaton construction is a random walk over
// gigabytes, so TLB misses are a large part of its cost; transparent huge pages
// cut them (this machine's THP mode is "madvise", so we must ask).
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace recallspec {

template <class T>
struct HugeAllocator {
  using value_type = T;
  static constexpr size_t kHuge = size_t(2) << 20;

  HugeAllocator() = default;
  template <class U>
  HugeAllocator(const HugeAllocator<U>&) {}

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHuge) {
      void* p = std::malloc(bytes ? bytes : 1);
      if (!p) throw std::bad_alloc();
      return static_cast<T*>(p);
    }
    void* p = ::mmap(nullptr, round(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    static const bool enabled = std::getenv("RECALLSPEC_NO_HUGEPAGES") == nullptr;
    if (enabled) ::madvise(p, round(bytes), MADV_HUGEPAGE);
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHuge) std::free(p);
    else ::munmap(p, round(bytes));
  }
  static size_t round(size_t b) { return (b + kHuge - 1) / kHuge * kHuge; }

  template <class U>
  bool operator==(const HugeAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const HugeAllocator<U>&) const { return false; }
};

}  // namespace recallspec
