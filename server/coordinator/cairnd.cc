#include "server/coordinator/cairnd.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/daemon.h"
#include "common/logging.h"
#include "server/coordinator/coordinator_server.h"
#include "server/coordinator/heap_releaser.h"

namespace cairn::coordinator {
namespace {

// Set when the storage lease is lost for good (then SIGTERM stops cairnd).
std::atomic<bool> storage_lease_lost{false};

// What --reload-every compares: each file's inode, size and mtime, after
// symlinks (a Kubernetes Secret volume swaps a symlink to a new directory).
std::string Fingerprint(const std::vector<std::string>& watched) {
  std::string out;
  for (const std::string& path : watched) {
    struct stat st;
    if (path.empty()) continue;
    if (stat(path.c_str(), &st) != 0) {
      absl::StrAppend(&out, path, ":missing;");
      continue;
    }
    absl::StrAppend(&out, path, ":", st.st_dev, ":", st.st_ino, ":", st.st_size,
                    ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ";");
  }
  return out;
}

// Reloads the TLS files and the token file; a bad file keeps the one in use:
// a typo must not lock everyone out.
void Reload(CoordinatorServer& server, const char* why) {
  if (server.tls_enabled()) {
    if (absl::Status s = server.ReloadTls(); s.ok()) {
      CAIRN_LOG(info, "cairnd: {}: TLS certificate, key and CA reloaded", why);
    } else {
      CAIRN_LOG(error,
                "cairnd: {}: {} (still serving with the previous "
                "TLS files)",
                why, std::string(s.message()));
    }
  }
  if (server.authorizer() == nullptr) {
    CAIRN_LOG(info, "cairnd: {}: no --auth-tokens, nothing to reload", why);
  } else if (absl::Status s = server.ReloadAuthTokens(); !s.ok()) {
    CAIRN_LOG(error, "cairnd: {}: keeping the tokens in use: {}", why,
              std::string(s.message()));
  }
}

// Writes the bound ports to the files the config names.
absl::Status WritePortFiles(const CairndConfig& config,
                            const CoordinatorServer& server) {
  if (!config.metrics_port_file.empty() && server.metrics_port() > 0) {
    if (absl::Status s = daemon::WriteFileAtomically(
            config.metrics_port_file,
            absl::StrCat(server.metrics_port(), "\n"));
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("--metrics-port-file: ", s.message()));
    }
  }
  if (!config.port_file.empty()) {
    if (absl::Status s = daemon::WriteFileAtomically(
            config.port_file, absl::StrCat(server.port(), "\n"));
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--port-file: ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunCairnd(CairndConfig config) {
  daemon::DisableMutexDeadlockDetection();
  if (absl::Status s = daemon::SetUpLogging(config.log); !s.ok()) {
    std::fprintf(stderr, "cairnd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // Lost for good, the lease may be another process's now: stop (exit 1)
  // rather than keep serving a storage this cairnd may no longer change.
  config.spec.coordinator.on_storage_lease_lost = [](const absl::Status&) {
    storage_lease_lost = true;
    kill(getpid(), SIGTERM);
  };
  // Blocked in every thread (gRPC's inherit the mask); this one takes them.
  const daemon::StopSignals signals;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> started =
      CoordinatorServer::Start(config.spec);
  if (!started.ok()) {
    std::fprintf(stderr, "cairnd: %s\n", started.status().ToString().c_str());
    return 1;
  }
  CoordinatorServer& server = **started;
  if (absl::Status s = WritePortFiles(config, server); !s.ok()) {
    std::fprintf(stderr, "cairnd: %s\n", s.ToString().c_str());
    server.Shutdown(config.shutdown_grace);
    return 1;
  }
  const std::vector<std::string> watched = {
      config.spec.tls.cert_file, config.spec.tls.key_file,
      config.spec.tls.client_ca_file, config.spec.auth_tokens_path};
  std::string seen = Fingerprint(watched);
  const HeapReleaser releaser(
      HeapReleasePolicy{.keep_free_bytes = config.keep_free_bytes});
  daemon::StopSignals::WaitOptions wait;
  wait.on_reload = [&] {
    seen = Fingerprint(watched);
    Reload(server, "SIGHUP");
  };
  wait.poll_every = config.reload_every;
  wait.on_poll = [&] {
    if (std::string now = Fingerprint(watched); now != seen) {
      seen = std::move(now);
      Reload(server, "changed files");
    }
  };
  const int sig = signals.Wait(wait);
  CAIRN_LOG(info, "cairnd: signal {} received, draining", sig);
  server.Shutdown(config.shutdown_grace);
  return storage_lease_lost ? 1 : 0;
}

}  // namespace cairn::coordinator
