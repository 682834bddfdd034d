#include "tests/testing/grpc_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <future>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/unique_fd.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace cairn::testing {
namespace {

grpc::Status Call(const std::string& address, const std::string& method,
                  absl::Duration timeout, std::string* answer) {
  grpc::GenericStub stub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(s); });
  grpc::Status s = done.get_future().get();
  if (!s.ok()) return s;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the answer");
  }
  answer->clear();
  for (const grpc::Slice& sl : slices) {
    answer->append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  return s;
}

}  // namespace

absl::StatusOr<int> HealthCheck(const std::string& address,
                                absl::Duration timeout) {
  std::string bytes;
  grpc::Status s =
      Call(address, "/grpc.health.v1.Health/Check", timeout, &bytes);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("health check of ", address,
                                               ": ", s.error_code(), " ",
                                               s.error_message()));
  }
  // HealthCheckResponse{status = 1: enum}: tag 0x08, one varint byte.
  if (bytes.size() != 2 || bytes[0] != '\x08') {
    return absl::InternalError(absl::StrCat("health check of ", address,
                                            ": unexpected answer of ",
                                            bytes.size(), " bytes"));
  }
  return static_cast<int>(bytes[1]);
}

grpc::Status CallEmpty(const std::string& address, const std::string& method,
                       absl::Duration timeout) {
  std::string ignored;
  return Call(address, method, timeout, &ignored);
}

grpc::Status CallRaw(const std::string& address, const std::string& method,
                     const grpc::Slice& body, const std::string& token,
                     absl::Duration timeout) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // its own connection
  args.SetMaxSendMessageSize(-1);
  grpc::GenericStub stub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  grpc::Slice copy = body;  // a reference, not a copy of the bytes
  grpc::ByteBuffer request(&copy, 1), response;
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&ctx, method, request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  return status;
}

int FreeLoopbackPort() {
  const UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd.valid() &&
      bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  return port;
}

}  // namespace cairn::testing
