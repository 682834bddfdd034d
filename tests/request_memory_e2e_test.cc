// Memory bounded against any client (issue 53): a real cairnd with
// --auth-tokens and --max-request-memory-mib takes waves of concurrent
// oversized requests (each on its own connection, raw gRPC, as a hostile
// client sends them), without a token and with a valid one, while a
// well-behaved two-rank job saves and loads. cairnd's peak resident memory
// (VmHWM) must stay under the documented bound: its level after the job's
// first save plus twice the budget (the budget, and what arrives while gRPC
// cancels calls to get back under it: ~200 MiB measured); without a token, the
// requests must be refused before their bodies are read (peak within 64 MiB of
// that level). The job must succeed throughout, and every oversized request be
// refused: UNAUTHENTICATED without a token, RESOURCE_EXHAUSTED with one.
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tests/testing/e2e_harness.h"
#include "tests/testing/grpc_probe.h"

namespace cairn {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::HasSubstr;

using testing::ProcStatusBytes;

const char kWriter[] = "writer-token-4a1f9c27d08e53b6";
constexpr int64_t kMiB = 1 << 20;
// The budget given to cairnd, and the hostile requests: 8 at a time of
// 300 MiB each (2.4 GB, which an unbounded cairnd buffers whole before
// refusing them as larger than its 128 MiB limit).
constexpr int64_t kBudgetMiB = 512;
constexpr int kConcurrent = 8;
constexpr int64_t kRequestBytes = 300 * kMiB;

// One oversized BeginSave (its bytes are not a valid request: they are
// never meant to be parsed) on a connection of its own: its status.
absl::Status OversizedCall(const std::string& address, const std::string& token,
                           const grpc::Slice& body) {
  return FromGrpcStatus(testing::CallRaw(
      address, "/cairn.v1.Coordinator/BeginSave", body, token));
}

class RequestMemoryE2ETest : public testing::EndToEndTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(EndToEndTest::SetUp());
    const std::string tokens = dir_ + "/tokens";
    std::ofstream(tokens) << kWriter << " writer * writer\n";
    ASSERT_EQ(std::filesystem::exists(tokens), true);
    std::filesystem::permissions(tokens,
                                 std::filesystem::perms::owner_read |
                                     std::filesystem::perms::owner_write);
    ASSERT_NO_FATAL_FAILURE(
        StartCairnd({"--auth-tokens", tokens, "--max-request-memory-mib",
                     std::to_string(kBudgetMiB)}));
    // The job's ranks find the token in their environment.
    setenv("CAIRN_TOKEN", kWriter, 1);
    // The level cairnd runs at: after a save of the job.
    ASSERT_EQ(RunJob("1", ""), 0);
    baseline_ = ProcStatusBytes(cairnd_->process().pid(), "VmHWM");
    ASSERT_GT(baseline_, 0);
  }

  void TearDown() override {
    if (cairnd_ != nullptr) {
      cairnd_->process().Signal(SIGTERM);
      (void)cairnd_->process().Wait();
    }
    EndToEndTest::TearDown();
  }

  // Two ranks of job "good" save `steps` then (when `load` is set) load
  // it; 0 when both succeed.
  int RunJob(const std::string& steps, const std::string& load) {
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < 2; ++r) {
      argvs.push_back(RankArgv("good", r, 2, "2:S0", {"--save-steps", steps}));
      if (!load.empty())
        argvs.back().insert(argvs.back().end(), {"--load", load});
    }
    std::vector<int> codes = RunAll(argvs, absl::Minutes(4));
    if (codes.empty()) return -1;
    for (int code : codes) {
      if (code != 0) return code;
    }
    return 0;
  }

  // Waves of kConcurrent oversized requests with `token` until the job
  // (steps 2-6, then a load of the latest) has finished, and at least two
  // waves. The job's result; the outcomes in `*outcomes`.
  int AttackWhileJobRuns(const std::string& token,
                         std::vector<absl::Status>* outcomes) {
    std::string bytes(kRequestBytes, 'x');
    const grpc::Slice body(bytes.data(), bytes.size());
    bytes = std::string();
    std::atomic<bool> job_done{false};
    int job_result = -1;
    std::thread job([&] {
      job_result = RunJob("2,3,4,5,6", "latest");
      job_done = true;
    });
    absl::Mutex mu;
    for (int wave = 0; wave < 2 || !job_done; ++wave) {
      std::vector<std::thread> callers;
      for (int i = 0; i < kConcurrent; ++i) {
        callers.emplace_back([&] {
          absl::Status o = OversizedCall(cairnd_->address(), token, body);
          absl::MutexLock l(&mu);
          outcomes->push_back(std::move(o));
        });
      }
      for (std::thread& t : callers) t.join();
      if (wave >= 20) break;  // the job is stuck: its result says so
    }
    job.join();
    return job_result;
  }

  static std::string Summary(const std::vector<absl::Status>& outcomes) {
    std::map<std::string, int> counts;
    for (const absl::Status& o : outcomes) {
      ++counts[o.ToString()];
    }
    std::string s;
    for (const auto& [what, n] : counts)
      absl::StrAppend(&s, n, " x ", what, "\n");
    return s;
  }

  int64_t baseline_ = 0;
};

TEST_F(RequestMemoryE2ETest, WithoutTokenRefusedBeforeTheBodyIsRead) {
  std::vector<absl::Status> outcomes;
  EXPECT_EQ(AttackWhileJobRuns("", &outcomes), 0)
      << "the well-behaved job failed during the attack; its logs are in "
      << dir_;
  const int64_t peak = ProcStatusBytes(cairnd_->process().pid(), "VmHWM");
  std::cerr << outcomes.size() << " requests of " << kRequestBytes / kMiB
            << " MiB without a token: cairnd's peak resident memory "
            << peak / kMiB << " MiB (" << baseline_ / kMiB
            << " MiB after the first save; budget " << kBudgetMiB << " MiB)\n"
            << Summary(outcomes);
  EXPECT_GE(outcomes.size(), 2u * kConcurrent);
  for (const absl::Status& o : outcomes) {
    EXPECT_THAT(o, StatusIs(absl::StatusCode::kUnauthenticated,
                            HasSubstr("no credentials")));
  }
  EXPECT_LE(peak, baseline_ + 64 * kMiB)
      << "unauthenticated bodies were buffered";
  // Refused on their metadata, and still audited.
  EXPECT_THAT(cairnd_->process().Log(),
              HasSubstr("audit: auth failure reason=no_credentials"));
}

TEST_F(RequestMemoryE2ETest, WithTokenBoundedByTheBudget) {
  std::vector<absl::Status> outcomes;
  EXPECT_EQ(AttackWhileJobRuns(kWriter, &outcomes), 0)
      << "the well-behaved job failed during the attack; its logs are in "
      << dir_;
  const int64_t peak = ProcStatusBytes(cairnd_->process().pid(), "VmHWM");
  const int64_t bound = baseline_ + 2 * kBudgetMiB * kMiB;
  std::cerr << outcomes.size() << " requests of " << kRequestBytes / kMiB
            << " MiB with a token: cairnd's peak resident memory "
            << peak / kMiB << " MiB, bound " << bound / kMiB << " MiB ("
            << baseline_ / kMiB << " MiB after the first save + 2 x "
            << kBudgetMiB << " MiB)\n"
            << Summary(outcomes);
  EXPECT_GE(outcomes.size(), 2u * kConcurrent);
  for (const absl::Status& o : outcomes) {
    // Cancelled at the budget, or read whole and refused as too large.
    EXPECT_THAT(o, StatusIs(absl::StatusCode::kResourceExhausted,
                            AnyOf(HasSubstr("larger than max"),
                                  HasSubstr("RST_STREAM with error code 11"))));
  }
  EXPECT_LE(peak, bound);
}

}  // namespace
}  // namespace cairn
