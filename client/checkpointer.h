// libcairn: the API a training process calls to save and load its shards.
//
// Direct mode: every rank writes its own bytes to the checkpoint storage,
// planned by cairnd:
//   Save:  BeginSave (only a fingerprint when the rank's plan is unchanged)
//          -> write the items cairnd assigned to this rank, crc32c computed
//          while writing -> CommitSave. Returns once the checkpoint is
//          COMMITTED (every rank's bytes durable, MANIFEST published).
//   Load:  PlanLoad for this rank's chunks, whatever layout saved them ->
//          read exactly the planned byte ranges -> verify crc32c -> fill the
//          caller's buffers.
//   Queries (read-only, any rank): List, LatestStep, Describe.
//
// Errors are absl::Status: a message names the job, step, rank and tensor
// (fqn) involved, and the code says what to do (UNAVAILABLE: cairnd did not
// answer — never, within first_contact_timeout, or not again after a
// restart, within max_retries — retry later; ABORTED: the save was aborted, by
// this rank or another — the message names which and why; INVALID_ARGUMENT: the
// state dict or step is wrong; NOT_FOUND: no such checkpoint; DATA_LOSS: stored
// bytes are damaged; CANCELLED: Cancel() stopped the call).
//
// Thread safety: a Checkpointer is thread-compatible — one Checkpointer per
// rank, used by one thread at a time (Save, Load and the queries must not
// overlap; different Checkpointers may be used concurrently) — except
// Cancel(), the one method that is thread-safe: any thread may call it at
// any time, e.g. a signal-watching thread stopping a Save in progress. Its
// internal I/O threads never call back into caller code except the
// *_for_test hooks.
//
// Example:
//   CheckpointerOptions opts;
//   opts.coordinator = "cairnd:7070";
//   opts.job = "llama";
//   opts.rank = rank;
//   opts.world_size = world;
//   CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<Checkpointer> ckpt,
//                          Checkpointer::Connect(opts));
//   CAIRN_ASSIGN_OR_RETURN(CheckpointInfo saved, ckpt->Save(step, state));
//   CAIRN_ASSIGN_OR_RETURN(int64_t loaded,
//                          ckpt->Load(LoadRef::Latest(), state));
#ifndef CAIRN_CLIENT_CHECKPOINTER_H_
#define CAIRN_CLIENT_CHECKPOINTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/state_dict.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "protocol/client_security.h"
#include "storage/shard_store.h"

namespace cairn::client {

// How a load verifies the crc32c of a stored chunk that a rank needs only
// part of (resharding: rows saved, columns loaded).
enum class PartialChunkCheck {
  // Read only the needed bytes and report their crc32c term to cairnd
  // (VerifyLoad), which combines the terms of every rank of the load round
  // (the ranks whose Loads start within cairnd's --load-join-grace of each
  // other, default 2 s) into the chunk's checksum. A rank loading alone or
  // after the others waits at most that grace for peers. Pieces cairnd
  // cannot verify (the ranks did not read the chunk completely between them,
  // or it does not match) are re-read whole and checked here; if cairnd
  // cannot be asked (a rank of the round never reports, cairnd restarts),
  // every partly read chunk is. Bytes read == bytes needed when the ranks
  // together read every chunk they touch.
  kCollective,
  // Read such chunks whole and check them locally: independent of other
  // ranks, but bytes read > bytes needed.
  kReadWhole,
  // Read only the needed bytes and leave such chunks unverified.
  kNone,
};

struct CheckpointerOptions {
  // cairnd's address, host:port. Required.
  std::string coordinator;
  // TLS (CA bundle, client certificate) and bearer token for the calls to
  // cairnd. Default: from CAIRN_TLS_CA, CAIRN_TLS_CERT, CAIRN_TLS_KEY and
  // CAIRN_TOKEN (none set: plaintext, no token).
  protocol::ClientSecurity security =
      protocol::ClientSecurity::FromEnvironment();
  // The training job's name ([A-Za-z0-9._-]{1,128}). Required.
  std::string job;
  int rank = 0;
  int world_size = 1;
  // Parallel reads/writes this rank issues to storage. Default: 4.
  int io_threads = 4;
  // How long a BeginSave/CommitSave/VerifyLoad may wait for the other
  // ranks. A backstop for a cairnd that never answers: cairnd's own
  // deadlines (begin 1 min, commit 60 min, load verify 1 min by default)
  // answer first with the real reason, so this must exceed them.
  // Default: 65 minutes.
  absl::Duration collective_timeout = absl::Minutes(65);
  // Timeout of every other RPC. Default: 5 minutes.
  absl::Duration rpc_timeout = absl::Minutes(5);
  // Retries of a call that failed UNAVAILABLE or CANCELLED (cairnd down,
  // restarting, or shutting down under the call: SIGTERM answers parked
  // ranks UNAVAILABLE), with exponential backoff from 100 ms to 5 s, once
  // cairnd has answered this Checkpointer: the default rides out a cairnd
  // restart of about a minute, then the call fails naming the attempts.
  // Default: 16.
  int max_retries = 16;
  // How long a call tries to reach a cairnd that has never answered this
  // Checkpointer (a wrong address, cairnd not running, a TLS handshake it
  // refuses) before failing UNAVAILABLE "cairnd at <address> was never
  // reached: <gRPC's reason>". Counted per call: a later call tries again.
  // Default: 5 s.
  absl::Duration first_contact_timeout = absl::Seconds(5);
  // How a load verifies a stored chunk this rank needs only part of (chunks
  // read whole are always verified here). Default: kCollective.
  PartialChunkCheck partial_chunk_check = PartialChunkCheck::kCollective;
  // Storage options for the URI cairnd hands out (posix threads, O_DIRECT).
  // Default: StoreOptions's defaults, but data objects written with O_DIRECT
  // (falls back to buffered writes where the filesystem refuses it). Ranks
  // write large objects once and never read them back, so the page cache
  // would only cost them a copy per byte (docs/design.md, "O_DIRECT saves").
  storage::StoreOptions store = [] {
    storage::StoreOptions o;
    o.use_odirect = true;
    return o;
  }();
  // Test hook: runs after this rank's bytes are written, before CommitSave
  // (fault tests kill the process here).
  std::function<void()> before_commit_for_test;
  // Test hook: runs after PlanLoad answered (with the step it resolved),
  // before any read (race tests hold a rank here).
  std::function<void(int64_t step)> after_plan_load_for_test;
};

class LoadRef {
 public:
  static LoadRef Latest() { return LoadRef(-1); }
  static LoadRef Step(int64_t step) { return LoadRef(step); }
  bool latest() const { return step_ < 0; }
  int64_t step() const { return step_; }

 private:
  explicit LoadRef(int64_t step) : step_(step) {}
  int64_t step_;
};

// What one Save or Load did, for logs and benchmarks.
struct TransferStats {
  uint64_t bytes = 0;          // payload bytes written or delivered
  uint64_t bytes_storage = 0;  // bytes moved to/from storage
  int64_t items = 0;
  int64_t chunks_verified_by_cairnd = 0;  // load: partly read, combined
  int64_t chunks_verified_locally = 0;    // load: partly read, read whole
  bool plan_from_cache = false;
  bool sent_fingerprint_only = false;
  absl::Duration plan_time;
  absl::Duration io_time;
  absl::Duration commit_time;
};

enum class CheckpointState {
  kUnknown,    // a state this library does not know (a newer cairnd)
  kWriting,    // a save in progress: not loadable
  kCommitted,  // every rank's bytes durable and the MANIFEST published
  kAborted,    // never loadable; abort_reason says why
  kDeleting,   // being deleted (cairn rm, gc, retention): never loadable
};

// "WRITING", "COMMITTED", "ABORTED", "DELETING" or "UNKNOWN".
absl::string_view CheckpointStateName(CheckpointState state);

// cairnd's record of one checkpoint (job, step).
struct CheckpointInfo {
  std::string job;
  int64_t step = 0;
  CheckpointState state = CheckpointState::kUnknown;
  int world_size = 0;  // ranks that saved it
  uint64_t bytes = 0;  // stored bytes of every tensor and entry
  int num_tensors = 0;
  int num_bytes_entries = 0;
  absl::Time created = absl::InfinitePast();    // when its save began
  absl::Time committed = absl::InfinitePast();  // kCommitted only
  std::string storage_uri;                      // where its bytes are
  std::string abort_reason;  // kAborted only: which rank aborted and why
};

// One tensor of a committed checkpoint, as its manifest records it.
struct TensorSummary {
  std::string fqn;
  planner::DType dtype = planner::DType::kUnspecified;
  planner::Shape shape;  // global
  int chunks = 0;        // stored chunks (a resharding load reads any subset)
  uint64_t bytes = 0;    // stored bytes of all its chunks
  // The global box of every stored chunk (chunks of them), sorted by box
  // (offsets, then sizes: the manifest's order): how the saving ranks split
  // the tensor, e.g. [0:4, 0:4] and [4:8, 0:4] for rows split over 2 ranks.
  std::vector<planner::ChunkBox> chunk_boxes;
};

// One bytes entry of a committed checkpoint.
struct BytesEntrySummary {
  std::string fqn;
  uint64_t bytes = 0;
};

// What a committed checkpoint holds (Describe).
struct CheckpointSummary {
  CheckpointInfo info;
  std::vector<TensorSummary> tensors;            // sorted by fqn
  std::vector<BytesEntrySummary> bytes_entries;  // sorted by fqn
};

class Checkpointer {
 public:
  // Checks `options` (INVALID_ARGUMENT naming the job and rank) and sets up
  // the channel to cairnd; does not wait for cairnd to be up (the first
  // call does, for first_contact_timeout).
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Connect(
      const CheckpointerOptions& options);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Saves `state` as `step` (collective: every rank of the job calls it) and
  // returns the committed checkpoint. On a local failure the save is aborted
  // for every rank (AbortSave) and the error is returned, naming this rank,
  // the job and step: ABORTED with the first reason when another rank's
  // failure aborted it. A committed checkpoint is never affected.
  absl::StatusOr<CheckpointInfo> Save(int64_t step, const StateDict& state);

  // Fills every chunk and bytes entry of `state` from checkpoint `ref`,
  // resharding from whatever layout saved it. Returns the step loaded.
  absl::StatusOr<int64_t> Load(LoadRef ref, StateDict& state);

  // The job's checkpoints, by step: committed ones, and with
  // `include_uncommitted` also those being written, aborted or deleted.
  absl::StatusOr<std::vector<CheckpointInfo>> List(
      bool include_uncommitted = false);

  // The job's newest committed step, as cairnd resolves `latest` for a load
  // (never a step being written, aborted or deleted). NOT_FOUND naming the
  // job when it has none.
  absl::StatusOr<int64_t> LatestStep();

  // The record and the manifest summary (tensors with dtype, shape, stored
  // chunks' boxes and bytes; bytes entries) of `step`. NOT_FOUND naming the job
  // and step when cairnd has no record of it; FAILED_PRECONDITION naming its
  // state when it is not committed (no manifest).
  absl::StatusOr<CheckpointSummary> Describe(int64_t step);

  // Cancels the Save or Load in progress on another thread; with none in
  // progress, the next Save or Load to start is cancelled at once. Each
  // Cancel() is consumed by exactly one Save or Load (the one it cancelled,
  // or the one running when it came): the call after that runs normally.
  // List, LatestStep and Describe are never cancelled and do not consume
  // it. Thread-safe; returns at once (it does not wait for the call to end).
  // Not async-signal-safe (it takes a mutex): from a signal, wake a thread
  // that calls it (Python: the thread that sees KeyboardInterrupt).
  //
  // The cancelled call returns promptly wherever it is — waiting for the
  // other ranks in BeginSave, CommitSave or VerifyLoad (a load round's join
  // grace; the call to cairnd is cancelled and not retried), or reading or
  // writing storage (no further item is started; the ones in flight finish) —
  // with CANCELLED naming the rank, job and step: "rank 0 saving job 'llama'
  // step 200: cancelled (Checkpointer::Cancel)".
  //
  // Save: the save is aborted at cairnd (AbortSave with that reason), so the
  // other ranks fail ABORTED at once, naming this rank and the reason; the
  // step is listed ABORTED, its partly written objects are deleted, and the
  // previous committed checkpoint stays the latest and loadable (a
  // committed checkpoint is never affected). Best effort once every rank has
  // called CommitSave: cairnd then commits regardless, and Save returns the
  // committed checkpoint instead of CANCELLED. If another rank aborted the
  // save first, Save returns ABORTED with that rank's reason.
  //
  // Load: nothing is committed or changed at cairnd. When Load returns
  // CANCELLED, the state's buffers are untouched if it was cancelled before
  // reading (at its start or in PlanLoad); cancelled in VerifyLoad, they
  // hold every byte the load planned, but the chunks read in part are not
  // verified; cancelled while reading, some are filled and some not. Treat
  // the state as not loaded unless Load returned OK. A Cancel that comes
  // once the load has verified everything may let it return OK (fully
  // loaded).
  void Cancel();

  // The id this Checkpointer's saves carry (a random nonzero 64-bit nonce
  // made by Connect), so cairnd tells a restarted rank from a retry of the
  // same process.
  uint64_t incarnation() const;

  // What the last Save or Load did.
  const TransferStats& last_stats() const;
  const CheckpointerOptions& options() const;

 private:
  class Impl;
  explicit Checkpointer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn::client

#endif  // CAIRN_CLIENT_CHECKPOINTER_H_
