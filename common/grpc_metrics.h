// RPC metrics of a gRPC server, as a server interceptor (so the services
// stay unaware of them):
//   cairn_rpcs_total{service, method, code}       counter, one per finished
//                                                 call, by gRPC status code
//   cairn_rpc_duration_seconds{service, method}   histogram, from the call's
//                                                 start to its status
// `service` is the full service name (cairn.v1.Coordinator), `method` the
// method's (BeginSave), `code` the status code's name (OK, NOT_FOUND).
#ifndef CAIRN_COMMON_GRPC_METRICS_H_
#define CAIRN_COMMON_GRPC_METRICS_H_

#include <memory>
#include <string>

#include "common/metrics.h"
#include "grpcpp/support/server_interceptor.h"

namespace cairn::metrics {

// Registers the two metrics in `registry` (once per registry) and returns an
// interceptor factory recording into them, for
// ServerBuilder::experimental().SetInterceptorCreators. `registry` must
// outlive every server built with it.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcMetricsInterceptorFactory(Registry* registry);

// "NOT_FOUND" for grpc::StatusCode::NOT_FOUND (the number as text for codes
// outside the 17 defined).
std::string GrpcCodeName(int code);

}  // namespace cairn::metrics

#endif  // CAIRN_COMMON_GRPC_METRICS_H_
