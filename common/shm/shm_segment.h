// ShmSegment: a POSIX shared-memory object (shm_open) mapped into this
// process. The agent creates staging and load segments; ranks on the same
// node open them by name and copy tensor bytes in or out, so a tensor crosses
// the process boundary with exactly one memcpy.
//
// Names are "/cairn-agent-<node>-<pid>-<seq>". The creator unlinks the name
// when the segment is destroyed; a crashed agent's names are removed by the
// next agent of that node (RemoveStaleSegments). Pages are pre-faulted
// (MAP_POPULATE) so the rank's copy runs at memcpy speed instead of taking a
// page fault per 4 KiB.
//
// Thread-compatible: the mapping may be read and written concurrently by
// callers that coordinate their own byte ranges.
#ifndef CAIRN_COMMON_SHM_SHM_SEGMENT_H_
#define CAIRN_COMMON_SHM_SHM_SEGMENT_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

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

// Removes /dev/shm entries named "<prefix><pid>-..." (prefix without the
// leading '/') whose creator `pid` is no longer alive: what a crashed agent
// left behind. Live agents' segments are kept. Returns how many were removed.
int RemoveStaleSegments(absl::string_view prefix);

}  // namespace cairn::shm

#endif  // CAIRN_COMMON_SHM_SHM_SEGMENT_H_
