// The RocksDB catalog; the key schema is documented in catalog.h. Reads use
// prefix iteration over the sorted key space: every record of a job is the
// contiguous range "ckpt/<job>\0...", in step order, so LatestCommitted walks
// that range backwards from its end.
#include "storage/catalog/catalog.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "storage/checkpoint_layout.h"
#include "storage/checkpoint_record.h"

namespace cairn::storage {
namespace {

constexpr char kSchemaKey[] = "meta/schema";
constexpr char kJobPrefix[] = "job/";
constexpr char kCkptPrefix[] = "ckpt/";
constexpr char kPlanPrefix[] = "plan/";
constexpr char kAgentPrefix[] = "agent/";
constexpr char kPolicyPrefix[] = "policy/";

std::string Step16(int64_t step) { return absl::StrFormat("%016d", step); }

std::string JobKey(absl::string_view job) {
  return absl::StrCat(kJobPrefix, job);
}
std::string CkptJobPrefix(absl::string_view job) {
  return absl::StrCat(kCkptPrefix, job, absl::string_view("\0", 1));
}
std::string CkptKey(absl::string_view job, int64_t step) {
  return CheckpointRecordKey(job, step);
}
std::string PlanJobPrefix(absl::string_view job) {
  return absl::StrCat(kPlanPrefix, job, absl::string_view("\0", 1));
}

rocksdb::Slice ToSlice(absl::string_view s) {
  return rocksdb::Slice(s.data(), s.size());
}
absl::string_view ToView(const rocksdb::Slice& s) {
  return absl::string_view(s.data(), s.size());
}

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat("catalog: ", what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg);
  if (s.IsIOError() || s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

// `key` C-escaped, its '\0' separators shown as \0 ("ckpt/a\0" +
// "0000000000000005"), which CHexEscape alone would render as \x00 followed
// by every digit in hex.
std::string PrintableKey(absl::string_view key) {
  return absl::StrJoin(absl::StrSplit(key, '\0'), "\\0",
                       [](std::string* out, absl::string_view piece) {
                         out->append(absl::CHexEscape(piece));
                       });
}

absl::Status CheckJobStep(absl::string_view job, int64_t step) {
  CAIRN_RETURN_IF_ERROR(ValidateJobName(job));
  return ValidateStep(step);
}

rocksdb::WriteOptions SyncWrite() {
  rocksdb::WriteOptions w;
  w.sync = true;
  return w;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::Open(
    const std::string& path) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  options.max_open_files = 256;
  options.keep_log_file_num = 4;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, &raw);
  if (!s.ok()) {
    // RocksDB's LOCK file: another process has this catalog open.
    if (s.IsIOError() && absl::StrContains(s.ToString(), "lock")) {
      return absl::FailedPreconditionError(absl::StrCat(
          "catalog '", path,
          "' is in use by another process (is another cairnd running with "
          "the same --catalog or --data-dir?): ",
          s.ToString()));
    }
    return absl::UnavailableError(
        absl::StrCat("cannot open catalog '", path, "': ", s.ToString()));
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string schema;
  s = db->Get(rocksdb::ReadOptions(), kSchemaKey, &schema);
  if (s.IsNotFound()) {
    CAIRN_RETURN_IF_ERROR(FromRocks(
        db->Put(SyncWrite(), kSchemaKey, std::to_string(kCatalogSchemaVersion)),
        "writing the schema version"));
  } else {
    CAIRN_RETURN_IF_ERROR(FromRocks(s, "reading the schema version"));
    int version = 0;
    if (!absl::SimpleAtoi(schema, &version)) {
      return absl::DataLossError(absl::StrCat(
          "catalog '", path, "': unreadable schema version '", schema, "'"));
    }
    if (version > kCatalogSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "catalog '", path, "' has schema version ", version,
          ", newer than this build understands (", kCatalogSchemaVersion, ")"));
    }
  }
  return std::unique_ptr<Catalog>(new Catalog(std::move(db)));
}

Catalog::Catalog(std::unique_ptr<rocksdb::DB> db) : db_(std::move(db)) {}

Catalog::~Catalog() = default;

absl::Status Catalog::PutCheckpoint(const v1::CheckpointRecord& record) {
  CAIRN_RETURN_IF_ERROR(CheckJobStep(record.job(), record.step()));
  if (!v1::CheckpointState_IsValid(record.state()) ||
      record.state() == v1::CHECKPOINT_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint of job '", record.job(), "' step ", record.step(),
        " has no valid state (", static_cast<int>(record.state()), ")"));
  }
  rocksdb::WriteBatch batch;
  batch.Put(JobKey(record.job()), "");
  batch.Put(CkptKey(record.job(), record.step()), record.SerializeAsString());
  return FromRocks(
      db_->Write(SyncWrite(), &batch),
      absl::StrCat("recording job '", record.job(), "' step ", record.step()));
}

absl::StatusOr<v1::CheckpointRecord> Catalog::GetCheckpoint(
    absl::string_view job, int64_t step) {
  CAIRN_RETURN_IF_ERROR(CheckJobStep(job, step));
  const std::string key = CkptKey(job, step);
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat(
        "no checkpoint of job '", job, "' step ", step, " in the catalog"));
  }
  CAIRN_RETURN_IF_ERROR(
      FromRocks(s, absl::StrCat("reading job '", job, "' step ", step)));
  return DecodeCheckpointRecord(key, value);
}

absl::StatusOr<std::vector<v1::CheckpointRecord>> Catalog::ListCheckpoints(
    absl::string_view job, bool include_uncommitted) {
  std::string prefix = kCkptPrefix;
  if (!job.empty()) {
    CAIRN_RETURN_IF_ERROR(ValidateJobName(job));
    prefix = CkptJobPrefix(job);
  }
  std::vector<v1::CheckpointRecord> out;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix);
       it->Next()) {
    CAIRN_ASSIGN_OR_RETURN(
        v1::CheckpointRecord record,
        DecodeCheckpointRecord(ToView(it->key()), ToView(it->value())));
    if (include_uncommitted ||
        record.state() == v1::CHECKPOINT_STATE_COMMITTED) {
      out.push_back(std::move(record));
    }
  }
  CAIRN_RETURN_IF_ERROR(FromRocks(it->status(), "listing checkpoints"));
  return out;
}

absl::StatusOr<v1::CheckpointRecord> Catalog::LatestCommitted(
    absl::string_view job) {
  CAIRN_RETURN_IF_ERROR(ValidateJobName(job));
  const std::string prefix = CkptJobPrefix(job);
  // The first key after every record of the job: the prefix with its last
  // byte ('\0') bumped to '\1'.
  std::string end = prefix;
  end.back() = '\1';
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekForPrev(end); it->Valid() && it->key().starts_with(prefix);
       it->Prev()) {
    CAIRN_ASSIGN_OR_RETURN(
        v1::CheckpointRecord record,
        DecodeCheckpointRecord(ToView(it->key()), ToView(it->value())));
    if (record.state() == v1::CHECKPOINT_STATE_COMMITTED) return record;
  }
  CAIRN_RETURN_IF_ERROR(FromRocks(it->status(), "finding the latest step"));
  return absl::NotFoundError(
      absl::StrCat("job '", job, "' has no committed checkpoint"));
}

absl::Status Catalog::DeleteCheckpoint(absl::string_view job, int64_t step) {
  CAIRN_RETURN_IF_ERROR(CheckJobStep(job, step));
  const std::string key = CkptKey(job, step);
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat(
        "no checkpoint of job '", job, "' step ", step, " in the catalog"));
  }
  CAIRN_RETURN_IF_ERROR(FromRocks(s, "reading before delete"));
  return FromRocks(db_->Delete(SyncWrite(), key),
                   absl::StrCat("deleting job '", job, "' step ", step));
}

absl::StatusOr<std::vector<std::string>> Catalog::ListJobs() {
  std::vector<std::string> jobs;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(kJobPrefix); it->Valid() && it->key().starts_with(kJobPrefix);
       it->Next()) {
    jobs.emplace_back(ToView(it->key()).substr(sizeof(kJobPrefix) - 1));
  }
  CAIRN_RETURN_IF_ERROR(FromRocks(it->status(), "listing jobs"));
  return jobs;
}

absl::Status Catalog::PutPlanCacheEntry(absl::string_view job,
                                        absl::string_view key,
                                        absl::string_view value) {
  CAIRN_RETURN_IF_ERROR(ValidateJobName(job));
  return FromRocks(
      db_->Put(SyncWrite(), absl::StrCat(PlanJobPrefix(job), key),
               ToSlice(value)),
      absl::StrCat("storing a plan-cache entry of job '", job, "'"));
}

absl::StatusOr<std::string> Catalog::GetPlanCacheEntry(absl::string_view job,
                                                       absl::string_view key) {
  CAIRN_RETURN_IF_ERROR(ValidateJobName(job));
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(),
                               absl::StrCat(PlanJobPrefix(job), key), &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("no plan-cache entry '",
                                            absl::CHexEscape(key),
                                            "' for job '", job, "'"));
  }
  CAIRN_RETURN_IF_ERROR(FromRocks(s, "reading a plan-cache entry"));
  return value;
}

absl::Status Catalog::DeletePlanCacheEntries(absl::string_view job) {
  CAIRN_RETURN_IF_ERROR(ValidateJobName(job));
  const std::string begin = PlanJobPrefix(job);
  std::string end = begin;
  end.back() = '\1';
  rocksdb::WriteBatch batch;
  batch.DeleteRange(begin, end);
  return FromRocks(
      db_->Write(SyncWrite(), &batch),
      absl::StrCat("deleting plan-cache entries of job '", job, "'"));
}

absl::Status Catalog::PutAgent(const v1::AgentRecord& record) {
  if (record.node_name().empty() || record.node_id() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "agent record needs a node name and an id >= 0 (got '",
        absl::CHexEscape(record.node_name()), "', ", record.node_id(), ")"));
  }
  return FromRocks(
      db_->Put(SyncWrite(), absl::StrCat(kAgentPrefix, record.node_name()),
               record.SerializeAsString()),
      absl::StrCat("recording agent of node '", record.node_name(), "'"));
}

absl::StatusOr<std::vector<v1::AgentRecord>> Catalog::ListAgents() {
  std::vector<v1::AgentRecord> out;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(kAgentPrefix);
       it->Valid() && it->key().starts_with(kAgentPrefix); it->Next()) {
    v1::AgentRecord record;
    const absl::string_view name =
        ToView(it->key()).substr(sizeof(kAgentPrefix) - 1);
    if (!record.ParseFromArray(it->value().data(),
                               static_cast<int>(it->value().size())) ||
        record.node_name() != name) {
      return absl::DataLossError(absl::StrCat(
          "catalog: agent record '", PrintableKey(ToView(it->key())),
          "' is not an AgentRecord of that node"));
    }
    out.push_back(std::move(record));
  }
  CAIRN_RETURN_IF_ERROR(FromRocks(it->status(), "listing agents"));
  return out;
}

absl::Status Catalog::DeleteAgent(absl::string_view node_name) {
  const std::string key = absl::StrCat(kAgentPrefix, node_name);
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(
        absl::StrCat("no agent of node '", node_name, "' in the catalog"));
  }
  CAIRN_RETURN_IF_ERROR(FromRocks(s, "reading an agent before delete"));
  return FromRocks(db_->Delete(SyncWrite(), key),
                   absl::StrCat("deleting agent of node '", node_name, "'"));
}

absl::Status Catalog::PutPolicy(const v1::JobPolicy& policy) {
  CAIRN_RETURN_IF_ERROR(ValidateJobName(policy.job()));
  return FromRocks(
      db_->Put(SyncWrite(), absl::StrCat(kPolicyPrefix, policy.job()),
               policy.SerializeAsString()),
      absl::StrCat("recording the policy of job '", policy.job(), "'"));
}

absl::StatusOr<v1::JobPolicy> Catalog::GetPolicy(absl::string_view job) {
  const std::string key = absl::StrCat(kPolicyPrefix, job);
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(
        absl::StrCat("job '", job, "' has no checkpoint policy"));
  }
  CAIRN_RETURN_IF_ERROR(FromRocks(s, "reading a job's policy"));
  v1::JobPolicy policy;
  if (!policy.ParseFromString(value) || policy.job() != job) {
    return absl::DataLossError(absl::StrCat(
        "catalog: the policy record of job '", job, "' is not its JobPolicy"));
  }
  return policy;
}

absl::Status Catalog::DeletePolicy(absl::string_view job) {
  return FromRocks(db_->Delete(SyncWrite(), absl::StrCat(kPolicyPrefix, job)),
                   absl::StrCat("deleting the policy of job '", job, "'"));
}

bool Catalog::empty() {
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions()));
  for (const char* prefix : {kJobPrefix, kCkptPrefix}) {
    it->Seek(prefix);
    if (it->Valid() && it->key().starts_with(prefix)) return false;
  }
  return true;
}

std::string CheckpointRecordKey(absl::string_view job, int64_t step) {
  return absl::StrCat(CkptJobPrefix(job), Step16(step));
}

absl::StatusOr<v1::CheckpointRecord> DecodeCheckpointRecord(
    absl::string_view key, absl::string_view value) {
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("catalog: record '", PrintableKey(key), "' ", what));
  };
  // "ckpt/" + job + '\0' + 16 decimal digits.
  absl::string_view rest = key;
  const size_t nul = rest.find('\0');
  if (!absl::ConsumePrefix(&rest, kCkptPrefix) ||
      nul == absl::string_view::npos || key.size() - nul - 1 != 16) {
    return bad("is not a checkpoint key");
  }
  const absl::string_view job = rest.substr(0, rest.find('\0'));
  const absl::string_view digits = key.substr(nul + 1);
  int64_t step = 0;
  if (!std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &step) || !ValidateStep(step).ok() ||
      !ValidateJobName(job).ok()) {
    return bad("is not a checkpoint key");
  }
  v1::CheckpointRecord record;
  if (value.size() > static_cast<size_t>(INT32_MAX) ||
      !record.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return bad("does not parse");
  }
  if (record.job() != job || record.step() != step) {
    return bad(absl::StrCat("holds the record of job '",
                            absl::CHexEscape(record.job().substr(0, 200)),
                            "' step ", record.step()));
  }
  return record;
}

absl::StatusOr<int> Catalog::RebuildFromStore(ShardStore& store) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> jobs,
                         storage::ListJobs(store));
  rocksdb::WriteBatch batch;
  int recorded = 0;
  const std::string uri = store.uri();
  for (const std::string& job : jobs) {
    CAIRN_ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                           ListCommittedSteps(store, job));
    for (int64_t step : steps) {
      absl::StatusOr<ManifestSummary> manifest =
          ReadManifestSummary(store, job, step);
      if (!manifest.ok()) {
        // A damaged manifest must not keep every other checkpoint from
        // being found again; it stays on storage for an operator to inspect.
        if (absl::IsUnavailable(manifest.status())) return manifest.status();
        CAIRN_LOG(warn, "catalog rebuild: skipping job {} step {}: {}", job,
                  step, manifest.status().ToString());
        continue;
      }
      batch.Put(JobKey(job), "");
      batch.Put(CkptKey(job, step),
                RecordFromManifest(*manifest, uri).SerializeAsString());
      ++recorded;
    }
  }
  CAIRN_RETURN_IF_ERROR(
      FromRocks(db_->Write(SyncWrite(), &batch), "writing the rebuild"));
  CAIRN_LOG(info, "catalog rebuilt from {}: {} committed checkpoints", uri,
            recorded);
  return recorded;
}

}  // namespace cairn::storage
