// ShmSegment: a POSIX shared-memory object (shm_open) mapped into this
// process. The agent creates staging and load segments; ranks on the same
// node open them by name and copy tensor bytes in or out, so a tensor crosses
// the process boundary with exactly one memcpy.
//
// Names are "/cairn-agent-<node>-<tag>-<seq>", where <tag> is the creating
// agent's SegmentFamily: its pid and a random 64-bit nonce, so names never
// collide even between agents in different PID namespaces that share
// /dev/shm (containers, test sandboxes), where pids repeat. The creator
// unlinks the name when the segment is destroyed; a crashed agent's names
// are removed by the next agent of that node (RemoveStaleSegments), which
// tells a dead family from a live one by the family's lock (an flock the
// kernel drops when its owner dies, whatever its namespace), not by its pid.
// Pages are pre-faulted (MAP_POPULATE) so the rank's copy runs at memcpy speed
// instead of taking a page fault per 4 KiB.
//
// Thread-compatible: the mapping may be read and written concurrently by
// callers that coordinate their own byte ranges.
#ifndef CAIRN_COMMON_SHM_SHM_SEGMENT_H_
#define CAIRN_COMMON_SHM_SHM_SEGMENT_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/unique_fd.h"

namespace cairn::shm {

class ShmSegment {
 public:
  // Creates and maps a new segment of `size` bytes (> 0) named `name`
  // ("/..." without further '/'), with permission bits `mode` exactly (not
  // widened by the umask; 0600: only this user) and, unless `group` is -1,
  // owned by that group (with mode 0660: the ranks of a shared socket
  // group). ALREADY_EXISTS if the name is taken; RESOURCE_EXHAUSTED if
  // /dev/shm is full.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(
      absl::string_view name, size_t size, mode_t mode = 0600,
      gid_t group = static_cast<gid_t>(-1));
  // Maps an existing segment read-write. NOT_FOUND if missing;
  // FAILED_PRECONDITION if it is smaller than `size`.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(
      absl::string_view name, size_t size);

  // Unmaps; the creator also unlinks the name.
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  absl::Span<char> span() const { return absl::MakeSpan(data_, size_); }

 private:
  ShmSegment(std::string name, char* data, size_t size, bool owner)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner) {}

  const std::string name_;
  char* const data_;
  const size_t size_;
  const bool owner_;
};

// One process's claim on a family of segment names, "<prefix><tag>-<seq>"
// with tag "<pid>x<random 64-bit hex>". Claim creates
// /dev/shm/<prefix><tag>.lock and holds an exclusive flock on it until the
// family is destroyed (then the lock file is unlinked) or the process dies
// (then the kernel drops the lock and the file stays for the next
// RemoveStaleSegments). Create the family before its segments and destroy
// it after them.
class SegmentFamily {
 public:
  static absl::StatusOr<std::unique_ptr<SegmentFamily>> Claim(
      absl::string_view prefix);
  ~SegmentFamily();
  SegmentFamily(const SegmentFamily&) = delete;
  SegmentFamily& operator=(const SegmentFamily&) = delete;

  // "<prefix><tag>-": this family's segment names (without the leading '/')
  // start with it.
  const std::string& name_prefix() const { return name_prefix_; }

 private:
  SegmentFamily(std::string name_prefix, std::string lock_path, UniqueFd fd)
      : name_prefix_(std::move(name_prefix)),
        lock_path_(std::move(lock_path)),
        fd_(std::move(fd)) {}
  const std::string name_prefix_;
  const std::string lock_path_;
  const UniqueFd fd_;  // the lock file, flocked
};

// Removes what crashed processes left in /dev/shm under `prefix` (without
// the leading '/'): the segments and lock file of every family
// "<prefix><tag>-..." whose lock no process holds, and segments of the older
// "<prefix><pid>-<seq>" form whose pid is not alive here. Live families'
// segments are kept. Returns how many segments were removed.
int RemoveStaleSegments(absl::string_view prefix);

}  // namespace cairn::shm

#endif  // CAIRN_COMMON_SHM_SHM_SEGMENT_H_
