#include "server/coordinator/cairnd_flags.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace cairn::coordinator {

CairndFlags::CairndFlags() {
  // Defaults come from CoordinatorOptions (documented there).
  const CoordinatorOptions defaults;
  begin_deadline_s = absl::ToDoubleSeconds(defaults.begin_deadline);
  commit_deadline_s = absl::ToDoubleSeconds(defaults.commit_deadline);
  load_join_grace_s = absl::ToDoubleSeconds(defaults.load_join_grace);
  load_verify_deadline_s = absl::ToDoubleSeconds(defaults.load_verify_deadline);
  storage_lease_ttl_s = absl::ToDoubleSeconds(defaults.storage_lease_ttl);
  max_request_memory_mib =
      static_cast<int>(spec.max_request_memory_bytes >> 20);
}

CairndConfig CairndFlags::Config() const {
  CairndConfig config;
  config.spec = spec;
  CoordinatorOptions& c = config.spec.coordinator;
  if (c.storage_uri.empty()) {
    c.storage_uri =
        absl::StrCat("file://", std::filesystem::absolute(data_dir).string(),
                     "/checkpoints");
  }
  if (c.catalog_path.empty()) {
    c.catalog_path = (std::filesystem::absolute(data_dir) / "catalog").string();
  }
  c.begin_deadline = absl::Seconds(begin_deadline_s);
  c.commit_deadline = absl::Seconds(commit_deadline_s);
  c.load_join_grace = absl::Seconds(load_join_grace_s);
  c.load_verify_deadline = absl::Seconds(load_verify_deadline_s);
  c.storage_lease_ttl = absl::Seconds(storage_lease_ttl_s);
  c.storage_lease_wait = absl::Seconds(storage_lease_wait_s);
  c.plan_cache_bytes = static_cast<size_t>(plan_cache_mib) << 20;
  c.known_plan_cache_bytes = static_cast<size_t>(known_plan_cache_mib) << 20;
  c.load_index_cache_bytes = static_cast<size_t>(load_index_cache_mib) << 20;
  c.manifest_held_bytes = static_cast<size_t>(manifest_held_mib) << 20;
  config.spec.max_request_memory_bytes = int64_t{max_request_memory_mib} << 20;
  if (reflection != "auto") config.spec.reflection = reflection == "on";
  config.port_file = port_file;
  config.metrics_port_file = metrics_port_file;
  config.shutdown_grace = absl::Seconds(grace_s);
  config.reload_every = absl::Seconds(reload_every_s);
  config.keep_free_bytes = static_cast<size_t>(keep_free_mib) << 20;
  config.log = log;
  return config;
}

void AddCairndFlags(CLI::App& app, CairndFlags* f) {
  app.add_option("--listen", f->spec.listen_address,
                 "host:port to serve on (port 0 picks a free port; default: "
                 "0.0.0.0:7070 with TLS, 127.0.0.1:7070 without)");
  app.add_option("--tls-cert", f->spec.tls.cert_file,
                 "PEM certificate chain to serve TLS with (with --tls-key); "
                 "SIGHUP re-reads it");
  app.add_option("--tls-key", f->spec.tls.key_file,
                 "PEM private key of --tls-cert; SIGHUP re-reads it");
  app.add_option("--tls-client-ca", f->spec.tls.client_ca_file,
                 "PEM CA bundle: require client certificates it signed "
                 "(mutual TLS); SIGHUP re-reads it");
  app.add_flag("--allow-insecure", f->spec.allow_insecure,
               "Serve plaintext on an address other than loopback (refused "
               "without it when there is no --tls-cert)");
  app.add_option("--data-dir", f->data_dir,
                 "Directory for the default storage (<dir>/checkpoints) and "
                 "catalog (<dir>/catalog)")
      ->capture_default_str();
  app.add_option("--storage", f->spec.coordinator.storage_uri,
                 "Checkpoint storage URI, e.g. file:///mnt/lustre/ckpt "
                 "(default: file://<data-dir>/checkpoints)");
  app.add_option("--catalog", f->spec.coordinator.catalog_path,
                 "RocksDB catalog directory (default: <data-dir>/catalog)");
  app.add_option("--storage-lease-ttl", f->storage_lease_ttl_s,
                 "Seconds cairnd's lease on its storage lasts unrenewed "
                 "(renewed every third of it; saves and deletes stop after "
                 "two thirds without renewal). Another cairnd, or an offline "
                 "`cairn rm`/`gc`, is refused the storage while it is held; "
                 "after cairnd dies it is free at once on the same host, "
                 "after this long from another")
      ->capture_default_str()
      ->check(flags::InRange(1, 3600));
  app.add_option("--storage-lease-wait", f->storage_lease_wait_s,
                 "Seconds to wait at start for another process's lease on "
                 "the storage to be released or to expire, then take it over; "
                 "0 refuses to start at once, naming the holder")
      ->capture_default_str()
      ->check(flags::InRange(0, 86400));
  app.add_option("--begin-deadline", f->begin_deadline_s,
                 "Seconds all ranks have to call BeginSave after the first; "
                 "missing ranks abort the save with DEADLINE_EXCEEDED")
      ->capture_default_str()
      ->check(flags::Positive());
  app.add_option("--commit-deadline", f->commit_deadline_s,
                 "Seconds all ranks have to call CommitSave after the plan")
      ->capture_default_str()
      ->check(flags::Positive());
  app.add_option("--load-join-grace", f->load_join_grace_s,
                 "Seconds after a rank's PlanLoad during which another rank "
                 "of the job joins the same load round (same step for "
                 "'latest', collective verification) once every member has "
                 "reported (while members still read, a rank joins anyway); "
                 "a rank loading alone waits at most this long after "
                 "reading")
      ->capture_default_str()
      ->check(flags::Positive());
  app.add_option("--load-verify-deadline", f->load_verify_deadline_s,
                 "Seconds each rank of a load round has to report its "
                 "checksum pieces (VerifyLoad) after the round's previous "
                 "PlanLoad or report; "
                 "then the waiting ranks verify partly read chunks themselves")
      ->capture_default_str()
      ->check(flags::Positive());
  app.add_option("--max-load-rounds-per-job",
                 f->spec.coordinator.max_load_rounds_per_job,
                 "Live load rounds of one job (loads in progress, and failed "
                 "ones waiting for their ranks until the verify deadline); "
                 "a PlanLoad that would open one more is refused "
                 "RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 20));
  app.add_option("--max-load-rounds", f->spec.coordinator.max_load_rounds,
                 "Live load rounds of all jobs together; a PlanLoad that "
                 "would open one more is refused RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 24));
  app.add_option("--keep-last", f->spec.coordinator.keep_last,
                 "Retention: keep the newest N committed checkpoints per job "
                 "(0 keeps all; the newest is never deleted)")
      ->capture_default_str()
      ->check(flags::AtLeast(0));
  app.add_option("--workers", f->spec.coordinator.worker_threads,
                 "Threads for storage, catalog and planning work (also the "
                 "threads combining a large load round's checksum pieces)")
      ->capture_default_str()
      ->check(flags::InRange(1, 256));
  app.add_option("--plan-cache-mib", f->plan_cache_mib,
                 "Byte bound of the global save plan cache, in MiB (too "
                 "small for a job: every save of it is planned anew)")
      ->capture_default_str()
      ->check(flags::InRange(0, 1 << 20));
  app.add_option("--known-plan-cache-mib", f->known_plan_cache_mib,
                 "Byte bound of the ranks' last local plans, in MiB: needed "
                 "when a global plan is built anew from fingerprint-only "
                 "saves (too small for a job: its ranks are asked to resend "
                 "their plans then)")
      ->capture_default_str()
      ->check(flags::InRange(0, 1 << 20));
  app.add_option("--load-index-cache-mib", f->load_index_cache_mib,
                 "Byte bound of the committed checkpoints indexed for "
                 "PlanLoad kept in memory, in MiB (about 20 bytes a stored "
                 "chunk; one that does not fit is indexed again by every "
                 "load round of it)")
      ->capture_default_str()
      ->check(flags::InRange(0, 1 << 20));
  app.add_option("--prepare-loads", f->spec.coordinator.prepare_loads,
                 "After each commit, index the new checkpoint for PlanLoad "
                 "at once (and drop the job's older ones from memory), so "
                 "that a restarted job's first load does not wait for it")
      ->capture_default_str();
  app.add_option("--manifest-held-mib", f->manifest_held_mib,
                 "Largest manifest a commit keeps in memory between encoding "
                 "and writing, in MiB; a larger one is written as it is "
                 "encoded, its header last (file://), or encoded twice and "
                 "streamed (s3://, whose uploads cannot rewrite their start)")
      ->capture_default_str()
      ->check(flags::InRange(0, 1 << 20));
  app.add_option("--keep-free-mib", f->keep_free_mib,
                 "Freed memory cairnd keeps for its next round, in MiB: more "
                 "than this (and 64 MiB) free goes back to the kernel once "
                 "cairnd is quiet. Keeping it spares the next round a page "
                 "fault per reused page (16k calls in flight fault in ~170 "
                 "MB); idle RSS is up to this much higher")
      ->capture_default_str()
      ->check(flags::InRange(0, 1 << 20));
  app.add_option("--reload-every", f->reload_every_s,
                 "Seconds between checks of the TLS and token files; a "
                 "changed file is reloaded as on SIGHUP (0: only on SIGHUP)")
      ->capture_default_str()
      ->check(flags::InRange(0, 86400));
  app.add_option("--shutdown-grace", f->grace_s,
                 "Seconds to let running calls finish on SIGTERM")
      ->capture_default_str()
      ->check(flags::InRange(0, 3600));
  app.add_option("--max-world-size", f->spec.coordinator.max_world_size,
                 "Largest world size a save or load may claim")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 24));
  app.add_option("--max-agents", f->spec.coordinator.max_agents,
                 "Node names the agent registry records (agents started "
                 "with --node-id auto); forget gone nodes to make room")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 20));
  app.add_option("--max-sessions", f->spec.coordinator.max_sessions,
                 "Saves in progress at a time, all jobs together; one more "
                 "is refused with RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(flags::AtLeast(1));
  app.add_option("--max-sessions-per-job",
                 f->spec.coordinator.max_sessions_per_job,
                 "Saves (steps) of one job in progress at a time")
      ->capture_default_str()
      ->check(flags::AtLeast(1));
  app.add_option("--max-plan-items-per-rank",
                 f->spec.coordinator.max_plan_items_per_rank,
                 "Items (tensor chunks, bytes entries) of one rank's save plan")
      ->capture_default_str()
      ->check(flags::AtLeast(1));
  app.add_option("--max-plan-items-per-save",
                 f->spec.coordinator.max_plan_items_per_save,
                 "Items of all ranks' save plans of one save together")
      ->capture_default_str()
      ->check(flags::AtLeast(1));
  app.add_option("--max-fqn-bytes", f->spec.coordinator.max_fqn_bytes,
                 "Longest tensor or bytes entry name (fqn)")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 20));
  app.add_option("--max-request-memory-mib", f->max_request_memory_mib,
                 "Memory budget of gRPC's request buffers, in MiB: requests "
                 "received and not yet parsed, connections' buffers. At the "
                 "budget, idle connections are closed and calls in flight "
                 "cancelled (RESOURCE_EXHAUSTED) until they fit; raise it "
                 "for jobs whose ranks together send more at once")
      ->capture_default_str()
      ->check(flags::InRange(16, 1 << 24));
  app.add_option("--max-streams-per-connection",
                 f->spec.max_streams_per_connection,
                 "Calls in flight on one client connection (clients queue "
                 "more); above the ranks one process runs, whose parked "
                 "BeginSave calls share its connection")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 30));
  app.add_option("--port-file", f->port_file,
                 "Write the bound port to this file once serving");
  app.add_option("--metrics-listen", f->spec.metrics_listen,
                 "host:port serving Prometheus metrics at GET /metrics "
                 "(port 0 picks a free port; default: none)");
  app.add_option("--metrics-port-file", f->metrics_port_file,
                 "Write the bound metrics port to this file once serving");
  app.add_option("--health-listen", f->spec.health_listen,
                 "host:port serving grpc.health.v1 only, in plaintext, with "
                 "the main port's status: for Kubernetes gRPC probes, which "
                 "cannot speak TLS (default: none; health is always also on "
                 "the main port)");
  app.add_option("--auth-tokens", f->spec.auth_tokens_path,
                 "Token file: lines 'CREDENTIAL ROLE JOBGLOB [NAME]' "
                 "(docs/security.md); every call then needs a listed token or "
                 "client certificate. Reloaded on SIGHUP. Default: none, "
                 "authentication off")
      ->check(CLI::ExistingFile);
  app.add_option("--reflection", f->reflection,
                 "Serve grpc.reflection: auto (on without --auth-tokens, "
                 "off with it: reflection is not authenticated), on, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  flags::AddLogFlags(app, &f->log);
  flags::AddVersionFlag(app, "cairnd");
  flags::AddPrintConfigFlag(app);
  flags::AddEnvironmentVariables(app);
}

}  // namespace cairn::coordinator
