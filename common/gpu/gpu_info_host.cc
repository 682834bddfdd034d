// Host-only implementation of gpu_info.h, for builds without CUDA/NCCL.
#include "common/gpu/gpu_info.h"

namespace cairn::gpu {

bool BuiltWithCuda() { return false; }

absl::StatusOr<int> DeviceCount() { return 0; }

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  return std::vector<DeviceInfo>{};
}

absl::StatusOr<int> NcclVersion() {
  return absl::UnimplementedError("Cairn was built without NCCL");
}

absl::Status FillDeviceBytes(void*, size_t, uint8_t) {
  return absl::FailedPreconditionError(
      "FillDeviceBytes: Cairn was built without CUDA");
}

}  // namespace cairn::gpu
