// Cancellation on its own and in CallWithRetry against an address where no
// cairnd listens (every attempt fails UNAVAILABLE at once): the flag and its
// consumption, a wait woken by Cancel from another thread, a call registered
// after Cancel failing CANCELLED, and retries with backoff cut short. The
// cancelled calls parked at a real cairnd are in save_protocol_test.cc and
// client/checkpointer_test.cc.
#include "protocol/cancellation.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/coordinator_call.h"

namespace cairn::protocol {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CancellationTest, CancelSetsTheFlagUntilResetConsumesIt) {
  Cancellation cancel("cancelled (test)");
  EXPECT_FALSE(cancel.cancelled());
  EXPECT_FALSE(cancel.Reset());
  cancel.Cancel();
  EXPECT_TRUE(cancel.cancelled());
  EXPECT_THAT(cancel.status(), StatusIs(absl::StatusCode::kCancelled,
                                        HasSubstr("cancelled (test)")));
  cancel.Cancel();  // twice is once
  EXPECT_TRUE(cancel.Reset());
  EXPECT_FALSE(cancel.cancelled());
  EXPECT_FALSE(cancel.Reset());
}

TEST(CancellationTest, WaitForEndsWhenAnotherThreadCancels) {
  Cancellation cancel("cancelled (test)");
  EXPECT_FALSE(cancel.WaitFor(absl::Milliseconds(1)));
  absl::Notification waiting;
  bool woke_cancelled = false;
  std::thread waiter([&] {
    waiting.Notify();
    woke_cancelled = cancel.WaitFor(absl::InfiniteDuration());
  });
  waiting.WaitForNotification();
  cancel.Cancel();
  waiter.join();  // an infinite wait: only Cancel ends it
  EXPECT_TRUE(woke_cancelled);
  EXPECT_TRUE(cancel.WaitFor(absl::InfiniteDuration()));  // already set
}

// A loopback port nothing listens on: calls to it fail UNAVAILABLE at once.
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);  // bound, never listened on, closed: connections are refused
  return port;
}

class CallWithRetryCancellationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int port = ClosedPort();
    ASSERT_NE(port, 0);
    stub_ = v1::Coordinator::NewStub(
        NewCoordinatorChannel(absl::StrCat("127.0.0.1:", port)));
    request_.set_job("job");
  }
  absl::StatusOr<v1::ListCheckpointsResponse> List(int max_retries,
                                                   Cancellation* cancel) {
    return CallWithRetry(&v1::Coordinator::Stub::ListCheckpoints, *stub_,
                         request_, absl::Minutes(1), max_retries, cancel);
  }

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  v1::ListCheckpointsRequest request_;
};

TEST_F(CallWithRetryCancellationTest, WithoutCancellationTheCallIsUnchanged) {
  Cancellation cancel("cancelled (test)");
  EXPECT_THAT(List(0, nullptr), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(List(0, &cancel), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(CallWithRetryCancellationTest, AlreadyCancelledFailsWithItsStatus) {
  Cancellation cancel("cancelled (test)");
  cancel.Cancel();
  EXPECT_THAT(
      List(0, &cancel).status(),
      StatusIs(absl::StatusCode::kCancelled, HasSubstr("cancelled (test)")));
  // A context registered after Cancel is cancelled at once: gRPC fails the
  // call CANCELLED (not UNAVAILABLE) as soon as it starts.
  grpc::ClientContext ctx;
  v1::ListCheckpointsResponse response;
  grpc::Status s;
  {
    Cancellation::ScopedCall registered(&cancel, &ctx);
    s = stub_->ListCheckpoints(&ctx, request_, &response);
  }
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
}

// 16 retries with backoff up to 5 s would take about a minute; Cancel ends
// them at once, and the call is not retried after it.
TEST_F(CallWithRetryCancellationTest, CancelEndsTheRetriesFromAnotherThread) {
  Cancellation cancel("cancelled (test)");
  absl::Notification started;
  absl::StatusOr<v1::ListCheckpointsResponse> result =
      absl::UnknownError("not run");
  std::thread caller([&] {
    started.Notify();
    result = List(16, &cancel);
  });
  started.WaitForNotification();
  cancel.Cancel();
  caller.join();
  EXPECT_THAT(result.status(), StatusIs(absl::StatusCode::kCancelled,
                                        HasSubstr("cancelled (test)")));
}

// Calls cairnd's transport reset to stay within its request memory budget
// are retried; cairnd's own RESOURCE_EXHAUSTED answers are final.
TEST(ShedByServerTest, OnlyTheTransportsResetIsRetried) {
  EXPECT_TRUE(ShedByServer(
      FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                  "Received RST_STREAM with error code 11"))));
  EXPECT_FALSE(ShedByServer(absl::ResourceExhaustedError(
      "job j: 8 saves in progress (--max-sessions-per-job 8)")));
  EXPECT_FALSE(ShedByServer(absl::ResourceExhaustedError(
      "Received message larger than max (943718400 vs. 134217728)")));
  EXPECT_FALSE(
      ShedByServer(absl::UnavailableError("RST_STREAM with error code 11")));
}

}  // namespace
}  // namespace cairn::protocol
