// Calls to cairnd (the Coordinator service) as every rank-side caller makes
// them: one channel setup and one retry policy (cancellable), shared by
// libcairn's Checkpointer and by cairn-agent (which saves on behalf of
// ranks).
#ifndef CAIRN_CLIENT_PROTOCOL_COORDINATOR_CALL_H_
#define CAIRN_CLIENT_PROTOCOL_COORDINATOR_CALL_H_

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "common/grpc_status.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "protocol/cancellation.h"
#include "protocol/client_security.h"

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

// How long a rank waits for a cairnd it has never reached before it gives up
// (CheckpointerOptions::first_contact_timeout, cairn-agent
// --coordinator-first-contact-s).
inline constexpr absl::Duration kDefaultFirstContactTimeout = absl::Seconds(5);

// Whether cairnd has ever answered on one channel, and how long a call may
// try to reach it before it has. A cairnd that answered before and is gone
// is restarting (SIGTERM drains, a rollout): calls retry it for their whole
// retry budget (CallWithRetry's max_retries). One that never answered is,
// far more often, a wrong address, a cairnd that is not running, or a TLS
// setup it refuses: a call then fails after `first_contact_timeout` with
// UNAVAILABLE naming the address and gRPC's reason ("Connection refused",
// "DNS resolution failed", "Handshake failed", or no answer at all),
// instead of retrying for a minute.
//
// "Answered" means the channel connected (TCP, TLS and HTTP/2 handshakes
// done) at least once; the flag never goes back.
//
// Thread-safe.
class CoordinatorContact {
 public:
  // `channel` is the one the calls use; `address` names cairnd in errors.
  CoordinatorContact(
      std::shared_ptr<grpc::Channel> channel, std::string address,
      absl::Duration first_contact_timeout = kDefaultFirstContactTimeout);
  CoordinatorContact(const CoordinatorContact&) = delete;
  CoordinatorContact& operator=(const CoordinatorContact&) = delete;

  const std::string& address() const { return address_; }
  absl::Duration first_contact_timeout() const {
    return first_contact_timeout_;
  }

  // Whether cairnd has answered on the channel (now or before).
  bool reached() const { return reached_.load(std::memory_order_acquire); }

  // Records an answer if the channel is connected now.
  void Observe();

  // Before an attempt while !reached(): waits until the channel has
  // connected (reached() is then true) or has failed to connect (the
  // attempt then fails at once with gRPC's reason), until `deadline`. OK
  // in both cases; UNAVAILABLE naming the address when it is still
  // connecting at `deadline` (nothing answered the connection attempt: a
  // host that is down, packets dropped, or something other than cairnd
  // listening). With a `cancellation`, returns its status once cancelled.
  absl::Status AwaitConnectAttempt(absl::Time deadline,
                                   Cancellation* cancellation);

  // UNAVAILABLE "cairnd at <address> was never reached ...": the error of a
  // call that gave up on first contact after `attempts` attempts since
  // `start`; `last` is the last attempt's error.
  absl::Status NeverReached(int attempts, absl::Time start,
                            const absl::Status& last) const;

  // Connects to `address` within `timeout` and returns OK once cairnd (or
  // any gRPC server) has answered, else NeverReached's error: a daemon's
  // check at start that its --coordinator is right.
  static absl::Status Probe(const std::string& address,
                            const ClientSecurity& security,
                            absl::Duration timeout);

 private:
  const std::shared_ptr<grpc::Channel> channel_;
  const std::string address_;
  const absl::Duration first_contact_timeout_;
  std::atomic<bool> reached_{false};
};

// One unary call with retries on UNAVAILABLE (cairnd restarting or
// unreachable) and CANCELLED (not by `cancellation`: cairnd went away under
// the call, e.g. a retry that reached it while it drained), exponential
// backoff from 100 ms to 5 s. `timeout` bounds each attempt. With
// max_retries == 0 the first answer is returned as is; after max_retries
// retries, UNAVAILABLE naming the attempts and the last error.
// With a `cancellation` (not owned), its Cancel() cancels the attempt in
// flight or the backoff: the call then fails with cancellation->status(),
// never retried (an answer that arrived first is still returned).
// With a `contact` (not owned, for the stub's channel) that has not reached
// cairnd yet, the call gives up after contact->first_contact_timeout()
// (counted from the start of this call) with contact->NeverReached's
// UNAVAILABLE; once cairnd has answered, max_retries alone bounds it.
// Whether `s` is a call cairnd's transport dropped to stay within its
// request memory budget (`--max-request-memory-mib`): gRPC resets such a
// stream with ENHANCE_YOUR_CALM, which reaches the caller as
// RESOURCE_EXHAUSTED "Received RST_STREAM with error code 11". cairnd never
// saw the request, so it is retried like UNAVAILABLE; cairnd's own
// RESOURCE_EXHAUSTED answers (a bound on sessions, plans, space) are not.
inline bool ShedByServer(const absl::Status& s) {
  return absl::IsResourceExhausted(s) &&
         absl::StrContains(s.message(), "RST_STREAM with error code 11");
}

template <typename Req, typename Resp>
absl::StatusOr<Resp> CallWithRetry(
    grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                  const Req&, Resp*),
    v1::Coordinator::Stub& stub, const Req& request, absl::Duration timeout,
    int max_retries, Cancellation* cancellation = nullptr,
    CoordinatorContact* contact = nullptr) {
  // No wait_for_ready: a cairnd that is down fails each attempt at once, so
  // the retries (not a call deadline of hours) bound the wait.
  absl::Duration backoff = absl::Milliseconds(100);
  const absl::Time start = absl::Now();
  const absl::Time first_contact_deadline =
      contact == nullptr ? absl::InfiniteFuture()
                         : start + contact->first_contact_timeout();
  for (int attempt = 0;; ++attempt) {
    if (cancellation != nullptr && cancellation->cancelled()) {
      return cancellation->status();
    }
    if (contact != nullptr && !contact->reached()) {
      // Not sent while the channel is still connecting: an attempt would
      // wait for the connection (up to 20 s for a silent address, see
      // NewCoordinatorChannel) and then for its own deadline.
      absl::Status connecting =
          contact->AwaitConnectAttempt(first_contact_deadline, cancellation);
      if (cancellation != nullptr && cancellation->cancelled()) {
        return cancellation->status();
      }
      if (!connecting.ok()) {
        return contact->NeverReached(attempt, start, connecting);
      }
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    Resp response;
    absl::Status s;
    {
      Cancellation::ScopedCall registered(cancellation, &ctx);
      s = FromGrpcStatus((stub.*method)(&ctx, request, &response));
    }
    if (contact != nullptr) contact->Observe();
    if (s.ok()) return response;
    if (cancellation != nullptr && cancellation->cancelled()) {
      return cancellation->status();
    }
    const bool retryable =
        absl::IsUnavailable(s) || absl::IsCancelled(s) || ShedByServer(s);
    const bool first_contact = contact != nullptr && !contact->reached();
    if (retryable && first_contact &&
        (max_retries == 0 || attempt >= max_retries ||
         absl::Now() >= first_contact_deadline)) {
      return contact->NeverReached(attempt + 1, start, s);
    }
    if (!retryable || max_retries == 0) return s;
    if (attempt >= max_retries) {
      return absl::UnavailableError(absl::StrCat(
          "cairnd",
          contact == nullptr ? "" : absl::StrCat(" at ", contact->address()),
          " did not answer after ", attempt + 1, " attempts over ",
          absl::FormatDuration(
              absl::Trunc(absl::Now() - start, absl::Milliseconds(100))),
          " (is it running and reachable?); last error: ", s.ToString()));
    }
    const absl::Duration wait =
        first_contact
            ? std::max(absl::ZeroDuration(),
                       std::min(backoff, first_contact_deadline - absl::Now()))
            : backoff;
    if (cancellation == nullptr) {
      absl::SleepFor(wait);
    } else if (cancellation->WaitFor(wait)) {
      return cancellation->status();
    }
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

}  // namespace cairn::protocol

#endif  // CAIRN_CLIENT_PROTOCOL_COORDINATOR_CALL_H_
