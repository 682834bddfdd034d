// What a probe or an outsider sees of a daemon's gRPC ports, for tests:
// grpc.health.v1 checks and raw calls by method name, without credentials.
#ifndef CAIRN_TESTS_TESTING_GRPC_PROBE_H_
#define CAIRN_TESTS_TESTING_GRPC_PROBE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/support/slice.h"
#include "grpcpp/support/status.h"

namespace cairn::testing {

// grpc.health.v1.Health/Check (service "") at `address` in plaintext, as
// Kubernetes' gRPC probe makes it: the status field of the answer
// (1 SERVING, 2 NOT_SERVING), or UNAVAILABLE with the call's error.
absl::StatusOr<int> HealthCheck(const std::string& address,
                                absl::Duration timeout = absl::Seconds(30));

// Calls `method` ("/pkg.Service/Method") at `address` in plaintext with an
// empty request and returns the call's status.
grpc::Status CallEmpty(const std::string& address, const std::string& method,
                       absl::Duration timeout = absl::Seconds(30));

// Calls `method` at `address` in plaintext with `body` as the request's
// bytes (a valid message or not), on a connection of its own with no limit on
// what it sends, with "authorization: Bearer <token>" unless `token` is
// empty; returns the call's status. `body` is referenced, not copied, so
// many calls at once may send one large body.
grpc::Status CallRaw(const std::string& address, const std::string& method,
                     const grpc::Slice& body, const std::string& token = "",
                     absl::Duration timeout = absl::Minutes(2));

// A TCP port on loopback that was free a moment ago (bound, then released).
int FreeLoopbackPort();

}  // namespace cairn::testing

#endif  // CAIRN_TESTS_TESTING_GRPC_PROBE_H_
