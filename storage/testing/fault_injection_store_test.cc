#include "storage/testing/fault_injection_store.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/testing/shard_store_conformance.h"

namespace cairn::storage {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

absl::Span<const char> AsSpan(const std::string& s) {
  return absl::Span<const char>(s.data(), s.size());
}

// With no faults programmed the wrapper is a conforming store.
INSTANTIATE_TEST_SUITE_P(
    FaultInjectionPassThrough, ShardStoreConformanceTest,
    ::testing::Values(ShardStoreConformanceParam{
        "fault_injection_over_memory",
        []() -> absl::StatusOr<std::unique_ptr<ShardStore>> {
          auto base = OpenShardStore("mem://");
          if (!base.ok()) return base.status();
          return std::unique_ptr<ShardStore>(
              new FaultInjectionStore(std::move(base).value()));
        },
        true}),
    ShardStoreConformanceParamName);

class FaultInjectionStoreTest : public ::testing::Test {
 protected:
  FaultInjectionStoreTest()
      : base_(OpenShardStore("mem://").value()), store_(base_.get()) {}
  std::unique_ptr<ShardStore> base_;
  FaultInjectionStore store_;
};

TEST_F(FaultInjectionStoreTest, FailNthWriteCountsAppendCloseAndPut) {
  store_.FailNthWrite(3, absl::UnavailableError("boom"));
  auto w = store_.NewWriter("a");
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE((*w)->Append(AsSpan("12")).ok());  // 1
  EXPECT_TRUE((*w)->Append(AsSpan("34")).ok());  // 2
  const absl::Status s = (*w)->Close();          // 3
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                          HasSubstr("boom (Close of 'a')")));
  EXPECT_THAT(base_->Size("a"), StatusIs(absl::StatusCode::kNotFound));
  // Only once.
  EXPECT_TRUE(store_.Put("b", AsSpan("x")).ok());
  EXPECT_EQ(store_.write_count(), 4);
}

TEST_F(FaultInjectionStoreTest, RulesMatchOpKeySkipAndCount) {
  FaultRule rule;
  rule.ops = kFaultPut;
  rule.key_contains = "data";
  rule.skip = 1;
  rule.count = 2;
  rule.status = absl::PermissionDeniedError("nope");
  const int id = store_.AddRule(rule);
  EXPECT_TRUE(store_.Put("x/data-0", AsSpan("a")).ok());  // skipped
  EXPECT_TRUE(store_.Put("x/meta", AsSpan("a")).ok());    // no match
  EXPECT_THAT(store_.Put("x/data-1", AsSpan("a")),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(store_.Put("x/data-2", AsSpan("a")),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_TRUE(store_.Put("x/data-3", AsSpan("a")).ok());  // count used up
  EXPECT_EQ(store_.fired(id), 2);
  EXPECT_EQ(base_->List("").value().size(), 3u);
  // count = -1: forever.
  FaultRule forever;
  forever.ops = kFaultSize;
  forever.count = -1;
  store_.AddRule(forever);
  for (int i = 0; i < 5; ++i) {
    EXPECT_THAT(store_.Size("x/meta"),
                StatusIs(absl::StatusCode::kUnavailable));
  }
}

TEST_F(FaultInjectionStoreTest, SpaceLimitIsResourceExhaustedAndInvisible) {
  store_.SetSpaceLimit(10);
  auto w = store_.NewWriter("obj");
  EXPECT_TRUE((*w)->Append(AsSpan("123456")).ok());
  const absl::Status s = (*w)->Append(AsSpan("789012"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted,
                          HasSubstr("No space left on device")));
  EXPECT_THAT((*w)->Close(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(base_->List("").value(), IsEmpty());
  EXPECT_THAT(store_.Put("p", AsSpan("12345678901")),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST_F(FaultInjectionStoreTest, CrashStopsEverythingAfterIt) {
  ASSERT_TRUE(store_.Put("before", AsSpan("x")).ok());  // mutation 1
  store_.CrashAtMutation(1);  // the next mutating call
  EXPECT_FALSE(store_.crashed());
  const absl::Status s = store_.Put("during", AsSpan("y"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                          HasSubstr("simulated crash during Put")));
  EXPECT_TRUE(store_.crashed());
  EXPECT_THAT(store_.Size("before"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(store_.List(""), StatusIs(absl::StatusCode::kUnavailable));
  // The base store (the "disk") holds what happened before the crash only.
  EXPECT_EQ(base_->List("").value(), std::vector<std::string>{"before"});
  store_.Reset();
  EXPECT_TRUE(store_.Size("before").ok());
}

TEST_F(FaultInjectionStoreTest, CorruptReadFlipsOneBit) {
  const std::string data(100, 'a');
  ASSERT_TRUE(store_.Put("obj", AsSpan(data)).ok());
  FaultRule rule;
  rule.ops = kFaultRead;
  rule.action = FaultAction::kCorruptRead;
  store_.AddRule(rule);
  std::string out(100, '\0');
  ASSERT_TRUE(
      store_.Read("obj", ByteRange{0, 100}, absl::Span<char>(out.data(), 100))
          .ok());
  int diff = 0;
  for (size_t i = 0; i < out.size(); ++i) diff += out[i] != data[i];
  EXPECT_EQ(diff, 1);
  EXPECT_EQ(out[50], 'a' ^ 1);
  // Only once (count = 1).
  ASSERT_TRUE(
      store_.Read("obj", ByteRange{0, 100}, absl::Span<char>(out.data(), 100))
          .ok());
  EXPECT_EQ(out, data);
}

TEST_F(FaultInjectionStoreTest, ThreadSafeCounting) {
  store_.FailNthWrite(500);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 250; ++i) {
        if (!store_
                 .Put("k" + std::to_string(t) + "-" + std::to_string(i),
                      AsSpan("v"))
                 .ok()) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 1);
  EXPECT_EQ(store_.write_count(), 1000);
  EXPECT_EQ(base_->List("").value().size(), 999u);
  EXPECT_EQ(store_.bytes_written(), 999u);
}

}  // namespace
}  // namespace cairn::storage
