// RetryPolicy: full-jitter exponential backoff and the retryable outcomes.
#include "storage/s3/retry_policy.h"

#include <curl/curl.h>

#include <algorithm>

#include "absl/random/distributions.h"

namespace cairn::storage::s3 {

absl::Duration RetryPolicy::MaxBackoff(int retry) const {
  absl::Duration d = base;
  for (int i = 0; i < retry && d < cap; ++i) d *= 2;
  return std::min(d, cap);
}

absl::Duration RetryPolicy::Backoff(int retry, absl::BitGenRef gen) const {
  const int64_t max_us = absl::ToInt64Microseconds(MaxBackoff(retry));
  return absl::Microseconds(
      absl::Uniform<int64_t>(absl::IntervalClosed, gen, 0, max_us));
}

bool RequestSurelyNotSent(const AttemptOutcome& o) {
  switch (o.curl_code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
      return true;
    default:
      return false;
  }
}

bool IsRetryable(const AttemptOutcome& o) {
  if (o.curl_code != CURLE_OK) {
    switch (o.curl_code) {
      case CURLE_COULDNT_RESOLVE_HOST:
      case CURLE_COULDNT_RESOLVE_PROXY:
      case CURLE_COULDNT_CONNECT:
      case CURLE_OPERATION_TIMEDOUT:
      case CURLE_SEND_ERROR:
      case CURLE_RECV_ERROR:
      case CURLE_GOT_NOTHING:
      case CURLE_PARTIAL_FILE:
      case CURLE_SSL_CONNECT_ERROR:
      case CURLE_HTTP2:
      case CURLE_HTTP2_STREAM:
        return true;
      default:
        return false;  // bad URL, CA file, our write callback refusing, ...
    }
  }
  static constexpr absl::string_view kRetryableCodes[] = {
      "SlowDown",           "RequestTimeout",       "InternalError",
      "ServiceUnavailable", "Throttling",           "ThrottlingException",
      "RequestThrottled",   "RequestTimeTooSkewed", "TooManyRequests"};
  for (absl::string_view c : kRetryableCodes) {
    if (o.s3_code == c) return true;
  }
  if (o.http_status == 501) return false;  // NotImplemented
  return o.http_status >= 500 || o.http_status == 429 || o.http_status == 408;
}

}  // namespace cairn::storage::s3
