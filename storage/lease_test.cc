// The storage lease (lease.h) on the memory and posix drivers, and on stores
// that cannot create only-if-absent (PutIfAbsent UNIMPLEMENTED, or a server
// that ignores the condition): acquire, refusal naming the holder, release,
// takeover of expired, released and dead holders (one winner when several
// race), renewal, fencing when renewals fail, loss to a higher generation.
// The S3 driver runs the same scenarios against radosgw in
// storage/s3/s3_shard_store_test.cc.
#include "storage/lease.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_layout.h"
#include "storage/testing/fault_injection_store.h"

namespace cairn::storage {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A store over another that cannot create only-if-absent: PutIfAbsent is
// UNIMPLEMENTED (kUnimplemented) or replaces like Put, as an S3 server that
// ignores If-None-Match (kIgnoresCondition).
class NoCreateOnlyStore : public ShardStore {
 public:
  enum Mode { kUnimplemented, kIgnoresCondition };
  NoCreateOnlyStore(std::unique_ptr<ShardStore> base, Mode mode)
      : base_(std::move(base)), mode_(mode) {}
  std::string uri() const override { return base_->uri(); }
  using ShardStore::NewWriter;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(
      absl::string_view key, const WriterOptions& options) override {
    return base_->NewWriter(key, options);
  }
  absl::Status Put(absl::string_view key,
                   absl::Span<const char> data) override {
    return base_->Put(key, data);
  }
  absl::Status PutIfAbsent(absl::string_view key,
                           absl::Span<const char> data) override {
    if (mode_ == kIgnoresCondition) return base_->Put(key, data);
    return ShardStore::PutIfAbsent(key, data);
  }
  absl::StatusOr<size_t> Read(absl::string_view key, ByteRange range,
                              absl::Span<char> out) override {
    return base_->Read(key, range, out);
  }
  absl::Status ReadRanges(absl::string_view key,
                          absl::Span<const ByteRange> ranges,
                          absl::Span<const absl::Span<char>> outs) override {
    return base_->ReadRanges(key, ranges, outs);
  }
  absl::StatusOr<uint64_t> Size(absl::string_view key) override {
    return base_->Size(key);
  }
  absl::StatusOr<std::vector<std::string>> List(
      absl::string_view prefix) override {
    return base_->List(prefix);
  }
  absl::Status Delete(absl::string_view key) override {
    return base_->Delete(key);
  }
  absl::Status DeletePrefix(absl::string_view prefix) override {
    return base_->DeletePrefix(prefix);
  }

 private:
  std::unique_ptr<ShardStore> base_;
  const Mode mode_;
};

struct Backend {
  std::string name;
  // A fresh, empty store.
  std::function<std::unique_ptr<ShardStore>(const std::string& test)> open;
  bool create_only = true;
};

std::vector<Backend> Backends() {
  return {
      {"memory",
       [](const std::string& test) {
         return OpenShardStore("mem://lease-" + test).value();
       }},
      {"posix",
       [](const std::string& test) {
         return OpenShardStore("file://" + testing::MakeTempDirRemovedAtExit(
                                               "lease-" + test))
             .value();
       }},
      {"no_create_only",
       [](const std::string& test) -> std::unique_ptr<ShardStore> {
         return std::make_unique<NoCreateOnlyStore>(
             OpenShardStore("file://" +
                            testing::MakeTempDirRemovedAtExit("lease-" + test))
                 .value(),
             NoCreateOnlyStore::kUnimplemented);
       },
       false},
      {"ignores_condition",
       [](const std::string& test) -> std::unique_ptr<ShardStore> {
         return std::make_unique<NoCreateOnlyStore>(
             OpenShardStore("mem://lease-ignores-" + test).value(),
             NoCreateOnlyStore::kIgnoresCondition);
       },
       false},
  };
}

class LeaseTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    const std::string test =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::string name = test;
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    store_ = GetParam().open(name);
  }

  LeaseOptions Options(const std::string& address = "10.1.2.3:7070") {
    LeaseOptions o;
    o.address = address;
    o.detail = "catalog /data/catalog";
    o.settle = absl::Milliseconds(200);
    return o;
  }

  // A record of another machine's cairnd, renewed now, written as
  // generation `generation`.
  LeaseRecord Foreign(int64_t generation, absl::Duration ttl) {
    LeaseRecord r;
    r.generation = generation;
    r.holder_id = "foreign-holder";
    r.role = "cairnd";
    r.host = "other-host";
    r.pid = 4242;
    r.address = "10.9.9.9:7070";
    r.acquired_unix_micros = absl::ToUnixMicros(absl::Now());
    r.renewed_unix_micros = r.acquired_unix_micros;
    r.ttl_micros = absl::ToInt64Microseconds(ttl);
    r.boot_id = "another-boot";
    r.pid_namespace = "pid:[1]";
    return r;
  }
  void Write(const LeaseRecord& r) {
    const std::string body = r.Serialize();
    ASSERT_TRUE(
        store_->Put(LeaseKey(r.generation), absl::MakeConstSpan(body)).ok());
  }
  std::vector<std::string> LeaseObjects() {
    return store_->List(kLeasePrefix).value();
  }

  std::unique_ptr<ShardStore> store_;
};

TEST_P(LeaseTest, FirstHolderRecordsItselfAndReleaseFreesAtOnce) {
  auto a = StorageLease::Acquire(*store_, Options());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->Check().ok()) << (*a)->Check();
  EXPECT_FALSE((*a)->previous().has_value());
  EXPECT_EQ((*a)->create_only_unsupported(), !GetParam().create_only);
  auto read = ReadLease(*store_);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ((*read)->generation, 1);
  EXPECT_EQ((*read)->holder_id, (*a)->record().holder_id);
  EXPECT_EQ((*read)->role, "cairnd");
  EXPECT_EQ((*read)->pid, getpid());
  EXPECT_EQ((*read)->address, "10.1.2.3:7070");
  EXPECT_FALSE((*read)->released);
  EXPECT_EQ(EvaluateLease(**read, absl::Now()), LeaseState::kHeld);
  // The lease object is no job.
  EXPECT_THAT(ListJobs(*store_).value(), IsEmpty());

  ASSERT_TRUE((*a)->Release().ok());
  EXPECT_THAT((*a)->Check(), StatusIs(absl::StatusCode::kFailedPrecondition));
  read = ReadLease(*store_);
  ASSERT_TRUE(read.ok() && read->has_value());
  EXPECT_TRUE((*read)->released);

  auto b = StorageLease::Acquire(*store_, Options("10.1.2.4:7070"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->record().generation, 2);
  ASSERT_TRUE((*b)->previous().has_value());
  EXPECT_TRUE((*b)->previous()->released);
  // Older generations are deleted.
  EXPECT_THAT(LeaseObjects(), ElementsAre(LeaseKey(2)));
  b->reset();  // the destructor releases too
  EXPECT_TRUE(ReadLease(*store_).value()->released);
}

TEST_P(LeaseTest, SecondHolderIsRefusedNamingTheFirst) {
  auto a = StorageLease::Acquire(*store_, Options());
  ASSERT_TRUE(a.ok()) << a.status();
  LeaseOptions other = Options("10.1.2.4:7070");
  other.role = "cairn gc";
  auto b = StorageLease::Acquire(*store_, other);
  EXPECT_THAT(b, StatusIs(absl::StatusCode::kFailedPrecondition));
  const std::string msg(b.status().message());
  EXPECT_THAT(msg, HasSubstr(absl::StrCat("is held by cairnd (pid ", getpid(),
                                          " on host ")));
  EXPECT_THAT(msg, HasSubstr("serving 10.1.2.3:7070, catalog /data/catalog"));
  EXPECT_THAT(msg, HasSubstr("expires "));
  EXPECT_THAT(msg, HasSubstr(store_->uri()));
  // The refused one wrote nothing, and the holder is undisturbed.
  EXPECT_THAT(LeaseObjects(), ElementsAre(LeaseKey(1)));
  EXPECT_TRUE((*a)->Check().ok());
}

TEST_P(LeaseTest, AbandonedHolderOfThisProcessIsTakenOverAtOnce) {
  auto a = StorageLease::Acquire(*store_, Options());
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string first = (*a)->record().holder_id;
  (*a)->AbandonForTest();  // as if killed: the record stays, unreleased
  EXPECT_FALSE(ReadLease(*store_).value()->released);
  auto b = StorageLease::Acquire(*store_, Options());
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*b)->previous().has_value());
  EXPECT_EQ((*b)->previous()->holder_id, first);
  EXPECT_EQ((*b)->record().generation, 2);
}

TEST_P(LeaseTest, DeadProcessOnThisMachineFreesTheLease) {
  // A record of this machine whose pid has exited.
  auto probe = StorageLease::Acquire(*store_, Options());
  ASSERT_TRUE(probe.ok()) << probe.status();
  LeaseRecord r = (*probe)->record();
  probe->reset();
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  r.generation = 3;
  r.holder_id = "dead-holder";
  r.pid = child;
  r.released = false;
  r.renewed_unix_micros = absl::ToUnixMicros(absl::Now());
  r.ttl_micros = absl::ToInt64Microseconds(absl::Hours(1));
  Write(r);
  EXPECT_EQ(EvaluateLease(r, absl::Now()), LeaseState::kHolderDead);
  auto b = StorageLease::Acquire(*store_, Options());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->previous()->holder_id, "dead-holder");
  // A live process of this machine (the parent of this test) holds it.
  r.pid = getppid();
  r.start_ticks = 0;
  EXPECT_EQ(EvaluateLease(r, absl::Now()), LeaseState::kHeld);
}

TEST_P(LeaseTest, ForeignHolderIsRefusedUntilItExpiresThenTakenOver) {
  Write(Foreign(1, absl::Seconds(2)));
  auto refused = StorageLease::Acquire(*store_, Options());
  EXPECT_THAT(refused,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cairnd (pid 4242 on host other-host, serving "
                                 "10.9.9.9:7070)")));
  // Asked to wait, it takes over once the record expires.
  LeaseOptions wait = Options();
  wait.wait = absl::Seconds(60);
  auto b = StorageLease::Acquire(*store_, wait);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->record().generation, 2);
  EXPECT_EQ((*b)->previous()->host, "other-host");
  EXPECT_GE(absl::Now(), (*b)->previous()->expires());
}

TEST_P(LeaseTest, WaitingGivesUpAtItsDeadlineNamingTheHolder) {
  Write(Foreign(1, absl::Minutes(10)));
  LeaseOptions wait = Options();
  wait.wait = absl::Seconds(1);
  auto b = StorageLease::Acquire(*store_, wait);
  EXPECT_THAT(
      b, StatusIs(absl::StatusCode::kFailedPrecondition,
                  AllOf(HasSubstr("other-host"), HasSubstr("(waited 1 s)"))));
}

TEST_P(LeaseTest, ReleasedForeignRecordIsTakenAtOnce) {
  LeaseRecord r = Foreign(5, absl::Minutes(10));
  r.released = true;
  Write(r);
  auto b = StorageLease::Acquire(*store_, Options());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->record().generation, 6);
}

TEST_P(LeaseTest, OfProcessesTakingOverTogetherExactlyOneWins) {
  Write(Foreign(1, absl::Seconds(1)));
  absl::SleepFor(absl::Milliseconds(1100));
  constexpr int kRacers = 4;
  std::vector<std::unique_ptr<StorageLease>> won(kRacers);
  std::vector<absl::Status> errors(kRacers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRacers; ++i) {
    threads.emplace_back([&, i] {
      auto l = StorageLease::Acquire(*store_, Options(absl::StrCat("r", i)));
      if (l.ok()) {
        won[i] = std::move(*l);
      } else {
        errors[i] = l.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  int winners = 0;
  for (int i = 0; i < kRacers; ++i) {
    if (won[i] != nullptr) {
      ++winners;
      continue;
    }
    EXPECT_THAT(errors[i], StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr("is held by")));
  }
  EXPECT_EQ(winners, 1);
}

TEST_P(LeaseTest, RenewalKeepsItHeldBeyondItsTtl) {
  LeaseOptions o = Options();
  o.ttl = absl::Seconds(1);
  auto a = StorageLease::Acquire(*store_, o);
  ASSERT_TRUE(a.ok()) << a.status();
  const int64_t first = ReadLease(*store_).value()->renewed_unix_micros;
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_TRUE((*a)->Check().ok()) << (*a)->Check();
  EXPECT_GT(ReadLease(*store_).value()->renewed_unix_micros, first);
  // Still held: this process's own pid is checked against the leases it
  // holds.
  auto b = StorageLease::Acquire(*store_, Options());
  EXPECT_THAT(b, StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_P(LeaseTest, SetAddressIsWrittenAtOnce) {
  auto a = StorageLease::Acquire(*store_, Options("127.0.0.1:0"));
  ASSERT_TRUE(a.ok()) << a.status();
  (*a)->SetAddress("127.0.0.1:34567");
  EXPECT_EQ(ReadLease(*store_).value()->address, "127.0.0.1:34567");
}

TEST_P(LeaseTest, HigherGenerationMeansLostForGood) {
  std::atomic<int> lost_calls{0};
  LeaseOptions o = Options();
  o.on_lost = [&](const absl::Status&) { ++lost_calls; };
  auto a = StorageLease::Acquire(*store_, o);
  ASSERT_TRUE(a.ok()) << a.status();
  Write(Foreign(2, absl::Minutes(10)));
  (*a)->RenewNowForTest();
  const absl::Status s = (*a)->Check();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                          AllOf(HasSubstr("taken over by cairnd"),
                                HasSubstr("other-host"))));
  // It does not mark the other's lease released on its way out.
  ASSERT_TRUE((*a)->Release().ok());
  EXPECT_EQ(ReadLease(*store_).value()->holder_id, "foreign-holder");
  EXPECT_FALSE(ReadLease(*store_).value()->released);
}

TEST_P(LeaseTest, DamagedRecordIsDataLossNamingIt) {
  ASSERT_TRUE(store_->Put(LeaseKey(1), absl::MakeConstSpan("junk", 4)).ok());
  auto a = StorageLease::Acquire(*store_, Options());
  EXPECT_THAT(a.status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(LeaseKey(1))));
}

INSTANTIATE_TEST_SUITE_P(Drivers, LeaseTest, ::testing::ValuesIn(Backends()),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param.name;
                         });

// Renewals that fail fence the holder (UNAVAILABLE) after 2/3 of the TTL,
// and lose it for good after the TTL; a renewal that succeeds in time
// lifts the fence.
TEST(LeaseFencingTest, FailingRenewalsFenceThenLoseTheLease) {
  FaultInjectionStore store(OpenShardStore("mem://lease-fencing").value());
  std::atomic<int> lost_calls{0};
  LeaseOptions o;
  o.ttl = absl::Seconds(3);
  o.on_lost = [&](const absl::Status&) { ++lost_calls; };
  auto a = StorageLease::Acquire(store, o);
  ASSERT_TRUE(a.ok()) << a.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);

  // The storage stops answering for a while, then comes back in time.
  int rule = store.AddRule({.ops = kFaultPut | kFaultList,
                            .key_contains = kLeasePrefix,
                            .count = -1,
                            .status = absl::UnavailableError("disk gone")});
  while ((*a)->Check().ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  absl::Status fenced = (*a)->Check();
  EXPECT_THAT(fenced,
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk gone")));
  EXPECT_GT(store.fired(rule), 0);
  store.Reset();
  (*a)->RenewNowForTest();
  EXPECT_TRUE((*a)->Check().ok()) << (*a)->Check();

  // Now for good.
  store.AddRule({.ops = kFaultPut | kFaultList,
                 .key_contains = kLeasePrefix,
                 .count = -1,
                 .status = absl::UnavailableError("disk gone")});
  while (lost_calls.load() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(lost_calls.load(), 1);
  absl::Status lost = (*a)->Check();
  EXPECT_THAT(lost, StatusIs(absl::StatusCode::kFailedPrecondition,
                             HasSubstr("expired")));
  store.Reset();
  // Even with the storage back, an expired lease stays lost: another
  // process may have taken it meanwhile.
  (*a)->RenewNowForTest();
  EXPECT_THAT((*a)->Check(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(LeaseRecordTest, SerializeParseRoundTripAndDescribe) {
  LeaseRecord r;
  r.holder_id = "abc";
  r.role = "cairn rm";
  r.host = "n1";
  r.pid = 12;
  r.detail = "job x";
  r.acquired_unix_micros = 1700000000000000;
  r.renewed_unix_micros = 1700000010000000;
  r.ttl_micros = 30000000;
  r.boot_id = "b";
  r.pid_namespace = "pid:[4026531836]";
  r.start_ticks = 99;
  auto back = LeaseRecord::Parse("k", r.Serialize());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Serialize(), r.Serialize());
  EXPECT_EQ(back->holder_id, "abc");
  EXPECT_EQ(back->start_ticks, 99u);
  EXPECT_EQ(back->Holder(), "cairn rm (pid 12 on host n1, job x)");
  const absl::Time now = absl::FromUnixSeconds(1700000014);
  EXPECT_EQ(back->Describe(now),
            "cairn rm (pid 12 on host n1, job x), lease generation 0 renewed "
            "2023-11-14T22:13:30Z (4 s ago), expires 2023-11-14T22:14:00Z "
            "(in 26 s)");
  EXPECT_EQ(EvaluateLease(*back, now), LeaseState::kHeld);
  EXPECT_EQ(EvaluateLease(*back, now + absl::Seconds(26)),
            LeaseState::kExpired);
  EXPECT_THAT(LeaseRecord::Parse("k", "cairn storage lease\nholder: x\n"),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(LeaseKey(7), "cairn-lease.0000000000000007");
}

}  // namespace
}  // namespace cairn::storage
