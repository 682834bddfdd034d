// Channel setup for calls to cairnd (see coordinator_call.h).
#include "protocol/coordinator_call.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/tls_pem.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace cairn::protocol {
namespace {

// Adds "authorization: Bearer <token>" to every call's metadata. An
// interceptor rather than CallCredentials: gRPC refuses CallCredentials on
// insecure channels, and a token must also work over plaintext loopback.
class BearerTokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationMetadataKey,
                                                 *value_);
    }
    methods->Proceed();
  }

 private:
  const std::string* value_;  // owned by the factory, which the channel keeps
};

class BearerTokenInterceptorFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(const std::string& token)
      : value_(std::string(kBearerPrefix) + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(&value_);
  }

 private:
  const std::string value_;
};

grpc::ChannelArguments CoordinatorChannelArguments() {
  grpc::ChannelArguments args;
  // cairnd answers up to 1 GiB (a rank's PlanLoad of a large checkpoint) and
  // accepts requests of up to 128 MiB (CoordinatorServer::Spec).
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(128 << 20);
  // Reconnect to a restarted cairnd within the retry backoff (gRPC's own
  // reconnect backoff grows to 2 minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  // Not a backoff: gRPC's subchannel gives each connection attempt (TCP,
  // TLS handshake, HTTP/2 settings) until max(next backoff, this). A
  // minimum as short as the backoff (100 ms) is exceeded again and again by
  // the TLS handshakes of many ranks starting at once on a loaded node
  // ("handshaker shutdown"), and those ranks are then lost for a minute. A
  // refused connection still fails at once; only a silent address waits
  // this long.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20000);
  return args;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
CoordinatorChannelCredentials(const ClientSecurity& security) {
  if (!security.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!security.ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        tls::ReadCertificates(security.ca_file, "TLS CA (CAIRN_TLS_CA)");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!security.cert_file.empty() || !security.key_file.empty()) {
    if (security.cert_file.empty() || security.key_file.empty()) {
      return absl::InvalidArgumentError(
          "a TLS client certificate needs both a certificate and a key "
          "(CAIRN_TLS_CERT and CAIRN_TLS_KEY)");
    }
    absl::StatusOr<tls::KeyCertPair> pair = tls::ReadKeyCertPair(
        security.cert_file, "TLS client certificate (CAIRN_TLS_CERT)",
        security.key_file, "TLS client key (CAIRN_TLS_KEY)");
    if (!pair.ok()) return pair.status();
    ssl.pem_cert_chain = std::move(pair->cert_chain);
    ssl.pem_private_key = std::move(pair->private_key);
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> NewCoordinatorChannel(
    const std::string& address, const ClientSecurity& security) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      CoordinatorChannelCredentials(security);
  if (!creds.ok()) return creds.status();
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  if (!security.token.empty()) {
    interceptors.push_back(
        std::make_unique<BearerTokenInterceptorFactory>(security.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, *creds, CoordinatorChannelArguments(), std::move(interceptors));
}

std::shared_ptr<grpc::Channel> NewCoordinatorChannel(
    const std::string& address) {
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   CoordinatorChannelArguments());
}

CoordinatorContact::CoordinatorContact(std::shared_ptr<grpc::Channel> channel,
                                       std::string address,
                                       absl::Duration first_contact_timeout)
    : channel_(std::move(channel)),
      address_(std::move(address)),
      first_contact_timeout_(first_contact_timeout) {}

void CoordinatorContact::Observe() {
  if (reached()) return;
  if (channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
    reached_.store(true, std::memory_order_release);
  }
}

absl::Status CoordinatorContact::AwaitConnectAttempt(
    absl::Time deadline, Cancellation* cancellation) {
  grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
  while (true) {
    if (state == GRPC_CHANNEL_READY) {
      reached_.store(true, std::memory_order_release);
      return absl::OkStatus();
    }
    // Failed: an attempt now fails at once with gRPC's reason.
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE ||
        state == GRPC_CHANNEL_SHUTDOWN) {
      return absl::OkStatus();
    }
    if (cancellation != nullptr && cancellation->cancelled()) {
      return cancellation->status();
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "no answer to the connection attempt within ",
          absl::FormatDuration(first_contact_timeout_),
          " (the host is down, packets to it are dropped, or what listens "
          "there is not cairnd)"));
    }
    // In slices, so that a Cancel() is seen within 100 ms.
    (void)channel_->WaitForStateChange(
        state,
        absl::ToChronoTime(std::min(deadline, now + absl::Milliseconds(100))));
    state = channel_->GetState(/*try_to_connect=*/true);
  }
}

absl::Status CoordinatorContact::NeverReached(int attempts, absl::Time start,
                                              const absl::Status& last) const {
  return absl::UnavailableError(absl::StrCat(
      "cairnd at ", address_, " was never reached: ", last.message(), " (",
      attempts, attempts == 1 ? " attempt" : " attempts", " over ",
      absl::FormatDuration(
          absl::Trunc(absl::Now() - start, absl::Milliseconds(100))),
      ", first-contact timeout ", absl::FormatDuration(first_contact_timeout_),
      "); is the address right and cairnd running?"));
}

absl::Status CoordinatorContact::Probe(const std::string& address,
                                       const ClientSecurity& security,
                                       absl::Duration timeout) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      NewCoordinatorChannel(address, security);
  if (!channel.ok()) return channel.status();
  CoordinatorContact contact(*channel, address, timeout);
  std::unique_ptr<v1::Coordinator::Stub> stub =
      v1::Coordinator::NewStub(*channel);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  for (int attempt = 0;; ++attempt) {
    absl::Status connecting = contact.AwaitConnectAttempt(deadline, nullptr);
    if (contact.reached()) return absl::OkStatus();
    if (!connecting.ok())
      return contact.NeverReached(attempt, start, connecting);
    // The channel failed to connect: a call (never sent, unless the channel
    // reconnected meanwhile, and then harmless) carries gRPC's reason.
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(
        std::max(deadline, absl::Now() + absl::Milliseconds(100))));
    v1::ListAgentsResponse response;
    const absl::Status s = FromGrpcStatus(
        stub->ListAgents(&ctx, v1::ListAgentsRequest(), &response));
    contact.Observe();
    if (s.ok() || contact.reached()) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) return contact.NeverReached(attempt + 1, start, s);
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

}  // namespace cairn::protocol
