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
//
// Thread-compatible: one Checkpointer per rank, used by one thread at a time.
//
// Example:
//   CheckpointerOptions opts{.coordinator = "cairnd:7070", .job = "llama",
//                            .rank = rank, .world_size = world};
//   CAIRN_ASSIGN_OR_RETURN(auto ckpt, Checkpointer::Connect(opts));
//   CAIRN_RETURN_IF_ERROR(ckpt->Save(step, state).status());
//   CAIRN_ASSIGN_OR_RETURN(int64_t loaded, ckpt->Load(LoadRef::Latest(),
//   state));
#ifndef CAIRN_CLIENT_CHECKPOINTER_H_
#define CAIRN_CLIENT_CHECKPOINTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "cairn/v1/cairn.pb.h"
#include "client/protocol/save_protocol.h"
#include "client/state_dict.h"
#include "common/thread_pool.h"
#include "planner/save_plan.h"
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
  // ranks UNAVAILABLE), with exponential backoff from 100 ms to 5 s: the
  // default rides out a cairnd restart of about a minute, then the call
  // fails naming the attempts. Default: 16.
  int max_retries = 16;
  // How a load verifies a stored chunk this rank needs only part of (chunks
  // read whole are always verified here). Default: kCollective.
  PartialChunkCheck partial_chunk_check = PartialChunkCheck::kCollective;
  // Storage options for the URI cairnd hands out (posix threads, O_DIRECT).
  // Default: StoreOptions's defaults, but data objects written with O_DIRECT
  // (falls back to buffered writes where the filesystem refuses it). Ranks
  // write large objects once and never read them back: through the page
  // cache, four ranks on two cores saved at 0.8-1.0 GB/s, with O_DIRECT at
  // 2.5-3.5 GB/s on the same disk (bench/e2e_bench.py, README).
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

class Checkpointer {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Connect(
      const CheckpointerOptions& options);

  // Saves `state` as `step` and returns the committed record. On a local
  // failure the save is aborted for every rank (AbortSave) and the error is
  // returned; a committed checkpoint is never affected.
  absl::StatusOr<v1::CheckpointRecord> Save(int64_t step,
                                            const StateDict& state);

  // Phased save, for callers that produce the bytes themselves instead of
  // pointing a StateDict at them (cairn-agent streaming a save larger than
  // its memory). Save() is exactly BeginPlannedSave -> write every planned
  // item (crc32c into the CommitSaveRequest's results) -> CommitPlannedSave,
  // or AbortPlannedSave on a local failure.
  //
  // BeginPlannedSave: BeginSave (collective) for `local` (this rank's item
  // set); returns cairnd's plan. The commit request's results are in
  // plan.rank_plan().writes() order; MakeCommitRequest prefills them.
  absl::StatusOr<v1::BeginSaveResponse> BeginPlannedSave(
      int64_t step, const planner::LocalSavePlan& local);
  v1::CommitSaveRequest MakeCommitRequest(
      int64_t step, const v1::BeginSaveResponse& plan) const;
  // The store of the plan's storage URI (cached).
  absl::StatusOr<storage::ShardStore*> StoreFor(const std::string& uri);
  // Runs before_commit_for_test, then CommitSave (collective).
  absl::StatusOr<v1::CheckpointRecord> CommitPlannedSave(
      const v1::CommitSaveRequest& commit);
  // Aborts the save for every rank (best effort) after this rank's part
  // failed with `failure`, and returns the error to report: `failure`, or,
  // when the save had already been aborted (by another rank, or by cairnd)
  // — so what this rank ran into was that abort's cleanup: a temp file
  // deleted under it, say — ABORTED with the first reason, which names the
  // rank and the real cause (e.g. no space left), this rank's own failure
  // appended. Not prefixed with this rank's job/step (callers add it).
  absl::Status AbortPlannedSave(int64_t step, const absl::Status& failure);

  // The id this Checkpointer's calls carry (BeginSaveRequest.incarnation): a
  // random nonzero 64-bit nonce made by Connect, so cairnd tells a restarted
  // rank from a retry of the same process. A process acting for the rank
  // (cairn-agent) sets the rank process's id before each save.
  uint64_t incarnation() const { return protocol_->incarnation(); }
  void set_incarnation(uint64_t incarnation) {
    protocol_->set_incarnation(incarnation);
  }

  // Fills every chunk and bytes entry of `state` from checkpoint `ref`,
  // resharding from whatever layout saved it. Returns the step loaded.
  absl::StatusOr<int64_t> Load(LoadRef ref, StateDict& state);

  const TransferStats& last_stats() const { return stats_; }
  const CheckpointerOptions& options() const { return options_; }
  v1::Coordinator::Stub& stub() { return *stub_; }

 private:
  explicit Checkpointer(const CheckpointerOptions& options);

  absl::Status ReadItems(const v1::PlanLoadResponse& plan,
                         const std::vector<TensorChunk*>& dests);
  absl::Status ReadBytesEntries(const v1::PlanLoadResponse& plan,
                                StateDict& state);
  // Whether a load reports its partly read chunks to cairnd (VerifyLoad in
  // the load round PlanLoad joined).
  bool JoinsLoadCollective() const;
  // This rank's VerifyLoad request for `plan`'s round, without pieces.
  v1::VerifyLoadRequest LoadReport(const v1::PlanLoadResponse& plan) const;
  // Tells the load round this rank is done (its load failed), so the other
  // ranks are answered without its pieces. Synchronous: cairnd answers a
  // report without pieces at once, and nothing is left running.
  void ReportLoadFailure(const v1::VerifyLoadRequest& request);

  // Constant after construction.
  const CheckpointerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<ThreadPool> io_pool_;
  std::unique_ptr<protocol::SaveProtocol> protocol_;

  TransferStats stats_;
};

// A random nonzero 64-bit id for one process's part in saves (see
// Checkpointer::incarnation()).
using protocol::NewIncarnation;

}  // namespace cairn::client

#endif  // CAIRN_CLIENT_CHECKPOINTER_H_
