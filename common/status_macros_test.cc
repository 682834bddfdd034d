#include "common/status_macros.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn {
namespace {

int g_calls = 0;

absl::Status CountedStatus(absl::Status s) {
  ++g_calls;
  return s;
}

absl::Status ReturnIfErrorWrapper(absl::Status s, bool* reached_end) {
  CAIRN_RETURN_IF_ERROR(CountedStatus(s));
  *reached_end = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<int>> MakeInt(absl::StatusOr<int> v) {
  if (!v.ok()) return v.status();
  return std::make_unique<int>(*v);
}

absl::StatusOr<int> Doubled(absl::StatusOr<int> v) {
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<int> p, MakeInt(v));  // move-only
  int twice;
  CAIRN_ASSIGN_OR_RETURN(twice, absl::StatusOr<int>(*p * 2));  // existing var
  return twice;
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesErrorAndEvaluatesOnce) {
  g_calls = 0;
  bool reached = false;
  absl::Status s =
      ReturnIfErrorWrapper(absl::NotFoundError("job 'x' step 3"), &reached);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "job 'x' step 3");
  EXPECT_FALSE(reached);
  EXPECT_EQ(g_calls, 1);
}

TEST(StatusMacrosTest, ReturnIfErrorContinuesOnOk) {
  bool reached = false;
  EXPECT_TRUE(ReturnIfErrorWrapper(absl::OkStatus(), &reached).ok());
  EXPECT_TRUE(reached);
}

TEST(StatusMacrosTest, AssignOrReturnMovesValueOrReturnsError) {
  absl::StatusOr<int> ok = Doubled(21);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 42);
  absl::StatusOr<int> bad = Doubled(absl::DataLossError("crc mismatch"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("crc"));
}

TEST(AnnotateTest, PrefixesTheMessageAndKeepsCodeAndPayloads) {
  absl::Status s = absl::NotFoundError("no such key");
  s.SetPayload("type.cairn/why", absl::Cord("gone"));
  const absl::Status annotated =
      Annotate(s, "deleting the manifest of job 'llama' step 7");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(annotated.message(),
            "deleting the manifest of job 'llama' step 7: no such key");
  ASSERT_TRUE(annotated.GetPayload("type.cairn/why").has_value());
  EXPECT_EQ(*annotated.GetPayload("type.cairn/why"), "gone");
}

TEST(AnnotateTest, LeavesOkAlone) {
  EXPECT_EQ(Annotate(absl::OkStatus(), "anything"), absl::OkStatus());
}

}  // namespace
}  // namespace cairn
