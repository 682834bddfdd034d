#include "common/unique_fd.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <utility>

#include "gtest/gtest.h"

namespace cairn {
namespace {

// Whether `fd` is an open descriptor of this process.
bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }
// Whether `fd` is closed: fcntl fails on it with EBADF (not for another
// reason).
bool IsClosed(int fd) { return ::fcntl(fd, F_GETFD) == -1 && errno == EBADF; }

// A fresh descriptor (the read end of a pipe whose write end is closed).
int OpenFd() {
  int fds[2];
  EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  ::close(fds[1]);
  return fds[0];
}

TEST(UniqueFdTest, ClosesItsDescriptorWhenDestroyed) {
  const int fd = OpenFd();
  {
    UniqueFd owned(fd);
    EXPECT_TRUE(owned.valid());
    EXPECT_EQ(owned.get(), fd);
    EXPECT_TRUE(IsOpen(fd));
  }
  EXPECT_TRUE(IsClosed(fd));
}

TEST(UniqueFdTest, HoldsAFailedOpenAsInvalid) {
  UniqueFd none;
  EXPECT_FALSE(none.valid());
  EXPECT_EQ(none.get(), -1);
  UniqueFd failed(::open("/nonexistent/cairn", O_RDONLY | O_CLOEXEC));
  EXPECT_FALSE(failed.valid());
}

TEST(UniqueFdTest, MoveTransfersOwnership) {
  const int fd = OpenFd();
  UniqueFd a(fd);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): moved-from
  EXPECT_EQ(b.get(), fd);
  const int other = OpenFd();
  UniqueFd c(other);
  c = std::move(b);  // closes `other`, takes `fd`
  EXPECT_TRUE(IsClosed(other));
  EXPECT_EQ(c.get(), fd);
  EXPECT_TRUE(IsOpen(fd));
  c = std::move(c);  // self-move keeps it
  EXPECT_EQ(c.get(), fd);
  EXPECT_TRUE(IsOpen(fd));
}

TEST(UniqueFdTest, ResetClosesAndReleaseDoesNot) {
  const int first = OpenFd();
  UniqueFd owned(first);
  const int second = OpenFd();
  owned.Reset(second);
  EXPECT_TRUE(IsClosed(first));
  EXPECT_EQ(owned.get(), second);
  const int released = owned.Release();
  EXPECT_EQ(released, second);
  EXPECT_FALSE(owned.valid());
  EXPECT_TRUE(IsOpen(second));
  ::close(released);
  owned.Reset();  // holds none: closes nothing
  EXPECT_FALSE(owned.valid());
}

}  // namespace
}  // namespace cairn
