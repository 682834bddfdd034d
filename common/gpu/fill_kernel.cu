// A grid-stride byte fill: the smallest real kernel, so that CI proves nvcc
// builds Cairn device code for the configured architectures.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cairn::gpu {

__global__ void FillKernel(uint8_t* p, size_t n, uint8_t value) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = value;
  }
}

cudaError_t LaunchFillKernel(void* device_ptr, size_t n, uint8_t value) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  size_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535) blocks = 65535;
  FillKernel<<<static_cast<unsigned>(blocks), threads>>>(
      static_cast<uint8_t*>(device_ptr), n, value);
  return cudaGetLastError();
}

}  // namespace cairn::gpu
