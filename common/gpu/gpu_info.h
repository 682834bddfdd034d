// GPU support that every build has: what devices and which NCCL this process
// can use. Built against CUDA/NCCL when CAIRN_WITH_CUDA is on, otherwise a
// host-only implementation that reports no devices.
//
// Thread-safe: every function may be called concurrently.
//
// Example:
//   CAIRN_ASSIGN_OR_RETURN(int n, gpu::DeviceCount());
//   if (n == 0) return UseHostCopier();
#ifndef CAIRN_COMMON_GPU_GPU_INFO_H_
#define CAIRN_COMMON_GPU_GPU_INFO_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cairn::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;
  size_t total_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};

// True when this binary was compiled with CUDA/NCCL support.
bool BuiltWithCuda();

// The number of usable CUDA devices: 0 when CUDA is not built in, no driver
// is loaded (cudaErrorInsufficientDriver) or no device is present. Other
// driver failures are errors.
absl::StatusOr<int> DeviceCount();

// One entry per usable device; empty without devices.
absl::StatusOr<std::vector<DeviceInfo>> ListDevices();

// NCCL's version code (e.g. 22809 for 2.28.9); UNIMPLEMENTED when not built
// with NCCL. Works without a device.
absl::StatusOr<int> NcclVersion();

// Fills `n` bytes of device memory at `device_ptr` with `value` using a Cairn
// kernel, and waits for it. FAILED_PRECONDITION without a device.
absl::Status FillDeviceBytes(void* device_ptr, size_t n, uint8_t value);

}  // namespace cairn::gpu

#endif  // CAIRN_COMMON_GPU_GPU_INFO_H_
