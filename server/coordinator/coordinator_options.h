// CoordinatorOptions: what cairnd is configured with. A header of its own
// so the coordinator's parts (request_bounds, save_session, load_rounds, ...)
// read their limits without including the Coordinator they serve.
#ifndef CAIRN_SERVER_COORDINATOR_COORDINATOR_OPTIONS_H_
#define CAIRN_SERVER_COORDINATOR_COORDINATOR_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "planner/save_plan.h"

namespace cairn::coordinator {

struct CoordinatorOptions {
  // Where checkpoints live: file:///path or mem:// (tests). Required.
  std::string storage_uri;
  // RocksDB directory of the catalog; created if missing. Required.
  std::string catalog_path;
  // Directory of the MANIFESTs of memory checkpoints (their bytes are in the
  // agents' memory): kept by cairnd beside its catalog, never on storage.
  // Default (empty): catalog_path + "-memory".
  std::string memory_manifest_path;
  // How long an agent counts as live after its last ReportHoldings (agents
  // report every second): its copies of memory checkpoints stop counting
  // after that, and after a restart cairnd waits up to this long for the
  // agents to report before resolving `latest`. Default: 5 s.
  absl::Duration holdings_lease = absl::Seconds(5);
  // All ranks of a save must call BeginSave within this time of the first;
  // the ranks of a training job reach a save together, so a missing rank is
  // a dead or misconfigured process, reported to the others
  // (DEADLINE_EXCEEDED naming it) within this time. Default: 1 minute.
  absl::Duration begin_deadline = absl::Minutes(1);
  // All ranks must call CommitSave within this time of receiving the plan.
  // Default: 60 minutes.
  absl::Duration commit_deadline = absl::Minutes(60);
  // Once every member of a load round has reported, its membership closes
  // this long after the last PlanLoad that joined it (at once when all
  // world_size ranks have joined). A rank planning later joins a new round.
  // Default: 2 seconds.
  absl::Duration load_join_grace = absl::Seconds(2);
  // A load round's ranks must call VerifyLoad within this time of the
  // round's previous PlanLoad or report; then the
  // waiting ranks get DEADLINE_EXCEEDED and verify locally (only a rank that
  // planned and then died or stalled can cause this). Default: 1 minute.
  absl::Duration load_verify_deadline = absl::Minutes(1);
  // Live load rounds (joining, or waiting for their ranks' reports) of one
  // job, and of all jobs: a PlanLoad that would open one more is refused
  // RESOURCE_EXHAUSTED naming the job and the cap. A job has one round per
  // load in progress (its training, an evaluation), plus a failed one
  // waiting for its dead ranks until the verify deadline after a restart.
  // Defaults: 64 per job, 1024 in all.
  int max_load_rounds_per_job = 64;
  int max_load_rounds = 1024;
  // Retention: keep the newest N committed checkpoints of each job and delete
  // older ones after every commit. 0 keeps everything. Default: 0.
  int keep_last = 0;
  // Byte bound of the global save plan cache. Default: 1 GiB (a 70B model's
  // plan at 16k FSDP x TP ranks is ~0.85 GB).
  size_t plan_cache_bytes = size_t{1} << 30;
  // Byte bound of the local plans kept for fingerprint-only BeginSaves (each
  // rank's last plan, charged its approximate in-memory size). Needed only
  // when the global plan must be rebuilt (it is not in the plan cache):
  // ranks whose plans were evicted are then asked to resend them, a second
  // round trip. Size it to the ranks x items of the largest job (a 70B
  // model's FSDP x TP state takes ~0.7 MB per rank). Default: 256 MiB.
  size_t known_plan_cache_bytes = size_t{256} << 20;
  // A commit's manifest is built, checked and encoded tensor by tensor; a
  // body up to this size is kept between encoding and writing, a larger one
  // is encoded a second time and streamed to storage (the manifest of a
  // 16k-rank save of a 70B model is 1.4 GB). Default: 64 MiB.
  size_t manifest_held_bytes = size_t{64} << 20;
  // Byte bound of the load indexes kept in memory: a loaded checkpoint's
  // planner (about 20 bytes a stored chunk plus an overlap index per
  // tiling: ~0.4 GB for a 70B model saved by 16k FSDP x TP ranks), charged
  // LoadPlanner::MemoryBytes. One larger than the bound is not kept (every
  // PlanLoad round builds it again; cairnd warns). Default: 2 GiB.
  size_t load_index_cache_bytes = size_t{2} << 30;
  // After each commit, build the new checkpoint's load index on a worker
  // (reading its manifest back from storage) and drop the job's older
  // ones from memory: a job that restarts loads the newest checkpoint, and
  // its first PlanLoad round then does not wait for the build (12.6 s at
  // 16k ranks). Costs that build's CPU once per commit. Default: true.
  bool prepare_loads = true;
  // Bytes of PlanLoad answers kept in memory (an answer is charged its
  // serialized size: requests choose how large it is). An answer is cached
  // from the second request of its layout on. Default: 256 MiB.
  size_t load_plan_cache_bytes = size_t{256} << 20;
  // Threads for blocking work (storage, RocksDB, plan building). Default: 4.
  int worker_threads = 4;
  // Largest world size accepted. Default: 1 << 20. A save's memory grows
  // with the ranks that actually arrived, not with the world size it claims.
  int max_world_size = 1 << 20;
  // Agents (node names) the registry records (agent_registry.h); one more
  // name is RESOURCE_EXHAUSTED. Default: 4096.
  int max_agents = 4096;
  // Save sessions in progress (gathering, writing or committing) at a time,
  // per job and in total; one more is RESOURCE_EXHAUSTED naming the job.
  // Defaults: 8 per job, 256 in total.
  int max_sessions_per_job = 8;
  int max_sessions = 256;
  // Bounds of one rank's local save plan: items, and bytes of an fqn.
  // Defaults: 65,536 items (a 70B model with its optimizer state has ~2,500
  // tensors, one item each per rank under FSDP), fqns of up to 1 KiB.
  int max_plan_items_per_rank = 1 << 16;
  int max_fqn_bytes = 1024;
  // Items of every rank's plan of one save together. Default: 2^26 (67 M:
  // 16,384 ranks x 4,096 items).
  int64_t max_plan_items_per_save = int64_t{1} << 26;
  // Storage placement of planned items (alignment, object names).
  planner::SavePlanOptions save_plan;
  // On start, reconcile the catalog with storage (a valid MANIFEST makes its
  // step COMMITTED, a record without one is not), finish interrupted
  // deletions, delete steps that have no MANIFEST and temp files of writers
  // that died (all left by a crash). Default: true.
  bool clean_incomplete_on_start = true;
  // One cairnd per storage (storage/lease.h): Create takes the storage's
  // lease before recovery touches anything and is refused
  // (FAILED_PRECONDITION naming the holder and when its lease expires) while
  // another cairnd, or an offline `cairn rm`/`cairn gc`, holds it. Renewed
  // every third of this; released on destruction. A holder that died on
  // this host frees it at once, one elsewhere after this long. Saves,
  // commits and deletes are refused while renewals are overdue (UNAVAILABLE,
  // after 2/3 of it) and once the lease is lost (FAILED_PRECONDITION).
  // Default: 30 s.
  absl::Duration storage_lease_ttl = absl::Seconds(30);
  // How long Create waits for another holder's lease to be released or to
  // expire before refusing. Default: 0 (refuse at once).
  absl::Duration storage_lease_wait = absl::ZeroDuration();
  // Called once (from the lease's thread) when the lease is lost for good:
  // another process may have taken the storage over. cairnd stops.
  // Default: none (the coordinator keeps refusing changes).
  std::function<void(const absl::Status&)> on_storage_lease_lost;
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_COORDINATOR_OPTIONS_H_
