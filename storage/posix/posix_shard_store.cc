// The posix ShardStore. See posix_shard_store.h for the behaviour; the
// mechanics are:
//
// Path resolution. A key's segments are walked one at a time from a
// directory fd on the root: openat(parent, segment, O_DIRECTORY | O_NOFOLLOW)
// for directories, openat / renameat / unlinkat (with O_NOFOLLOW where it
// applies) on the leaf directory fd for the object itself. No path string
// is ever handed to the kernel whole, so a symlink anywhere below the root
// is refused (ELOOP / ENOTDIR) rather than followed, and validated keys
// cannot name anything outside the root.
//
// Writes. An ObjectWriter creates ".cairn-tmp.<random>" in the object's
// directory (O_EXCL). Buffered mode: Append pwrite()s the caller's bytes in
// 1 MiB calls and every io_chunk_bytes asks the kernel to start writeback
// (sync_file_range(SYNC_FILE_RANGE_WRITE)) so that the fdatasync in Close()
// mostly waits for I/O already in flight. O_DIRECT mode: 4096-aligned
// caller buffers are written in place, split into io_chunk_bytes pieces
// written in parallel on the I/O pool (Append waits for them); other bytes
// are copied into aligned staging buffers that are written asynchronously
// (at most io_threads + 1 buffers in flight) while the caller continues.
// Close(): wait for in-flight writes, write the zero-padded tail and
// ftruncate to the real length (O_DIRECT), fdatasync, renameat to the final
// name, fsync the directory. Directories created on the way are made durable
// when they are created (fsync of their parent).
//
// Reads. One open + fstat per call; the requested ranges are sorted. A
// contiguous span is streamed sequentially in 1 MiB preads (readahead does
// the rest; splitting a cold sequential read over threads defeats it).
// Otherwise ranges adjacent in the file are merged into one preadv(), large
// ones split into io_chunk_bytes pieces, and the pieces read in parallel on
// the I/O pool with the calling thread taking its share.
#include "storage/posix/posix_shard_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/task_group.h"
#include "common/thread_pool.h"
#include "common/unique_fd.h"
#include "storage/store_util.h"

namespace cairn::storage {
namespace {

constexpr size_t kAlign = 4096;
constexpr absl::string_view kTempPrefix = ".cairn-tmp";
constexpr int kMaxIov = 1024;
// pread size when streaming a contiguous span (see ReadRangesImpl).
constexpr uint64_t kSequentialReadBytes = 1 << 20;
// pwrite size of buffered appends (see AppendBuffered).
constexpr size_t kBufferedWriteBytes = 1 << 20;

size_t RoundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

bool IsTempName(absl::string_view name) {
  return absl::StartsWith(name, kTempPrefix);
}

// "FIFO", "socket", ... for messages about a file that should be regular.
const char* FileTypeName(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

absl::Status ErrnoError(int err, absl::string_view what) {
  return absl::ErrnoToStatus(err, what);
}

bool IsNoSpace(int err) { return err == ENOSPC || err == EDQUOT; }

// RESOURCE_EXHAUSTED naming the object, what it needed and what is free.
absl::Status NoSpaceError(int fd, int err, absl::string_view key,
                          uint64_t needed) {
  std::string free = "unknown";
  struct statvfs vfs;
  if (::fstatvfs(fd, &vfs) == 0) {
    free = absl::StrCat(static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize);
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(err == EDQUOT ? "disk quota exceeded" : "no space left",
                   " on device writing '", key, "' (", needed,
                   " bytes needed, ", free, " free)"));
}

// Writes all of [data, data + n) at `offset`, retrying short writes and EINTR.
absl::Status PwriteAll(int fd, const char* data, size_t n, uint64_t offset,
                       absl::string_view key) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      if (IsNoSpace(errno)) return NoSpaceError(fd, errno, key, n);
      return ErrnoError(
          errno, absl::StrCat("writing object '", key, "' at offset ", offset));
    }
    if (w == 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "writing object '", key, "' at offset ", offset, ": wrote 0 bytes"));
    }
    data += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

// One preadv task: iovecs that are contiguous in the file from `offset`.
struct ReadPiece {
  uint64_t offset = 0;
  std::vector<iovec> iov;
  uint64_t bytes = 0;
};

absl::Status PreadvAll(int fd, ReadPiece piece, absl::string_view key) {
  size_t first = 0;
  uint64_t offset = piece.offset;
  while (first < piece.iov.size()) {
    const int cnt =
        static_cast<int>(std::min<size_t>(piece.iov.size() - first, kMaxIov));
    const ssize_t r =
        ::preadv(fd, &piece.iov[first], cnt, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(
          errno, absl::StrCat("reading object '", key, "' at offset ", offset));
    }
    if (r == 0) {
      return absl::DataLossError(absl::StrCat(
          "reading object '", key, "': unexpected end of file at ", offset));
    }
    offset += static_cast<uint64_t>(r);
    size_t left = static_cast<size_t>(r);
    while (left > 0 && first < piece.iov.size()) {
      iovec& v = piece.iov[first];
      if (left >= v.iov_len) {
        left -= v.iov_len;
        ++first;
      } else {
        v.iov_base = static_cast<char*>(v.iov_base) + left;
        v.iov_len -= left;
        left = 0;
      }
    }
    while (first < piece.iov.size() && piece.iov[first].iov_len == 0) ++first;
  }
  return absl::OkStatus();
}

struct AlignedFree {
  void operator()(char* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, AlignedFree>;

AlignedBuffer NewAlignedBuffer(size_t n) {
  return AlignedBuffer(static_cast<char*>(std::aligned_alloc(kAlign, n)));
}

// The directory fds from the root down to a key's leaf directory:
// fds[0] is the root, fds[i + 1] is fds[i]/names[i].
struct DirChain {
  std::vector<UniqueFd> fds;
  std::vector<std::string> names;
  int leaf() const { return fds.back().get(); }
};

class PosixShardStore;

class PosixObjectWriter : public ObjectWriter {
 public:
  PosixObjectWriter(PosixShardStore* store, std::string key, DirChain dirs,
                    std::string final_name, std::string temp_name, UniqueFd fd,
                    bool direct, uint64_t reserved, bool prealloc_ok);
  ~PosixObjectWriter() override;

  absl::Status Append(absl::Span<const char> data) override;
  absl::Status Close() override;
  uint64_t bytes_written() const override { return written_; }
  absl::Status RewritePrefix(absl::Span<const char> data) override;
  void SimulateCrashForTest() override;

 private:
  absl::Status AppendBuffered(absl::Span<const char> data);
  absl::Status AppendDirect(absl::Span<const char> data);
  // Writes [data, data + n) at file offset `offset` in parallel pieces and
  // waits. O_DIRECT requires aligned data, offset and n.
  absl::Status WriteParallel(const char* data, size_t n, uint64_t offset);
  // Hands the current staging buffer (staged_ bytes, padded to kAlign when
  // `pad`) to the pool.
  absl::Status FlushStaging(bool pad);
  absl::Status Fail(absl::Status s);
  void Abort();

  PosixShardStore* const store_;
  const std::string key_;
  DirChain dirs_;
  const std::string final_name_;
  const std::string temp_name_;
  UniqueFd fd_;
  const bool direct_;
  const size_t chunk_;

  // File space is reserved (fallocate with FALLOC_FL_KEEP_SIZE): the
  // expected size when the writer is created, and with O_DIRECT whatever a
  // write reaches beyond that, exactly (never ahead), so that pieces written
  // in parallel and out of order still land in reserved extents and a full
  // disk fails the reservation rather than a write. Close() truncates an
  // unused reservation back to the real length.
  absl::Status Reserve(uint64_t end);
  uint64_t allocated_ = 0;
  bool prealloc_ok_ = true;

  uint64_t written_ = 0;      // bytes accepted
  uint64_t file_offset_ = 0;  // bytes handed to pwrite (direct: aligned)
  uint64_t synced_to_ = 0;    // buffered: start of the unsynced range
  absl::Status status_;       // sticky error
  bool closed_ = false;
  bool crashed_ = false;

  // O_DIRECT staging. Buffers are owned here; a buffer in `busy_` is being
  // written by a pool task.
  TaskGroup tasks_;
  AlignedBuffer staging_;
  size_t staged_ = 0;
  absl::Mutex buf_mu_;
  std::vector<AlignedBuffer> free_ ABSL_GUARDED_BY(buf_mu_);
  int buffers_ = 0;  // allocated so far
};

class PosixShardStore : public ShardStore {
 public:
  PosixShardStore(std::string root, UniqueFd root_fd,
                  const StoreOptions& options)
      : root_(std::move(root)),
        root_fd_(std::move(root_fd)),
        options_(options),
        chunk_(
            RoundUp(std::max<size_t>(options.io_chunk_bytes, kAlign), kAlign)),
        pool_(options.io_threads > 1
                  ? std::make_unique<ThreadPool>(options.io_threads - 1)
                  : nullptr) {}

  std::string uri() const override { return absl::StrCat("file://", root_); }
  bool CanRewritePrefix() const override { return true; }

  using ShardStore::NewWriter;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(
      absl::string_view key, const WriterOptions& options) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    std::vector<std::string> segs = absl::StrSplit(key, '/');
    const std::string name = segs.back();
    segs.pop_back();
    // A concurrent Delete may remove an emptied directory between the walk
    // and the create: walk again.
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<DirChain> walked = Walk(key, segs, /*create=*/true);
      if (absl::IsNotFound(walked.status()) && attempt < 8) continue;
      CAIRN_RETURN_IF_ERROR(walked.status());
      DirChain dirs = std::move(walked).value();
      thread_local absl::BitGen bitgen;
      const std::string temp = absl::StrFormat("%s.%016x", kTempPrefix,
                                               absl::Uniform<uint64_t>(bitgen));
      // A prefix rewritten in place is a buffered pwrite (with O_DIRECT it
      // would be an aligned read-modify-write of a block in flight).
      bool direct = options_.use_odirect && !options.rewrite_prefix &&
                    !odirect_refused_.load();
      int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
      int fd = ::openat(dirs.leaf(), temp.c_str(),
                        flags | (direct ? O_DIRECT : 0), 0644);
      if (fd < 0 && direct && errno == EINVAL) {
        if (!odirect_refused_.exchange(true)) {
          CAIRN_LOG(warn,
                    "store {}: the filesystem refuses O_DIRECT; using buffered "
                    "writes",
                    uri());
        }
        direct = false;
        ::unlinkat(dirs.leaf(), temp.c_str(), 0);  // may have been created
        fd = ::openat(dirs.leaf(), temp.c_str(), flags, 0644);
      }
      if (fd < 0) {
        if (errno == ENOENT && attempt < 8) continue;
        return ErrnoError(errno, absl::StrCat("creating a temp file for '", key,
                                              "' in ", uri()));
      }
      UniqueFd file(fd);
      // Reserve exactly what the object will hold: a save that cannot fit
      // fails here, before it writes, naming the object.
      uint64_t reserved = 0;
      bool prealloc_ok = true;
      if (options.expected_bytes > 0) {
        const uint64_t want = direct ? RoundUp(options.expected_bytes, kAlign)
                                     : options.expected_bytes;
        if (::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(want)) ==
            0) {
          reserved = want;
        } else if (IsNoSpace(errno)) {
          absl::Status s = NoSpaceError(fd, errno, key, options.expected_bytes);
          file.Reset();
          ::unlinkat(dirs.leaf(), temp.c_str(), 0);
          RemoveEmptyDirs(dirs);
          return s;
        } else {
          prealloc_ok = false;  // EOPNOTSUPP etc.: write without one
        }
      }
      return std::unique_ptr<ObjectWriter>(new PosixObjectWriter(
          this, std::string(key), std::move(dirs), name, temp, std::move(file),
          direct, reserved, prealloc_ok));
    }
  }

  absl::Status Put(absl::string_view key,
                   absl::Span<const char> data) override {
    WriterOptions wo;
    wo.expected_bytes = data.size();
    CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer,
                           NewWriter(key, wo));
    CAIRN_RETURN_IF_ERROR(writer->Append(data));
    return writer->Close();
  }

  // A durable temp file hard-linked to the final name: link(2) fails with
  // EEXIST when the name exists (rename would replace it), and the object
  // appears whole or not at all.
  absl::Status PutIfAbsent(absl::string_view key,
                           absl::Span<const char> data) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    std::vector<std::string> segs = absl::StrSplit(key, '/');
    const std::string name = segs.back();
    segs.pop_back();
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<DirChain> walked = Walk(key, segs, /*create=*/true);
      if (absl::IsNotFound(walked.status()) && attempt < 8) continue;
      CAIRN_RETURN_IF_ERROR(walked.status());
      const DirChain dirs = std::move(walked).value();
      thread_local absl::BitGen bitgen;
      const std::string temp = absl::StrFormat("%s.%016x", kTempPrefix,
                                               absl::Uniform<uint64_t>(bitgen));
      const int fd =
          ::openat(dirs.leaf(), temp.c_str(),
                   O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0) {
        if (errno == ENOENT && attempt < 8) continue;
        return ErrnoError(errno, absl::StrCat("creating a temp file for '", key,
                                              "' in ", uri()));
      }
      UniqueFd file(fd);
      absl::Status s = PwriteAll(fd, data.data(), data.size(), 0, key);
      if (s.ok() && options_.durable && ::fdatasync(fd) != 0) {
        s = ErrnoError(errno, absl::StrCat("fdatasync of '", key, "'"));
      }
      file.Reset();
      bool vanished = false;
      if (s.ok() && ::linkat(dirs.leaf(), temp.c_str(), dirs.leaf(),
                             name.c_str(), 0) != 0) {
        const int err = errno;
        if (err == EEXIST) {
          s = absl::AlreadyExistsError(
              absl::StrCat("object '", key, "' already exists in ", uri()));
        } else if (err == ENOENT) {
          vanished = true;  // a concurrent DeletePrefix took the temp file
        } else {
          s = ErrnoError(err, absl::StrCat("linking the temp file of '", key,
                                           "' into place in ", uri()));
        }
      }
      ::unlinkat(dirs.leaf(), temp.c_str(), 0);
      if (vanished && attempt < 8) continue;
      if (vanished) {
        s = absl::AbortedError(absl::StrCat(
            "the temp file of '", key, "' was deleted before it was linked"));
      }
      if (s.ok() && options_.durable && ::fsync(dirs.leaf()) != 0) {
        s = ErrnoError(errno,
                       absl::StrCat("fsync of the directory of '", key, "'"));
      }
      if (!s.ok() && !absl::IsAlreadyExists(s)) RemoveEmptyDirs(dirs);
      return s;
    }
  }

  absl::StatusOr<size_t> Read(absl::string_view key, ByteRange range,
                              absl::Span<char> out) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    CAIRN_RETURN_IF_ERROR(internal::CheckOutBuffer(key, range, out.size()));
    const absl::Span<char> outs[] = {out.subspan(0, range.length)};
    CAIRN_RETURN_IF_ERROR(ReadRangesImpl(key, absl::MakeConstSpan(&range, 1),
                                         absl::MakeConstSpan(outs)));
    return static_cast<size_t>(range.length);
  }

  absl::Status ReadRanges(absl::string_view key,
                          absl::Span<const ByteRange> ranges,
                          absl::Span<const absl::Span<char>> outs) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    CAIRN_RETURN_IF_ERROR(internal::CheckRangeBuffers(key, ranges, outs));
    return ReadRangesImpl(key, ranges, outs);
  }

  absl::StatusOr<uint64_t> Size(absl::string_view key) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    std::vector<std::string> segs = absl::StrSplit(key, '/');
    const std::string name = segs.back();
    segs.pop_back();
    CAIRN_ASSIGN_OR_RETURN(DirChain dirs, WalkExisting(key, segs));
    struct stat st;
    if (::fstatat(dirs.leaf(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return internal::ObjectNotFound(uri(), key);
      return ErrnoError(errno, absl::StrCat("stat of '", key, "'"));
    }
    if (!S_ISREG(st.st_mode)) return internal::ObjectNotFound(uri(), key);
    return static_cast<uint64_t>(st.st_size);
  }

  absl::StatusOr<std::vector<std::string>> List(
      absl::string_view prefix) override {
    CAIRN_RETURN_IF_ERROR(ValidatePrefix(prefix));
    std::vector<std::string> keys;
    CAIRN_RETURN_IF_ERROR(ForEachUnder(
        prefix, /*include_temp=*/false,
        [&](int, const std::string&, const std::string& key) {
          keys.push_back(key);
          return absl::OkStatus();
        },
        nullptr));
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  absl::StatusOr<std::vector<std::string>> ListChildren(
      absl::string_view dir_prefix) override {
    if (!dir_prefix.empty() && !absl::EndsWith(dir_prefix, "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("ListChildren: prefix '", dir_prefix,
                       "' must be empty or end in '/'"));
    }
    CAIRN_RETURN_IF_ERROR(ValidatePrefix(dir_prefix));
    std::vector<std::string> segs;
    if (!dir_prefix.empty()) {
      segs = absl::StrSplit(dir_prefix.substr(0, dir_prefix.size() - 1), '/');
    }
    absl::StatusOr<DirChain> dirs = WalkExisting(dir_prefix, segs);
    if (absl::IsNotFound(dirs.status())) return std::vector<std::string>();
    CAIRN_RETURN_IF_ERROR(dirs.status());
    std::vector<std::string> children;
    const int leaf = dirs->leaf();
    CAIRN_RETURN_IF_ERROR(
        ReadDir(leaf, dir_prefix,
                [&](const std::string& name, bool is_dir) -> absl::Status {
                  if (IsTempName(name)) return absl::OkStatus();
                  if (!is_dir) {
                    children.push_back(name);
                    return absl::OkStatus();
                  }
                  // Directories holding only in-flight or crashed temp files
                  // (or nothing) have no visible keys below them.
                  UniqueFd sub(::openat(
                      leaf, name.c_str(),
                      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
                  if (!sub.valid())
                    return absl::OkStatus();  // raced or a symlink
                  CAIRN_ASSIGN_OR_RETURN(
                      bool visible, HasVisibleObject(sub.get(), dir_prefix));
                  if (visible) children.push_back(name + "/");
                  return absl::OkStatus();
                }));
    std::sort(children.begin(), children.end());
    return children;
  }

  absl::Status Delete(absl::string_view key) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    std::vector<std::string> segs = absl::StrSplit(key, '/');
    const std::string name = segs.back();
    segs.pop_back();
    CAIRN_ASSIGN_OR_RETURN(DirChain dirs, WalkExisting(key, segs));
    struct stat st;
    if (::fstatat(dirs.leaf(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode)) {
      return internal::ObjectNotFound(uri(), key);
    }
    if (::unlinkat(dirs.leaf(), name.c_str(), 0) != 0) {
      if (errno == ENOENT) return internal::ObjectNotFound(uri(), key);
      return ErrnoError(errno, absl::StrCat("deleting '", key, "' in ", uri()));
    }
    // The deletion must be durable before anything that relies on it
    // (DeleteStep removes MANIFEST first, then the data).
    if (options_.durable && ::fsync(dirs.leaf()) != 0) {
      return ErrnoError(errno, absl::StrCat("fsync of the directory of '", key,
                                            "' after deleting it"));
    }
    RemoveEmptyDirs(dirs);
    return absl::OkStatus();
  }

  absl::Status DeletePrefix(absl::string_view prefix) override {
    CAIRN_RETURN_IF_ERROR(ValidatePrefix(prefix));
    // Files first (temp files of crashed writers included), then every
    // directory that became empty, deepest first.
    CAIRN_RETURN_IF_ERROR(ForEachUnder(
        prefix, /*include_temp=*/true,
        [&](int dir_fd, const std::string& name,
            const std::string& key) -> absl::Status {
          if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
            return ErrnoError(errno,
                              absl::StrCat("deleting '", key, "' in ", uri()));
          }
          return absl::OkStatus();
        },
        [&](int parent_fd, const std::string& name) {
          ::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR);  // if empty
        }));
    // The prefix's own directory chain may now be empty too.
    const size_t slash = prefix.rfind('/');
    if (slash != absl::string_view::npos) {
      std::vector<std::string> segs =
          absl::StrSplit(prefix.substr(0, slash), '/');
      absl::StatusOr<DirChain> dirs = WalkExisting(prefix, segs);
      if (dirs.ok()) RemoveEmptyDirs(*dirs);
    }
    return absl::OkStatus();
  }

  absl::Status DeleteAbandonedWrites(absl::string_view dir_prefix) override {
    CAIRN_RETURN_IF_ERROR(ShardStore::DeleteAbandonedWrites(dir_prefix));
    // Temp files only (Recurse offers those of every directory inside the
    // prefix), then every directory that became empty, deepest first.
    return ForEachUnder(
        dir_prefix, /*include_temp=*/true,
        [&](int dir_fd, const std::string& name,
            const std::string& key) -> absl::Status {
          if (!IsTempName(name)) return absl::OkStatus();
          if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
            return ErrnoError(errno, absl::StrCat("deleting abandoned '", key,
                                                  "' in ", uri()));
          }
          CAIRN_LOG(info, "removed {} of an unfinished write in {}", key,
                    uri());
          return absl::OkStatus();
        },
        [&](int parent_fd, const std::string& name) {
          ::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR);  // if empty
        });
  }

  // Walks `segs` from the root, creating missing directories when `create`.
  absl::StatusOr<DirChain> Walk(absl::string_view key,
                                const std::vector<std::string>& segs,
                                bool create) {
    DirChain chain;
    const int root = ::fcntl(root_fd_.get(), F_DUPFD_CLOEXEC, 0);
    if (root < 0) return ErrnoError(errno, "dup of the root directory fd");
    chain.fds.emplace_back(root);
    for (const std::string& seg : segs) {
      const int parent = chain.leaf();
      bool created = false;
      if (create) {
        if (::mkdirat(parent, seg.c_str(), 0755) == 0) {
          created = true;
        } else if (errno != EEXIST) {
          if (errno == ENOENT) {  // parent removed under us
            return absl::NotFoundError(absl::StrCat(
                "directory of '", key, "' vanished while creating it"));
          }
          return ErrnoError(
              errno, absl::StrCat("creating directory '", seg, "' for '", key,
                                  "' in ", uri()));
        }
      }
      const int fd = ::openat(parent, seg.c_str(),
                              O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) {
        const int err = errno;
        if (err == ENOENT) {
          return absl::NotFoundError(
              absl::StrCat("object '", key, "' not found in ", uri(),
                           " (no directory '", seg, "')"));
        }
        if (err == ENOTDIR || err == ELOOP) {
          const std::string msg =
              absl::StrCat("path segment '", seg, "' of '", key, "' in ", uri(),
                           " is not a directory (an object or a symlink)");
          return create ? absl::FailedPreconditionError(msg)
                        : absl::NotFoundError(msg);
        }
        return ErrnoError(err, absl::StrCat("opening directory '", seg,
                                            "' of '", key, "' in ", uri()));
      }
      chain.fds.emplace_back(fd);
      chain.names.push_back(seg);
      // A new directory entry must be durable before the object inside it.
      if (created && options_.durable && ::fsync(parent) != 0) {
        return ErrnoError(errno, absl::StrCat("fsync of the parent of '", seg,
                                              "' for '", key, "'"));
      }
    }
    return chain;
  }

  absl::StatusOr<DirChain> WalkExisting(absl::string_view key,
                                        const std::vector<std::string>& segs) {
    return Walk(key, segs, /*create=*/false);
  }

  // Removes the chain's directories from the deepest up while they are
  // empty (never the root).
  void RemoveEmptyDirs(const DirChain& chain) {
    for (size_t i = chain.names.size(); i > 0; --i) {
      if (::unlinkat(chain.fds[i - 1].get(), chain.names[i - 1].c_str(),
                     AT_REMOVEDIR) != 0) {
        return;  // not empty (or already gone): stop
      }
    }
  }

  const StoreOptions& options() const { return options_; }
  size_t chunk() const { return chunk_; }
  ThreadPool* pool() { return pool_.get(); }

 private:
  // Reads ranges (already checked against the buffers) from one open file.
  absl::Status ReadRangesImpl(absl::string_view key,
                              absl::Span<const ByteRange> ranges,
                              absl::Span<const absl::Span<char>> outs) {
    std::vector<std::string> segs = absl::StrSplit(key, '/');
    const std::string name = segs.back();
    segs.pop_back();
    CAIRN_ASSIGN_OR_RETURN(DirChain dirs, WalkExisting(key, segs));
    // O_NONBLOCK: opening a FIFO put where an object was would otherwise
    // block until some process opens it for writing (a load or `cairn
    // verify` hung forever). Non-regular files are refused before any read.
    UniqueFd fd(::openat(dirs.leaf(), name.c_str(),
                         O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
    if (!fd.valid()) {
      if (errno == ENOENT || errno == ELOOP) {
        return internal::ObjectNotFound(uri(), key);
      }
      if (errno == ENXIO) {  // a socket, or a device without a driver
        return absl::DataLossError(
            absl::StrCat("object '", key, "' in ", uri(),
                         " is not a regular file (a socket or a device); "
                         "refusing to read it"));
      }
      return ErrnoError(errno, absl::StrCat("opening '", key, "' in ", uri()));
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) {
      return ErrnoError(errno, absl::StrCat("stat of '", key, "'"));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::DataLossError(absl::StrCat(
          "object '", key, "' in ", uri(), " is not a regular file (",
          FileTypeName(st.st_mode), "); refusing to read it"));
    }
    // Back to ordinary blocking reads (O_NONBLOCK means nothing for regular
    // files on Linux, but keep the descriptor's flags plain).
    const int fl = ::fcntl(fd.get(), F_GETFL);
    if (fl >= 0) (void)::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK);
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    for (const ByteRange& r : ranges) {
      CAIRN_RETURN_IF_ERROR(internal::CheckRange(uri(), key, r, size));
    }

    // Sort by offset. When the ranges form one dense span (a whole object,
    // adjacent chunks, or a strided part of a chunk such as the columns of
    // a row-major block: every gap under kSequentialReadBytes) the span is
    // read front to back on this thread: the kernel's readahead then streams
    // it (splitting it over threads defeats readahead on a cold cache, and a
    // strided pattern read out of order by several threads more so). Only
    // the requested bytes are copied out; readahead pulls small gaps into
    // the page cache, where a rank reading the other columns finds them.
    // Sparse ranges are merged where they touch, split into io_chunk_bytes
    // pieces and read in parallel.
    std::vector<size_t> order(ranges.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ranges[a].offset < ranges[b].offset;
    });
    uint64_t span_end = 0;
    bool dense = true;
    for (size_t k = 0; k < order.size(); ++k) {
      const ByteRange& r = ranges[order[k]];
      if (k > 0 && r.offset > span_end + kSequentialReadBytes) dense = false;
      span_end = std::max(span_end, r.offset + r.length);
    }
    const uint64_t span_begin = order.empty() ? 0 : ranges[order[0]].offset;
    const uint64_t span_bytes = span_end - span_begin;
    const uint64_t cap = dense ? kSequentialReadBytes : chunk_;
    std::vector<ReadPiece> pieces;
    for (size_t i : order) {
      uint64_t off = ranges[i].offset;
      char* dst = outs[i].data();
      uint64_t left = ranges[i].length;
      while (left > 0) {
        ReadPiece* p = pieces.empty() ? nullptr : &pieces.back();
        if (p == nullptr || p->offset + p->bytes != off || p->bytes >= cap ||
            p->iov.size() >= static_cast<size_t>(kMaxIov)) {
          pieces.emplace_back();
          p = &pieces.back();
          p->offset = off;
        }
        const uint64_t take = std::min<uint64_t>(left, cap - p->bytes);
        p->iov.push_back(iovec{dst, static_cast<size_t>(take)});
        p->bytes += take;
        off += take;
        dst += take;
        left -= take;
      }
    }
    if (dense || pieces.size() <= 1 || pool_ == nullptr) {
      if (dense && span_bytes >= 2 * kSequentialReadBytes) {
        ::posix_fadvise(fd.get(), static_cast<off_t>(span_begin),
                        static_cast<off_t>(span_bytes), POSIX_FADV_SEQUENTIAL);
      }
      for (ReadPiece& p : pieces) {
        CAIRN_RETURN_IF_ERROR(PreadvAll(fd.get(), std::move(p), key));
      }
      return absl::OkStatus();
    }
    TaskGroup group(pool_.get());
    const int fdv = fd.get();
    // The calling thread takes every io_threads-th piece itself.
    const size_t stride = static_cast<size_t>(options_.io_threads);
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (i % stride == 0) continue;
      group.Run([fdv, &pieces, i, key] {
        return PreadvAll(fdv, std::move(pieces[i]), key);
      });
    }
    for (size_t i = 0; i < pieces.size(); i += stride) {
      group.RunInline([fdv, &pieces, i, key] {
        return PreadvAll(fdv, std::move(pieces[i]), key);
      });
    }
    return group.Wait();
  }

  // Reads one directory: fn(name, is_dir) for every entry but "." and "..";
  // symlinks and other non-regular entries are skipped.
  absl::Status ReadDir(
      int dir_fd, absl::string_view where,
      const std::function<absl::Status(const std::string&, bool)>& fn) {
    UniqueFd opened(::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!opened.valid()) {
      return ErrnoError(errno, absl::StrCat("opening '", where, "'"));
    }
    DIR* dir = ::fdopendir(opened.get());
    if (dir == nullptr) {
      return ErrnoError(errno, absl::StrCat("listing '", where, "'"));
    }
    const int fd = opened.Release();  // the DIR owns it: closedir closes it
    std::vector<std::pair<std::string, bool>> entries;
    errno = 0;
    while (struct dirent* e = ::readdir(dir)) {
      const absl::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      unsigned char type = e->d_type;
      if (type == DT_UNKNOWN) {
        struct stat st;
        if (::fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        type = S_ISDIR(st.st_mode)   ? DT_DIR
               : S_ISREG(st.st_mode) ? DT_REG
                                     : DT_UNKNOWN;
      }
      if (type == DT_DIR || type == DT_REG) {
        entries.emplace_back(std::string(name), type == DT_DIR);
      }
    }
    const int err = errno;
    ::closedir(dir);
    if (err != 0) {
      return ErrnoError(err, absl::StrCat("listing '", where, "'"));
    }
    for (const auto& [name, is_dir] : entries) {
      CAIRN_RETURN_IF_ERROR(fn(name, is_dir));
    }
    return absl::OkStatus();
  }

  // Whether the tree below dir_fd holds a visible object (depth-first,
  // stops at the first one).
  absl::StatusOr<bool> HasVisibleObject(int dir_fd, absl::string_view where) {
    std::vector<std::string> subdirs;
    bool found = false;
    CAIRN_RETURN_IF_ERROR(
        ReadDir(dir_fd, where, [&](const std::string& name, bool is_dir) {
          if (is_dir) {
            subdirs.push_back(name);
          } else if (!IsTempName(name)) {
            found = true;
          }
          return absl::OkStatus();
        }));
    if (found) return true;
    for (const std::string& name : subdirs) {
      UniqueFd sub(::openat(dir_fd, name.c_str(),
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub.valid()) continue;
      CAIRN_ASSIGN_OR_RETURN(bool visible, HasVisibleObject(sub.get(), where));
      if (visible) return true;
    }
    return false;
  }

  // Calls on_file(dir_fd, name, key) for every file whose key starts with
  // `prefix` and, after a directory's contents, on_dir_done(parent_fd, name).
  absl::Status ForEachUnder(
      absl::string_view prefix, bool include_temp,
      const std::function<absl::Status(int, const std::string&,
                                       const std::string&)>& on_file,
      const std::function<void(int, const std::string&)>& on_dir_done) {
    const size_t slash = prefix.rfind('/');
    const absl::string_view dir_part =
        slash == absl::string_view::npos ? "" : prefix.substr(0, slash + 1);
    std::vector<std::string> segs;
    if (!dir_part.empty()) {
      segs = absl::StrSplit(dir_part.substr(0, dir_part.size() - 1), '/');
    }
    absl::StatusOr<DirChain> dirs = WalkExisting(prefix, segs);
    if (absl::IsNotFound(dirs.status())) return absl::OkStatus();
    CAIRN_RETURN_IF_ERROR(dirs.status());
    return Recurse(dirs->leaf(), std::string(dir_part), prefix, include_temp,
                   on_file, on_dir_done);
  }

  absl::Status Recurse(
      int dir_fd, const std::string& dir_key, absl::string_view prefix,
      bool include_temp,
      const std::function<absl::Status(int, const std::string&,
                                       const std::string&)>& on_file,
      const std::function<void(int, const std::string&)>& on_dir_done) {
    return ReadDir(
        dir_fd, dir_key,
        [&](const std::string& name, bool is_dir) -> absl::Status {
          const std::string key = dir_key + name;
          if (is_dir) {
            const std::string sub = key + "/";
            // Descend only where keys can still match the prefix.
            if (!absl::StartsWith(sub, prefix) &&
                !absl::StartsWith(prefix, sub)) {
              return absl::OkStatus();
            }
            UniqueFd fd(
                ::openat(dir_fd, name.c_str(),
                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!fd.valid()) {
              if (errno == ENOENT) return absl::OkStatus();  // raced
              return ErrnoError(errno, absl::StrCat("opening '", sub, "'"));
            }
            CAIRN_RETURN_IF_ERROR(Recurse(fd.get(), sub, prefix, include_temp,
                                          on_file, on_dir_done));
            if (on_dir_done && absl::StartsWith(sub, prefix)) {
              on_dir_done(dir_fd, name);
            }
            return absl::OkStatus();
          }
          if (IsTempName(name)) {
            // A temp file belongs to its directory: it goes when the
            // directory is wholly inside the prefix.
            if (include_temp && absl::StartsWith(dir_key, prefix)) {
              return on_file(dir_fd, name, key);
            }
            return absl::OkStatus();
          }
          if (!absl::StartsWith(key, prefix)) return absl::OkStatus();
          return on_file(dir_fd, name, key);
        });
  }

  // Constant after construction.
  const std::string root_;
  const UniqueFd root_fd_;
  const StoreOptions options_;
  const size_t chunk_;
  const std::unique_ptr<ThreadPool> pool_;

  std::atomic<bool> odirect_refused_{false};
};

PosixObjectWriter::PosixObjectWriter(PosixShardStore* store, std::string key,
                                     DirChain dirs, std::string final_name,
                                     std::string temp_name, UniqueFd fd,
                                     bool direct, uint64_t reserved,
                                     bool prealloc_ok)
    : store_(store),
      key_(std::move(key)),
      dirs_(std::move(dirs)),
      final_name_(std::move(final_name)),
      temp_name_(std::move(temp_name)),
      fd_(std::move(fd)),
      direct_(direct),
      chunk_(store->chunk()),
      allocated_(reserved),
      prealloc_ok_(prealloc_ok),
      tasks_(store->pool()) {}

PosixObjectWriter::~PosixObjectWriter() {
  tasks_.Wait().IgnoreError();
  if (!closed_ && !crashed_) Abort();
}

void PosixObjectWriter::Abort() {
  tasks_.Wait().IgnoreError();
  if (fd_.valid()) {
    fd_.Reset();
    ::unlinkat(dirs_.leaf(), temp_name_.c_str(), 0);
    store_->RemoveEmptyDirs(dirs_);
  }
}

void PosixObjectWriter::SimulateCrashForTest() {
  tasks_.Wait().IgnoreError();
  fd_.Reset();  // the temp file stays, as after a real crash
  crashed_ = true;
  if (status_.ok()) {
    status_ = absl::FailedPreconditionError(
        absl::StrCat("writer of '", key_, "' after a simulated crash"));
  }
}

absl::Status PosixObjectWriter::Fail(absl::Status s) {
  if (status_.ok()) status_ = s;
  Abort();
  return s;
}

absl::Status PosixObjectWriter::Append(absl::Span<const char> data) {
  if (closed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Append to the writer of '", key_, "' after Close()"));
  }
  CAIRN_RETURN_IF_ERROR(status_);
  absl::Status s = direct_ ? AppendDirect(data) : AppendBuffered(data);
  if (!s.ok()) return Fail(std::move(s));
  written_ += data.size();
  return absl::OkStatus();
}

absl::Status PosixObjectWriter::RewritePrefix(absl::Span<const char> data) {
  if (closed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RewritePrefix on the writer of '", key_, "' after Close()"));
  }
  CAIRN_RETURN_IF_ERROR(status_);
  if (direct_ || data.size() > written_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RewritePrefix of ", data.size(), " bytes on the writer of '", key_,
        "', which has ", written_,
        direct_ ? " with O_DIRECT (open it with WriterOptions::rewrite_prefix)"
                : ""));
  }
  absl::Status s = PwriteAll(fd_.get(), data.data(), data.size(), 0, key_);
  if (!s.ok()) return Fail(std::move(s));
  return absl::OkStatus();
}

absl::Status PosixObjectWriter::AppendBuffered(absl::Span<const char> data) {
  // 1 MiB pwrites: one huge pwrite into the page cache costs several times
  // the kernel time per byte of the same bytes in 1 MiB calls. Every
  // io_chunk_bytes, writeback of what is complete is started now
  // (SYNC_FILE_RANGE_WRITE), so that Close()'s fdatasync mostly waits for
  // I/O already under way instead of starting it all.
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const size_t n = std::min<size_t>(left, kBufferedWriteBytes);
    CAIRN_RETURN_IF_ERROR(PwriteAll(fd_.get(), p, n, file_offset_, key_));
    file_offset_ += n;
    p += n;
    left -= n;
    if (store_->options().durable && file_offset_ - synced_to_ >= chunk_) {
      ::sync_file_range(fd_.get(), static_cast<off_t>(synced_to_),
                        static_cast<off_t>(file_offset_ - synced_to_),
                        SYNC_FILE_RANGE_WRITE);
      synced_to_ = file_offset_;
    }
  }
  return absl::OkStatus();
}

absl::Status PosixObjectWriter::WriteParallel(const char* data, size_t n,
                                              uint64_t offset) {
  TaskGroup group(store_->pool());
  const int fd = fd_.get();
  const std::string& key = key_;
  std::vector<std::pair<size_t, size_t>> pieces;  // (pos, len)
  for (size_t pos = 0; pos < n; pos += chunk_) {
    pieces.emplace_back(pos, std::min(chunk_, n - pos));
  }
  for (size_t i = 1; i < pieces.size(); ++i) {
    const size_t pos = pieces[i].first;
    const size_t len = pieces[i].second;
    group.Run([=, &key] {
      return PwriteAll(fd, data + pos, len, offset + pos, key);
    });
  }
  if (!pieces.empty()) {
    const size_t len = pieces[0].second;
    group.RunInline(
        [=, &key] { return PwriteAll(fd, data, len, offset, key); });
  }
  return group.Wait();
}

absl::Status PosixObjectWriter::Reserve(uint64_t end) {
  if (!prealloc_ok_ || end <= allocated_) return absl::OkStatus();
  // Exactly up to `end`: reserving ahead (64 MiB per writer, once) made
  // saves fail with space still free.
  if (::fallocate(fd_.get(), FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(allocated_),
                  static_cast<off_t>(end - allocated_)) == 0) {
    allocated_ = end;
    return absl::OkStatus();
  }
  if (IsNoSpace(errno)) {
    return NoSpaceError(fd_.get(), errno, key_, end - allocated_);
  }
  prealloc_ok_ = false;  // EOPNOTSUPP etc.: write without a reservation
  return absl::OkStatus();
}

absl::Status PosixObjectWriter::FlushStaging(bool pad) {
  size_t n = staged_;
  if (n == 0) return absl::OkStatus();
  if (pad) {
    const size_t padded = RoundUp(n, kAlign);
    std::memset(staging_.get() + n, 0, padded - n);
    n = padded;
  }
  const uint64_t offset = file_offset_;
  CAIRN_RETURN_IF_ERROR(Reserve(offset + n));
  file_offset_ += n;
  staged_ = 0;
  char* buf = staging_.release();
  const int fd = fd_.get();
  tasks_.Run([this, buf, n, offset, fd] {
    absl::Status s = PwriteAll(fd, buf, n, offset, key_);
    absl::MutexLock lock(&buf_mu_);
    free_.emplace_back(buf);
    return s;
  });
  return tasks_.status();
}

absl::Status PosixObjectWriter::AppendDirect(absl::Span<const char> data) {
  const char* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    // In-place path: nothing staged and the caller's bytes are aligned.
    if (staged_ == 0 && reinterpret_cast<uintptr_t>(p) % kAlign == 0 &&
        n >= kAlign) {
      const size_t direct = n / kAlign * kAlign;
      const uint64_t offset = file_offset_;
      CAIRN_RETURN_IF_ERROR(Reserve(offset + direct));
      file_offset_ += direct;
      CAIRN_RETURN_IF_ERROR(WriteParallel(p, direct, offset));
      p += direct;
      n -= direct;
      continue;
    }
    if (staging_ == nullptr) {
      absl::MutexLock lock(&buf_mu_);
      if (free_.empty() && buffers_ < store_->options().io_threads + 1) {
        free_.push_back(NewAlignedBuffer(chunk_));
        if (free_.back() == nullptr) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "writer of '", key_, "': cannot allocate a staging buffer"));
        }
        ++buffers_;
      }
      buf_mu_.Await(absl::Condition(
          +[](std::vector<AlignedBuffer>* f) { return !f->empty(); }, &free_));
      staging_ = std::move(free_.back());
      free_.pop_back();
    }
    const size_t take = std::min(n, chunk_ - staged_);
    std::memcpy(staging_.get() + staged_, p, take);
    staged_ += take;
    p += take;
    n -= take;
    if (staged_ == chunk_) CAIRN_RETURN_IF_ERROR(FlushStaging(/*pad=*/false));
  }
  return absl::OkStatus();
}

absl::Status PosixObjectWriter::Close() {
  if (closed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Close of the writer of '", key_, "' called twice"));
  }
  CAIRN_RETURN_IF_ERROR(status_);
  const bool durable = store_->options().durable;
  absl::Status s;
  if (direct_) {
    s = FlushStaging(/*pad=*/true);
    absl::Status w = tasks_.Wait();
    if (s.ok()) s = w;
  }
  // A reservation beyond the real length (an expected size larger than what
  // came, O_DIRECT padding) is given back.
  if (s.ok() && (file_offset_ != written_ || allocated_ > written_) &&
      ::ftruncate(fd_.get(), static_cast<off_t>(written_)) != 0) {
    s = ErrnoError(
        errno, absl::StrCat("truncating '", key_, "' to ", written_, " bytes"));
  }
  if (s.ok() && durable && ::fdatasync(fd_.get()) != 0) {
    s = IsNoSpace(errno)
            ? NoSpaceError(fd_.get(), errno, key_, written_)
            : ErrnoError(errno, absl::StrCat("fdatasync of '", key_, "'"));
  }
  if (!s.ok()) return Fail(std::move(s));
  fd_.Reset();
  if (::renameat(dirs_.leaf(), temp_name_.c_str(), dirs_.leaf(),
                 final_name_.c_str()) != 0) {
    const int err = errno;
    ::unlinkat(dirs_.leaf(), temp_name_.c_str(), 0);
    if (err == EISDIR || err == ENOTEMPTY) {
      status_ = absl::FailedPreconditionError(absl::StrCat(
          "cannot publish '", key_, "': a directory has its name"));
    } else if (err == ENOENT) {
      // DeletePrefix (an aborted save's cleanup, a delete of its step)
      // removed the temp file while it was being written.
      status_ = absl::AbortedError(absl::StrCat(
          "the temp file of '", key_,
          "' was deleted before it could be published (its save was aborted "
          "or its step deleted meanwhile)"));
    } else {
      status_ = ErrnoError(err, absl::StrCat("renaming the temp file of '",
                                             key_, "' into place"));
    }
    store_->RemoveEmptyDirs(dirs_);
    return status_;
  }
  closed_ = true;
  if (durable && ::fsync(dirs_.leaf()) != 0) {
    status_ = ErrnoError(
        errno, absl::StrCat("fsync of the directory of '", key_, "'"));
    return status_;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardStore>> OpenPosixShardStore(
    absl::string_view root, const StoreOptions& options) {
  if (!absl::StartsWith(root, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("posix store root '", root, "' is not an absolute path"));
  }
  if (root.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("posix store root contains NUL");
  }
  if (options.io_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("posix store '", root, "': io_threads must be >= 1, got ",
                     options.io_threads));
  }
  std::string path(root);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  // mkdir -p (the root itself may be reached through symlinks: it is the
  // operator's choice; only what is below it is guarded).
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') {
      const std::string part = path.substr(0, pos);
      if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError(errno,
                          absl::StrCat("creating store root '", part, "'"));
      }
    }
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    return ErrnoError(errno, absl::StrCat("opening store root '", path, "'"));
  }
  return std::unique_ptr<ShardStore>(
      new PosixShardStore(path, std::move(fd), options));
}

namespace {

// "file:///path" (and a bare "/path"): `rest` is the absolute root.
absl::StatusOr<std::unique_ptr<ShardStore>> OpenFileUri(
    absl::string_view rest, const StoreOptions& options) {
  if (!absl::StartsWith(rest, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed store URI 'file://", rest,
        "': file URIs name an absolute path (file:///path); hosts are not "
        "supported"));
  }
  return OpenPosixShardStore(rest, options);
}

const ShardStoreRegistrar kFileScheme("file", &OpenFileUri);

}  // namespace

}  // namespace cairn::storage
