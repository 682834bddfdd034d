#ifndef CAIRN_SERVER_COORDINATOR_HEAP_RELEASER_H_
#define CAIRN_SERVER_COORDINATOR_HEAP_RELEASER_H_

#include <cstddef>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace cairn::coordinator {

// When cairnd hands the memory tcmalloc holds free back to the kernel.
// tcmalloc keeps the pages a large round freed (a 4096-rank commit frees
// ~2 GB) for later, so cairnd's RSS, what a container's memory limit
// counts, would stay at its peak for the rest of its life. Releasing during
// a round costs a page fault per reused page (as much CPU again as a large
// round's own work), so it happens only when cairnd is quiet: the
// heap in use moved by less than `quiet_bytes` since the last look.
// `keep_free_bytes` stay free: the next round reuses them without faulting
// (16k calls in flight take ~170 MB of gRPC arenas and stacks, faulted in
// afresh every round when all is released).
struct HeapReleasePolicy {
  size_t threshold_bytes = size_t{64} << 20;
  size_t quiet_bytes = size_t{16} << 20;
  size_t keep_free_bytes = size_t{256} << 20;

  // Bytes to release now, given what tcmalloc holds free and how far the
  // heap in use moved since the last look; 0 for none. Releases only when
  // more than `threshold_bytes` would go.
  size_t BytesToRelease(size_t free_bytes, size_t moved_bytes) const;
};

// Applies a HeapReleasePolicy every `every` on a thread of its own, from
// construction to destruction, when the process runs on tcmalloc (its C API
// linked in: cairnd links it); does nothing on another allocator.
class HeapReleaser {
 public:
  explicit HeapReleaser(HeapReleasePolicy policy,
                        absl::Duration every = absl::Seconds(1));
  ~HeapReleaser();
  HeapReleaser(const HeapReleaser&) = delete;
  HeapReleaser& operator=(const HeapReleaser&) = delete;

  // Whether the process runs on tcmalloc, so that a releaser acts.
  static bool Available();
  // tcmalloc's free bytes (its page heap's free, not yet released pages);
  // 0 without tcmalloc.
  static size_t FreeBytes();

 private:
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_HEAP_RELEASER_H_
