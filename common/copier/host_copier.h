// HostCopier: DeviceCopier for host memory of this process. Items of at least
// `parallel_min_bytes` are split into equal slices copied by `threads`
// threads (one memcpy stream per core saturates little of the memory
// bandwidth on large hosts); smaller items are a single memcpy.
#ifndef CAIRN_COMMON_COPIER_HOST_COPIER_H_
#define CAIRN_COMMON_COPIER_HOST_COPIER_H_

#include <memory>

#include "common/copier/device_copier.h"
#include "common/thread_pool.h"

namespace cairn::copier {

struct HostCopierOptions {
  // Threads copying one large item. Default: 1 (the caller's thread only).
  int threads = 1;
  // Items at least this large are split over the threads. Default: 64 MiB.
  size_t parallel_min_bytes = size_t{64} << 20;
};

class HostCopier : public DeviceCopier {
 public:
  explicit HostCopier(HostCopierOptions options = {});
  absl::string_view name() const override { return "host"; }
  absl::Status Copy(const CopySource& src, absl::Span<char> dst) override;
  absl::Status Flush() override { return absl::OkStatus(); }

 private:
  const HostCopierOptions options_;
  std::unique_ptr<ThreadPool> pool_;  // null with one thread
};

}  // namespace cairn::copier

#endif  // CAIRN_COMMON_COPIER_HOST_COPIER_H_
