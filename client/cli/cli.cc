#include "client/cli/cli.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "client/cli/checkpoint_diff.h"
#include "client/cli/safetensors_export.h"
#include "common/cli_flags.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "protocol/client_security.h"
#include "protocol/coordinator_call.h"
#include "storage/checkpoint_layout.h"
#include "storage/checkpoint_record.h"
#include "storage/lease.h"
#include "storage/manifest.h"
#include "storage/shard_store.h"

namespace cairn::cli {
namespace {

std::string HumanBytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(n, " B")
                : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string HumanTime(int64_t unix_micros) {
  if (unix_micros == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S",
                          absl::FromUnixMicros(unix_micros),
                          absl::LocalTimeZone());
}

std::string StateName(v1::CheckpointState s) {
  switch (s) {
    case v1::CHECKPOINT_STATE_WRITING:
      return "WRITING";
    case v1::CHECKPOINT_STATE_COMMITTED:
      return "COMMITTED";
    case v1::CHECKPOINT_STATE_ABORTED:
      return "ABORTED";
    case v1::CHECKPOINT_STATE_DELETING:
      return "DELETING";
    case v1::CHECKPOINT_STATE_UNSPECIFIED:
      return "DAMAGED";  // offline: a MANIFEST that cannot be read
    default:
      return "UNKNOWN";
  }
}

// The directory of a file:// URI ("" for other schemes).
std::string FileRoot(absl::string_view uri) {
  if (!absl::StartsWith(uri, "file://")) return "";
  return std::string(uri.substr(7));
}

// Opening a posix store creates its root, so a typo would be listed as an
// empty storage: a file:// root must exist (and be a directory) first.
absl::Status CheckStorageRootExists(const std::string& uri) {
  const std::string root = FileRoot(uri);
  if (root.empty()) return absl::OkStatus();
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) {
    return absl::NotFoundError(
        absl::StrCat("storage root '", root, "' (", uri, ") ",
                     std::filesystem::exists(root, ec) ? "is not a directory"
                                                       : "does not exist"));
  }
  return absl::OkStatus();
}

// A plain aligned text table.
class Table {
 public:
  explicit Table(std::vector<std::string> header) {
    rows_.push_back(std::move(header));
  }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(std::ostream& out) const {
    std::vector<size_t> width;
    for (const auto& r : rows_) {
      width.resize(std::max(width.size(), r.size()));
      for (size_t i = 0; i < r.size(); ++i) {
        width[i] = std::max(width[i], r[i].size());
      }
    }
    for (const auto& r : rows_) {
      std::string line;
      for (size_t i = 0; i < r.size(); ++i) {
        absl::StrAppend(&line, r[i],
                        i + 1 < r.size()
                            ? std::string(width[i] - r[i].size() + 2, ' ')
                            : "");
      }
      // An empty last column leaves no trailing spaces.
      out << absl::StripTrailingAsciiWhitespace(line) << "\n";
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// Where the CLI gets its answers: a running cairnd or the storage itself.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual absl::StatusOr<std::vector<v1::CheckpointRecord>> List(
      const std::string& job, bool all) = 0;
  // Resolves "latest" (step < 0) to the newest committed step.
  virtual absl::StatusOr<v1::GetCheckpointResponse> Get(const std::string& job,
                                                        int64_t step) = 0;
  virtual absl::Status Delete(const std::string& job, int64_t step) = 0;
  virtual absl::StatusOr<v1::GarbageCollectResponse> Gc(const std::string& job,
                                                        int keep, bool dry) = 0;
};

class CoordinatorBackend : public Backend {
 public:
  // `channel` from protocol::NewCoordinatorChannel (TLS, token, limits).
  explicit CoordinatorBackend(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::Coordinator::NewStub(std::move(channel))) {}

  absl::StatusOr<std::vector<v1::CheckpointRecord>> List(const std::string& job,
                                                         bool all) override {
    v1::ListCheckpointsRequest req;
    req.set_job(job);
    req.set_include_uncommitted(all);
    v1::ListCheckpointsResponse resp;
    CAIRN_RETURN_IF_ERROR(
        Call(&v1::Coordinator::Stub::ListCheckpoints, req, &resp));
    return std::vector<v1::CheckpointRecord>(resp.checkpoints().begin(),
                                             resp.checkpoints().end());
  }

  absl::StatusOr<v1::GetCheckpointResponse> Get(const std::string& job,
                                                int64_t step) override {
    v1::GetCheckpointRequest req;
    req.set_job(job);
    if (step < 0) {
      req.set_latest(true);  // cairnd resolves it with the lookup
    } else {
      req.set_step(step);
    }
    v1::GetCheckpointResponse resp;
    CAIRN_RETURN_IF_ERROR(
        Call(&v1::Coordinator::Stub::GetCheckpoint, req, &resp));
    return resp;
  }

  absl::Status Delete(const std::string& job, int64_t step) override {
    v1::DeleteCheckpointRequest req;
    req.set_job(job);
    req.set_step(step);
    v1::DeleteCheckpointResponse resp;
    return Call(&v1::Coordinator::Stub::DeleteCheckpoint, req, &resp);
  }

  absl::StatusOr<v1::GarbageCollectResponse> Gc(const std::string& job,
                                                int keep, bool dry) override {
    v1::GarbageCollectRequest req;
    req.set_job(job);
    req.set_keep_last(keep);
    req.set_dry_run(dry);
    v1::GarbageCollectResponse resp;
    CAIRN_RETURN_IF_ERROR(
        Call(&v1::Coordinator::Stub::GarbageCollect, req, &resp));
    return resp;
  }

  // The agent registry (agents started with --node-id auto).
  absl::StatusOr<v1::ListAgentsResponse> ListAgents() {
    v1::ListAgentsResponse resp;
    CAIRN_RETURN_IF_ERROR(Call(&v1::Coordinator::Stub::ListAgents,
                               v1::ListAgentsRequest(), &resp));
    return resp;
  }
  // A job's checkpoint policy (multi-tier saves).
  absl::StatusOr<v1::GetJobPolicyResponse> GetPolicy(const std::string& job) {
    v1::GetJobPolicyRequest req;
    req.set_job(job);
    v1::GetJobPolicyResponse resp;
    CAIRN_RETURN_IF_ERROR(
        Call(&v1::Coordinator::Stub::GetJobPolicy, req, &resp));
    return resp;
  }
  absl::Status SetPolicy(const v1::SetJobPolicyRequest& req) {
    v1::SetJobPolicyResponse resp;
    return Call(&v1::Coordinator::Stub::SetJobPolicy, req, &resp);
  }
  // Writes a memory checkpoint to storage; with `wait`, until it is there.
  absl::StatusOr<v1::CheckpointRecord> Persist(const std::string& job,
                                               int64_t step, bool wait,
                                               absl::Duration timeout) {
    v1::PersistCheckpointRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_wait(wait);
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    v1::PersistCheckpointResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(30)));
    CAIRN_RETURN_IF_ERROR(
        FromGrpcStatus(stub_->PersistCheckpoint(&ctx, req, &resp)));
    return resp.checkpoint();
  }
  absl::StatusOr<int> ForgetAgent(const std::string& node_name) {
    v1::ForgetAgentRequest req;
    req.set_node_name(node_name);
    v1::ForgetAgentResponse resp;
    CAIRN_RETURN_IF_ERROR(
        Call(&v1::Coordinator::Stub::ForgetAgent, req, &resp));
    return resp.node_id();
  }

 private:
  template <typename Req, typename Resp>
  absl::Status Call(grpc::Status (v1::Coordinator::Stub::*m)(
                        grpc::ClientContext*, const Req&, Resp*),
                    const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    absl::Status s = FromGrpcStatus(((*stub_).*m)(&ctx, req, resp));
    if (absl::IsUnavailable(s)) {
      return absl::UnavailableError(
          absl::StrCat("cannot reach cairnd: ", s.message()));
    }
    return s;
  }

  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// Offline: reads MANIFESTs straight from storage.
class StorageBackend : public Backend {
 public:
  explicit StorageBackend(std::unique_ptr<storage::ShardStore> store)
      : store_(std::move(store)) {}

  absl::StatusOr<std::vector<v1::CheckpointRecord>> List(const std::string& job,
                                                         bool all) override {
    std::vector<std::string> jobs;
    if (job.empty()) {
      CAIRN_ASSIGN_OR_RETURN(jobs, storage::ListJobs(*store_));
    } else {
      CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(job));
      jobs.push_back(job);
    }
    std::vector<v1::CheckpointRecord> out;
    for (const std::string& j : jobs) {
      CAIRN_ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                             storage::ListCommittedSteps(*store_, j));
      for (int64_t step : steps) {
        absl::StatusOr<v1::Manifest> m =
            storage::ReadManifest(*store_, j, step);
        if (m.ok()) {
          out.push_back(RecordOf(*m));
          continue;
        }
        // One damaged MANIFEST must not hide the others: listed DAMAGED.
        v1::CheckpointRecord r;
        r.set_job(j);
        r.set_step(step);
        r.set_state(v1::CHECKPOINT_STATE_UNSPECIFIED);
        r.set_abort_reason(m.status().ToString());
        r.set_storage_uri(store_->uri());
        out.push_back(r);
      }
      if (all) {
        CAIRN_ASSIGN_OR_RETURN(std::vector<int64_t> incomplete,
                               storage::ListIncompleteSteps(*store_, j));
        for (int64_t step : incomplete) {
          v1::CheckpointRecord r;
          r.set_job(j);
          r.set_step(step);
          r.set_state(v1::CHECKPOINT_STATE_WRITING);
          out.push_back(r);
        }
      }
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
      return a.job() != b.job() ? a.job() < b.job() : a.step() < b.step();
    });
    return out;
  }

  absl::StatusOr<v1::GetCheckpointResponse> Get(const std::string& job,
                                                int64_t step) override {
    CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(job));
    if (step < 0) {
      // The newest step whose MANIFEST reads: damaged ones are skipped (and
      // reported), as a load of 'latest' would need.
      CAIRN_ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                             storage::ListCommittedSteps(*store_, job));
      for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        absl::StatusOr<v1::Manifest> m =
            storage::ReadManifest(*store_, job, *it);
        if (!m.ok()) {
          notes_.push_back(absl::StrCat("skipping damaged job '", job,
                                        "' step ", *it, ": ",
                                        m.status().ToString()));
          continue;
        }
        v1::GetCheckpointResponse resp;
        *resp.mutable_manifest() = std::move(*m);
        *resp.mutable_checkpoint() = RecordOf(resp.manifest());
        return resp;
      }
      return absl::NotFoundError(absl::StrCat(
          "job '", job, "' has no ", steps.empty() ? "" : "undamaged ",
          "committed checkpoint on ", store_->uri()));
    }
    v1::GetCheckpointResponse resp;
    CAIRN_ASSIGN_OR_RETURN(*resp.mutable_manifest(),
                           storage::ReadManifest(*store_, job, step));
    *resp.mutable_checkpoint() = RecordOf(resp.manifest());
    return resp;
  }

  absl::Status Delete(const std::string& job, int64_t step) override {
    CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(job));
    CAIRN_RETURN_IF_ERROR(storage::ValidateStep(step));
    if (lease_ != nullptr) {
      if (absl::Status s = lease_->Check(); !s.ok()) {
        return Annotate(
            s, absl::StrCat("not deleting job '", job, "' step ", step));
      }
    }
    return storage::DeleteStep(*store_, job, step);
  }

  absl::StatusOr<v1::GarbageCollectResponse> Gc(const std::string& job,
                                                int keep, bool dry) override {
    CAIRN_ASSIGN_OR_RETURN(std::vector<v1::CheckpointRecord> listed,
                           List(job, false));
    // Only readable checkpoints are COMMITTED, so only they count as kept;
    // damaged ones stay for a human. Newest first, as cairnd deletes them.
    v1::GarbageCollectResponse resp;
    for (const v1::CheckpointRecord& r :
         storage::RetentionVictims(listed, keep)) {
      if (!dry) CAIRN_RETURN_IF_ERROR(Delete(job, r.step()));
      resp.add_deleted_steps(r.step());
      resp.set_freed_bytes(resp.freed_bytes() + r.total_bytes());
    }
    return resp;
  }

  storage::ShardStore& store() { return *store_; }
  // What the last calls skipped (damaged steps), for the user.
  std::vector<std::string> TakeNotes() { return std::move(notes_); }
  // Deletions from now on need it to hold (null: none is held, --force).
  void set_lease(const storage::StorageLease* lease) { lease_ = lease; }

 private:
  v1::CheckpointRecord RecordOf(const v1::Manifest& m) {
    v1::CheckpointRecord r = storage::RecordFromManifest(m, store_->uri());
    // Only a catalog knows when a checkpoint was committed: offline, none is
    // shown (not the creation time a rebuilt catalog takes as its bound).
    r.clear_committed_unix_micros();
    return r;
  }

  std::unique_ptr<storage::ShardStore> store_;
  std::vector<std::string> notes_;
  const storage::StorageLease* lease_ = nullptr;
};

// An offline rm or gc changes the storage under whatever cairnd uses it: it
// holds the storage's lease (storage/lease.h) while it deletes, so it is
// refused while a cairnd (or another rm/gc) holds it, and a cairnd starting
// meanwhile is refused. The refusal names the holder and, for a cairnd, the
// command that deletes through it (`online`: "rm JOB STEP").
absl::StatusOr<std::unique_ptr<storage::StorageLease>> TakeStorageToDelete(
    storage::ShardStore& store, const std::string& role,
    const std::string& what, const std::string& online) {
  storage::LeaseOptions options;
  options.role = role;
  options.detail = what;
  absl::StatusOr<std::unique_ptr<storage::StorageLease>> lease =
      storage::StorageLease::Acquire(store, options);
  if (lease.ok() || !absl::IsFailedPrecondition(lease.status())) return lease;
  absl::StatusOr<std::optional<storage::LeaseRecord>> holder =
      storage::ReadLease(store);
  if (!holder.ok() || !holder->has_value()) return lease.status();
  const storage::LeaseRecord& h = **holder;
  const absl::Time now = absl::Now();
  std::string text =
      absl::StrCat("refusing to ", what, " offline: storage ", store.uri(),
                   " is in use by ", h.Describe(now), ". ");
  if (h.role == "cairnd") {
    absl::StrAppend(
        &text,
        "Deleting under a running cairnd would leave it listing checkpoints "
        "whose MANIFEST is gone; delete through it instead: cairn -c ",
        h.address.empty() ? "HOST:PORT" : h.address, " ", online,
        ". Give --force only if that cairnd is gone for good (its lease then "
        "expires by itself at ",
        absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", h.expires(),
                         absl::UTCTimeZone()),
        ")");
  } else {
    absl::StrAppend(&text, "Wait for it to finish, then try again");
  }
  return absl::FailedPreconditionError(text);
}

// Opens the storage cairnd reports for `manifest`'s checkpoint, from this
// host. Storage that is not mounted here (no root, or not a single object of
// the checkpoint) is FAILED_PRECONDITION, not the DATA_LOSS that verifying
// would report for every object: unreachable storage is not corruption.
absl::StatusOr<std::unique_ptr<storage::ShardStore>> OpenReachableStore(
    const std::string& uri, const v1::Manifest& manifest) {
  const std::string where =
      absl::StrCat("storage ", uri, " of job '", manifest.job(), "' step ",
                   manifest.step(), " is not reachable from this host");
  if (absl::Status s = CheckStorageRootExists(uri); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": ", s.message(), " (is it mounted here?)"));
  }
  // An object store this host cannot reach or may not read (no route to the
  // endpoint, other credentials here) fails to open or to answer.
  auto unreachable = [&](const absl::Status& s) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": ", s.ToString(),
                     " (are its endpoint and credentials set here?)"));
  };
  absl::StatusOr<std::unique_ptr<storage::ShardStore>> store =
      storage::OpenShardStore(uri);
  if (!store.ok()) {
    if (absl::IsInvalidArgument(store.status())) return store.status();
    return unreachable(store.status());
  }
  const std::string prefix =
      storage::StepPrefix(manifest.job(), manifest.step());
  std::vector<std::string> keys = {
      storage::ManifestKey(manifest.job(), manifest.step())};
  for (const std::string& o : manifest.objects()) {
    keys.push_back(absl::StrCat(prefix, o));
  }
  for (const std::string& key : keys) {
    absl::StatusOr<uint64_t> size = (*store)->Size(key);
    if (size.ok()) return std::move(*store);
    const absl::Status& s = size.status();
    if (absl::IsUnavailable(s) || absl::IsUnauthenticated(s) ||
        absl::IsPermissionDenied(s)) {
      return unreachable(s);
    }
    if (!absl::IsNotFound(s)) return std::move(*store);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      where, ": neither its MANIFEST nor any of its ", manifest.objects_size(),
      " data objects exist there (",
      FileRoot(uri).empty() ? "is it another bucket or prefix than cairnd's?)"
                            : absl::StrCat("is another filesystem mounted at ",
                                           FileRoot(uri), "?)")));
}

absl::StatusOr<int64_t> ParseStepArg(const std::string& s) {
  if (s == "latest") return -1;
  int64_t step;
  // Digits only: SimpleAtoi also takes a sign, spaces and a 0x prefix.
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(s, &step)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step must be a non-negative integer or 'latest', got '", s, "'"));
  }
  CAIRN_RETURN_IF_ERROR(storage::ValidateStep(step));
  return step;
}

// "memory" or "persistent" (older records, offline ones: persistent).
std::string TierOf(const v1::CheckpointRecord& r) {
  return r.tier() == v1::TIER_MEMORY ? "memory" : "persistent";
}

// Where a committed checkpoint's copies are: for a memory one, its live
// copies and the nodes holding them ("2 (nodes 0,1)"); "storage" for a
// persistent one, plus the agents' in-memory copies when cairnd knows any.
std::string CopiesOf(const v1::CheckpointRecord& r) {
  if (r.state() != v1::CHECKPOINT_STATE_COMMITTED) return "-";
  const std::string nodes =
      r.live_holder_nodes_size() == 0
          ? std::string()
          : absl::StrCat(" (nodes ", absl::StrJoin(r.live_holder_nodes(), ","),
                         ")");
  if (r.tier() == v1::TIER_MEMORY) {
    return absl::StrCat(r.live_copies(), nodes);
  }
  return r.live_copies() > 0 ? absl::StrCat("storage+", r.live_copies(), nodes)
                             : std::string("storage");
}

void PrintList(const std::vector<v1::CheckpointRecord>& records,
               std::ostream& out) {
  if (records.empty()) {
    out << "no checkpoints\n";
    return;
  }
  Table t({"JOB", "STEP", "STATE", "TIER", "COPIES", "SIZE", "RANKS", "TENSORS",
           "CREATED", "COMMITTED"});
  for (const auto& r : records) {
    t.Add({r.job(), absl::StrCat(r.step()), StateName(r.state()), TierOf(r),
           CopiesOf(r), HumanBytes(r.total_bytes()),
           absl::StrCat(r.world_size()), absl::StrCat(r.num_tensors()),
           HumanTime(r.created_unix_micros()),
           HumanTime(r.committed_unix_micros())});
  }
  t.Print(out);
  for (const auto& r : records) {
    if (r.state() == v1::CHECKPOINT_STATE_COMMITTED &&
        r.tier() == v1::TIER_MEMORY && !r.restorable()) {
      out << "NOT RESTORABLE: job " << r.job() << " step " << r.step() << ": "
          << r.unrestorable_reason() << "\n";
    }
    if (r.state() != v1::CHECKPOINT_STATE_UNSPECIFIED) continue;
    out << "DAMAGED: job " << r.job() << " step " << r.step() << ": "
        << r.abort_reason() << "\n";
  }
}

// RFC 3339 in UTC ("2026-03-01T12:00:00.123456+00:00"); null for 0.
nlohmann::json JsonTime(int64_t unix_micros) {
  if (unix_micros == 0) return nullptr;
  return absl::FormatTime(absl::RFC3339_full, absl::FromUnixMicros(unix_micros),
                          absl::UTCTimeZone());
}
nlohmann::json JsonUnixSeconds(int64_t unix_micros) {
  if (unix_micros == 0) return nullptr;
  return absl::ToUnixSeconds(absl::FromUnixMicros(unix_micros));
}

// What `ls` prints, as typed JSON: {"jobs": [{"job": J, "checkpoints":
// [{"step": N, "state": "COMMITTED", ...}]}]}, jobs by name, steps ascending.
std::string ListJson(std::vector<v1::CheckpointRecord> records) {
  std::stable_sort(
      records.begin(), records.end(), [](const auto& a, const auto& b) {
        return a.job() != b.job() ? a.job() < b.job() : a.step() < b.step();
      });
  nlohmann::json jobs = nlohmann::json::array();
  for (const v1::CheckpointRecord& r : records) {
    if (jobs.empty() || jobs.back()["job"] != r.job()) {
      jobs.push_back(
          {{"job", r.job()}, {"checkpoints", nlohmann::json::array()}});
    }
    nlohmann::json c = {
        {"step", r.step()},
        {"state", StateName(r.state())},
        {"world_size", r.world_size()},
        {"total_bytes", r.total_bytes()},
        {"num_tensors", r.num_tensors()},
        {"num_bytes_entries", r.num_bytes_entries()},
        {"created", JsonTime(r.created_unix_micros())},
        {"created_unix_seconds", JsonUnixSeconds(r.created_unix_micros())},
        {"committed", JsonTime(r.committed_unix_micros())},
        {"committed_unix_seconds", JsonUnixSeconds(r.committed_unix_micros())},
        {"storage_uri", r.storage_uri()},
        {"tier", TierOf(r)},
    };
    if (r.state() == v1::CHECKPOINT_STATE_COMMITTED) {
      c["live_copies"] = r.live_copies();
      c["live_holder_nodes"] = std::vector<int>(r.live_holder_nodes().begin(),
                                                r.live_holder_nodes().end());
      c["restorable"] = r.tier() != v1::TIER_MEMORY || r.restorable();
      if (!r.unrestorable_reason().empty()) {
        c["unrestorable_reason"] = r.unrestorable_reason();
      }
    }
    // Why it is ABORTED, or DAMAGED (offline: its MANIFEST does not read).
    if (!r.abort_reason().empty()) c["reason"] = r.abort_reason();
    jobs.back()["checkpoints"].push_back(std::move(c));
  }
  return nlohmann::json{{"jobs", std::move(jobs)}}.dump(2);
}

// SIGINT and SIGTERM set a flag while one is in scope (an export polls it
// and stops, removing what it wrote); the previous handlers come back after.
class InterruptFlag {
 public:
  InterruptFlag() {
    interrupted_ = 0;
    struct sigaction sa = {};
    sa.sa_handler = [](int) { interrupted_ = 1; };
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~InterruptFlag() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  InterruptFlag(const InterruptFlag&) = delete;
  InterruptFlag& operator=(const InterruptFlag&) = delete;

  bool raised() const { return interrupted_ != 0; }

 private:
  static volatile std::sig_atomic_t interrupted_;
  struct sigaction old_int_ = {};
  struct sigaction old_term_ = {};
};
volatile std::sig_atomic_t InterruptFlag::interrupted_ = 0;

void PrintExport(const v1::Manifest& m, const std::string& out_dir,
                 const ExportResult& r, std::ostream& out) {
  out << "exported job " << m.job() << " step " << m.step() << " to " << out_dir
      << ": " << r.num_tensors << " tensors, " << HumanBytes(r.tensor_bytes)
      << " (" << r.tensor_bytes << " bytes) in " << r.files.size()
      << (r.files.size() == 1 ? " file" : " files") << "\n";
  Table t({"FILE", "TENSORS", "SIZE"});
  for (const ExportedFile& f : r.files) {
    t.Add({f.name, absl::StrCat(f.num_tensors), HumanBytes(f.bytes)});
  }
  if (r.wrote_index) t.Add({kSafetensorsIndexName, "-", "-"});
  t.Print(out);
  const auto& skipped = r.skipped_bytes_entries;
  if (!skipped.empty()) {
    std::vector<std::string> some(
        skipped.begin(), skipped.begin() + std::min<size_t>(5, skipped.size()));
    out << "skipped " << skipped.size() << " non-tensor (bytes) "
        << (skipped.size() == 1 ? "entry" : "entries")
        << ": safetensors holds tensors only (" << absl::StrJoin(some, ", ")
        << (skipped.size() > some.size() ? ", ..." : "") << ")\n";
  }
}

std::string SideText(const DiffSide& s) {
  if (!s.present) return "-";
  if (!s.is_tensor) return absl::StrCat("bytes ", HumanBytes(s.bytes));
  return absl::StrCat(storage::DTypeName(s.dtype), " [",
                      absl::StrJoin(s.shape, ", "), "]");
}

// What changed of an entry in both that is another kind, dtype or shape.
std::vector<std::string> ChangedParts(const EntryDiff& d) {
  if (d.a.is_tensor != d.b.is_tensor) return {"kind"};
  std::vector<std::string> parts;
  if (d.a.dtype != d.b.dtype) parts.push_back("dtype");
  if (d.a.shape != d.b.shape) parts.push_back("shape");
  return parts;
}

std::string DiffDetail(const EntryDiff& d) {
  switch (d.change) {
    case EntryDiff::Change::kAdded:
    case EntryDiff::Change::kRemoved:
      return "";
    case EntryDiff::Change::kChanged:
      return absl::StrCat(absl::StrJoin(ChangedParts(d), " and "), " changed");
    case EntryDiff::Change::kDiffers:
      break;
  }
  if (!d.a.is_tensor) return "crc32c or size differs";
  if (d.compared_bytes) {
    return absl::StrCat(d.elements_differ, " of ", d.elements,
                        " elements differ (compared bytes: other layout)");
  }
  return absl::StrCat(d.chunks_differ, " of ", d.chunks,
                      " chunks differ (by stored crc32c)");
}

void PrintDiff(const v1::Manifest& a, const v1::Manifest& b,
               const CheckpointDiff& diff, std::ostream& out) {
  const std::string both = absl::StrCat(
      diff.identical + diff.entries.size() -
          std::count_if(diff.entries.begin(), diff.entries.end(),
                        [](const EntryDiff& d) {
                          return d.change == EntryDiff::Change::kAdded ||
                                 d.change == EntryDiff::Change::kRemoved;
                        }),
      " entries in both");
  const std::string how = absl::StrCat(
      diff.compared_by_crc32c, " compared by stored crc32c without reading, ",
      diff.compared_by_bytes, " by reading bytes (",
      HumanBytes(diff.bytes_read), " read)");
  if (diff.same()) {
    out << "job " << a.job() << ": step " << a.step() << " and step "
        << b.step() << " are identical (" << both << ": " << how << ")\n";
    return;
  }
  out << "job " << a.job() << ": step " << a.step() << " -> step " << b.step()
      << ": " << diff.entries.size() << " of "
      << diff.identical + diff.entries.size() << " entries differ\n";
  Table t({"CHANGE", "ENTRY", absl::StrCat("STEP ", a.step()),
           absl::StrCat("STEP ", b.step()), "DETAIL"});
  for (const EntryDiff& d : diff.entries) {
    t.Add({ChangeName(d.change), d.fqn, SideText(d.a), SideText(d.b),
           DiffDetail(d)});
  }
  t.Print(out);
  out << diff.identical << " identical; " << both << ": " << how << "\n";
}

nlohmann::json SideJson(const DiffSide& s) {
  if (!s.present) return nullptr;
  if (!s.is_tensor) return {{"kind", "bytes"}, {"bytes", s.bytes}};
  return {{"kind", "tensor"},
          {"dtype", storage::DTypeName(s.dtype)},
          {"shape", s.shape},
          {"bytes", s.bytes}};
}

std::string DiffJson(const v1::Manifest& a, const v1::Manifest& b,
                     const CheckpointDiff& diff) {
  nlohmann::json entries = nlohmann::json::array();
  for (const EntryDiff& d : diff.entries) {
    nlohmann::json e = {{"fqn", d.fqn},
                        {"change", ChangeName(d.change)},
                        {"a", SideJson(d.a)},
                        {"b", SideJson(d.b)}};
    if (d.change == EntryDiff::Change::kChanged) e["what"] = ChangedParts(d);
    if (d.change == EntryDiff::Change::kDiffers) {
      e["compared"] = d.compared_bytes ? "bytes" : "crc32c";
      if (d.a.is_tensor && d.compared_bytes) {
        e["elements"] = d.elements;
        e["elements_differ"] = d.elements_differ;
      } else if (d.a.is_tensor) {
        e["chunks"] = d.chunks;
        e["chunks_differ"] = d.chunks_differ;
      }
    }
    entries.push_back(std::move(e));
  }
  return nlohmann::json{{"job", a.job()},
                        {"step_a", a.step()},
                        {"step_b", b.step()},
                        {"identical", diff.same()},
                        {"entries", std::move(entries)},
                        {"unchanged", diff.identical},
                        {"compared_by_crc32c", diff.compared_by_crc32c},
                        {"compared_by_bytes", diff.compared_by_bytes},
                        {"bytes_read", diff.bytes_read}}
      .dump(2);
}

void PrintShow(const v1::GetCheckpointResponse& resp, bool chunks,
               std::ostream& out) {
  const v1::Manifest& m = resp.manifest();
  const v1::CheckpointRecord& r = resp.checkpoint();
  out << "job " << r.job() << "  step " << r.step() << "  "
      << StateName(r.state()) << "  tier " << TierOf(r) << "  copies "
      << CopiesOf(r) << "\n";
  if (r.tier() == v1::TIER_MEMORY && !r.restorable()) {
    out << "NOT RESTORABLE: " << r.unrestorable_reason() << "\n";
  }
  out << "format v" << m.format_version() << "  ranks " << m.world_size()
      << "  size " << HumanBytes(m.total_bytes()) << " (" << m.total_bytes()
      << " bytes)  objects " << m.objects_size() << "\n";
  out << "created " << HumanTime(m.created_unix_micros()) << "  storage "
      << r.storage_uri() << "\n\n";
  Table t({"ENTRY", "DTYPE", "SHAPE", "CHUNKS", "SIZE"});
  for (const auto& tensor : m.tensors()) {
    uint64_t bytes = 0;
    for (const auto& c : tensor.chunks()) bytes += c.location().length();
    t.Add({tensor.entry().fqn(), storage::DTypeName(tensor.entry().dtype()),
           absl::StrCat("[", absl::StrJoin(tensor.entry().global_shape(), ", "),
                        "]"),
           absl::StrCat(tensor.chunks_size()), HumanBytes(bytes)});
  }
  for (const auto& b : m.bytes_entries()) {
    t.Add({b.fqn(), "bytes", "-", "1", HumanBytes(b.location().length())});
  }
  t.Print(out);
  if (!chunks) return;
  out << "\n";
  Table c({"ENTRY", "CHUNK", "RANK", "OBJECT", "OFFSET", "LENGTH", "CRC32C"});
  for (const auto& tensor : m.tensors()) {
    for (const auto& ch : tensor.chunks()) {
      c.Add({tensor.entry().fqn(), storage::BoxToString(ch.box()),
             absl::StrCat(ch.writer_rank()), ch.location().object_key(),
             absl::StrCat(ch.location().offset()),
             absl::StrCat(ch.location().length()),
             absl::StrFormat("%08x", ch.crc32c())});
    }
  }
  c.Print(out);
}

// The flags every command shares: which cairnd, or which storage, and how
// to reach cairnd.
struct GlobalArgs {
  std::string coordinator;
  std::string storage_uri;
  CLI::Option* coordinator_option = nullptr;
  CLI::Option* storage_option = nullptr;
  protocol::ClientSecurity security;
  std::string token_file;
};

void AddGlobalFlags(CLI::App& app, GlobalArgs& g) {
  g.coordinator_option =
      app.add_option("--coordinator,-c", g.coordinator,
                     "cairnd address host:port (env CAIRN_COORDINATOR)")
          ->envname("CAIRN_COORDINATOR");
  g.storage_option =
      app.add_option("--storage,-s", g.storage_uri,
                     "Storage URI to read offline, e.g. file:///data/ckpt "
                     "(env CAIRN_STORAGE)")
          ->envname("CAIRN_STORAGE");
  app.add_option("--tls-ca", g.security.ca_file,
                 "PEM CA bundle of cairnd's certificate: call cairnd over TLS "
                 "(env CAIRN_TLS_CA)")
      ->envname("CAIRN_TLS_CA");
  app.add_option("--tls-cert", g.security.cert_file,
                 "PEM client certificate, for cairnd with --tls-client-ca "
                 "(env CAIRN_TLS_CERT)")
      ->envname("CAIRN_TLS_CERT");
  app.add_option("--tls-key", g.security.key_file,
                 "PEM private key of --tls-cert (env CAIRN_TLS_KEY)")
      ->envname("CAIRN_TLS_KEY");
  app.add_option("--token-file", g.token_file,
                 "File holding the bearer token sent to cairnd (default: env "
                 "CAIRN_TOKEN)");
}

// What a command runs against once the global flags are checked: a running
// cairnd (online) or the storage itself (offline), and the streams.
class Session {
 public:
  // `failure`: the exit code of a failed operation (1; diff's is 2).
  Session(std::istream& in, std::ostream& out, std::ostream& err, int failure)
      : in(in), out(out), err(err), failure(failure) {}

  // Picks the backend the global flags name. Returns nullopt to go on, or
  // the exit code (2: the flags are wrong; `failure`: the storage does not
  // open). `registry_command`: the command needs cairnd (agents,
  // forget-agent).
  std::optional<int> Open(GlobalArgs& g, int argc, const char* const* argv,
                          bool registry_command);

  // Reports `s` and returns the failure exit code.
  int Fail(const absl::Status& s) {
    err << "cairn: " << s << "\n";
    return failure;
  }
  // Reports a usage error (`message` alone, without the status code) and
  // returns 2.
  int Usage(absl::string_view message) {
    err << "cairn: " << message << "\n";
    return flags::kExitUsage;
  }
  // Prints the damaged steps an offline command skipped.
  void PrintNotes();
  // A committed checkpoint (with its manifest), for the commands that read
  // its contents; step < 0 is the latest.
  absl::StatusOr<v1::GetCheckpointResponse> GetCommitted(const std::string& job,
                                                         int64_t step);
  // The store a checkpoint's bytes are read from: the offline one, or the
  // storage cairnd names, which this host reads and may not see.
  absl::StatusOr<storage::ShardStore*> StoreOf(
      const v1::GetCheckpointResponse& resp);
  // Offline rm and gc hold the storage's lease while they delete (without
  // it under --force); online, cairnd deletes through its own.
  absl::Status TakeStorage(bool force, const std::string& role,
                           const std::string& what,
                           const std::string& online_command);

  std::istream& in;
  std::ostream& out;
  std::ostream& err;
  const int failure;
  std::unique_ptr<Backend> backend;
  StorageBackend* offline = nullptr;     // set when reading storage directly
  CoordinatorBackend* online = nullptr;  // set when asking cairnd

 private:
  std::vector<std::unique_ptr<storage::ShardStore>> opened_;
  // Released before the backend's store closes.
  std::unique_ptr<storage::StorageLease> lease_;
};

std::optional<int> Session::Open(GlobalArgs& g, int argc,
                                 const char* const* argv,
                                 bool registry_command) {
  // One given on the command line wins over the other's variable: in
  // cairnd's container CAIRN_STORAGE is cairnd's setting, and
  // `cairn -c 127.0.0.1:7070 ls` there means cairnd.
  const bool coordinator_arg =
      flags::GivenOnCommandLine(*g.coordinator_option, argc, argv);
  const bool storage_arg =
      flags::GivenOnCommandLine(*g.storage_option, argc, argv);
  if (coordinator_arg && !storage_arg) g.storage_uri.clear();
  if (storage_arg && !coordinator_arg) g.coordinator.clear();
  if (g.coordinator.empty() == g.storage_uri.empty()) {
    err << "cairn: give exactly one of --coordinator HOST:PORT or --storage "
           "URI";
    if (!g.coordinator.empty() && !coordinator_arg && !storage_arg) {
      err << " (both CAIRN_COORDINATOR and CAIRN_STORAGE are set)";
    }
    err << "\n";
    return flags::kExitUsage;
  }
  if (registry_command && g.coordinator.empty()) {
    return Usage(
        "the agent registry is cairnd's: give --coordinator HOST:PORT");
  }
  if (!g.coordinator.empty()) {
    absl::StatusOr<std::string> token = protocol::TokenFromFileOrEnv(
        "--token-file", g.token_file, "CAIRN_TOKEN");
    if (!token.ok()) return Usage(token.status().message());
    g.security.token = *std::move(token);
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        protocol::NewCoordinatorChannel(g.coordinator, g.security);
    if (!channel.ok()) return Usage(channel.status().message());
    auto cb = std::make_unique<CoordinatorBackend>(*std::move(channel));
    online = cb.get();
    backend = std::move(cb);
    return std::nullopt;
  }
  if (absl::Status s = CheckStorageRootExists(g.storage_uri); !s.ok()) {
    return Fail(s);
  }
  absl::StatusOr<std::unique_ptr<storage::ShardStore>> store =
      storage::OpenShardStore(g.storage_uri);
  if (!store.ok()) return Fail(store.status());
  auto sb = std::make_unique<StorageBackend>(std::move(*store));
  offline = sb.get();
  backend = std::move(sb);
  return std::nullopt;
}

void Session::PrintNotes() {
  if (offline == nullptr) return;
  for (const std::string& note : offline->TakeNotes()) {
    err << "cairn: " << note << "\n";
  }
}

absl::StatusOr<v1::GetCheckpointResponse> Session::GetCommitted(
    const std::string& job, int64_t step) {
  absl::StatusOr<v1::GetCheckpointResponse> resp = backend->Get(job, step);
  PrintNotes();
  if (!resp.ok()) return resp.status();
  if (!resp->has_manifest()) {
    return absl::FailedPreconditionError(absl::StrCat("job '", job, "' step ",
                                                      resp->checkpoint().step(),
                                                      " is not committed"));
  }
  return resp;
}

absl::StatusOr<storage::ShardStore*> Session::StoreOf(
    const v1::GetCheckpointResponse& resp) {
  if (offline != nullptr) return &offline->store();
  if (resp.checkpoint().tier() == v1::TIER_MEMORY) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", resp.checkpoint().job(), "' step ", resp.checkpoint().step(),
        " is a memory checkpoint: its bytes are in cairn-agents' memory, not "
        "on storage (load it through cairn-agent)"));
  }
  CAIRN_ASSIGN_OR_RETURN(
      std::unique_ptr<storage::ShardStore> s,
      OpenReachableStore(resp.checkpoint().storage_uri(), resp.manifest()));
  opened_.push_back(std::move(s));
  return opened_.back().get();
}

absl::Status Session::TakeStorage(bool force, const std::string& role,
                                  const std::string& what,
                                  const std::string& online_command) {
  if (offline == nullptr) return absl::OkStatus();
  if (force) {
    err << "cairn: --force: deleting without the storage's lease\n";
    return absl::OkStatus();
  }
  CAIRN_ASSIGN_OR_RETURN(lease_, TakeStorageToDelete(offline->store(), role,
                                                     what, online_command));
  offline->set_lease(lease_.get());
  return absl::OkStatus();
}

// A malformed job name is a usage error, in both modes; so is a malformed
// step. Each returns nullopt to go on, or the exit code.
std::optional<int> CheckJobArg(const std::string& job, Session& session) {
  if (absl::Status s = storage::ValidateJobName(job); !s.ok()) {
    return session.Usage(s.message());
  }
  return std::nullopt;
}
std::optional<int> ParseStepInto(const std::string& arg, int64_t* step,
                                 Session& session) {
  absl::StatusOr<int64_t> parsed = ParseStepArg(arg);
  if (!parsed.ok()) return session.Usage(parsed.status().message());
  *step = *parsed;
  return std::nullopt;
}
// --force is for offline deletes: cairnd deletes through its own lease.
std::optional<int> CheckForce(bool force, Session& session) {
  if (force && session.offline == nullptr) {
    return session.Usage(
        "--force is for --storage (offline) deletes; cairnd deletes through "
        "its own lease");
  }
  return std::nullopt;
}

// Asks `question` [y/N] on the session's streams; false prints `refused`.
bool Confirm(const std::string& question, const char* refused,
             Session& session) {
  session.out << question << " [y/N] " << std::flush;
  std::string answer;
  if (!std::getline(session.in, answer) ||
      (answer != "y" && answer != "Y" && answer != "yes")) {
    session.out << refused << "\n";
    return false;
  }
  return true;
}

constexpr char kForceHelp[] =
    "--storage: delete even while another process (a cairnd) holds the "
    "storage's lease. Only when that process is gone for good: a running "
    "cairnd goes on listing the deleted checkpoints until it restarts";

// Each command: its arguments, the function adding its subcommand, and the
// function running it once the session is open.

// ls [JOB] [--all] [--json]
struct LsArgs {
  std::string job;
  bool all = false;
  bool json = false;
  const CLI::Option* job_option = nullptr;
};

CLI::App* AddLs(CLI::App& app, LsArgs& a) {
  CLI::App* cmd = app.add_subcommand("ls", "List jobs and their checkpoints");
  a.job_option = cmd->add_option("job", a.job, "Only this job");
  cmd->add_flag("--all,-a", a.all, "Include WRITING and ABORTED checkpoints");
  cmd->add_flag("--json", a.json,
                "Print the list as JSON: jobs, each with its checkpoints' "
                "step, state, world size, bytes, tensor count and times "
                "(RFC 3339 and unix seconds)");
  return cmd;
}

int RunLs(const LsArgs& a, Session& session) {
  if (a.job_option->count() > 0) {
    if (std::optional<int> rc = CheckJobArg(a.job, session)) return *rc;
  }
  absl::StatusOr<std::vector<v1::CheckpointRecord>> records =
      session.backend->List(a.job, a.all);
  session.PrintNotes();
  if (!records.ok()) return session.Fail(records.status());
  if (a.json) {
    session.out << ListJson(*std::move(records)) << "\n";
  } else {
    PrintList(*records, session.out);
  }
  return 0;
}

// show JOB STEP|latest [--json] [--chunks]
struct ShowArgs {
  std::string job;
  std::string step;
  bool json = false;
  bool chunks = false;
};

CLI::App* AddShow(CLI::App& app, ShowArgs& a) {
  CLI::App* cmd =
      app.add_subcommand("show", "Show a checkpoint's entries and chunks");
  cmd->add_option("job", a.job, "Job name")->required();
  cmd->add_option("step", a.step, "Step number or 'latest'")->required();
  cmd->add_flag("--json", a.json, "Print the manifest as JSON");
  cmd->add_flag("--chunks", a.chunks,
                "Also list every stored chunk (object, offset, crc32c)");
  return cmd;
}

int RunShow(const ShowArgs& a, Session& session) {
  int64_t step = -1;
  if (std::optional<int> rc = CheckJobArg(a.job, session)) return *rc;
  if (std::optional<int> rc = ParseStepInto(a.step, &step, session)) {
    return *rc;
  }
  absl::StatusOr<v1::GetCheckpointResponse> resp =
      session.backend->Get(a.job, step);
  session.PrintNotes();
  if (!resp.ok()) return session.Fail(resp.status());
  std::ostream& out = session.out;
  if (!resp->has_manifest()) {
    out << "job " << a.job << " step " << resp->checkpoint().step() << " is "
        << StateName(resp->checkpoint().state())
        << (resp->checkpoint().abort_reason().empty()
                ? ""
                : ": " + resp->checkpoint().abort_reason())
        << "\n";
    return 0;
  }
  if (a.json) {
    out << storage::ManifestToJson(resp->manifest(), a.chunks) << "\n";
  } else {
    PrintShow(*resp, a.chunks, out);
  }
  return 0;
}

// verify JOB STEP|latest
struct VerifyArgs {
  std::string job;
  std::string step;
};

CLI::App* AddVerify(CLI::App& app, VerifyArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "verify", "Re-read every byte of a checkpoint and check its crc32c");
  cmd->add_option("job", a.job, "Job name")->required();
  cmd->add_option("step", a.step, "Step number or 'latest'")->required();
  return cmd;
}

int RunVerify(const VerifyArgs& a, Session& session) {
  int64_t step = -1;
  if (std::optional<int> rc = CheckJobArg(a.job, session)) return *rc;
  if (std::optional<int> rc = ParseStepInto(a.step, &step, session)) {
    return *rc;
  }
  absl::StatusOr<v1::GetCheckpointResponse> resp =
      session.GetCommitted(a.job, step);
  if (!resp.ok()) return session.Fail(resp.status());
  absl::StatusOr<storage::ShardStore*> store = session.StoreOf(*resp);
  if (!store.ok()) return session.Fail(store.status());
  std::ostream& err = session.err;
  const bool tty = isatty(fileno(stderr));
  const absl::Time start = absl::Now();
  int last_percent = -1;
  absl::Status s = storage::VerifyCheckpoint(
      **store, resp->manifest(), [&](uint64_t done, uint64_t total) {
        const int percent =
            total == 0 ? 100 : static_cast<int>(done * 100 / total);
        if (percent == last_percent) return;
        last_percent = percent;
        if (tty) {
          const int bars = percent / 4;
          err << "\rverifying [" << std::string(bars, '#')
              << std::string(25 - bars, ' ') << "] " << percent << "% "
              << HumanBytes(done) << " / " << HumanBytes(total) << std::flush;
        } else if (percent % 10 == 0) {
          err << "verifying: " << percent << "% (" << HumanBytes(done) << " / "
              << HumanBytes(total) << ")\n";
        }
      });
  if (tty) err << "\n";
  if (!s.ok()) return session.Fail(s);
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  const v1::Manifest& m = resp->manifest();
  session.out << "OK: job " << a.job << " step " << m.step() << ": "
              << HumanBytes(m.total_bytes()) << " in " << m.objects_size()
              << " objects verified ("
              << absl::StrFormat("%.2f s, %.2f GB/s", secs,
                                 secs > 0 ? m.total_bytes() / secs / 1e9 : 0.0)
              << ")\n";
  return 0;
}

// rm JOB STEP [--yes] [--force]
struct RmArgs {
  std::string job;
  std::string step;
  bool yes = false;
  bool force = false;
};

CLI::App* AddRm(CLI::App& app, RmArgs& a) {
  CLI::App* cmd = app.add_subcommand("rm", "Delete a checkpoint");
  cmd->add_option("job", a.job, "Job name")->required();
  cmd->add_option("step", a.step, "Step number")->required();
  cmd->add_flag("--yes,-y", a.yes, "Do not ask for confirmation");
  cmd->add_flag("--force", a.force, kForceHelp);
  return cmd;
}

int RunRm(const RmArgs& a, Session& session) {
  int64_t step = -1;
  if (std::optional<int> rc = CheckForce(a.force, session)) return *rc;
  if (std::optional<int> rc = CheckJobArg(a.job, session)) return *rc;
  if (std::optional<int> rc = ParseStepInto(a.step, &step, session)) {
    return *rc;
  }
  if (step < 0) {
    session.err << "cairn rm: give an explicit step, not 'latest'\n";
    return flags::kExitUsage;
  }
  if (!a.yes &&
      !Confirm(absl::StrCat("delete job ", a.job, " step ", step, "?"),
               "not deleted", session)) {
    return 1;
  }
  if (absl::Status s = session.TakeStorage(
          a.force, "cairn rm",
          absl::StrCat("delete job '", a.job, "' step ", step),
          absl::StrCat("rm ", a.job, " ", step));
      !s.ok()) {
    return session.Fail(s);
  }
  if (absl::Status s = session.backend->Delete(a.job, step); !s.ok()) {
    return session.Fail(s);
  }
  session.out << "deleted job " << a.job << " step " << step << "\n";
  return 0;
}

// gc JOB --keep N [--dry-run] [--force]
struct GcArgs {
  std::string job;
  int keep = 0;
  bool dry_run = false;
  bool force = false;
};

CLI::App* AddGc(CLI::App& app, GcArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "gc", "Delete all but the newest N committed checkpoints of a job");
  cmd->add_option("job", a.job, "Job name")->required();
  cmd->add_option("--keep", a.keep, "How many committed checkpoints to keep")
      ->required()
      ->check(flags::AtLeast(1));
  cmd->add_flag("--dry-run,-n", a.dry_run, "Only print what would be deleted");
  cmd->add_flag("--force", a.force, kForceHelp);
  return cmd;
}

int RunGc(const GcArgs& a, Session& session) {
  if (std::optional<int> rc = CheckForce(a.force, session)) return *rc;
  if (std::optional<int> rc = CheckJobArg(a.job, session)) return *rc;
  if (!a.dry_run) {
    if (absl::Status s = session.TakeStorage(
            a.force, "cairn gc", absl::StrCat("gc job '", a.job, "'"),
            absl::StrCat("gc ", a.job, " --keep ", a.keep));
        !s.ok()) {
      return session.Fail(s);
    }
  }
  absl::StatusOr<v1::GarbageCollectResponse> resp =
      session.backend->Gc(a.job, a.keep, a.dry_run);
  if (!resp.ok()) return session.Fail(resp.status());
  session.out << (a.dry_run ? "would delete " : "deleted ")
              << resp->deleted_steps_size() << " checkpoints of job " << a.job
              << (resp->deleted_steps_size() > 0
                      ? absl::StrCat(" (steps ",
                                     absl::StrJoin(resp->deleted_steps(), ", "),
                                     ")")
                      : "")
              << ", " << HumanBytes(resp->freed_bytes()) << "\n";
  return 0;
}

// export JOB STEP|latest --out DIR [--format safetensors]
//        [--max-shard-size 5GB] [--filter PREFIX]... [--dtype-as-saved]
struct ExportArgs {
  std::string job;
  std::string step;
  std::string format = "safetensors";
  std::string out_dir;
  std::string max_shard_size = "5GB";
  std::vector<std::string> filters;
  bool dtype_as_saved = false;
};

CLI::App* AddExport(CLI::App& app, ExportArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Write a checkpoint's tensors as Hugging Face safetensors files");
  cmd->footer(
      "Every tensor is written whole (all ranks' chunks assembled, crc32c "
      "checked), dtypes as saved: model.safetensors, or, over "
      "--max-shard-size, model-00001-of-0000N.safetensors ... and "
      "model.safetensors.index.json, as transformers' save_pretrained. "
      "Non-tensor (bytes) entries are skipped and counted. The files go into "
      "DIR.tmp-XXXXXX, fsynced, renamed to DIR at the end: a failure or "
      "Ctrl-C leaves neither.");
  cmd->add_option("job", a.job, "Job name")->required();
  cmd->add_option("step", a.step, "Step number or 'latest'")->required();
  cmd->add_option("--format", a.format, "Output format (default safetensors)")
      ->check(CLI::IsMember({"safetensors"}));
  cmd->add_option("--out,-o", a.out_dir,
                  "Directory to create (must not exist; parents are made)")
      ->required();
  cmd->add_option(
      "--max-shard-size", a.max_shard_size,
      "Largest file: 5GB (default), 500MB, 2GiB or bytes (GB = 10^9, GiB = "
      "2^30, as transformers); a larger tensor gets a file of its own");
  cmd->add_option("--filter", a.filters,
                  "Only tensors whose fqn starts with PREFIX (repeatable); a "
                  "prefix matching no tensor is an error")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--dtype-as-saved", a.dtype_as_saved,
                "Keep every dtype as saved (bfloat16 stays BF16); the "
                "default and only behaviour");
  return cmd;
}

int RunExport(const ExportArgs& a, Session& session) {
  int64_t step = -1;
  if (std::optional<int> rc = CheckJobArg(a.job, session)) return *rc;
  if (std::optional<int> rc = ParseStepInto(a.step, &step, session)) {
    return *rc;
  }
  ExportOptions options;
  options.out_dir = a.out_dir;
  options.filters = a.filters;
  absl::StatusOr<uint64_t> cap = ParseByteSize(a.max_shard_size);
  if (!cap.ok()) {
    return session.Usage(
        absl::StrCat("--max-shard-size: ", cap.status().message()));
  }
  options.max_shard_bytes = *cap;
  // Before asking anyone anything: an existing DIR is the user's to fix.
  std::error_code ec;
  if (!a.out_dir.empty() &&
      std::filesystem::exists(std::filesystem::symlink_status(a.out_dir, ec))) {
    return session.Fail(absl::AlreadyExistsError(
        absl::StrCat(a.out_dir, " exists; pass a new directory")));
  }
  absl::StatusOr<v1::GetCheckpointResponse> resp =
      session.GetCommitted(a.job, step);
  if (!resp.ok()) return session.Fail(resp.status());
  absl::StatusOr<storage::ShardStore*> store = session.StoreOf(*resp);
  if (!store.ok()) return session.Fail(store.status());
  InterruptFlag interrupt;
  options.cancelled = [&] { return interrupt.raised(); };
  int last_percent = -1;
  std::string last_file;
  std::ostream& err = session.err;
  if (isatty(fileno(stderr))) {
    options.progress = [&](const ExportProgress& p) {
      const int percent =
          p.total == 0 ? 100 : static_cast<int>(p.done * 100 / p.total);
      if (percent == last_percent && p.file == last_file) return;
      last_percent = percent;
      last_file = p.file;
      const int bars = percent / 4;
      err << "\rexporting [" << std::string(bars, '#')
          << std::string(25 - bars, ' ') << "] " << percent << "% "
          << HumanBytes(p.done) << " / " << HumanBytes(p.total) << "  "
          << p.file << " " << HumanBytes(p.file_done) << " / "
          << HumanBytes(p.file_total) << "\x1b[K" << std::flush;
    };
  }
  absl::StatusOr<ExportResult> result =
      ExportSafetensors(**store, resp->manifest(), options);
  if (options.progress) err << "\n";
  if (!result.ok()) return session.Fail(result.status());
  PrintExport(resp->manifest(), a.out_dir, *result, session.out);
  return 0;
}

// diff JOB STEP_A STEP_B [--json]; exit codes as diff(1).
struct DiffArgs {
  std::string job;
  std::string step_a;
  std::string step_b;
  bool json = false;
};

CLI::App* AddDiff(CLI::App& app, DiffArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "diff",
      "Compare two checkpoints of a job: entries added, removed, changed in "
      "dtype or shape, and whose bytes differ");
  cmd->footer(
      "A tensor stored in the same chunks in both is compared by the crc32c "
      "values the MANIFESTs record, without reading data; one stored in "
      "other chunks (resharded) is read and compared byte by byte, and the "
      "output says so. Bytes entries: by crc32c and size. Exit codes as "
      "diff(1): 0 identical, 1 different, 2 error.");
  cmd->add_option("job", a.job, "Job name")->required();
  cmd->add_option("step_a", a.step_a, "First step or 'latest'")->required();
  cmd->add_option("step_b", a.step_b, "Second step or 'latest'")->required();
  cmd->add_flag("--json", a.json, "Print the differences as JSON");
  return cmd;
}

int RunDiff(const DiffArgs& a, Session& session) {
  int64_t step_a = -1;
  int64_t step_b = -1;
  if (std::optional<int> rc = CheckJobArg(a.job, session)) return *rc;
  if (std::optional<int> rc = ParseStepInto(a.step_a, &step_a, session)) {
    return *rc;
  }
  if (std::optional<int> rc = ParseStepInto(a.step_b, &step_b, session)) {
    return *rc;
  }
  absl::StatusOr<v1::GetCheckpointResponse> resp_a =
      session.GetCommitted(a.job, step_a);
  if (!resp_a.ok()) return session.Fail(resp_a.status());
  absl::StatusOr<v1::GetCheckpointResponse> resp_b =
      session.GetCommitted(a.job, step_b);
  if (!resp_b.ok()) return session.Fail(resp_b.status());
  // Opened only if bytes must be read: by crc32c, cairnd's manifests do.
  std::vector<storage::ShardStore*> stores(2, nullptr);
  auto diff_store = [&](int side) -> absl::StatusOr<storage::ShardStore*> {
    if (stores[side] == nullptr) {
      CAIRN_ASSIGN_OR_RETURN(stores[side],
                             session.StoreOf(side == 0 ? *resp_a : *resp_b));
    }
    return stores[side];
  };
  const v1::Manifest& ma = resp_a->manifest();
  const v1::Manifest& mb = resp_b->manifest();
  absl::StatusOr<CheckpointDiff> diff = DiffCheckpoints(ma, mb, diff_store);
  if (!diff.ok()) return session.Fail(diff.status());
  if (a.json) {
    session.out << DiffJson(ma, mb, *diff) << "\n";
  } else {
    PrintDiff(ma, mb, *diff, session.out);
  }
  return diff->same() ? 0 : 1;
}

// agents
CLI::App* AddAgents(CLI::App& app) {
  return app.add_subcommand(
      "agents",
      "List the agents registered with cairnd (--node-id auto): node id, "
      "node name, peer address, last registration");
}

int RunAgents(Session& session) {
  absl::StatusOr<v1::ListAgentsResponse> resp = session.online->ListAgents();
  if (!resp.ok()) return session.Fail(resp.status());
  Table t({"ID", "NODE", "PEER ADDRESS", "REGISTERED"});
  for (const v1::AgentRecord& a : resp->agents()) {
    t.Add({absl::StrCat(a.node_id()), a.node_name(),
           a.peer_address().empty() ? "(starting)" : a.peer_address(),
           HumanTime(a.registered_unix_micros())});
  }
  t.Print(session.out);
  return 0;
}

// forget-agent NODE [--yes]
struct ForgetAgentArgs {
  std::string node_name;
  bool yes = false;
};

CLI::App* AddForgetAgent(CLI::App& app, ForgetAgentArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "forget-agent",
      "Remove a node that is gone for good from cairnd's agent registry, so "
      "its id can go to a new node (never for a node whose agent runs)");
  cmd->add_option("node", a.node_name, "Node name")->required();
  cmd->add_flag("--yes,-y", a.yes, "Do not ask for confirmation");
  return cmd;
}

int RunForgetAgent(const ForgetAgentArgs& a, Session& session) {
  if (!a.yes && !Confirm(absl::StrCat("forget node ", a.node_name,
                                      " (its agent must not be running)?"),
                         "not forgotten", session)) {
    return 1;
  }
  absl::StatusOr<int> id = session.online->ForgetAgent(a.node_name);
  if (!id.ok()) return session.Fail(id.status());
  session.out << "forgot node " << a.node_name << ": node id " << *id
              << " is free\n";
  return 0;
}

// persist JOB STEP [--no-wait] [--timeout S]
struct PersistArgs {
  std::string job;
  std::string step;
  bool no_wait = false;
  int timeout_s = 600;
};

CLI::App* AddPersist(CLI::App& app, PersistArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "persist",
      "Write a memory checkpoint to storage (the agents holding it write "
      "its shards, then it is committed there)");
  cmd->add_option("job", a.job, "Job name")->required();
  cmd->add_option("step", a.step, "Step number or 'latest'")->required();
  cmd->add_flag("--no-wait", a.no_wait,
                "Return once ordered (cairn ls shows when it is persistent)");
  cmd->add_option("--timeout", a.timeout_s,
                  "Seconds to wait for it to be on storage")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  return cmd;
}

int RunPersist(const PersistArgs& a, Session& session) {
  if (std::optional<int> rc = CheckJobArg(a.job, session)) return *rc;
  int64_t step = -1;
  if (std::optional<int> rc = ParseStepInto(a.step, &step, session)) {
    return *rc;
  }
  if (step < 0) {
    absl::StatusOr<v1::GetCheckpointResponse> latest =
        session.backend->Get(a.job, -1);
    if (!latest.ok()) return session.Fail(latest.status());
    step = latest->checkpoint().step();
  }
  absl::StatusOr<v1::CheckpointRecord> rec = session.online->Persist(
      a.job, step, !a.no_wait, absl::Seconds(a.timeout_s));
  if (!rec.ok()) return session.Fail(rec.status());
  if (rec->tier() != v1::TIER_MEMORY) {
    session.out << "job " << a.job << " step " << step << " is persistent: on "
                << rec->storage_uri() << "\n";
  } else {
    session.out << "job " << a.job << " step " << step
                << " is being written to storage (cairn ls shows when it is "
                   "persistent)\n";
  }
  return 0;
}

// policy JOB [--memory-every N --persist-every M --replicas K
//             --keep-memory X --keep-persistent Y | --clear]
struct PolicyArgs {
  std::string job;
  int64_t memory_every = 0;
  int64_t persist_every = 0;
  int replicas = 1;
  int keep_memory = 2;
  int keep_persistent = 0;
  bool clear = false;
};

CLI::App* AddPolicy(CLI::App& app, PolicyArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "policy",
      "Show or set a job's checkpoint policy: memory checkpoints every N "
      "steps with K replicas, every M-th persisted to storage");
  cmd->add_option("job", a.job, "Job name")->required();
  cmd->add_option("--memory-every", a.memory_every,
                  "N: the job saves every N steps (to memory)");
  cmd->add_option("--persist-every", a.persist_every,
                  "M (a multiple of N): every M-th step goes to storage");
  cmd->add_option("--replicas", a.replicas,
                  "K: copies of a memory checkpoint beyond one, on other "
                  "nodes")
      ->capture_default_str();
  cmd->add_option("--keep-memory", a.keep_memory, "Memory checkpoints kept")
      ->capture_default_str();
  cmd->add_option("--keep-persistent", a.keep_persistent,
                  "Persistent checkpoints kept (0: cairnd's --keep-last)")
      ->capture_default_str();
  cmd->add_flag("--clear", a.clear,
                "Remove the policy (every save persistent again)");
  return cmd;
}

void PrintPolicy(const v1::JobPolicy& p, std::ostream& out) {
  out << "job " << p.job() << ": memory every " << p.memory_every()
      << " steps with " << p.replicas() << " replica"
      << (p.replicas() == 1 ? "" : "s") << ", persisted every "
      << p.persist_every() << "; keep " << p.keep_memory() << " memory, "
      << (p.keep_persistent() > 0 ? absl::StrCat(p.keep_persistent())
                                  : std::string("--keep-last"))
      << " persistent\n";
}

int RunPolicy(const PolicyArgs& a, Session& session) {
  if (std::optional<int> rc = CheckJobArg(a.job, session)) return *rc;
  if (a.clear || a.memory_every > 0 || a.persist_every > 0) {
    v1::SetJobPolicyRequest req;
    v1::JobPolicy* p = req.mutable_policy();
    p->set_job(a.job);
    p->set_memory_every(a.memory_every);
    p->set_persist_every(a.persist_every);
    p->set_replicas(a.replicas);
    p->set_keep_memory(a.keep_memory);
    p->set_keep_persistent(a.keep_persistent);
    req.set_clear(a.clear);
    if (absl::Status s = session.online->SetPolicy(req); !s.ok()) {
      return session.Fail(s);
    }
    if (a.clear) {
      session.out << "job " << a.job
                  << ": policy cleared (every save persistent)\n";
      return 0;
    }
    PrintPolicy(*p, session.out);
    return 0;
  }
  absl::StatusOr<v1::GetJobPolicyResponse> got =
      session.online->GetPolicy(a.job);
  if (!got.ok()) return session.Fail(got.status());
  if (!got->set()) {
    session.out << "job " << a.job << " has no policy: every save is "
                << "persistent unless it asks for the memory tier\n";
    return 0;
  }
  PrintPolicy(got->policy(), session.out);
  return 0;
}

}  // namespace

int RunCli(int argc, const char* const* argv, std::ostream& out,
           std::ostream& err) {
  return RunCli(argc, argv, std::cin, out, err);
}

int RunCli(int argc, const char* const* argv, std::istream& in,
           std::ostream& out, std::ostream& err) {
  CLI::App app{
      "cairn: list, inspect, verify, compare, export and delete Cairn "
      "checkpoints.\n"
      "Talks to a running cairnd (--coordinator) or reads storage directly "
      "(--storage, offline).",
      "cairn"};
  app.require_subcommand(1);
  GlobalArgs global;
  AddGlobalFlags(app, global);
  LsArgs ls_args;
  ShowArgs show_args;
  VerifyArgs verify_args;
  RmArgs rm_args;
  GcArgs gc_args;
  ExportArgs export_args;
  DiffArgs diff_args;
  ForgetAgentArgs forget_agent_args;
  PolicyArgs policy_args;
  PersistArgs persist_args;
  CLI::App* ls = AddLs(app, ls_args);
  CLI::App* show = AddShow(app, show_args);
  CLI::App* verify = AddVerify(app, verify_args);
  CLI::App* rm = AddRm(app, rm_args);
  CLI::App* gc = AddGc(app, gc_args);
  CLI::App* export_cmd = AddExport(app, export_args);
  CLI::App* diff = AddDiff(app, diff_args);
  CLI::App* agents = AddAgents(app);
  CLI::App* forget_agent = AddForgetAgent(app, forget_agent_args);
  CLI::App* policy = AddPolicy(app, policy_args);
  CLI::App* persist = AddPersist(app, persist_args);
  flags::AddVersionFlag(app, "cairn");
  if (std::optional<int> exit_code = flags::Parse(app, argc, argv, out, err)) {
    return *exit_code;
  }

  // diff's exit code 1 means "they differ": its failures are 2, as diff(1).
  Session session(in, out, err, diff->parsed() ? 2 : 1);
  if (std::optional<int> exit_code =
          session.Open(global, argc, argv,
                       agents->parsed() || forget_agent->parsed() ||
                           policy->parsed() || persist->parsed())) {
    return *exit_code;
  }
  if (ls->parsed()) return RunLs(ls_args, session);
  if (show->parsed()) return RunShow(show_args, session);
  if (verify->parsed()) return RunVerify(verify_args, session);
  if (export_cmd->parsed()) return RunExport(export_args, session);
  if (diff->parsed()) return RunDiff(diff_args, session);
  if (rm->parsed()) return RunRm(rm_args, session);
  if (agents->parsed()) return RunAgents(session);
  if (forget_agent->parsed()) return RunForgetAgent(forget_agent_args, session);
  if (gc->parsed()) return RunGc(gc_args, session);
  if (policy->parsed()) return RunPolicy(policy_args, session);
  if (persist->parsed()) return RunPersist(persist_args, session);
  return flags::kExitUsage;
}

}  // namespace cairn::cli
