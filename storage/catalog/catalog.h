// The coordinator's catalog, in an embedded RocksDB: jobs, checkpoint
// records (WRITING / COMMITTED / ABORTED, bytes, times) and plan-cache
// entries. Manifests on storage are the source of truth; RebuildFromStore
// recreates the catalog from them when it is empty or lost.
//
// Key schema (every value of a record is a serialized proto; '\0' separates
// a job name from what follows, so keys sort by job name, then by step):
//   "meta/schema"                        -> decimal schema version ("1")
//   "job/" + job                         -> "" (the job exists)
//   "ckpt/" + job + '\0' + step16        -> cairn.v1.CheckpointRecord
//   "plan/" + job + '\0' + key           -> opaque plan-cache bytes
//   "agent/" + node_name                 -> cairn.v1.AgentRecord
//   "policy/" + job                      -> cairn.v1.JobPolicy
// step16 is the step as 16 zero-padded decimal digits. Job names are
// [A-Za-z0-9._-]{1,128} (ValidateJobName), so they contain neither '\0' nor
// '/'. Multi-key updates (a checkpoint and its job) are one WriteBatch; every
// write is synced (WriteOptions::sync) before the call returns.
//
// Thread-safe: every method may be called concurrently without external
// locking.
#ifndef CAIRN_STORAGE_CATALOG_CATALOG_H_
#define CAIRN_STORAGE_CATALOG_CATALOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cairn/v1/cairn.pb.h"
#include "storage/checkpoint_layout.h"
#include "storage/shard_store.h"

namespace rocksdb {
class DB;
}

namespace cairn::storage {

inline constexpr int kCatalogSchemaVersion = 1;

class Catalog {
 public:
  // Opens or creates the database directory `path`. FAILED_PRECONDITION if
  // it was written by a newer schema; UNAVAILABLE if RocksDB cannot open it
  // (e.g. locked by another process).
  static absl::StatusOr<std::unique_ptr<Catalog>> Open(const std::string& path);
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  // Inserts or replaces the record of (record.job, record.step), and records
  // the job, atomically. INVALID_ARGUMENT for a bad job, step or state.
  absl::Status PutCheckpoint(const v1::CheckpointRecord& record);
  // NOT_FOUND naming job and step if absent.
  absl::StatusOr<v1::CheckpointRecord> GetCheckpoint(absl::string_view job,
                                                     int64_t step);
  // Records of `job` ("" = every job), by job then step. Only COMMITTED ones
  // unless include_uncommitted.
  absl::StatusOr<std::vector<v1::CheckpointRecord>> ListCheckpoints(
      absl::string_view job, bool include_uncommitted);
  // The COMMITTED record of `job` with the highest step; NOT_FOUND if none.
  absl::StatusOr<v1::CheckpointRecord> LatestCommitted(absl::string_view job);
  // NOT_FOUND if absent. The job stays recorded.
  absl::Status DeleteCheckpoint(absl::string_view job, int64_t step);
  // Every job that ever had a checkpoint recorded, sorted.
  absl::StatusOr<std::vector<std::string>> ListJobs();

  // Plan-cache persistence: opaque bytes keyed by (job, key). Put replaces.
  absl::Status PutPlanCacheEntry(absl::string_view job, absl::string_view key,
                                 absl::string_view value);
  // NOT_FOUND if absent.
  absl::StatusOr<std::string> GetPlanCacheEntry(absl::string_view job,
                                                absl::string_view key);
  // Removes every plan-cache entry of `job`.
  absl::Status DeletePlanCacheEntries(absl::string_view job);

  // The agent registry (see cairn.v1.AgentRecord): one record per node name.
  // Put inserts or replaces; INVALID_ARGUMENT for an empty name or a negative
  // id. List returns every record, by name.
  absl::Status PutAgent(const v1::AgentRecord& record);
  absl::StatusOr<std::vector<v1::AgentRecord>> ListAgents();
  // NOT_FOUND naming the node if absent.
  absl::Status DeleteAgent(absl::string_view node_name);

  // A job's checkpoint policy (cairn.v1.JobPolicy), not validated here
  // beyond the job's name. Get: NOT_FOUND naming the job when it has none.
  // Delete: OK when there is none.
  absl::Status PutPolicy(const v1::JobPolicy& policy);
  absl::StatusOr<v1::JobPolicy> GetPolicy(absl::string_view job);
  absl::Status DeletePolicy(absl::string_view job);

  // True when no job and no checkpoint is recorded (plan-cache entries,
  // agent records and metadata do not count).
  bool empty();

  // Scans every job's committed steps in `store`, reads their MANIFESTs and
  // records each as COMMITTED (one atomic WriteBatch; existing records of
  // those steps are replaced, others are kept). A MANIFEST that cannot be
  // read or validated is skipped with a warning. Returns the number of
  // checkpoints recorded.
  absl::StatusOr<int> RebuildFromStore(ShardStore& store);

 private:
  explicit Catalog(std::unique_ptr<rocksdb::DB> db);

  // Constant after construction.
  const std::unique_ptr<rocksdb::DB> db_;
};

// The catalog key of a checkpoint record: "ckpt/" + job + '\0' + step16.
std::string CheckpointRecordKey(absl::string_view job, int64_t step);

// Decodes the value stored under checkpoint key `key` (what every read of a
// record does). DATA_LOSS naming the key when `key` is not a well-formed
// checkpoint key, `value` does not parse as a cairn.v1.CheckpointRecord, or
// the record names another job or step than its key does (a record is only
// ever written under its own key).
absl::StatusOr<v1::CheckpointRecord> DecodeCheckpointRecord(
    absl::string_view key, absl::string_view value);

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_CATALOG_CATALOG_H_
