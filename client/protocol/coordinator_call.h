// Calls to cairnd (the Coordinator service) as every rank-side caller makes
// them: one channel setup and one retry policy (cancellable), shared by
// libcairn's Checkpointer and by cairn-agent (which saves on behalf of
// ranks).
#ifndef CAIRN_CLIENT_PROTOCOL_COORDINATOR_CALL_H_
#define CAIRN_CLIENT_PROTOCOL_COORDINATOR_CALL_H_

#include <algorithm>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "client/protocol/cancellation.h"
#include "client/protocol/client_security.h"
#include "common/grpc_status.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"

namespace cairn::protocol {

// The metadata a client's bearer token travels in: "authorization:
// Bearer <token>" (cairnd's authorization reads exactly this).
inline constexpr char kAuthorizationMetadataKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";

// A channel to cairnd at `address` (host:port): message limits that match
// cairnd's (answers up to 1 GiB, requests up to 128 MiB) and a reconnect
// backoff of 100 ms to 5 s, so a restarted cairnd is reached within the
// retry backoff of CallWithRetry. With `security.tls()`, TLS with its CA
// and client certificate (INVALID_ARGUMENT naming a missing or bad file);
// with a token, every call carries it (kAuthorizationMetadataKey).
absl::StatusOr<std::shared_ptr<grpc::Channel>> NewCoordinatorChannel(
    const std::string& address, const ClientSecurity& security);
// A plaintext channel without a token (tests).
std::shared_ptr<grpc::Channel> NewCoordinatorChannel(
    const std::string& address);

// The channel credentials NewCoordinatorChannel uses: insecure without TLS.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
CoordinatorChannelCredentials(const ClientSecurity& security);

// One unary call with retries on UNAVAILABLE (cairnd restarting or
// unreachable) and CANCELLED (not by `cancellation`: cairnd went away under
// the call, e.g. a retry that reached it while it drained), exponential
// backoff from 100 ms to 5 s. `timeout` bounds each attempt. With
// max_retries == 0 the first answer is returned as is; after max_retries
// retries, UNAVAILABLE naming the attempts and the last error.
// With a `cancellation` (not owned), its Cancel() cancels the attempt in
// flight or the backoff: the call then fails with cancellation->status(),
// never retried (an answer that arrived first is still returned).
template <typename Req, typename Resp>
absl::StatusOr<Resp> CallWithRetry(
    grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                  const Req&, Resp*),
    v1::Coordinator::Stub& stub, const Req& request, absl::Duration timeout,
    int max_retries, Cancellation* cancellation = nullptr) {
  // No wait_for_ready: a cairnd that is down fails each attempt at once, so
  // the retries (not a call deadline of hours) bound the wait.
  absl::Duration backoff = absl::Milliseconds(100);
  const absl::Time start = absl::Now();
  for (int attempt = 0;; ++attempt) {
    if (cancellation != nullptr && cancellation->cancelled()) {
      return cancellation->status();
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    Resp response;
    absl::Status s;
    {
      Cancellation::ScopedCall registered(cancellation, &ctx);
      s = FromGrpcStatus((stub.*method)(&ctx, request, &response));
    }
    if (s.ok()) return response;
    if (cancellation != nullptr && cancellation->cancelled()) {
      return cancellation->status();
    }
    const bool retryable = absl::IsUnavailable(s) || absl::IsCancelled(s);
    if (!retryable || max_retries == 0) return s;
    if (attempt >= max_retries) {
      return absl::UnavailableError(absl::StrCat(
          "cairnd did not answer after ", attempt + 1, " attempts over ",
          absl::FormatDuration(
              absl::Trunc(absl::Now() - start, absl::Milliseconds(100))),
          " (is it running and reachable?); last error: ", s.ToString()));
    }
    if (cancellation == nullptr) {
      absl::SleepFor(backoff);
    } else if (cancellation->WaitFor(backoff)) {
      return cancellation->status();
    }
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

}  // namespace cairn::protocol

#endif  // CAIRN_CLIENT_PROTOCOL_COORDINATOR_CALL_H_
