// Tests of RetryPolicy: backoff bounds, the full-jitter distribution over
// many draws, and which outcomes are retryable.
#include "storage/s3/retry_policy.h"

#include <curl/curl.h>

#include "absl/random/random.h"
#include "gtest/gtest.h"

namespace cairn::storage::s3 {
namespace {

TEST(RetryPolicyTest, MaxBackoffDoublesUpToCap) {
  RetryPolicy p;  // 50 ms base, 5 s cap
  EXPECT_EQ(p.MaxBackoff(0), absl::Milliseconds(50));
  EXPECT_EQ(p.MaxBackoff(1), absl::Milliseconds(100));
  EXPECT_EQ(p.MaxBackoff(2), absl::Milliseconds(200));
  EXPECT_EQ(p.MaxBackoff(6), absl::Milliseconds(3200));
  EXPECT_EQ(p.MaxBackoff(7), absl::Seconds(5));
  EXPECT_EQ(p.MaxBackoff(1000), absl::Seconds(5));
}

TEST(RetryPolicyTest, FullJitterStaysInRangeAndCoversIt) {
  absl::BitGen gen;
  for (RetryPolicy p : {RetryPolicy{}, RetryPolicy{3, absl::Milliseconds(7),
                                                   absl::Milliseconds(90)}}) {
    for (int retry = 0; retry < 12; ++retry) {
      const absl::Duration max = p.MaxBackoff(retry);
      constexpr int kDraws = 4000;
      int low = 0, high = 0;
      absl::Duration sum;
      for (int i = 0; i < kDraws; ++i) {
        absl::Duration d = p.Backoff(retry, gen);
        ASSERT_GE(d, absl::ZeroDuration());
        ASSERT_LE(d, max);
        if (d < max / 4) ++low;
        if (d > max * 3 / 4) ++high;
        sum += d;
      }
      // Uniform on [0, max]: each quarter holds ~1000 of 4000 draws (the
      // bounds are > 10 standard deviations away), mean ~max/2.
      EXPECT_GT(low, 800) << retry;
      EXPECT_GT(high, 800) << retry;
      EXPECT_NEAR(absl::FDivDuration(sum / kDraws, max), 0.5, 0.05) << retry;
    }
  }
}

TEST(RetryPolicyTest, RetryableOutcomes) {
  auto http = [](long status, std::string code = "") {
    return AttemptOutcome{0, status, std::move(code)};
  };
  auto curl = [](int c) { return AttemptOutcome{c, 0, ""}; };
  for (long s : {500, 502, 503, 504, 429, 408}) {
    EXPECT_TRUE(IsRetryable(http(s))) << s;
  }
  for (long s : {200, 204, 206, 301, 400, 401, 403, 404, 409, 412, 416, 501}) {
    EXPECT_FALSE(IsRetryable(http(s))) << s;
  }
  EXPECT_TRUE(IsRetryable(http(503, "SlowDown")));
  EXPECT_TRUE(IsRetryable(http(400, "RequestTimeout")));
  EXPECT_FALSE(IsRetryable(http(403, "SignatureDoesNotMatch")));
  EXPECT_FALSE(IsRetryable(http(404, "NoSuchKey")));
  for (int c : {CURLE_COULDNT_CONNECT, CURLE_OPERATION_TIMEDOUT,
                CURLE_RECV_ERROR, CURLE_SEND_ERROR, CURLE_GOT_NOTHING,
                CURLE_PARTIAL_FILE, CURLE_COULDNT_RESOLVE_HOST}) {
    EXPECT_TRUE(IsRetryable(curl(c))) << c;
  }
  for (int c : {CURLE_URL_MALFORMAT, CURLE_WRITE_ERROR,
                CURLE_SSL_CACERT_BADFILE, CURLE_ABORTED_BY_CALLBACK}) {
    EXPECT_FALSE(IsRetryable(curl(c))) << c;
  }
  EXPECT_TRUE(RequestSurelyNotSent(curl(CURLE_COULDNT_CONNECT)));
  EXPECT_FALSE(RequestSurelyNotSent(curl(CURLE_RECV_ERROR)));
  EXPECT_FALSE(RequestSurelyNotSent(http(503)));
}

}  // namespace
}  // namespace cairn::storage::s3
