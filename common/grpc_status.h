// Conversion between absl::Status and grpc::Status. The only place in Cairn
// that maps one to the other: gRPC and Abseil share canonical code numbers, so
// codes and messages carry over unchanged in both directions.
#ifndef CAIRN_COMMON_GRPC_STATUS_H_
#define CAIRN_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace cairn {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace cairn

#endif  // CAIRN_COMMON_GRPC_STATUS_H_
