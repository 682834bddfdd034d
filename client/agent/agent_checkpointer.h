// libcairn's agent mode: a rank hands its state to the node-local cairn-agent
// and goes back to training while the agent persists, keeps the checkpoint
// in memory and replicates it to peer agents.
//
//   AsyncSave: BeginStage (the agent reserves shared-memory staging space)
//              -> memcpy every host tensor and bytes entry into it (the only
//              time training waits) -> FinishStage -> returns a SaveFuture.
//              The agent commits through cairnd's protocol on the rank's
//              behalf, even if this process exits right after AsyncSave.
//              A save larger than the agent's whole staging budget streams:
//              the agent answers BeginStage with `streaming`, and AsyncSave
//              loops StageBucket — copy the pieces of one bucket, hand it
//              back, get the next (waiting only for buffer space while the
//              agent writes earlier buckets to storage) — then FinishStage.
//              Such an AsyncSave returns when the last bucket is handed over.
//   Load:      asks the agent (its memory, then peer agents' memory,
//              resharding point to point, crc32c-verified); on any failure
//              falls back to the direct path (Checkpointer::Load from
//              storage). last_load_source() tells which tier served it.
//
// Thread safety: thread-compatible — one AgentCheckpointer per rank, used by
// one thread at a time — except Cancel(), which any thread may call at any
// time (as Checkpointer::Cancel); a SaveFuture may be waited on from any
// thread.
//
// Cancel (as Checkpointer::Cancel, client/checkpointer.h): the AsyncSave,
// SaveFuture::Wait or Load in progress returns promptly, CANCELLED naming
// the rank, job and step ("rank 0 saving job 'llama' step 200 via agent:
// cancelled (AgentCheckpointer::Cancel)"); with none in progress, the next
// to start is cancelled at once. Each Cancel() is consumed by the call it
// cancelled (or that ran when it came). A cancelled save is cancelled at the
// agent (CancelSave): a copy still being staged is dropped and its staging
// space freed; once the agent has joined the save at cairnd (its persist, or
// a streaming save's BeginSave), the save is aborted there, so the other
// ranks fail ABORTED at once naming this rank, the step is listed ABORTED
// and the previous committed checkpoint stays the latest. Cancelled before
// the agent joined it (while AsyncSave waits for staging space or copies a
// save that fits the budget), nothing reached cairnd from this rank: the
// other ranks' saves end at cairnd's begin deadline, as when a rank never
// saves. Best effort once every rank has committed: SaveFuture::Wait then
// returns the committed checkpoint; if another rank aborted the save first,
// ABORTED with its reason. A cancelled Load does not fall back to storage;
// cancelled during the fallback, it stops as Checkpointer::Load does.
//
// Example:
//   AgentCheckpointerOptions o;
//   o.agent_socket = "/run/cairn/agent.sock";
//   o.direct = {.coordinator = "cairnd:7070", .job = "llama", .rank = r,
//               .world_size = w};
//   CAIRN_ASSIGN_OR_RETURN(auto ckpt, AgentCheckpointer::Connect(o));
//   CAIRN_ASSIGN_OR_RETURN(SaveFuture f, ckpt->AsyncSave(step, state));
//   ... train ...
//   CAIRN_ASSIGN_OR_RETURN(CheckpointInfo committed, f.Wait());
#ifndef CAIRN_CLIENT_AGENT_AGENT_CHECKPOINTER_H_
#define CAIRN_CLIENT_AGENT_AGENT_CHECKPOINTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/checkpointer.h"
#include "client/state_dict.h"

namespace cairn::client {

struct AgentCheckpointerOptions {
  // The agent's Unix domain socket path. Required.
  std::string agent_socket;
  // Job, rank, world size, cairnd address and direct-mode settings (used for
  // the storage fallback of Load). Required: job, rank, world_size,
  // coordinator.
  CheckpointerOptions direct;
  // Threads copying one large tensor into staging. Default: 1.
  int copy_threads = 1;
  // How long AsyncSave may wait for staging space (the agent's budget is
  // shared by its ranks and its in-memory tiers). Default: 10 minutes.
  absl::Duration wait_for_space = absl::Minutes(10);
  // Timeout of the control calls to the agent. Default: 5 minutes.
  absl::Duration rpc_timeout = absl::Minutes(5);
  // Let a save larger than the agent's budget stream through buckets
  // (otherwise it fails RESOURCE_EXHAUSTED). Default: true.
  bool allow_streaming = true;
  // Fault injection for tests: the agent exits right before CommitSave.
  bool agent_dies_before_commit_for_test = false;
  // Fault injection for tests: when > 0, this process exits (_exit(137))
  // right after filling this many streaming buckets, before handing the
  // last one back (a rank killed mid-stream).
  int exit_after_stream_buckets_for_test = 0;
};

// Durability of one AsyncSave. Copyable; may be waited on from any thread.
class SaveFuture {
 public:
  // Waits until the checkpoint is committed (every rank's agent done) and
  // this rank's tier 0 is replicated to its peers, and returns it; the
  // save's error otherwise (e.g. ABORTED, UNAVAILABLE when the agent died).
  // DEADLINE_EXCEEDED "... not persisted within ..." when `timeout` passes
  // first (the save goes on). AgentCheckpointer::Cancel() (of the
  // checkpointer that made this future) during the wait, or before it,
  // cancels the save (see the file comment) and returns CANCELLED, unless it
  // committed regardless. A Wait for a save that had already ended returns
  // its outcome and leaves a pending Cancel() to the next call.
  absl::StatusOr<CheckpointInfo> Wait(
      absl::Duration timeout = absl::Hours(2)) const;
  int64_t step() const { return step_; }

  // The agent connection and save key a future waits on (defined in the
  // .cc; made by AgentCheckpointer::AsyncSave).
  struct Target;
  SaveFuture(std::shared_ptr<const Target> target, int64_t step)
      : target_(std::move(target)), step_(step) {}

 private:
  std::shared_ptr<const Target> target_;
  int64_t step_;
};

enum class LoadSource { kNone, kAgentMemory, kStorage };

// Where an AsyncSave goes: as the job's policy says (cairn policy; storage
// without one), to storage, or to the agents' memory only (committed once
// every rank's shards are in replicas + 1 agents on distinct nodes; a save
// larger than the agent's budget is then refused RESOURCE_EXHAUSTED).
enum class SaveTier { kPolicy, kPersistent, kMemory };

struct AgentSaveStats {
  uint64_t bytes = 0;            // bytes copied into staging
  absl::Duration blocked;        // total time inside AsyncSave
  absl::Duration copy_time;      // of which memcpy into staging
  absl::Duration begin_time;     // of which waiting for BeginStage
  int64_t streamed_buckets = 0;  // > 0: the save streamed through buckets
};

class AgentCheckpointer {
 public:
  static absl::StatusOr<std::unique_ptr<AgentCheckpointer>> Connect(
      const AgentCheckpointerOptions& options);
  ~AgentCheckpointer();
  AgentCheckpointer(const AgentCheckpointer&) = delete;
  AgentCheckpointer& operator=(const AgentCheckpointer&) = delete;

  // Snapshots `state` into the agent's staging memory and returns once the
  // buffers of `state` may change again.
  absl::StatusOr<SaveFuture> AsyncSave(int64_t step, const StateDict& state,
                                       SaveTier tier = SaveTier::kPolicy);

  // The future of this rank's save of `step` staged by an AsyncSave of the
  // same job and rank, in this process or another (DCP's async_save in
  // PROCESS mode waits in a child process for the copy its parent staged).
  // Its Wait asks the agent by (job, step, rank); a Cancel() of this
  // checkpointer stops the wait, and the save only if this process staged
  // it.
  SaveFuture FutureOf(int64_t step) const;

  // Fills `state` from `ref`: agent memory tiers first, storage otherwise.
  // Returns the step loaded.
  absl::StatusOr<int64_t> Load(LoadRef ref, StateDict& state);

  // Cancels the AsyncSave, SaveFuture::Wait (of this checkpointer's
  // futures) or Load in progress on another thread, or with none in
  // progress the next one to start (see the file comment). Thread-safe;
  // returns at once. Not async-signal-safe.
  void Cancel();

  const AgentSaveStats& last_save_stats() const;
  LoadSource last_load_source() const;
  // Why the agent could not serve the last load (OK if it did).
  const absl::Status& last_agent_load_error() const;
  // Bytes the agent served from its own memory / from peers on the last load.
  uint64_t last_load_bytes_local() const;
  uint64_t last_load_bytes_peers() const;

 private:
  class Impl;
  explicit AgentCheckpointer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn::client

#endif  // CAIRN_CLIENT_AGENT_AGENT_CHECKPOINTER_H_
