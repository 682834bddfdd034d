// cudaError_t / ncclResult_t -> absl::Status, at the edge, as NCCL's own
// NCCLCHECK propagates codes instead of aborting. Only for CUDA builds.
//
// Code choice follows retry semantics: no driver or device is
// FAILED_PRECONDITION (retrying will not help on this host), out of memory is
// RESOURCE_EXHAUSTED, bad arguments INVALID_ARGUMENT, a remote/system error in
// NCCL UNAVAILABLE, everything else INTERNAL.
#ifndef CAIRN_COMMON_GPU_CUDA_STATUS_H_
#define CAIRN_COMMON_GPU_CUDA_STATUS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cairn::gpu {

absl::Status CudaStatus(cudaError_t err, absl::string_view what);
absl::Status NcclStatus(ncclResult_t res, absl::string_view what);

}  // namespace cairn::gpu

#define CAIRN_CUDA_RETURN_IF_ERROR(expr)                       \
  do {                                                         \
    cudaError_t _cairn_cuda_err = (expr);                      \
    if (_cairn_cuda_err != cudaSuccess) {                      \
      return ::cairn::gpu::CudaStatus(_cairn_cuda_err, #expr); \
    }                                                          \
  } while (0)

#define CAIRN_NCCL_RETURN_IF_ERROR(expr)                       \
  do {                                                         \
    ncclResult_t _cairn_nccl_res = (expr);                     \
    if (_cairn_nccl_res != ncclSuccess) {                      \
      return ::cairn::gpu::NcclStatus(_cairn_nccl_res, #expr); \
    }                                                          \
  } while (0)

#endif  // CAIRN_COMMON_GPU_CUDA_STATUS_H_
