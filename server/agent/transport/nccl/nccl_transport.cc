#include "server/agent/transport/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_status.h"
#include "common/gpu/gpu_info.h"
#include "common/status_macros.h"

namespace cairn::agent {
namespace {

// Control tags of the NCCL transport (kept clear of the agent's tags, which
// carry a node id in bits 40..62).
constexpr uint64_t kBootstrapTag = (uint64_t{1} << 62) | 1;
constexpr uint64_t kAnnounceBase = uint64_t{1} << 62 | (uint64_t{1} << 61);

struct Announce {
  uint64_t tag;
  uint64_t length;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    TcpTransport* control, int num_nodes, int device, absl::Duration timeout) {
  CAIRN_ASSIGN_OR_RETURN(int devices, gpu::DeviceCount());
  if (devices == 0 || device < 0 || device >= devices) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl transport: device ", device, " not usable (",
                     devices, " CUDA devices on this host)"));
  }
  std::unique_ptr<NcclTransport> t(
      new NcclTransport(control, num_nodes, device));
  ncclUniqueId id;
  const int me = control->node_id();
  if (me == 0) {
    CAIRN_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    for (int n = 1; n < num_nodes; ++n) {
      CAIRN_RETURN_IF_ERROR(control->Send(
          n, kBootstrapTag,
          absl::MakeConstSpan(reinterpret_cast<const char*>(&id), sizeof(id))));
    }
  } else {
    CAIRN_RETURN_IF_ERROR(control->Recv(
        0, kBootstrapTag,
        absl::MakeSpan(reinterpret_cast<char*>(&id), sizeof(id)), timeout));
  }
  CAIRN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream;
  CAIRN_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  t->stream_ = stream;
  ncclComm_t comm;
  CAIRN_NCCL_RETURN_IF_ERROR(ncclCommInitRank(&comm, num_nodes, id, me));
  t->comm_ = comm;
  return t;
}

NcclTransport::~NcclTransport() {
  if (comm_ != nullptr) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status NcclTransport::Send(int peer, uint64_t tag,
                                 absl::Span<const char> data) {
  if (peer < 0 || peer >= num_nodes_ || peer == node_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transport: bad peer node ", peer));
  }
  absl::MutexLock l(&mu_);
  const uint64_t seq = sent_[peer]++;
  Announce a{tag, data.size()};
  CAIRN_RETURN_IF_ERROR(control_->Send(
      peer, kAnnounceBase + seq,
      absl::MakeConstSpan(reinterpret_cast<const char*>(&a), sizeof(a))));
  CAIRN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CAIRN_NCCL_RETURN_IF_ERROR(ncclSend(data.data(), data.size(), ncclChar, peer,
                                      static_cast<ncclComm_t>(comm_),
                                      static_cast<cudaStream_t>(stream_)));
  CAIRN_CUDA_RETURN_IF_ERROR(
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  return absl::OkStatus();
}

absl::Status NcclTransport::Recv(int peer, uint64_t tag, absl::Span<char> out,
                                 absl::Duration timeout) {
  if (peer < 0 || peer >= num_nodes_ || peer == node_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transport: bad peer node ", peer));
  }
  absl::MutexLock l(&mu_);
  const uint64_t seq = received_[peer]++;
  Announce a;
  CAIRN_RETURN_IF_ERROR(control_->Recv(
      peer, kAnnounceBase + seq,
      absl::MakeSpan(reinterpret_cast<char*>(&a), sizeof(a)), timeout));
  if (a.tag != tag || a.length != out.size()) {
    return absl::DataLossError(absl::StrCat(
        "nccl transport: message ", seq, " from node ", peer, " is tag ", a.tag,
        " of ", a.length, " bytes; expected tag ", tag, " of ", out.size(),
        " bytes (Send/Recv order differs between the nodes)"));
  }
  CAIRN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CAIRN_NCCL_RETURN_IF_ERROR(ncclRecv(out.data(), out.size(), ncclChar, peer,
                                      static_cast<ncclComm_t>(comm_),
                                      static_cast<cudaStream_t>(stream_)));
  CAIRN_CUDA_RETURN_IF_ERROR(
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  return absl::OkStatus();
}

}  // namespace cairn::agent
