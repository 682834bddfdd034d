// DeviceCopier: takes the snapshot of one tensor item into host staging
// memory. The only step of a save that training waits for.
//
// Implementations:
//   host (common/copier/host_copier.h): the source is host memory of this
//        process; memcpy, split over threads for large items. Fully tested.
//   cuda (server/agent/copier/cuda/): the source is device memory of another
//        process, exported as a CUDA IPC handle; the agent opens it and copies
//        device-to-host with cudaMemcpyAsync on its own stream into pinned
//        (cudaHostRegister'ed) staging memory. Built when CAIRN_HAVE_CUDA;
//        its tests skip without a device.
//
// Thread-compatible: one copier per thread; Copy calls may be asynchronous
// until Flush() returns.
//
// Example:
//   CAIRN_RETURN_IF_ERROR(copier.Copy(CopySource::Host(ptr), staging_span));
//   CAIRN_RETURN_IF_ERROR(copier.Flush());  // the snapshot is complete
#ifndef CAIRN_COMMON_COPIER_DEVICE_COPIER_H_
#define CAIRN_COMMON_COPIER_DEVICE_COPIER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace cairn::copier {

// Where an item's bytes are.
struct CopySource {
  enum class Kind { kHost, kCudaIpc };
  Kind kind = Kind::kHost;
  const void* host = nullptr;   // kHost: in this process
  std::string cuda_ipc_handle;  // kCudaIpc: cudaIpcMemHandle_t bytes (64)
  uint64_t offset = 0;          // kCudaIpc: byte offset in the allocation
  int device = 0;               // kCudaIpc: the exporting device

  static CopySource Host(const void* p) {
    CopySource s;
    s.host = p;
    return s;
  }
};

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  DeviceCopier() = default;
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;

  // "host" or "cuda".
  virtual absl::string_view name() const = 0;
  // Starts copying dst.size() bytes from `src` into `dst` (host memory).
  // INVALID_ARGUMENT for a source kind this copier cannot read.
  virtual absl::Status Copy(const CopySource& src, absl::Span<char> dst) = 0;
  // Waits until every Copy issued so far has completed; returns the first
  // error among them.
  virtual absl::Status Flush() = 0;
};

}  // namespace cairn::copier

#endif  // CAIRN_COMMON_COPIER_DEVICE_COPIER_H_
