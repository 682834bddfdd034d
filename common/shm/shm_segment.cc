#include "common/shm/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace cairn::shm {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string msg = absl::StrCat(what, ": ", strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::StatusOr<char*> Map(int fd, size_t size, absl::string_view name) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    return ErrnoStatus(errno, absl::StrCat("mmap of shm segment ", name));
  }
  return static_cast<char*>(p);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(
    absl::string_view name, size_t size, mode_t mode, gid_t group) {
  if (size == 0 || name.size() < 2 || name[0] != '/' ||
      name.substr(1).find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad shm segment '", name, "' of ", size, " bytes"));
  }
  const std::string n(name);
  // Created 0600 (the umask can only narrow it), then set to exactly `mode`
  // and `group` before anything is in it.
  int fd = shm_open(n.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open ", n));
  if ((group != static_cast<gid_t>(-1) &&
       fchown(fd, static_cast<uid_t>(-1), group) != 0) ||
      fchmod(fd, mode & 0777) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(n.c_str());
    return ErrnoStatus(err, absl::StrCat("setting the owner group ",
                                         static_cast<int64_t>(group),
                                         " and mode of shm segment ", n));
  }
  // posix_fallocate reserves the pages now: a full /dev/shm is an error here
  // instead of a SIGBUS in the rank's memcpy later.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err != 0) {
    close(fd);
    shm_unlink(n.c_str());
    return ErrnoStatus(
        err, absl::StrCat("allocating ", size, " bytes for shm segment ", n));
  }
  absl::StatusOr<char*> data = Map(fd, size, n);
  close(fd);
  if (!data.ok()) {
    shm_unlink(n.c_str());
    return data.status();
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(n, *data, size, true));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(
    absl::string_view name, size_t size) {
  const std::string n(name);
  int fd = shm_open(n.c_str(), O_RDWR, 0);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open ", n));
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < size) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "shm segment ", n, " is smaller than the expected ", size, " bytes"));
  }
  absl::StatusOr<char*> data = Map(fd, size, n);
  close(fd);
  if (!data.ok()) return data.status();
  return std::unique_ptr<ShmSegment>(new ShmSegment(n, *data, size, false));
}

ShmSegment::~ShmSegment() {
  munmap(data_, size_);
  if (owner_) shm_unlink(name_.c_str());
}

int RemoveStaleSegments(absl::string_view prefix) {
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = e.path().filename().string();
    if (!absl::StartsWith(file, prefix)) continue;
    // "<prefix><pid>-<seq>": only a dead creator's segments are stale. A
    // live one may be another agent of the same node id (a rolling restart,
    // or tests running side by side) and its memory is in use.
    absl::string_view rest = absl::string_view(file).substr(prefix.size());
    int pid = 0;
    if (!absl::SimpleAtoi(rest.substr(0, rest.find('-')), &pid) || pid <= 0) {
      continue;
    }
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (shm_unlink(("/" + file).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace cairn::shm
