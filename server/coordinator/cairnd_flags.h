// cairnd's command line: every option bound to a CairndFlags, and the
// CairndConfig they make once parsed (cairnd.h runs it). Each option's
// default is the library's (CoordinatorOptions, CoordinatorServer::Spec)
// unless its help says otherwise; every option is also CAIRN_<NAME>.
//
// Example (cairnd's main):
//   CLI::App app{"cairnd: ...", "cairnd"};
//   CairndFlags cairnd_flags;
//   AddCairndFlags(app, &cairnd_flags);
//   if (std::optional<int> exit_code =
//           flags::Parse(app, argc, argv, std::cout, std::cerr)) {
//     return *exit_code;
//   }
//   return RunCairnd(cairnd_flags.Config());
#ifndef CAIRN_SERVER_COORDINATOR_CAIRND_FLAGS_H_
#define CAIRN_SERVER_COORDINATOR_CAIRND_FLAGS_H_

#include <cstddef>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "server/coordinator/coordinator_server.h"

namespace cairn::coordinator {

// What cairnd runs with.
struct CairndConfig {
  CoordinatorServer::Spec spec;
  // Written with the bound port (--port-file) and the bound metrics port
  // (--metrics-port-file) once serving; empty: none.
  std::string port_file;
  std::string metrics_port_file;
  // How long running calls may finish on SIGTERM (--shutdown-grace).
  absl::Duration shutdown_grace = absl::Seconds(10);
  // Between checks of the TLS and token files (--reload-every); zero: they
  // are reloaded on SIGHUP only.
  absl::Duration reload_every = absl::ZeroDuration();
  // Freed memory kept for the next round (--keep-free-mib, heap_releaser.h).
  size_t keep_free_bytes = size_t{256} << 20;
  flags::LogFlags log;
};

// The values cairnd's options bind, in the flags' units (seconds, MiB).
struct CairndFlags {
  CairndFlags();

  // The configuration they make: durations and byte counts from the flags'
  // units, storage and catalog under --data-dir (made absolute against the
  // working directory) unless given.
  CairndConfig Config() const;

  CoordinatorServer::Spec spec;
  std::string data_dir = "cairn-data";
  std::string port_file;
  std::string metrics_port_file;
  double begin_deadline_s;
  double commit_deadline_s;
  double load_join_grace_s;
  double load_verify_deadline_s;
  double storage_lease_ttl_s;
  double storage_lease_wait_s = 0;
  double grace_s = 10;
  double reload_every_s = 0;
  int plan_cache_mib = 1024;
  int known_plan_cache_mib = 256;
  int load_index_cache_mib = 2048;
  int manifest_held_mib = 64;
  int keep_free_mib = 256;
  int max_request_memory_mib;
  std::string reflection = "auto";
  flags::LogFlags log;
};

// Adds every cairnd option to `app`, bound to `*f` (which must outlive
// parsing): the server's, --log-level and --log-format, --version and
// --print-config, each also settable as CAIRN_<NAME>.
void AddCairndFlags(CLI::App& app, CairndFlags* f);

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_CAIRND_FLAGS_H_
