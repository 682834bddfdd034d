// gMock matchers for absl::Status and absl::StatusOr<T>: a test asserts the
// specific error, its code and what its message says, in one expectation.
//
// Example:
//   using ::cairn::testing::StatusIs;
//   using ::testing::HasSubstr;
//   EXPECT_THAT(store->Delete("x"),
//               StatusIs(absl::StatusCode::kNotFound, HasSubstr("'x'")));
//   EXPECT_THAT(store->Read("x", range, out),
//               StatusIs(absl::StatusCode::kOutOfRange));
//   ASSERT_THAT(store->Put("x", data), IsOk());
//
// A grpc::Status is matched through cairn::FromGrpcStatus
// (common/grpc_status.h).
#ifndef CAIRN_COMMON_TESTING_STATUS_MATCHERS_H_
#define CAIRN_COMMON_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace cairn::testing {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

class StatusIsMatcher {
 public:
  StatusIsMatcher(::testing::Matcher<absl::StatusCode> code,
                  ::testing::Matcher<const std::string&> message)
      : code_(std::move(code)), message_(std::move(message)) {}

  template <typename T>
  bool MatchAndExplain(const T& value,
                       ::testing::MatchResultListener* listener) const {
    const absl::Status& s = GetStatus(value);
    *listener << "whose status is " << s;
    return code_.Matches(s.code()) &&
           message_.Matches(std::string(s.message()));
  }
  void DescribeTo(std::ostream* os) const {
    *os << "has a status code that ";
    code_.DescribeTo(os);
    *os << ", and has an error message that ";
    message_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "has a status code that ";
    code_.DescribeNegationTo(os);
    *os << ", or has an error message that ";
    message_.DescribeNegationTo(os);
  }

 private:
  const ::testing::Matcher<absl::StatusCode> code_;
  const ::testing::Matcher<const std::string&> message_;
};

}  // namespace internal

// Matches a Status, or the status of a StatusOr, whose code matches `code`
// (a StatusCode or a matcher of one) and whose message matches `message`
// (a matcher such as HasSubstr("..."), or a string it must equal).
template <typename CodeMatcher, typename MessageMatcher>
::testing::PolymorphicMatcher<internal::StatusIsMatcher> StatusIs(
    CodeMatcher code, MessageMatcher message) {
  return ::testing::MakePolymorphicMatcher(internal::StatusIsMatcher(
      ::testing::MatcherCast<absl::StatusCode>(code),
      ::testing::MatcherCast<const std::string&>(message)));
}

// The same, any message.
template <typename CodeMatcher>
::testing::PolymorphicMatcher<internal::StatusIsMatcher> StatusIs(
    CodeMatcher code) {
  return StatusIs(code, ::testing::_);
}

// Matches an OK Status, or a StatusOr holding a value.
inline ::testing::PolymorphicMatcher<internal::StatusIsMatcher> IsOk() {
  return StatusIs(absl::StatusCode::kOk);
}

}  // namespace cairn::testing

#endif  // CAIRN_COMMON_TESTING_STATUS_MATCHERS_H_
