// NcclTransport: the device-memory Transport (CAIRN_HAVE_CUDA builds).
//
// Bulk bytes move GPU to GPU with ncclSend/ncclRecv on a communicator of all
// agents (one rank per node), on the transport's own CUDA stream. NCCL
// matches point-to-point calls between a pair in issue order and carries no
// tag or checksum, so every message is announced on the control transport
// (tcp) with its tag, length and the order number NCCL will match it by:
// a Recv whose announced tag or length differs fails DATA_LOSS instead of
// silently receiving the wrong bytes. End-to-end integrity stays with the
// agent, which verifies every item's crc32c once it lands in host memory.
//
// Bootstrap: node 0 creates the ncclUniqueId and sends it to every node over
// the control transport; then each calls ncclCommInitRank(num_nodes, id,
// node_id) on `device`.
//
// Without a device Create() returns FAILED_PRECONDITION (tests skip).
// Thread-safe: calls are serialized on the communicator.
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_NCCL_NCCL_TRANSPORT_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_NCCL_NCCL_TRANSPORT_H_

#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/agent/transport/tcp/tcp_transport.h"

namespace cairn::agent {

class NcclTransport : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      TcpTransport* control, int num_nodes, int device, absl::Duration timeout);
  ~NcclTransport() override;

  absl::string_view name() const override { return "nccl"; }
  MemoryKind memory_kind() const override { return MemoryKind::kDevice; }
  int node_id() const override { return control_->node_id(); }

  // `data` / `out` are device pointers.
  absl::Status Send(int peer, uint64_t tag,
                    absl::Span<const char> data) override;
  absl::Status Recv(int peer, uint64_t tag, absl::Span<char> out,
                    absl::Duration timeout) override;

 private:
  NcclTransport(TcpTransport* control, int num_nodes, int device)
      : control_(control), num_nodes_(num_nodes), device_(device) {}

  TcpTransport* const control_;
  const int num_nodes_;
  const int device_;
  void* comm_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t

  absl::Mutex mu_;
  std::map<int, uint64_t> sent_ ABSL_GUARDED_BY(mu_);      // per peer
  std::map<int, uint64_t> received_ ABSL_GUARDED_BY(mu_);  // per peer
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_NCCL_NCCL_TRANSPORT_H_
