#include "common/shm/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"

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
  UniqueFd fd(shm_open(n.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("shm_open ", n));
  if ((group != static_cast<gid_t>(-1) &&
       fchown(fd.get(), static_cast<uid_t>(-1), group) != 0) ||
      fchmod(fd.get(), mode & 0777) != 0) {
    const int err = errno;
    shm_unlink(n.c_str());
    return ErrnoStatus(err, absl::StrCat("setting the owner group ",
                                         static_cast<int64_t>(group),
                                         " and mode of shm segment ", n));
  }
  // posix_fallocate reserves the pages now: a full /dev/shm is an error here
  // instead of a SIGBUS in the rank's memcpy later.
  int err = posix_fallocate(fd.get(), 0, static_cast<off_t>(size));
  if (err != 0) {
    shm_unlink(n.c_str());
    return ErrnoStatus(
        err, absl::StrCat("allocating ", size, " bytes for shm segment ", n));
  }
  absl::StatusOr<char*> data = Map(fd.get(), size, n);
  fd.Reset();  // the mapping stays
  if (!data.ok()) {
    shm_unlink(n.c_str());
    return data.status();
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(n, *data, size, true));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(
    absl::string_view name, size_t size) {
  const std::string n(name);
  UniqueFd fd(shm_open(n.c_str(), O_RDWR, 0));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("shm_open ", n));
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) < size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shm segment ", n, " is smaller than the expected ", size, " bytes"));
  }
  absl::StatusOr<char*> data = Map(fd.get(), size, n);
  fd.Reset();  // the mapping stays
  if (!data.ok()) return data.status();
  return std::unique_ptr<ShmSegment>(new ShmSegment(n, *data, size, false));
}

ShmSegment::~ShmSegment() {
  munmap(data_, size_);
  if (owner_) shm_unlink(name_.c_str());
}

namespace {

constexpr absl::string_view kLockSuffix = ".lock";

// True if the family of `lock_path` has no owner: its lock file is gone (a
// family creates it before any segment) or can be locked now.
bool FamilyIsDead(const std::string& lock_path) {
  const UniqueFd fd(open(lock_path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return errno == ENOENT;
  return flock(fd.get(), LOCK_EX | LOCK_NB) == 0;
}

// The legacy "<pid>" tag of a segment named before families: stale when
// that pid is not alive in this PID namespace.
bool LegacyPidIsDead(absl::string_view tag) {
  int pid = 0;
  if (!absl::SimpleAtoi(tag, &pid) || pid <= 0) return false;
  return kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SegmentFamily>> SegmentFamily::Claim(
    absl::string_view prefix) {
  std::random_device rd;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const uint64_t nonce = (uint64_t{rd()} << 32) ^ rd();
    const std::string tag =
        absl::StrCat(getpid(), "x", absl::Hex(nonce, absl::kZeroPad16));
    const std::string lock_path =
        absl::StrCat("/dev/shm/", prefix, tag, kLockSuffix);
    UniqueFd fd(
        open(lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid()) {
      if (errno == EEXIST) continue;  // a nonce collision: draw again
      return ErrnoStatus(errno, absl::StrCat("creating ", lock_path));
    }
    if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      return ErrnoStatus(err, absl::StrCat("locking ", lock_path));
    }
    // Another process's RemoveStaleSegments may have locked and unlinked the
    // file between our open and flock; then this lock protects nothing.
    struct stat held, named;
    if (fstat(fd.get(), &held) == 0 && stat(lock_path.c_str(), &named) == 0 &&
        held.st_ino == named.st_ino && held.st_dev == named.st_dev) {
      return std::unique_ptr<SegmentFamily>(new SegmentFamily(
          absl::StrCat(prefix, tag, "-"), lock_path, std::move(fd)));
    }
  }
  return absl::InternalError(absl::StrCat(
      "could not claim a shared-memory name family under /dev/shm/", prefix));
}

SegmentFamily::~SegmentFamily() {
  unlink(lock_path_.c_str());
  // Then fd_ closes, which releases the lock.
}

int RemoveStaleSegments(absl::string_view prefix) {
  // tag -> the family's entries (segments and lock file).
  std::map<std::string, std::vector<std::string>> families;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = e.path().filename().string();
    if (!absl::StartsWith(file, prefix)) continue;
    absl::string_view rest = absl::string_view(file).substr(prefix.size());
    std::string tag;
    if (absl::EndsWith(rest, kLockSuffix)) {
      tag = std::string(rest.substr(0, rest.size() - kLockSuffix.size()));
    } else if (const size_t dash = rest.rfind('-');
               dash != absl::string_view::npos) {
      tag = std::string(rest.substr(0, dash));
    } else {
      continue;
    }
    families[tag].push_back(file);
  }
  int removed = 0;
  for (const auto& [tag, files] : families) {
    const bool family = absl::StrContains(tag, 'x');
    const std::string lock_path =
        absl::StrCat("/dev/shm/", prefix, tag, kLockSuffix);
    if (family ? !FamilyIsDead(lock_path) : !LegacyPidIsDead(tag)) continue;
    for (const std::string& file : files) {
      if (absl::EndsWith(file, kLockSuffix)) continue;
      if (shm_unlink(("/" + file).c_str()) == 0) ++removed;
    }
    if (family) unlink(lock_path.c_str());
  }
  return removed;
}

}  // namespace cairn::shm
