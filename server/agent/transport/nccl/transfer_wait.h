// AwaitTransfer: how the NCCL transport waits for a device transfer without
// hanging on a peer that died mid-transfer. ncclSend/ncclRecv only queue
// work on a CUDA stream; a peer that is gone never posts its side, so the
// kernel waits forever and a cudaStreamSynchronize with it. Instead the
// stream and the communicator are polled until the transfer is done, the
// communicator reports an error, or the deadline passes; then the
// communicator is aborted (ncclCommAbort ends the stuck kernel) and the
// caller gets the reason. Host-only logic (no CUDA here), so it is tested
// without a GPU.
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_NCCL_TRANSFER_WAIT_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_NCCL_TRANSFER_WAIT_H_

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace cairn::agent {

// Calls `poll` (true: done; an error: the communicator failed) until it is
// done (OK), fails (`abort` runs, then its error with "<what>: " before its
// message) or `deadline` passes (`abort` runs, then DEADLINE_EXCEEDED
// "<what> did not complete within <timeout> ..."). `timeout` is only named
// in the message. Polls back off from 20 us to 1 ms, so a short transfer is
// seen at once and a long one costs little CPU. `abort` runs at most once.
absl::Status AwaitTransfer(absl::FunctionRef<absl::StatusOr<bool>()> poll,
                           absl::FunctionRef<void()> abort, absl::Time deadline,
                           absl::Duration timeout, absl::string_view what);

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_NCCL_TRANSFER_WAIT_H_
