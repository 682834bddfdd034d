// One cairnd per storage (storage/lease.h), through the real binaries as
// processes, two cairnd with their own catalogs on one storage:
//   * the second refuses to start (exit 1, at once) naming the first: its
//     pid, host, address, catalog and when its lease expires;
//   * killed (kill -9), the first frees the storage at once for a cairnd on
//     its host; stopped cleanly, it releases it;
//   * a cairnd that stops renewing (SIGSTOP: hung, or cut off from the
//     storage) is taken over once its lease expires by a cairnd started with
//     --storage-lease-wait; woken up, it finds its lease lost and exits 1
//     without touching the storage;
//   * an offline `cairn -s ... rm/gc` is refused while a cairnd holds the
//     storage, naming it and the command to use instead; --force deletes.
// Storage is file:// (the first cairnd's default), or a fresh S3 bucket with
// CAIRN_TEST_STORAGE=s3 (tests/testing/test_storage.h): s3.lease_e2e_test.
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_layout.h"
#include "storage/lease.h"
#include "storage/testing/test_checkpoint.h"
#include "tests/testing/e2e_harness.h"

namespace cairn {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::Binaries;

class LeaseE2ETest : public testing::EndToEndTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(EndToEndTest::SetUp());
    ASSERT_NO_FATAL_FAILURE(CreateStorage("a"));
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    EndToEndTest::TearDown();
  }

  // Flags of a cairnd on the shared storage, data directory `name`.
  std::vector<std::string> Flags(std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--storage", storage_->uri()};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }
  absl::StatusOr<std::unique_ptr<testing::CairndProcess>> Start(
      const std::string& name, std::vector<std::string> extra = {}) {
    return testing::CairndProcess::Start(Binaries().cairnd, dir_ + "/" + name,
                                         Flags(std::move(extra)));
  }

  // A second cairnd started by hand (as an operator would), exit code and
  // output.
  int RunSecondCairnd(std::string* out, std::vector<std::string> extra = {}) {
    std::filesystem::create_directories(dir_ + "/b");
    std::vector<std::string> argv = {Binaries().cairnd, "--listen",
                                     "127.0.0.1:0", "--data-dir", dir_ + "/b"};
    for (const std::string& f : Flags(std::move(extra))) argv.push_back(f);
    return Run(argv, out, absl::Seconds(60));
  }

  std::unique_ptr<testing::CairndProcess> a_, b_;
};

TEST_F(LeaseE2ETest, SecondCairndOnAStorageInUseRefusesNamingTheFirst) {
  auto a = Start("a");
  ASSERT_TRUE(a.ok()) << a.status();
  a_ = std::move(*a);
  std::string out;
  EXPECT_EQ(RunSecondCairnd(&out), 1) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("storage ", storage_->uri(),
                                          " is held by cairnd (pid ",
                                          a_->process().pid(), " on host ")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("serving ", a_->address(),
                                          ", catalog ", dir_, "/a/catalog")));
  EXPECT_THAT(out, HasSubstr("expires "));
  // The first one still serves.
  std::string ls;
  EXPECT_EQ(Run({Binaries().cli, "-c", a_->address(), "ls"}, &ls), 0) << ls;
  EXPECT_THAT(a_->process().Wait(absl::Milliseconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(LeaseE2ETest, KilledCairndFreesTheStorageAtOnceOnItsHost) {
  auto a = Start("a");
  ASSERT_TRUE(a.ok()) << a.status();
  a_ = std::move(*a);
  a_->process().Signal(SIGKILL);
  ASSERT_TRUE(a_->process().Wait(absl::Seconds(30)).ok());
  // No --storage-lease-wait: the dead holder's pid is gone on this host.
  auto b = Start("b");
  ASSERT_TRUE(b.ok()) << b.status();
  b_ = std::move(*b);
  EXPECT_THAT(b_->process().Log(), HasSubstr("lease taken over"));
  EXPECT_THAT(b_->process().Log(), HasSubstr("its holder's process is gone"));
}

TEST_F(LeaseE2ETest, CleanShutdownReleasesTheStorage) {
  auto a = Start("a");
  ASSERT_TRUE(a.ok()) << a.status();
  a_ = std::move(*a);
  a_->process().Signal(SIGTERM);
  absl::StatusOr<int> code = a_->process().Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << a_->process().Log();
  EXPECT_THAT(a_->process().Log(), HasSubstr("lease released"));
  auto b = Start("b");
  ASSERT_TRUE(b.ok()) << b.status();
  b_ = std::move(*b);
  EXPECT_THAT(b_->process().Log(), HasSubstr("released"));
  EXPECT_THAT(b_->process().Log(), Not(HasSubstr("taken over")));
}

TEST_F(LeaseE2ETest, HungCairndIsTakenOverAfterItsLeaseExpiresAndThenExits) {
  auto a = Start("a", {"--storage-lease-ttl", "3"});
  ASSERT_TRUE(a.ok()) << a.status();
  a_ = std::move(*a);
  // Hung (or cut off from the storage): alive, but renewing nothing.
  a_->process().Signal(SIGSTOP);
  auto b = Start("b", {"--storage-lease-wait", "60"});
  ASSERT_TRUE(b.ok()) << b.status();
  b_ = std::move(*b);
  EXPECT_THAT(b_->process().Log(), HasSubstr("waiting up to"));
  EXPECT_THAT(b_->process().Log(), HasSubstr("lease taken over"));
  EXPECT_THAT(b_->process().Log(), HasSubstr("because it expired"));
  // Woken up, the first finds its lease expired and stops, exit 1.
  a_->process().Signal(SIGCONT);
  absl::StatusOr<int> code = a_->process().Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 1) << a_->process().Log();
  EXPECT_THAT(a_->process().Log(), HasSubstr("lease on storage"));
  // The new holder serves, and still holds the storage.
  std::string ls;
  EXPECT_EQ(Run({Binaries().cli, "-c", b_->address(), "ls"}, &ls), 0) << ls;
  absl::StatusOr<storage::ShardStore*> store = storage_->Store();
  ASSERT_TRUE(store.ok()) << store.status();
  auto lease = storage::ReadLease(**store);
  ASSERT_TRUE(lease.ok() && lease->has_value()) << lease.status();
  EXPECT_EQ((*lease)->pid, b_->process().pid());
  EXPECT_FALSE((*lease)->released);
}

TEST_F(LeaseE2ETest, OfflineRmAndGcAreRefusedWhileCairndHoldsTheStorage) {
  absl::StatusOr<storage::ShardStore*> store = storage_->Store();
  ASSERT_TRUE(store.ok()) << store.status();
  for (int64_t step : {1, 2, 3}) {
    storage::TestCheckpointSpec spec;
    spec.job = "job";
    spec.step = step;
    ASSERT_TRUE(storage::WriteTestCheckpoint(**store, spec).ok());
  }
  auto a = Start("a");
  ASSERT_TRUE(a.ok()) << a.status();
  a_ = std::move(*a);
  std::string out;
  EXPECT_EQ(Run({Binaries().cli, "-s", storage_->uri(), "rm", "job", "1", "-y"},
                &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr("refusing to delete job 'job' step 1 offline"));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("in use by cairnd (pid ",
                                          a_->process().pid())));
  EXPECT_THAT(out,
              HasSubstr(absl::StrCat("cairn -c ", a_->address(), " rm job 1")));
  EXPECT_THAT(out, HasSubstr("--force"));
  EXPECT_EQ(
      Run({Binaries().cli, "-s", storage_->uri(), "gc", "job", "--keep", "1"},
          &out),
      1)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("cairn -c ", a_->address(),
                                          " gc job --keep 1")));
  EXPECT_THAT(storage::ListCommittedSteps(**store, "job").value(),
              ::testing::ElementsAre(1, 2, 3));
  // Reading offline, and a dry run, are fine.
  EXPECT_EQ(Run({Binaries().cli, "-s", storage_->uri(), "ls"}, &out), 0) << out;
  EXPECT_EQ(Run({Binaries().cli, "-s", storage_->uri(), "gc", "job", "--keep",
                 "1", "-n"},
                &out),
            0)
      << out;
  // Through cairnd, it is deleted and cairnd knows.
  EXPECT_EQ(
      Run({Binaries().cli, "-c", a_->address(), "rm", "job", "1", "-y"}, &out),
      0)
      << out;
  // --force deletes anyway.
  EXPECT_EQ(Run({Binaries().cli, "-s", storage_->uri(), "rm", "job", "2", "-y",
                 "--force"},
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("deleting without the storage's lease"));
  EXPECT_THAT(storage::ListCommittedSteps(**store, "job").value(),
              ::testing::ElementsAre(3));
  // Once cairnd stopped, offline deletes need no --force.
  a_->process().Signal(SIGTERM);
  ASSERT_TRUE(a_->process().Wait(absl::Seconds(60)).ok());
  EXPECT_EQ(Run({Binaries().cli, "-s", storage_->uri(), "rm", "job", "3", "-y"},
                &out),
            0)
      << out;
  EXPECT_THAT(storage::ListCommittedSteps(**store, "job").value(),
              ::testing::IsEmpty());
  // It held the lease meanwhile, and released it.
  auto lease = storage::ReadLease(**store);
  ASSERT_TRUE(lease.ok() && lease->has_value()) << lease.status();
  EXPECT_EQ((*lease)->role, "cairn rm");
  EXPECT_TRUE((*lease)->released);
}

}  // namespace
}  // namespace cairn
