// NcclDeviceLink: the DeviceLink of real GPUs (CAIRN_HAVE_CUDA builds).
//
// Each direction (up/down, see device_link.h) has its own communicator, CUDA
// stream and GPU-resident staging buffer of `staging_bytes` on `device`. A
// Send copies the host bytes into the staging buffer piece by piece
// (cudaMemcpyAsync host-to-device) and ncclSend's each piece; a Recv
// ncclRecv's each piece into its staging buffer and copies it to host
// memory. Both sides cut a message into the same pieces (same staging size
// on every agent), so NCCL matches them in order. Communicators are created
// non-blocking (ncclConfig_t.blocking = 0) and polled, so a node that never
// joins makes Init fail DEADLINE_EXCEEDED (communicators aborted) instead
// of hanging. Transfers are bounded the same way: Send and Recv poll the
// stream and the communicator (transfer_wait.h) and abort the communicator
// when the peer does not complete its side within the timeout.
//
// Without a usable device Create() returns FAILED_PRECONDITION naming the
// reason; cairn-agent --transport=nccl then fails at start.
// Thread-compatible per direction (see DeviceLink).
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_NCCL_NCCL_DEVICE_LINK_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_NCCL_NCCL_DEVICE_LINK_H_

#include <cstdint>
#include <memory>

#include "server/agent/transport/nccl/device_link.h"

namespace cairn::agent {

class NcclDeviceLink : public DeviceLink {
 public:
  // Default staging piece: 32 MiB per direction.
  static constexpr uint64_t kDefaultStagingBytes = uint64_t{32} << 20;
  static absl::StatusOr<std::unique_ptr<NcclDeviceLink>> Create(
      int device, uint64_t staging_bytes = kDefaultStagingBytes);
  ~NcclDeviceLink() override;

  absl::StatusOr<std::string> NewUniqueId() override;
  absl::Status Init(int num_nodes, int node, const std::string& up_id,
                    const std::string& down_id,
                    absl::Duration timeout) override;
  absl::Status Send(int peer, absl::Span<const char> data,
                    absl::Duration timeout) override;
  absl::Status Recv(int peer, absl::Span<char> out,
                    absl::Duration timeout) override;

 private:
  struct Lane {
    void* comm = nullptr;     // ncclComm_t
    void* stream = nullptr;   // cudaStream_t
    char* staging = nullptr;  // device memory
    // Why the communicator was aborted (a transfer that did not complete,
    // an error it reported); OK while it is usable.
    absl::Status aborted;
  };
  NcclDeviceLink(int device, uint64_t staging_bytes)
      : device_(device), staging_bytes_(staging_bytes) {}
  Lane& LaneTo(int peer) { return peer > node_ ? up_ : down_; }
  // FAILED_PRECONDITION unless `lane` has a usable communicator.
  absl::Status CheckLane(const Lane& lane, int peer) const;
  // Waits for the work queued on `lane` (see transfer_wait.h); on failure
  // the lane's communicator is aborted and the lane records why.
  absl::Status AwaitLane(Lane& lane, absl::Time deadline,
                         absl::Duration timeout, const std::string& what);
  void DestroyComms();

  const int device_;
  const uint64_t staging_bytes_;
  int node_ = -1;
  Lane up_, down_;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_NCCL_NCCL_DEVICE_LINK_H_
