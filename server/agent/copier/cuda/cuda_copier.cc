#include "server/agent/copier/cuda/cuda_copier.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_status.h"
#include "common/gpu/gpu_info.h"
#include "common/status_macros.h"

namespace cairn::agent {

absl::StatusOr<std::unique_ptr<CudaCopier>> CudaCopier::Create(int device) {
  CAIRN_ASSIGN_OR_RETURN(int devices, gpu::DeviceCount());
  if (devices == 0 || device < 0 || device >= devices) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda copier: device ", device, " not usable (", devices,
                     " CUDA devices on this host)"));
  }
  std::unique_ptr<CudaCopier> c(new CudaCopier());
  CAIRN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream;
  CAIRN_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  c->stream_ = stream;
  return c;
}

CudaCopier::~CudaCopier() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  for (auto& [handle, base] : opened_) cudaIpcCloseMemHandle(base);
  for (auto& [ptr, size] : registered_) cudaHostUnregister(ptr);
}

absl::Status CudaCopier::RegisterHostMemory(char* data, size_t size) {
  if (registered_.count(data)) return absl::OkStatus();
  CAIRN_CUDA_RETURN_IF_ERROR(
      cudaHostRegister(data, size, cudaHostRegisterPortable));
  registered_[data] = size;
  return absl::OkStatus();
}

absl::Status CudaCopier::Copy(const copier::CopySource& src,
                              absl::Span<char> dst) {
  if (dst.empty()) return absl::OkStatus();
  if (src.kind == copier::CopySource::Kind::kHost) {
    std::memcpy(dst.data(), src.host, dst.size());
    return absl::OkStatus();
  }
  if (src.cuda_ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC handle has ", src.cuda_ipc_handle.size(),
                     " bytes, want ", sizeof(cudaIpcMemHandle_t)));
  }
  void*& base = opened_[src.cuda_ipc_handle];
  if (base == nullptr) {
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, src.cuda_ipc_handle.data(), sizeof(handle));
    CAIRN_CUDA_RETURN_IF_ERROR(cudaSetDevice(src.device));
    absl::Status s = gpu::CudaStatus(
        cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle");
    if (!s.ok()) {
      opened_.erase(src.cuda_ipc_handle);
      return s;
    }
  }
  CAIRN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      dst.data(), static_cast<const char*>(base) + src.offset, dst.size(),
      cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream_)));
  return absl::OkStatus();
}

absl::Status CudaCopier::Flush() {
  CAIRN_CUDA_RETURN_IF_ERROR(
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  return absl::OkStatus();
}

}  // namespace cairn::agent
