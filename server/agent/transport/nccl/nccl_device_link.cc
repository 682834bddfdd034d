#include "server/agent/transport/nccl/nccl_device_link.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/gpu/cuda_status.h"
#include "common/gpu/gpu_info.h"
#include "common/status_macros.h"
#include "server/agent/transport/nccl/transfer_wait.h"

namespace cairn::agent {
namespace {

// Polls a non-blocking communicator until its pending operation finished.
absl::Status WaitComm(ncclComm_t comm, absl::Time deadline,
                      absl::string_view what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    CAIRN_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return gpu::NcclStatus(state, what);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not complete in time"));
    }
    absl::SleepFor(absl::Milliseconds(1));  // polling NCCL's own state
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclDeviceLink>> NcclDeviceLink::Create(
    int device, uint64_t staging_bytes) {
  CAIRN_ASSIGN_OR_RETURN(int devices, gpu::DeviceCount());
  if (devices == 0) {
    return absl::FailedPreconditionError(
        "nccl transport: no CUDA device on this host (cudaGetDeviceCount "
        "found none: no GPU or no driver)");
  }
  if (device < 0 || device >= devices) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl transport: --cuda-device ", device,
                     " does not exist (", devices, " CUDA devices)"));
  }
  if (staging_bytes == 0) {
    return absl::InvalidArgumentError("nccl transport: staging_bytes is 0");
  }
  std::unique_ptr<NcclDeviceLink> l(new NcclDeviceLink(device, staging_bytes));
  CAIRN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  for (Lane* lane : {&l->up_, &l->down_}) {
    cudaStream_t s;
    CAIRN_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    lane->stream = s;
    void* p = nullptr;
    CAIRN_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, staging_bytes));
    lane->staging = static_cast<char*>(p);
  }
  return l;
}

void NcclDeviceLink::DestroyComms() {
  for (Lane* lane : {&up_, &down_}) {
    if (lane->comm != nullptr) {
      ncclCommAbort(static_cast<ncclComm_t>(lane->comm));
      lane->comm = nullptr;
    }
  }
}

NcclDeviceLink::~NcclDeviceLink() {
  DestroyComms();
  for (Lane* lane : {&up_, &down_}) {
    if (lane->staging != nullptr) cudaFree(lane->staging);
    if (lane->stream != nullptr) {
      cudaStreamDestroy(static_cast<cudaStream_t>(lane->stream));
    }
  }
}

absl::StatusOr<std::string> NcclDeviceLink::NewUniqueId() {
  ncclUniqueId id;
  CAIRN_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::Status NcclDeviceLink::Init(int num_nodes, int node,
                                  const std::string& up_id,
                                  const std::string& down_id,
                                  absl::Duration timeout) {
  if (up_id.size() != sizeof(ncclUniqueId) ||
      down_id.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transport: communicator id of ", up_id.size(),
                     " bytes, expected ", sizeof(ncclUniqueId)));
  }
  DestroyComms();
  up_.aborted = absl::OkStatus();  // new communicators
  down_.aborted = absl::OkStatus();
  node_ = node;
  CAIRN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const absl::Time deadline = absl::Now() + timeout;
  for (auto [lane, id] :
       {std::make_pair(&up_, &up_id), std::make_pair(&down_, &down_id)}) {
    ncclUniqueId uid;
    std::memcpy(&uid, id->data(), sizeof(uid));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r =
        ncclCommInitRankConfig(&comm, num_nodes, uid, node, &config);
    lane->comm = comm;
    if (r != ncclSuccess && r != ncclInProgress) {
      DestroyComms();
      return gpu::NcclStatus(r, "ncclCommInitRankConfig");
    }
    absl::Status s =
        WaitComm(comm, deadline,
                 absl::StrCat("node ", node, " joining the communicator of ",
                              num_nodes, " nodes"));
    if (!s.ok()) {
      DestroyComms();
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status NcclDeviceLink::CheckLane(const Lane& lane, int peer) const {
  if (!lane.aborted.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl transport: node ", node_, ": the communicator to ",
                     peer > node_ ? "higher" : "lower", " nodes was aborted (",
                     lane.aborted.message(),
                     "); restart the agents together to join new ones"));
  }
  if (lane.comm == nullptr) {
    return absl::FailedPreconditionError("nccl transport: not initialized");
  }
  return absl::OkStatus();
}

absl::Status NcclDeviceLink::AwaitLane(Lane& lane, absl::Time deadline,
                                       absl::Duration timeout,
                                       const std::string& what) {
  auto comm = static_cast<ncclComm_t>(lane.comm);
  auto stream = static_cast<cudaStream_t>(lane.stream);
  absl::Status s = AwaitTransfer(
      [&]() -> absl::StatusOr<bool> {
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &async);
        if (r != ncclSuccess)
          return gpu::NcclStatus(r, "ncclCommGetAsyncError");
        if (async != ncclSuccess && async != ncclInProgress) {
          return gpu::NcclStatus(async, "the communicator");
        }
        const cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaErrorNotReady) return false;
        if (q != cudaSuccess) {
          return absl::InternalError(
              absl::StrCat("cudaStreamQuery: ", cudaGetErrorString(q)));
        }
        // Issued calls of a non-blocking communicator may still be
        // pending in NCCL itself (ncclInProgress) with nothing on the
        // stream yet.
        return async == ncclSuccess;
      },
      [&] {
        ncclCommAbort(comm);
        lane.comm = nullptr;
      },
      deadline, timeout, what);
  if (!s.ok()) lane.aborted = s;
  return s;
}

absl::Status NcclDeviceLink::Send(int peer, absl::Span<const char> data,
                                  absl::Duration timeout) {
  Lane& lane = LaneTo(peer);
  CAIRN_RETURN_IF_ERROR(CheckLane(lane, peer));
  const absl::Time deadline = absl::Now() + timeout;
  const std::string what =
      absl::StrCat("ncclSend of ", data.size(), " bytes to node ", peer);
  auto stream = static_cast<cudaStream_t>(lane.stream);
  CAIRN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  for (size_t off = 0; off < data.size(); off += staging_bytes_) {
    const size_t n = std::min<size_t>(staging_bytes_, data.size() - off);
    CAIRN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        lane.staging, data.data() + off, n, cudaMemcpyHostToDevice, stream));
    const ncclResult_t r = ncclSend(lane.staging, n, ncclChar, peer,
                                    static_cast<ncclComm_t>(lane.comm), stream);
    if (r != ncclSuccess && r != ncclInProgress) {
      return gpu::NcclStatus(r, what);
    }
    // The staging buffer is reused by the next piece: wait for this one.
    CAIRN_RETURN_IF_ERROR(AwaitLane(lane, deadline, timeout, what));
  }
  return absl::OkStatus();
}

absl::Status NcclDeviceLink::Recv(int peer, absl::Span<char> out,
                                  absl::Duration timeout) {
  Lane& lane = LaneTo(peer);
  CAIRN_RETURN_IF_ERROR(CheckLane(lane, peer));
  const absl::Time deadline = absl::Now() + timeout;
  const std::string what =
      absl::StrCat("ncclRecv of ", out.size(), " bytes from node ", peer);
  auto stream = static_cast<cudaStream_t>(lane.stream);
  CAIRN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  for (size_t off = 0; off < out.size(); off += staging_bytes_) {
    const size_t n = std::min<size_t>(staging_bytes_, out.size() - off);
    const ncclResult_t r = ncclRecv(lane.staging, n, ncclChar, peer,
                                    static_cast<ncclComm_t>(lane.comm), stream);
    if (r != ncclSuccess && r != ncclInProgress) {
      return gpu::NcclStatus(r, what);
    }
    CAIRN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        out.data() + off, lane.staging, n, cudaMemcpyDeviceToHost, stream));
    CAIRN_RETURN_IF_ERROR(AwaitLane(lane, deadline, timeout, what));
  }
  return absl::OkStatus();
}

}  // namespace cairn::agent
