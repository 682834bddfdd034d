// CUDA/NCCL implementation of gpu_info.h.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_status.h"
#include "common/gpu/gpu_info.h"
#include "common/status_macros.h"

namespace cairn::gpu {

// Defined in fill_kernel.cu.
cudaError_t LaunchFillKernel(void* device_ptr, size_t n, uint8_t value);

bool BuiltWithCuda() { return true; }

absl::StatusOr<int> DeviceCount() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  CAIRN_CUDA_RETURN_IF_ERROR(err);
  return n;
}

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  CAIRN_ASSIGN_OR_RETURN(int n, DeviceCount());
  std::vector<DeviceInfo> out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop;
    CAIRN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, i));
    out.push_back(
        DeviceInfo{i, prop.name, prop.totalGlobalMem, prop.major, prop.minor});
  }
  return out;
}

absl::StatusOr<int> NcclVersion() {
  int version = 0;
  CAIRN_NCCL_RETURN_IF_ERROR(ncclGetVersion(&version));
  return version;
}

absl::Status FillDeviceBytes(void* device_ptr, size_t n, uint8_t value) {
  CAIRN_ASSIGN_OR_RETURN(int devices, DeviceCount());
  if (devices == 0) {
    return absl::FailedPreconditionError(
        "FillDeviceBytes: no CUDA device on this host");
  }
  CAIRN_CUDA_RETURN_IF_ERROR(LaunchFillKernel(device_ptr, n, value));
  CAIRN_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

}  // namespace cairn::gpu
