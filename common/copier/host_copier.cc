#include "common/copier/host_copier.h"

#include <algorithm>
#include <cstring>

#include "absl/synchronization/blocking_counter.h"

namespace cairn::copier {

HostCopier::HostCopier(HostCopierOptions options) : options_(options) {
  if (options_.threads > 1) {
    pool_ = std::make_unique<ThreadPool>(options_.threads - 1);
  }
}

absl::Status HostCopier::Copy(const CopySource& src, absl::Span<char> dst) {
  if (src.kind != CopySource::Kind::kHost) {
    return absl::InvalidArgumentError(
        "host copier cannot read a CUDA IPC source; this agent needs the "
        "cuda copier (built with CAIRN_WITH_CUDA)");
  }
  if (dst.empty()) return absl::OkStatus();
  if (src.host == nullptr) {
    return absl::InvalidArgumentError("host copy source is null");
  }
  const char* from = static_cast<const char*>(src.host);
  if (pool_ == nullptr || dst.size() < options_.parallel_min_bytes) {
    std::memcpy(dst.data(), from, dst.size());
    return absl::OkStatus();
  }
  const size_t parts = static_cast<size_t>(options_.threads);
  // Slices are multiples of 4 KiB so no two threads share a page.
  const size_t slice = ((dst.size() / parts + 4095) / 4096) * 4096;
  absl::BlockingCounter done(static_cast<int>(parts - 1));
  for (size_t i = 1; i < parts; ++i) {
    pool_->Schedule([&, i] {
      const size_t begin = std::min(dst.size(), i * slice);
      const size_t end = std::min(dst.size(), begin + slice);
      if (end > begin)
        std::memcpy(dst.data() + begin, from + begin, end - begin);
      done.DecrementCount();
    });
  }
  std::memcpy(dst.data(), from, std::min(dst.size(), slice));
  done.Wait();
  return absl::OkStatus();
}

}  // namespace cairn::copier
