// cairnd the daemon: runs a CoordinatorServer from a CairndConfig (from
// cairnd_flags.h) until SIGTERM or SIGINT, then drains and stops.
//
//   - Logging from config.log; SIGTERM, SIGINT and SIGHUP blocked in every
//     thread and taken by the calling thread (common/daemon.h).
//   - Once serving, the bound ports written to config.port_file and
//     config.metrics_port_file (atomically: a reader never sees a partial
//     file).
//   - SIGHUP reloads the TLS files (--tls-cert, --tls-key, --tls-client-ca)
//     and the token file (--auth-tokens); so does a change of any of them
//     seen every config.reload_every (Kubernetes Secrets and cert-manager
//     renewals replace the files but send no signal). A bad file keeps the
//     one in use.
//   - Freed memory beyond config.keep_free_bytes goes back to the kernel
//     once quiet (heap_releaser.h).
//   - A storage lease lost for good (storage/lease.h) stops cairnd as
//     SIGTERM does, with exit code 1: the storage may be another process's.
#ifndef CAIRN_SERVER_COORDINATOR_CAIRND_H_
#define CAIRN_SERVER_COORDINATOR_CAIRND_H_

#include "server/coordinator/cairnd_flags.h"

namespace cairn::coordinator {

// Runs cairnd in this process and returns its exit code: 0 after a stop
// signal, 1 if it could not start (or write its port files) or stopped
// because its storage lease was lost, 2 for a bad logging setting. The
// errors go to stderr, prefixed "cairnd: ". Call from the main thread
// before any other thread starts, once per process.
int RunCairnd(CairndConfig config);

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_CAIRND_H_
