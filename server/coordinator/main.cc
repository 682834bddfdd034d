// cairnd: the Cairn coordinator daemon. Parses flags, starts the server,
// waits for SIGTERM/SIGINT, drains and exits 0 (1 when it stopped because
// its storage lease was lost, storage/lease.h); SIGHUP reloads the TLS
// files (--tls-cert, --tls-key, --tls-client-ca) and the token file
// (--auth-tokens), and so does a change of any of them seen by
// --reload-every (for Kubernetes Secrets and cert-manager renewals, which
// replace the files but send no signal).
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "common/grpc_logging.h"
#include "common/logging.h"
#include "server/coordinator/coordinator_server.h"
#include "server/coordinator/heap_releaser.h"

int main(int argc, char** argv) {
  // Debian's Abseil is built with Mutex deadlock detection on: every lock
  // and every Mutex's destruction updates one global lock graph (CPU on
  // every lock, and one more lock that every thread shares). The tests keep
  // it; the daemons do not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using cairn::coordinator::CoordinatorServer;
  CLI::App app{
      "cairnd: Cairn's checkpoint coordinator. Plans every save (dedupe, "
      "balanced writers, cached plans) and load (resharding read items), and "
      "keeps the checkpoint catalog in RocksDB. Serves cairn.v1.Coordinator, "
      "grpc.health.v1 and server reflection (off with --auth-tokens), over "
      "TLS with --tls-cert and --tls-key (SIGHUP reloads them).",
      "cairnd"};
  CoordinatorServer::Spec spec;
  std::string data_dir = "cairn-data";
  std::string port_file;
  // Defaults come from CoordinatorOptions (documented there).
  const cairn::coordinator::CoordinatorOptions defaults;
  double begin_deadline_s = absl::ToDoubleSeconds(defaults.begin_deadline);
  double commit_deadline_s = absl::ToDoubleSeconds(defaults.commit_deadline);
  double load_join_grace_s = absl::ToDoubleSeconds(defaults.load_join_grace);
  double load_verify_deadline_s =
      absl::ToDoubleSeconds(defaults.load_verify_deadline);
  double grace_s = 10;
  double reload_every_s = 0;
  int plan_cache_mib = 1024;
  int known_plan_cache_mib = 256;
  int load_index_cache_mib = 2048;
  int manifest_held_mib = 64;
  int keep_free_mib = 256;
  app.add_option("--listen", spec.listen_address,
                 "host:port to serve on (port 0 picks a free port; default: "
                 "0.0.0.0:7070 with TLS, 127.0.0.1:7070 without)");
  app.add_option("--tls-cert", spec.tls.cert_file,
                 "PEM certificate chain to serve TLS with (with --tls-key); "
                 "SIGHUP re-reads it");
  app.add_option("--tls-key", spec.tls.key_file,
                 "PEM private key of --tls-cert; SIGHUP re-reads it");
  app.add_option("--tls-client-ca", spec.tls.client_ca_file,
                 "PEM CA bundle: require client certificates it signed "
                 "(mutual TLS); SIGHUP re-reads it");
  app.add_flag("--allow-insecure", spec.allow_insecure,
               "Serve plaintext on an address other than loopback (refused "
               "without it when there is no --tls-cert)");
  app.add_option("--data-dir", data_dir,
                 "Directory for the default storage (<dir>/checkpoints) and "
                 "catalog (<dir>/catalog)")
      ->capture_default_str();
  app.add_option("--storage", spec.coordinator.storage_uri,
                 "Checkpoint storage URI, e.g. file:///mnt/lustre/ckpt "
                 "(default: file://<data-dir>/checkpoints)");
  app.add_option("--catalog", spec.coordinator.catalog_path,
                 "RocksDB catalog directory (default: <data-dir>/catalog)");
  double storage_lease_ttl_s =
      absl::ToDoubleSeconds(defaults.storage_lease_ttl);
  double storage_lease_wait_s = 0;
  app.add_option("--storage-lease-ttl", storage_lease_ttl_s,
                 "Seconds cairnd's lease on its storage lasts unrenewed "
                 "(renewed every third of it; saves and deletes stop after "
                 "two thirds without renewal). Another cairnd, or an offline "
                 "`cairn rm`/`gc`, is refused the storage while it is held; "
                 "after cairnd dies it is free at once on the same host, "
                 "after this long from another")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 3600));
  app.add_option("--storage-lease-wait", storage_lease_wait_s,
                 "Seconds to wait at start for another process's lease on "
                 "the storage to be released or to expire, then take it over; "
                 "0 refuses to start at once, naming the holder")
      ->capture_default_str()
      ->check(cairn::flags::InRange(0, 86400));
  app.add_option("--begin-deadline", begin_deadline_s,
                 "Seconds all ranks have to call BeginSave after the first; "
                 "missing ranks abort the save with DEADLINE_EXCEEDED")
      ->capture_default_str()
      ->check(cairn::flags::Positive());
  app.add_option("--commit-deadline", commit_deadline_s,
                 "Seconds all ranks have to call CommitSave after the plan")
      ->capture_default_str()
      ->check(cairn::flags::Positive());
  app.add_option("--load-join-grace", load_join_grace_s,
                 "Seconds after a rank's PlanLoad during which another rank "
                 "of the job joins the same load round (same step for "
                 "'latest', collective verification) once every member has "
                 "reported (while members still read, a rank joins anyway); "
                 "a rank loading alone waits at most this long after "
                 "reading")
      ->capture_default_str()
      ->check(cairn::flags::Positive());
  app.add_option("--load-verify-deadline", load_verify_deadline_s,
                 "Seconds each rank of a load round has to report its "
                 "checksum pieces (VerifyLoad) after the round's previous "
                 "PlanLoad or report; "
                 "then the waiting ranks verify partly read chunks themselves")
      ->capture_default_str()
      ->check(cairn::flags::Positive());
  app.add_option("--max-load-rounds-per-job",
                 spec.coordinator.max_load_rounds_per_job,
                 "Live load rounds of one job (loads in progress, and failed "
                 "ones waiting for their ranks until the verify deadline); "
                 "a PlanLoad that would open one more is refused "
                 "RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 20));
  app.add_option("--max-load-rounds", spec.coordinator.max_load_rounds,
                 "Live load rounds of all jobs together; a PlanLoad that "
                 "would open one more is refused RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 24));
  app.add_option("--keep-last", spec.coordinator.keep_last,
                 "Retention: keep the newest N committed checkpoints per job "
                 "(0 keeps all; the newest is never deleted)")
      ->capture_default_str()
      ->check(cairn::flags::AtLeast(0));
  app.add_option("--workers", spec.coordinator.worker_threads,
                 "Threads for storage, catalog and planning work (also the "
                 "threads combining a large load round's checksum pieces)")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 256));
  app.add_option("--plan-cache-mib", plan_cache_mib,
                 "Byte bound of the global save plan cache, in MiB (too "
                 "small for a job: every save of it is planned anew)")
      ->capture_default_str()
      ->check(cairn::flags::InRange(0, 1 << 20));
  app.add_option("--known-plan-cache-mib", known_plan_cache_mib,
                 "Byte bound of the ranks' last local plans, in MiB: needed "
                 "when a global plan is built anew from fingerprint-only "
                 "saves (too small for a job: its ranks are asked to resend "
                 "their plans then)")
      ->capture_default_str()
      ->check(cairn::flags::InRange(0, 1 << 20));
  app.add_option("--load-index-cache-mib", load_index_cache_mib,
                 "Byte bound of the committed checkpoints indexed for "
                 "PlanLoad kept in memory, in MiB (about 20 bytes a stored "
                 "chunk; one that does not fit is indexed again by every "
                 "load round of it)")
      ->capture_default_str()
      ->check(cairn::flags::InRange(0, 1 << 20));
  app.add_option("--prepare-loads", spec.coordinator.prepare_loads,
                 "After each commit, index the new checkpoint for PlanLoad "
                 "at once (and drop the job's older ones from memory), so "
                 "that a restarted job's first load does not wait for it")
      ->capture_default_str();
  app.add_option("--manifest-held-mib", manifest_held_mib,
                 "Largest manifest a commit keeps in memory between encoding "
                 "and writing, in MiB; a larger one is written as it is "
                 "encoded, its header last (file://), or encoded twice and "
                 "streamed (s3://, whose uploads cannot rewrite their start)")
      ->capture_default_str()
      ->check(cairn::flags::InRange(0, 1 << 20));
  app.add_option("--keep-free-mib", keep_free_mib,
                 "Freed memory cairnd keeps for its next round, in MiB: more "
                 "than this (and 64 MiB) free goes back to the kernel once "
                 "cairnd is quiet. Keeping it spares the next round a page "
                 "fault per reused page (16k calls in flight fault in ~170 "
                 "MB); idle RSS is up to this much higher")
      ->capture_default_str()
      ->check(cairn::flags::InRange(0, 1 << 20));
  app.add_option("--reload-every", reload_every_s,
                 "Seconds between checks of the TLS and token files; a "
                 "changed file is reloaded as on SIGHUP (0: only on SIGHUP)")
      ->capture_default_str()
      ->check(cairn::flags::InRange(0, 86400));
  app.add_option("--shutdown-grace", grace_s,
                 "Seconds to let running calls finish on SIGTERM")
      ->capture_default_str()
      ->check(cairn::flags::InRange(0, 3600));
  app.add_option("--max-world-size", spec.coordinator.max_world_size,
                 "Largest world size a save or load may claim")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 24));
  app.add_option("--max-agents", spec.coordinator.max_agents,
                 "Node names the agent registry records (agents started "
                 "with --node-id auto); forget gone nodes to make room")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 20));
  app.add_option("--max-sessions", spec.coordinator.max_sessions,
                 "Saves in progress at a time, all jobs together; one more "
                 "is refused with RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(cairn::flags::AtLeast(1));
  app.add_option("--max-sessions-per-job",
                 spec.coordinator.max_sessions_per_job,
                 "Saves (steps) of one job in progress at a time")
      ->capture_default_str()
      ->check(cairn::flags::AtLeast(1));
  app.add_option("--max-plan-items-per-rank",
                 spec.coordinator.max_plan_items_per_rank,
                 "Items (tensor chunks, bytes entries) of one rank's save plan")
      ->capture_default_str()
      ->check(cairn::flags::AtLeast(1));
  app.add_option("--max-plan-items-per-save",
                 spec.coordinator.max_plan_items_per_save,
                 "Items of all ranks' save plans of one save together")
      ->capture_default_str()
      ->check(cairn::flags::AtLeast(1));
  app.add_option("--max-fqn-bytes", spec.coordinator.max_fqn_bytes,
                 "Longest tensor or bytes entry name (fqn)")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 20));
  int max_request_memory_mib =
      static_cast<int>(spec.max_request_memory_bytes >> 20);
  app.add_option("--max-request-memory-mib", max_request_memory_mib,
                 "Memory budget of gRPC's request buffers, in MiB: requests "
                 "received and not yet parsed, connections' buffers. At the "
                 "budget, idle connections are closed and calls in flight "
                 "cancelled (RESOURCE_EXHAUSTED) until they fit; raise it "
                 "for jobs whose ranks together send more at once")
      ->capture_default_str()
      ->check(cairn::flags::InRange(16, 1 << 24));
  app.add_option("--max-streams-per-connection",
                 spec.max_streams_per_connection,
                 "Calls in flight on one client connection (clients queue "
                 "more); above the ranks one process runs, whose parked "
                 "BeginSave calls share its connection")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 30));
  app.add_option("--port-file", port_file,
                 "Write the bound port to this file once serving");
  std::string metrics_port_file;
  app.add_option("--metrics-listen", spec.metrics_listen,
                 "host:port serving Prometheus metrics at GET /metrics "
                 "(port 0 picks a free port; default: none)");
  app.add_option("--metrics-port-file", metrics_port_file,
                 "Write the bound metrics port to this file once serving");
  app.add_option("--health-listen", spec.health_listen,
                 "host:port serving grpc.health.v1 only, in plaintext, with "
                 "the main port's status: for Kubernetes gRPC probes, which "
                 "cannot speak TLS (default: none; health is always also on "
                 "the main port)");
  app.add_option("--auth-tokens", spec.auth_tokens_path,
                 "Token file: lines 'CREDENTIAL ROLE JOBGLOB [NAME]' "
                 "(docs/security.md); every call then needs a listed token or "
                 "client certificate. Reloaded on SIGHUP. Default: none, "
                 "authentication off")
      ->check(CLI::ExistingFile);
  std::string reflection = "auto";
  app.add_option("--reflection", reflection,
                 "Serve grpc.reflection: auto (on without --auth-tokens, "
                 "off with it: reflection is not authenticated), on, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cairn::flags::LogFlags log;
  cairn::flags::AddLogFlags(app, &log);
  cairn::flags::AddVersionFlag(app, "cairnd");
  cairn::flags::AddPrintConfigFlag(app);
  cairn::flags::AddEnvironmentVariables(app);
  if (std::optional<int> exit_code =
          cairn::flags::Parse(app, argc, argv, std::cout, std::cerr)) {
    return *exit_code;
  }

  // Checked by the flags' own validators above.
  (void)cairn::SetLogFormat(log.format);
  cairn::RouteGrpcLogsToCairnLogger();
  if (absl::Status s = cairn::SetLogLevel(log.level); !s.ok()) {
    std::fprintf(stderr, "cairnd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (spec.coordinator.storage_uri.empty()) {
    spec.coordinator.storage_uri =
        absl::StrCat("file://", std::filesystem::absolute(data_dir).string(),
                     "/checkpoints");
  }
  if (spec.coordinator.catalog_path.empty()) {
    spec.coordinator.catalog_path =
        (std::filesystem::absolute(data_dir) / "catalog").string();
  }
  spec.coordinator.begin_deadline = absl::Seconds(begin_deadline_s);
  spec.coordinator.commit_deadline = absl::Seconds(commit_deadline_s);
  spec.coordinator.load_join_grace = absl::Seconds(load_join_grace_s);
  spec.coordinator.load_verify_deadline = absl::Seconds(load_verify_deadline_s);
  spec.coordinator.storage_lease_ttl = absl::Seconds(storage_lease_ttl_s);
  spec.coordinator.storage_lease_wait = absl::Seconds(storage_lease_wait_s);
  // Lost for good, the lease may be another process's now: stop (exit 1)
  // rather than keep serving a storage this cairnd may no longer change.
  static std::atomic<bool> storage_lease_lost{false};
  spec.coordinator.on_storage_lease_lost = [](const absl::Status&) {
    storage_lease_lost = true;
    kill(getpid(), SIGTERM);
  };
  spec.coordinator.plan_cache_bytes = static_cast<size_t>(plan_cache_mib) << 20;
  spec.coordinator.known_plan_cache_bytes =
      static_cast<size_t>(known_plan_cache_mib) << 20;
  spec.coordinator.load_index_cache_bytes =
      static_cast<size_t>(load_index_cache_mib) << 20;
  spec.coordinator.manifest_held_bytes = static_cast<size_t>(manifest_held_mib)
                                         << 20;
  spec.max_request_memory_bytes = int64_t{max_request_memory_mib} << 20;
  if (reflection != "auto") spec.reflection = reflection == "on";

  // Block the handled signals in every thread (gRPC's inherit the mask);
  // the main thread takes them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(spec);
  if (!server.ok()) {
    std::fprintf(stderr, "cairnd: %s\n", server.status().ToString().c_str());
    return 1;
  }
  if (!metrics_port_file.empty() && (*server)->metrics_port() > 0) {
    std::string tmp = metrics_port_file + ".tmp";
    std::ofstream(tmp) << (*server)->metrics_port() << "\n";
    std::filesystem::rename(tmp, metrics_port_file);
  }
  if (!port_file.empty()) {
    std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << (*server)->port() << "\n";
    std::filesystem::rename(tmp, port_file);
  }
  // A bad file keeps the one in use: a typo must not lock everyone out.
  auto reload = [&server](const char* why) {
    if ((*server)->tls_enabled()) {
      if (absl::Status s = (*server)->ReloadTls(); s.ok()) {
        CAIRN_LOG(info, "cairnd: {}: TLS certificate, key and CA reloaded",
                  why);
      } else {
        CAIRN_LOG(error,
                  "cairnd: {}: {} (still serving with the previous "
                  "TLS files)",
                  why, std::string(s.message()));
      }
    }
    if ((*server)->authorizer() == nullptr) {
      CAIRN_LOG(info, "cairnd: {}: no --auth-tokens, nothing to reload", why);
    } else if (absl::Status s = (*server)->ReloadAuthTokens(); !s.ok()) {
      CAIRN_LOG(error, "cairnd: {}: keeping the tokens in use: {}", why,
                std::string(s.message()));
    }
  };
  // What --reload-every compares: each file's inode, size and mtime, after
  // symlinks (a Kubernetes Secret volume swaps a symlink to a new directory).
  const std::vector<std::string> watched = {
      spec.tls.cert_file, spec.tls.key_file, spec.tls.client_ca_file,
      spec.auth_tokens_path};
  auto fingerprint = [&watched] {
    std::string out;
    for (const std::string& path : watched) {
      struct stat st;
      if (path.empty()) continue;
      if (stat(path.c_str(), &st) != 0) {
        absl::StrAppend(&out, path, ":missing;");
        continue;
      }
      absl::StrAppend(&out, path, ":", st.st_dev, ":", st.st_ino, ":",
                      st.st_size, ":", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec, ";");
    }
    return out;
  };
  std::string seen = fingerprint();
  const timespec every = {
      static_cast<time_t>(reload_every_s),
      static_cast<long>((reload_every_s - static_cast<time_t>(reload_every_s)) *
                        1e9)};
  const cairn::coordinator::HeapReleaser releaser(
      cairn::coordinator::HeapReleasePolicy{
          .keep_free_bytes = static_cast<size_t>(keep_free_mib) << 20});
  int sig = 0;
  while (true) {
    if (reload_every_s > 0) {
      sig = sigtimedwait(&signals, nullptr, &every);
      if (sig < 0) {
        if (errno != EAGAIN && errno != EINTR) break;
        if (std::string now = fingerprint(); now != seen) {
          seen = std::move(now);
          reload("changed files");
        }
        continue;
      }
    } else if (sigwait(&signals, &sig) != 0) {
      break;
    }
    if (sig != SIGHUP) break;
    seen = fingerprint();
    reload("SIGHUP");
  }
  CAIRN_LOG(info, "cairnd: signal {} received, draining", sig);
  (*server)->Shutdown(absl::Seconds(grace_s));
  return storage_lease_lost ? 1 : 0;
}
