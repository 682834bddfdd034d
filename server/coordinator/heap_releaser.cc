#include "server/coordinator/heap_releaser.h"

#include <optional>

// tcmalloc's C API, when the binary links it (weak: null without it, e.g. in
// the tests or a -DCAIRN_WITH_TCMALLOC=OFF build for heap profilers).
extern "C" {
int MallocExtension_GetNumericProperty(const char* property, size_t* value)
    __attribute__((weak));
void MallocExtension_ReleaseToSystem(size_t num_bytes) __attribute__((weak));
}

namespace cairn::coordinator {

namespace {

// One of tcmalloc's numeric properties; nullopt without tcmalloc or when it
// does not know the name.
std::optional<size_t> Property(const char* name) {
  size_t value = 0;
  if (MallocExtension_GetNumericProperty == nullptr ||
      !MallocExtension_GetNumericProperty(name, &value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

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
  return Property("tcmalloc.pageheap_free_bytes").value_or(0);
}

HeapReleaser::HeapReleaser(HeapReleasePolicy policy, absl::Duration every) {
  if (!Available()) return;  // another allocator: nothing held back this way
  thread_ = std::thread([this, policy, every] {
    size_t last_in_use = 0;
    while (!stop_.WaitForNotificationWithTimeout(every)) {
      const std::optional<size_t> free_bytes =
          Property("tcmalloc.pageheap_free_bytes");
      const std::optional<size_t> in_use =
          Property("generic.current_allocated_bytes");
      if (!free_bytes || !in_use) return;
      const size_t moved =
          *in_use > last_in_use ? *in_use - last_in_use : last_in_use - *in_use;
      last_in_use = *in_use;
      if (const size_t release = policy.BytesToRelease(*free_bytes, moved);
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
