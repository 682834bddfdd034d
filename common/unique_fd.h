// UniqueFd: an owned file descriptor, closed when its owner goes away (as
// std::unique_ptr owns a pointer). Files, directories, sockets, eventfds and
// shared-memory objects that Cairn opens are held in one, so an early return
// cannot leak them.
//
// Example:
//   UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
//   if (!fd.valid()) return absl::ErrnoToStatus(errno, path);
//   ... ::read(fd.get(), buf, n) ...  // closed at the end of the scope
//
// Thread-compatible, as the int it holds: moving or resetting one that other
// threads use needs external synchronization.
#ifndef CAIRN_COMMON_UNIQUE_FD_H_
#define CAIRN_COMMON_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace cairn {

class UniqueFd {
 public:
  UniqueFd() = default;
  // Takes ownership of `fd`; a negative one (a failed open) is held as
  // invalid and never closed.
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(other.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // Closes the descriptor held (if any), then holds `fd`.
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Gives up ownership without closing: returns the descriptor held, and
  // holds none.
  [[nodiscard]] int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

}  // namespace cairn

#endif  // CAIRN_COMMON_UNIQUE_FD_H_
