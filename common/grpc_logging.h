// Routes gRPC's own log lines (gpr_log: connection errors, TLS failures,
// "too many pings"...) through Cairn's logger, so they share its format
// (text or JSON), level and stream instead of gRPC's own stderr format.
//
// Example (a daemon's main, before starting servers or channels):
//   cairn::RouteGrpcLogsToCairnLogger();
#ifndef CAIRN_COMMON_GRPC_LOGGING_H_
#define CAIRN_COMMON_GRPC_LOGGING_H_

namespace cairn {

// Installs the routing for the whole process (gpr_set_log_function) and lets
// every severity through to Cairn's logger, whose level then decides: gRPC
// DEBUG -> trace, INFO -> debug (gRPC's info lines are chatty: pollers, fds),
// ERROR -> error, each prefixed "grpc <file>:<line>". Thread-safe;
// idempotent.
void RouteGrpcLogsToCairnLogger();

}  // namespace cairn

#endif  // CAIRN_COMMON_GRPC_LOGGING_H_
