#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace cairn {

// An array of `size` T's, uninitialized, for large arrays that live for one
// operation (a commit's gathered chunks: 585 MB at 16k ranks). Mapped
// directly and, from 2 MiB up, marked MADV_HUGEPAGE: where transparent huge
// pages are "madvise" (the default of most distributions) the kernel backs
// it with 2 MiB pages, one page fault where 4 KiB pages take 512 (first
// touches of fresh 4 KiB pages were a tenth of a commit's CPU at 4096 ranks
// on a virtual machine). Where huge pages are off it is an ordinary mapping.
// Unmapped on destruction: the memory goes back to the system at once.
template <typename T>
class LargeArray {
  static_assert(std::is_trivially_destructible_v<T> &&
                    std::is_trivially_default_constructible_v<T>,
                "LargeArray holds plain data");

 public:
  LargeArray() = default;
  // Throws std::bad_alloc when the mapping fails, as new[] would.
  explicit LargeArray(size_t size) : size_(size) {
    if (size == 0) return;
    bytes_ = size * sizeof(T);
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (bytes_ >= kHugePage) (void)madvise(p, bytes_, MADV_HUGEPAGE);
    data_ = static_cast<T*>(p);
  }
  LargeArray(LargeArray&& other) noexcept { *this = std::move(other); }
  LargeArray& operator=(LargeArray&& other) noexcept {
    if (this != &other) {
      Release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  LargeArray(const LargeArray&) = delete;
  LargeArray& operator=(const LargeArray&) = delete;
  ~LargeArray() { Release(); }

  T* get() const { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) const { return data_[i]; }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;

  void Release() {
    if (data_ != nullptr) munmap(data_, bytes_);
    data_ = nullptr;
  }

  T* data_ = nullptr;
  size_t size_ = 0;
  size_t bytes_ = 0;
};

}  // namespace cairn
