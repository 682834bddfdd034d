#include "common/grpc_status.h"

#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace cairn {
namespace {

using ::cairn::testing::StatusIs;

TEST(GrpcStatusTest, EveryCanonicalCodeRoundTrips) {
  for (int c = 0; c <= static_cast<int>(absl::StatusCode::kUnauthenticated);
       ++c) {
    auto code = static_cast<absl::StatusCode>(c);
    absl::Status in(code, c == 0 ? "" : "rank 3 of job 'j' step 7");
    grpc::Status g = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    absl::Status out = FromGrpcStatus(g);
    EXPECT_EQ(out, in) << "code " << c;
  }
}

TEST(GrpcStatusTest, MessageIsPreserved) {
  grpc::Status g = ToGrpcStatus(
      absl::DeadlineExceededError("rank 5 never arrived for job 'j' step 9"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(g.error_message(), "rank 5 never arrived for job 'j' step 9");
}

TEST(GrpcStatusTest, OutOfRangeCodeFromPeerBecomesUnknown) {
  grpc::Status g(static_cast<grpc::StatusCode>(99), "weird");
  absl::Status s = FromGrpcStatus(g);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnknown, "weird"));
}

}  // namespace
}  // namespace cairn
