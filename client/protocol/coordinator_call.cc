// Channel setup for calls to cairnd (see coordinator_call.h).
#include "client/protocol/coordinator_call.h"

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace cairn::protocol {

std::shared_ptr<grpc::Channel> NewCoordinatorChannel(
    const std::string& address) {
  grpc::ChannelArguments args;
  // cairnd answers up to 1 GiB (a rank's PlanLoad of a large checkpoint) and
  // accepts requests of up to 128 MiB (CoordinatorServer::Spec).
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(128 << 20);
  // Reconnect to a restarted cairnd within the retry backoff (gRPC's own
  // reconnect backoff grows to 2 minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

}  // namespace cairn::protocol
