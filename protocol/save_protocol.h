/// \file
/// The one save protocol: a rank's side of cairnd's collective save, shared by
/// libcairn's Checkpointer (a rank saving its own buffers) and cairn-agent
/// (saving staged or streamed bytes on a rank's behalf).
///
///   SaveProtocol::Begin   BeginSave (collective). Sends only the plan's
///                         fingerprint when this rank's local plan is
///                         unchanged since its last save; when cairnd no
///                         longer holds that plan (resend_plan) the whole
///                         plan goes again. The rank's part of the global
///                         plan is kept by plan id, so cairnd answers an
///                         unchanged one without sending it again. Returns a
///                         PlannedSave.
///   PlannedSave writes    every planned object through PlannedObjectWriter
///                         (zero padding to the planned offsets, crc32c per
///                         item, durable on Close): WriteAll from an
///                         ItemSources, or object by object (OpenObject).
///   PlannedSave::Commit   CommitSave (collective) with the crc32c of each
///                         item; returns once the checkpoint is COMMITTED.
///   PlannedSave::Abort    after a local failure: AbortSave for every rank,
///                         and the error to report — ABORTED with the first
///                         reason when another rank (or cairnd) aborted the
///                         save first, so the real cause is reported.
///
/// Cancellation (SaveProtocolOptions::cancellation, optional): Cancel() on
/// another thread stops the save wherever it is — a BeginSave or CommitSave
/// waiting for the other ranks returns at once, WriteAll issues no further
/// item (those being written finish) — and the save is aborted at cairnd
/// with the cancellation's reason, so the other ranks fail ABORTED at once
/// naming this rank and that reason. Once every rank has called CommitSave
/// cairnd no longer aborts the save: Commit then waits for and returns the
/// commit's outcome, so a committed checkpoint is never reported cancelled.
///
/// Every call carries the incarnation: a random nonzero id of the process
/// whose part in the save this is, so cairnd tells a restarted rank from a
/// retry of the same process.
///
/// Thread-compatible: one SaveProtocol per (job, rank), one save at a time;
/// WriteAll and writers of different objects run concurrently inside.
///
/// Example:
///   auto stub = v1::Coordinator::NewStub(NewCoordinatorChannel(address));
///   SaveProtocol protocol(stub.get(), {.job = "llama", .rank = r,
///                                      .world_size = w});
///   CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<PlannedSave> save,
///                          protocol.Begin(step, local_plan));
///   if (absl::Status s = save->WriteAll(sources, pool); !s.ok()) {
///     return save->Abort(s);
///   }
///   CAIRN_ASSIGN_OR_RETURN(v1::CheckpointRecord record, save->Commit());
#ifndef CAIRN_CLIENT_PROTOCOL_SAVE_PROTOCOL_H_
#define CAIRN_CLIENT_PROTOCOL_SAVE_PROTOCOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "cairn/v1/cairn.pb.h"
#include "common/thread_pool.h"
#include "planner/box.h"
#include "planner/save_plan.h"
#include "protocol/cancellation.h"
#include "protocol/coordinator_call.h"
#include "protocol/planned_writer.h"
#include "storage/shard_store.h"

namespace cairn::protocol {

struct SaveProtocolOptions {
  // The job ([A-Za-z0-9._-]{1,128}), the rank and the world size the saves
  // are for. Required.
  std::string job;
  int rank = 0;
  int world_size = 1;
  // How long BeginSave/CommitSave may wait for the other ranks (a backstop:
  // cairnd's own deadlines answer first). Default: 65 minutes.
  absl::Duration collective_timeout = absl::Minutes(65);
  // Timeout of AbortSave and GetCheckpoint. Default: 5 minutes.
  absl::Duration rpc_timeout = absl::Minutes(5);
  // Retries of BeginSave/CommitSave that failed UNAVAILABLE or CANCELLED
  // (CallWithRetry) once cairnd has answered. Default: 16.
  int max_retries = 16;
  // Whether cairnd has answered on the stub's channel, and how long a call
  // may try to reach it until it has (CallWithRetry). Not owned; must
  // outlive the SaveProtocol. A save whose cairnd was never reached is not
  // aborted there (it holds nothing of this process). Default: none (every
  // call retries max_retries times).
  CoordinatorContact* contact = nullptr;
  // Options of the store opened for the plan's storage URI.
  // Default: StoreOptions's defaults.
  storage::StoreOptions store;
  // Cancels the save in progress when another thread calls its Cancel()
  // (see above). Not owned; must outlive the SaveProtocol. The protocol
  // never resets it. Default: none (saves are not cancellable).
  Cancellation* cancellation = nullptr;
};

// A random nonzero 64-bit id for one process's part in saves (see
// SaveProtocol::incarnation()). Thread-safe.
uint64_t NewIncarnation();

// Where this process holds the bytes of the items it offered to a save: a
// tensor chunk by fqn and box, a bytes entry by fqn. The spans are borrowed.
class ItemSources {
 public:
  void AddChunk(absl::string_view fqn, const planner::ChunkBox& box,
                absl::Span<const char> data);
  void AddBytes(absl::string_view fqn, absl::Span<const char> data);

  // The bytes of planned write `w`: FAILED_PRECONDITION naming the item when
  // this process does not hold it, or not with the planned length.
  absl::StatusOr<absl::Span<const char>> Find(const v1::PlannedWrite& w) const;

 private:
  absl::flat_hash_map<std::string, absl::Span<const char>> spans_;
};

class PlannedSave;

class SaveProtocol {
 public:
  // `stub` (a Coordinator stub, see NewCoordinatorChannel) is not owned and
  // must outlive this object and every PlannedSave it returns.
  SaveProtocol(v1::Coordinator::Stub* stub, SaveProtocolOptions options);
  SaveProtocol(const SaveProtocol&) = delete;
  SaveProtocol& operator=(const SaveProtocol&) = delete;

  const SaveProtocolOptions& options() const { return options_; }

  // The id this protocol's calls carry (BeginSaveRequest.incarnation), made
  // by NewIncarnation. A process acting for a rank (cairn-agent) sets the
  // rank process's id before each save.
  uint64_t incarnation() const { return incarnation_; }
  void set_incarnation(uint64_t incarnation) { incarnation_ = incarnation; }

  // The tier the next saves ask for (BeginSaveRequest.tier, agent_holds,
  // replicas): cairn-agent sets it before each save; a rank saving its own
  // buffers leaves the default (the job's policy decides, and a memory
  // save needs an agent).
  struct Tier {
    v1::Tier tier = v1::TIER_UNSPECIFIED;
    bool agent_holds = false;
    int replicas = 0;
  };
  void set_tier(const Tier& tier) { tier_ = tier; }

  // BeginSave for `local` (this rank's items) as `step`: the fingerprint
  // alone when `local` is unchanged since the last successful Begin, the
  // plan when it changed or cairnd asks for it. INVALID_ARGUMENT for a bad
  // step; cairnd's answer otherwise. A plan that cannot be written (writes
  // overlapping in an object) is aborted for every rank and its error
  // returned. Cancelled: CANCELLED naming the rank, job and step, the save
  // aborted at cairnd when this rank had called BeginSave.
  absl::StatusOr<std::unique_ptr<PlannedSave>> Begin(
      int64_t step, const planner::LocalSavePlan& local);

  // The store of `uri` (opened with options().store; cached, so a series of
  // saves reuses one store).
  absl::StatusOr<storage::ShardStore*> StoreFor(const std::string& uri);

 private:
  friend class PlannedSave;

  // "rank 3 saving job 'llama' step 100".
  std::string Where(int64_t step) const;
  // Fills in `plan`'s rank plan from the held one when cairnd answered
  // rank_plan_unchanged (INTERNAL if this process holds another), or holds
  // the one it sent for the next save.
  absl::Status UseOrHoldRankPlan(v1::BeginSaveResponse& plan);
  // PlannedSave::Abort for `step` (also before a plan exists: a cancelled
  // BeginSave). `*abort_answer` (if not null) gets cairnd's answer to the
  // AbortSave.
  absl::Status AbortStep(int64_t step, const absl::Status& failure,
                         absl::Status* abort_answer = nullptr);

  // Constant after construction.
  v1::Coordinator::Stub* const stub_;
  const SaveProtocolOptions options_;

  uint64_t incarnation_;
  Tier tier_;
  std::string last_fingerprint_;
  // The rank plan of the last BeginSave answer, object keys relative to its
  // attempt's directory, and its plan id (empty: none held).
  std::string held_plan_id_;
  v1::RankSavePlan held_rank_plan_;
  std::string store_uri_;
  std::unique_ptr<storage::ShardStore> store_;
};

// One save after BeginSave: cairnd's plan for this rank, the commit request
// being filled in, and the calls that end the save.
class PlannedSave {
 public:
  PlannedSave(const PlannedSave&) = delete;
  PlannedSave& operator=(const PlannedSave&) = delete;

  int64_t step() const { return step_; }
  // "rank 3 saving job 'llama' step 100": how this save's errors start.
  const std::string& where() const { return where_; }
  const v1::BeginSaveResponse& plan() const { return plan_; }
  // Whether BeginSave went with the fingerprint only (the plan unchanged
  // and still held by cairnd).
  bool sent_fingerprint_only() const { return sent_fingerprint_only_; }
  // This rank's planned objects, in key order (GroupByObject).
  const std::vector<PlannedObject>& objects() const { return objects_; }
  // The store of the plan's storage URI.
  storage::ShardStore& store() const { return *store_; }
  // Payload bytes planned for this rank.
  uint64_t planned_bytes() const;

  // A writer of objects()[i] that records into this save's commit request.
  absl::StatusOr<std::unique_ptr<PlannedObjectWriter>> OpenObject(size_t i);

  // Writes every planned object from `sources`, objects in parallel on
  // `pool`; each object is durable when this returns OK. The first error
  // (every object's writer runs to its end or its error) names the item and
  // the object; Abort() adds job, step and rank. Once cancelled, no further
  // item is written and the cancellation's status is returned.
  absl::Status WriteAll(const ItemSources& sources, ThreadPool& pool);

  // A memory save (plan().tier() == TIER_MEMORY): nothing is written; the
  // crc32c of every planned write is taken from `sources` (the bytes held in
  // memory) and the commit names `holder_nodes`, the nodes whose agents
  // hold them. FAILED_PRECONDITION naming an item `sources` lacks.
  absl::Status RecordHeld(const ItemSources& sources,
                          const std::vector<int>& holder_nodes);

  // Runs right before CommitSave (fault tests kill the process here). The
  // crash point "client.before_commit" is hit just before it.
  void SetBeforeCommitForTest(std::function<void()> hook) {
    before_commit_for_test_ = std::move(hook);
  }

  // CommitSave (collective) with every item's crc32c: returns the committed
  // record, or cairnd's answer (which names the cause). A failed commit is
  // not aborted here: the caller calls Abort() so the save does not linger.
  // A cancelled one is (see Cancellation above): CANCELLED prefixed with
  // where(), or ABORTED when another rank aborted the save first, or the
  // committed record when every rank had already committed.
  absl::StatusOr<v1::CheckpointRecord> Commit();

  // Aborts the save for every rank (best effort) after this rank's part
  // failed with `failure`, and returns the error to report, prefixed with
  // where(): `failure`, or, when the save had already been aborted (by
  // another rank, or by cairnd) — so what this rank ran into was that
  // abort's cleanup: a temp file deleted under it, say — ABORTED with the
  // first reason, which names the rank and the real cause (e.g. no space
  // left), this rank's own failure appended.
  absl::Status Abort(const absl::Status& failure);

 private:
  friend class SaveProtocol;
  PlannedSave(SaveProtocol* protocol, int64_t step, v1::BeginSaveResponse plan,
              bool sent_fingerprint_only);

  // The CommitSave to send: commit_, or its short form (CommitSaveRequest
  // .crc32cs) when cairnd's answer named its plan and attempt.
  v1::CommitSaveRequest CommitRequest() const;

  // Constant after construction.
  SaveProtocol* const protocol_;
  const int64_t step_;
  const std::string where_;
  const v1::BeginSaveResponse plan_;
  const bool sent_fingerprint_only_;

  std::vector<PlannedObject> objects_;
  storage::ShardStore* store_ = nullptr;
  // Results in plan_.rank_plan().writes() order, locations prefilled.
  v1::CommitSaveRequest commit_;
  std::function<void()> before_commit_for_test_;
};

}  // namespace cairn::protocol

#endif  // CAIRN_CLIENT_PROTOCOL_SAVE_PROTOCOL_H_
