#include "common/testing/status_matchers.h"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(StatusIsTest, MatchesCodeAndMessageOfAStatus) {
  const absl::Status s = absl::NotFoundError("no object 'x'");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, HasSubstr("'x'")));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, "no object 'x'"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'x'"))));
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kNotFound, HasSubstr("'y'"))));
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kNotFound, "no object")));
  EXPECT_THAT(s, Not(IsOk()));
  EXPECT_THAT(absl::OkStatus(), IsOk());
}

TEST(StatusIsTest, MatchesTheStatusOfAStatusOr) {
  const absl::StatusOr<int> error = absl::OutOfRangeError("range [4, 8)");
  EXPECT_THAT(error,
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("[4, 8)")));
  EXPECT_THAT(error, Not(IsOk()));
  EXPECT_THAT(absl::StatusOr<int>(3), IsOk());
  EXPECT_THAT(absl::StatusOr<int>(3),
              Not(StatusIs(absl::StatusCode::kOutOfRange)));
}

TEST(StatusIsTest, DescribesWhatItWantsAndWhatItGot) {
  const ::testing::Matcher<absl::Status> m =
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("'x'"));
  EXPECT_EQ(::testing::DescribeMatcher<absl::Status>(m),
            "has a status code that is equal to NOT_FOUND, and has an error "
            "message that has substring \"'x'\"");
  ::testing::StringMatchResultListener listener;
  EXPECT_FALSE(m.MatchAndExplain(absl::DataLossError("bad"), &listener));
  EXPECT_EQ(listener.str(), "whose status is DATA_LOSS: bad");
}

}  // namespace
}  // namespace cairn::testing
