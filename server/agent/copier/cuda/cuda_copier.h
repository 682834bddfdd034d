// CudaCopier: DeviceCopier for GPU tensors of rank processes, exported as
// CUDA IPC handles (CAIRN_HAVE_CUDA builds only).
//
// Algorithm: each distinct handle is opened once (cudaIpcOpenMemHandle,
// cached until the copier is destroyed); each destination staging segment is
// page-locked once with cudaHostRegister so the device-to-host copy is a DMA
// at PCIe/NVLink speed; copies are issued with cudaMemcpyAsync on the
// copier's own stream (never the training process's streams) and Flush()
// synchronizes that stream. Host sources are copied with memcpy.
//
// Without a usable device Create() returns FAILED_PRECONDITION; agents then
// reject GPU items with that status and tests GTEST_SKIP().
#ifndef CAIRN_SERVER_AGENT_COPIER_CUDA_CUDA_COPIER_H_
#define CAIRN_SERVER_AGENT_COPIER_CUDA_CUDA_COPIER_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/copier/device_copier.h"

namespace cairn::agent {

class CudaCopier : public copier::DeviceCopier {
 public:
  // Creates a stream on `device`. FAILED_PRECONDITION without a device.
  static absl::StatusOr<std::unique_ptr<CudaCopier>> Create(int device);
  ~CudaCopier() override;

  absl::string_view name() const override { return "cuda"; }
  absl::Status Copy(const copier::CopySource& src,
                    absl::Span<char> dst) override;
  absl::Status Flush() override;

  // Page-locks [data, data + size) for DMA (idempotent per range start).
  absl::Status RegisterHostMemory(char* data, size_t size);

 private:
  CudaCopier() = default;

  void* stream_ = nullptr;               // cudaStream_t
  std::map<std::string, void*> opened_;  // IPC handle bytes -> base
  std::map<char*, size_t> registered_;   // host ranges page-locked
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_COPIER_CUDA_CUDA_COPIER_H_
