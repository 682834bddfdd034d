// RetryPolicy: when an S3 request is retried and how long to wait first.
//
// Backoff is exponential with "full jitter" (AWS Architecture Blog,
// "Exponential Backoff And Jitter"): before retry n (0-based) the client
// sleeps a uniformly random duration in [0, min(cap, base * 2^n)], which
// spreads the retries of many clients hitting one throttled server.
//
// Which outcomes are retryable (IsRetryable): transport failures (connection
// refused/reset, timeouts, DNS, TLS handshake, a truncated response), HTTP
// 5xx except 501, HTTP 429 and 408, and S3 error codes that mean "try again"
// (SlowDown, RequestTimeout, InternalError, ServiceUnavailable, Throttling,
// ...). A request that is not idempotent is retried only when it certainly
// never reached the server (connect/DNS failures: RequestSurelyNotSent).
#ifndef CAIRN_STORAGE_S3_RETRY_POLICY_H_
#define CAIRN_STORAGE_S3_RETRY_POLICY_H_

#include <string>

#include "absl/random/bit_gen_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace cairn::storage::s3 {

// What one attempt of a request came back with.
struct AttemptOutcome {
  int curl_code = 0;     // CURLcode; 0 = a response arrived
  long http_status = 0;  // valid when curl_code == 0
  std::string s3_code;   // the <Code> of S3's error body, if any
};

struct RetryPolicy {
  // Attempts in total (first try included). Default: 6.
  int max_attempts = 6;
  // Default: 50 ms.
  absl::Duration base = absl::Milliseconds(50);
  // Default: 5 s.
  absl::Duration cap = absl::Seconds(5);

  // The upper bound of the sleep before retry `retry` (0-based):
  // min(cap, base * 2^retry).
  absl::Duration MaxBackoff(int retry) const;
  // A uniformly random sleep in [0, MaxBackoff(retry)].
  absl::Duration Backoff(int retry, absl::BitGenRef gen) const;
};

// True when a failed attempt with this outcome may succeed if repeated.
bool IsRetryable(const AttemptOutcome& outcome);

// True when the attempt failed before any byte of the request could have
// reached the server (so even a non-idempotent request may be resent).
bool RequestSurelyNotSent(const AttemptOutcome& outcome);

}  // namespace cairn::storage::s3

#endif  // CAIRN_STORAGE_S3_RETRY_POLICY_H_
