#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace cairn {

// An uninitialized array of T's, for large arrays that live for one
// operation (a commit's gathered chunks: 585 MB at 16k ranks). Mapped
// directly and, from 2 MiB up, marked MADV_HUGEPAGE: where transparent huge
// pages are "madvise" (the default of most distributions) the kernel backs
// it with 2 MiB pages, one page fault where 4 KiB pages take 512 (first
// touches of fresh pages are expensive, on virtual machines most of all).
// Where huge pages are off it is an ordinary mapping.
// Unmapped on destruction: the memory goes back to the system at once.
template <typename T>
class LargeArray {
  static_assert(std::is_trivially_destructible_v<T> &&
                    std::is_trivially_default_constructible_v<T>,
                "LargeArray holds plain data");

 public:
  LargeArray() = default;
  // RESOURCE_EXHAUSTED when `size` T's cannot be mapped (or their bytes
  // overflow), naming `what` they were for.
  static absl::StatusOr<LargeArray> Allocate(size_t size,
                                             absl::string_view what) {
    LargeArray out;
    if (size == 0) return out;
    if (size > std::numeric_limits<size_t>::max() / sizeof(T)) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": ", size, " items overflow a size"));
    }
    const size_t bytes = size * sizeof(T);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": cannot map ", bytes, " bytes: ", std::strerror(err)));
    }
    if (bytes >= kHugePage) (void)madvise(p, bytes, MADV_HUGEPAGE);
    out.data_ = static_cast<T*>(p);
    out.size_ = size;
    out.bytes_ = bytes;
    return out;
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
