// Persister: writes ranks' saves to storage through cairnd's save protocol
// (protocol/save_protocol.h), one persist thread per save, and keeps each
// save's outcome for WaitSave.
//   Persist  a staged set (its bytes in its segment): crc32c of every item,
//            BeginSave / WriteAll / CommitSave; once committed the set
//            becomes the rank's tier 0 (MemoryTier::Keep) and is pushed to
//            the `replicas` next nodes; the save is done after the pushes.
//   Stream   a streaming save (StreamingSave): BeginSave at once, then the
//            rank's buckets appended object by object as they are filled,
//            CommitSave after the rank's Finish. Nothing of it is kept in
//            memory.
// One rank's saves persist one at a time, in order, through one
// SaveProtocol per (job, rank) (its plan cache). Cancel stops a rank's save
// wherever it is: a persist's calls to cairnd return at once and the save is
// aborted there (unless every rank had committed), a stream fails.
//
// Thread-safe. Lock order: mu_ before a StreamingSave's lock and the memory
// tier's; cairnd and replica pushes are called without mu_ held.
#ifndef CAIRN_SERVER_AGENT_PERSISTER_H_
#define CAIRN_SERVER_AGENT_PERSISTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cairn/v1/agent.pb.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "common/metrics.h"
#include "common/thread_pool.h"
#include "protocol/cancellation.h"
#include "protocol/coordinator_call.h"
#include "protocol/save_protocol.h"
#include "server/agent/items.h"
#include "server/agent/memory_tier.h"
#include "server/agent/streaming_save.h"
#include "storage/shard_store.h"

namespace cairn::agent {

// Whether a CancelSave request names `set`'s save: same job, step and rank,
// and the same process of the rank (incarnation) when both say which.
bool CancelNames(const v1::CancelSaveRequest& request, const ItemSet& set);

class Persister {
 public:
  // The persist metrics (docs/operations.md "Metrics"), owned by a registry.
  struct Metrics {
    metrics::Counter* bytes_persisted = nullptr;
    metrics::Histogram* persist_seconds = nullptr;
    metrics::Counter* persists_committed = nullptr;
    metrics::Counter* persists_failed = nullptr;
    metrics::Gauge* persist_queue = nullptr;
    metrics::Counter* replication_sent_bytes = nullptr;
    metrics::Counter* replication_failures = nullptr;
    // The sent counter's twin, direction="received": counted by the
    // PeerServer that keeps the replicas, not here.
    metrics::Counter* replication_received_bytes = nullptr;
    // Registers them in `registry`.
    static Metrics Register(metrics::Registry& registry);
  };
  struct Options {
    int node_id = 0;
    int num_nodes = 1;
    // Peers each committed staged set is pushed to: nodes node+1 ..
    // node+replicas (mod num_nodes).
    int replicas = 0;
    // Parallel object writes of one rank's persist.
    int io_threads = 4;
    storage::StoreOptions store;
    Metrics metrics;  // every member set
  };
  // Pushes a committed set to node `peer` (Replicator::Push).
  using Push = std::function<absl::Status(const ItemSet& set, int peer)>;
  // Bytes of committed sets whose pushes are still running, and when the
  // oldest of them committed (InfiniteFuture: none).
  struct ReplicationLag {
    uint64_t bytes = 0;
    absl::Time oldest_commit = absl::InfiniteFuture();
  };
  struct Counts {
    int64_t commits = 0;
    int64_t replicas_pushed = 0;
    int64_t streamed_saves = 0;
  };

  // `coordinator` and `contact` (cairnd's stub, and whether it has
  // answered) and `tier` must outlive this object.
  Persister(const Options& options, v1::Coordinator::Stub* coordinator,
            protocol::CoordinatorContact* contact, MemoryTier& tier, Push push);
  // Stop().
  ~Persister();
  Persister(const Persister&) = delete;
  Persister& operator=(const Persister&) = delete;

  // A save of `set`'s (job, step, rank) begins: Wait waits for it from now
  // on (an earlier outcome of that save is forgotten).
  void Expect(const ItemSet& set);
  // Records the outcome of an expected save that ends before it reaches a
  // persist (dropped while staged, its GPU copy failed).
  void Fail(const ItemSet& set, const absl::Status& status);

  // Persists `set` on a thread of its own. `prepare` (optional; GPU copies
  // into the segment) runs first, on the caller's thread, while the save is
  // already cancellable; its error is the save's outcome and is returned.
  // UNAVAILABLE once stopping.
  absl::Status Persist(const std::shared_ptr<ItemSet>& set,
                       bool die_before_commit,
                       const std::function<absl::Status()>& prepare = nullptr);
  // Starts persisting a streaming save; the rank's calls find it by id
  // (FindStream) until it commits.
  absl::Status Stream(const std::shared_ptr<StreamingSave>& stream);
  std::shared_ptr<StreamingSave> FindStream(uint64_t save_id);

  // Stops the save `request` names (see above); OK when there is none.
  // Returns whether a persist or stream was stopped.
  bool Cancel(const v1::CancelSaveRequest& request);

  // The outcome of the save of (job, step, rank): its committed record or
  // its error; NOT_FOUND when none was expected, DEADLINE_EXCEEDED after the
  // request's timeout_ms (default 2 h).
  absl::StatusOr<v1::CheckpointRecord> Wait(const v1::WaitSaveRequest& request);

  // Writes this agent's copy of `rank`'s shards of the memory checkpoint
  // (job, step) to storage, where its manifest (from cairnd) places them:
  // every object the rank's planned writes fill, zero-padded as a save
  // writes it, durable when this returns (cairnd's PersistOrder). Each
  // item's bytes are checked against the manifest's crc32c first
  // (DATA_LOSS naming it). NOT_FOUND when the agent holds no such set.
  absl::Status WriteHeld(const std::string& job, int64_t step, int rank);

  Counts counts();
  ReplicationLag replication_lag();

  // Refuses new persists (UNAVAILABLE), fails streams waiting on their rank
  // and waits for every persist thread. Idempotent.
  void Stop();

 private:
  using Key = std::tuple<std::string, int64_t, int>;  // job, step, rank
  struct SaveResult {
    bool done = false;
    absl::Status status;
    v1::CheckpointRecord record;
  };
  // The save protocol of a (job, rank) with its write threads, and the
  // cancellation of its saves.
  struct RankProtocol {
    std::unique_ptr<protocol::SaveProtocol> protocol;
    std::unique_ptr<ThreadPool> io_pool;
    // Cancelled by Cancel of the set being persisted; reset after it.
    protocol::Cancellation cancel{"cancelled (AgentCheckpointer::Cancel)"};
    // The set being persisted through `protocol` (null: none); guarded by
    // mu_.
    const ItemSet* persisting = nullptr;
  };
  static Key KeyOf(const ItemSet& set) {
    return Key{set.job, set.step, set.rank};
  }

  absl::Status StartThread(std::function<void()> fn);
  // A memory save: keeps `set` pinned in the tier and pushes it to peers
  // (the next nodes in turn) until `replicas` hold it; the holders, this
  // node first. UNAVAILABLE naming each peer's refusal (and nothing kept
  // here) when fewer could.
  absl::StatusOr<std::vector<int>> HoldInMemory(
      const std::shared_ptr<ItemSet>& set, int replicas);
  void RunPersist(const std::shared_ptr<ItemSet>& set, bool die_before_commit);
  void RunStream(const std::shared_ptr<StreamingSave>& stream);
  absl::StatusOr<v1::CheckpointRecord> StreamToStorage(StreamingSave& stream,
                                                       uint64_t& written);
  // Counts a finished persist begun at `start` that wrote `written` bytes
  // (what cairnd's plan had the rank write: deduplicated items are not).
  void RecordPersist(bool committed, uint64_t written, absl::Time start);
  // Held for the whole of one persist of (set.job, set.rank): its saves run
  // in order, and its RankProtocol is replaced (a new world size) only with
  // it held.
  absl::Mutex* PersistLock(const ItemSet& set);
  // With PersistLock(set) held.
  absl::StatusOr<RankProtocol*> ProtocolFor(const ItemSet& set);
  // With PersistLock(set) held: marks `set` as the one `rp` persists (Cancel
  // cancels rp->cancel for it), or CANCELLED naming it (nothing sent to
  // cairnd) when the rank cancelled it first.
  absl::Status StartPersisting(RankProtocol* rp, const ItemSet& set);
  // The persist StartPersisting began has ended (its cancellation consumed).
  void EndPersisting(RankProtocol* rp);
  void SetOutcome(const Key& key, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const Options options_;
  v1::Coordinator::Stub* const coordinator_;
  protocol::CoordinatorContact* const contact_;
  MemoryTier& tier_;
  const Push push_;
  // Read by streams waiting on their rank.
  std::atomic<bool> stopping_flag_{false};

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<Key, SaveResult> results_ ABSL_GUARDED_BY(mu_);
  // Staged sets handed over, until their persist ends.
  std::map<Key, std::shared_ptr<ItemSet>> persisting_ ABSL_GUARDED_BY(mu_);
  // Streaming saves by save id, until they commit.
  std::map<uint64_t, std::shared_ptr<StreamingSave>> streams_
      ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, std::unique_ptr<RankProtocol>>
      protocols_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, std::unique_ptr<absl::Mutex>>
      persist_locks_ ABSL_GUARDED_BY(mu_);
  // Persist threads with their "finished" flags; finished ones are joined
  // when the next persist starts.
  std::list<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> threads_
      ABSL_GUARDED_BY(mu_);
  // Committed sets whose pushes are running, by an id of their own.
  std::map<uint64_t, std::pair<uint64_t, absl::Time>> replicating_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_replication_ ABSL_GUARDED_BY(mu_) = 0;
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_PERSISTER_H_
