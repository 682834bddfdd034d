#include "server/coordinator/heap_releaser.h"

// tcmalloc's C API, when the binary links it (weak: null without it, e.g. in
// the tests or a -DCAIRN_WITH_TCMALLOC=OFF build for heap profilers).
extern "C" {
int MallocExtension_GetNumericProperty(const char* property, size_t* value)
    __attribute__((weak));
void MallocExtension_ReleaseToSystem(size_t num_bytes) __attribute__((weak));
}

namespace cairn::coordinator {

size_t HeapReleasePolicy::BytesToRelease(size_t free_bytes,
                                         size_t moved_bytes) const {
  if (moved_bytes >= quiet_bytes || free_bytes <= keep_free_bytes) return 0;
  const size_t excess = free_bytes - keep_free_bytes;
  return excess >= threshold_bytes ? excess : 0;
}

bool HeapReleaser::Available() {
  return MallocExtension_GetNumericProperty != nullptr &&
         MallocExtension_ReleaseToSystem != nullptr;
}

size_t HeapReleaser::FreeBytes() {
  size_t free_bytes = 0;
  if (!Available() || !MallocExtension_GetNumericProperty(
                          "tcmalloc.pageheap_free_bytes", &free_bytes)) {
    return 0;
  }
  return free_bytes;
}

HeapReleaser::HeapReleaser(HeapReleasePolicy policy, absl::Duration every) {
  if (!Available()) return;  // another allocator: nothing held back this way
  thread_ = std::thread([this, policy, every] {
    size_t last_in_use = 0;
    while (!stop_.WaitForNotificationWithTimeout(every)) {
      size_t free_bytes = 0;
      size_t in_use = 0;
      if (!MallocExtension_GetNumericProperty("tcmalloc.pageheap_free_bytes",
                                              &free_bytes) ||
          !MallocExtension_GetNumericProperty("generic.current_allocated_bytes",
                                              &in_use)) {
        return;
      }
      const size_t moved =
          in_use > last_in_use ? in_use - last_in_use : last_in_use - in_use;
      last_in_use = in_use;
      if (const size_t release = policy.BytesToRelease(free_bytes, moved);
          release > 0) {
        MallocExtension_ReleaseToSystem(release);
      }
    }
  });
}

HeapReleaser::~HeapReleaser() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

}  // namespace cairn::coordinator
