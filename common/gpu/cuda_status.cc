#include "common/gpu/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace cairn::gpu {

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg =
      absl::StrCat(what, ": CUDA error ", static_cast<int>(err), " (",
                   cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(msg);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status NcclStatus(ncclResult_t res, absl::string_view what) {
  if (res == ncclSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": NCCL error ", static_cast<int>(res),
                                 " (", ncclGetErrorString(res), ")");
  switch (res) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(msg);
    case ncclInProgress:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace cairn::gpu
