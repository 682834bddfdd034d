// Persister on its own against a real cairnd on loopback (no agent server,
// no peer transport: replica pushes go to a recording stand-in): staged and
// streamed saves commit and load back bit-exact through libcairn, the
// committed set becomes tier 0 and is pushed to the next nodes, and each
// way a save ends early (cancelled, its preparation failing, stopping, an
// unknown save) gives its outcome to Wait.
#include "server/agent/persister.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/checkpointer.h"
#include "common/metrics.h"
#include "common/shm/shm_segment.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/coordinator_call.h"
#include "server/agent/memory_tier.h"
#include "server/agent/staging_pool.h"
#include "server/agent/testing/item_sets.h"
#include "server/coordinator/coordinator_server.h"

namespace cairn::agent {
namespace {

using ::cairn::agent::testing::BytesItem;
using ::cairn::agent::testing::MakeFilledSet;
using ::cairn::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

char Fill(size_t i, uint64_t b) {
  return static_cast<char>((i * 37 + b * 11 + 5) & 0xff);
}

class PersisterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::cairn::testing::MakeTempDir("persister-test");
    coordinator::CoordinatorServer::Spec spec;
    spec.listen_address = "127.0.0.1:0";
    spec.coordinator.storage_uri = absl::StrCat("file://", dir_, "/ckpt");
    spec.coordinator.catalog_path = dir_ + "/catalog";
    spec.coordinator.commit_deadline = absl::Seconds(20);
    auto c = coordinator::CoordinatorServer::Start(spec);
    ASSERT_TRUE(c.ok()) << c.status();
    cairnd_ = std::move(*c);
    auto channel = protocol::NewCoordinatorChannel(Address(), {});
    ASSERT_TRUE(channel.ok()) << channel.status();
    channel_ = *channel;
    stub_ = v1::Coordinator::NewStub(channel_);
    contact_ = std::make_unique<protocol::CoordinatorContact>(
        channel_, Address(), absl::Seconds(5));
    StagingPool::Options po;
    po.node_id = 1;
    po.budget_bytes = uint64_t{16} << 20;
    auto pool = StagingPool::Create(po);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    Start(/*replicas=*/2);
  }
  void TearDown() override {
    persister_.reset();
    tier_.Clear();
    cairnd_.reset();
  }

  std::string Address() const {
    return absl::StrCat("127.0.0.1:", cairnd_->port());
  }

  void Start(int replicas) {
    persister_.reset();
    registry_ = std::make_unique<metrics::Registry>();
    Persister::Options o;
    o.node_id = 1;
    o.num_nodes = 4;
    o.replicas = replicas;
    o.io_threads = 2;
    o.store.durable = false;
    o.metrics = Persister::Metrics::Register(*registry_);
    persister_ = std::make_unique<Persister>(
        o, stub_.get(), contact_.get(), tier_,
        [this](const ItemSet& set, int peer) -> absl::Status {
          absl::MutexLock l(&mu_);
          pushes_.push_back({set.step, peer});
          if (peer == fail_push_to_) {
            return absl::UnavailableError(absl::StrCat("node ", peer));
          }
          return absl::OkStatus();
        });
  }

  // A staged set of job "j", rank 0 of 1: items of `lengths` bytes.
  std::shared_ptr<ItemSet> Staged(int64_t step,
                                  const std::vector<uint64_t>& lengths) {
    std::vector<v1::WriteItem> items;
    for (size_t i = 0; i < lengths.size(); ++i) {
      items.push_back(BytesItem(absl::StrCat("b", i), lengths[i]));
    }
    auto set = MakeFilledSet(*pool_, "j", step, 0, false, items, Fill);
    set->world_size = 1;
    return set;
  }

  // A streaming save `save_id` of job "j", rank 0 of 1, of bytes entries
  // "b<i>" of `lengths` bytes, in 4 KiB buckets; the rank stages nothing yet.
  std::shared_ptr<StreamingSave> Streaming(
      int64_t step, uint64_t save_id, const std::vector<uint64_t>& lengths) {
    auto set = std::make_shared<ItemSet>();
    set->job = "j";
    set->step = step;
    set->world_size = 1;
    for (size_t i = 0; i < lengths.size(); ++i) {
      StagedItem it;
      it.item = BytesItem(absl::StrCat("b", i), lengths[i]);
      set->items.push_back(std::move(it));
    }
    StreamingSave::Options so;
    so.save_id = save_id;
    so.bucket_bytes = 4096;
    return std::make_shared<StreamingSave>(set, so, *pool_);
  }

  absl::StatusOr<v1::CheckpointRecord> Wait(int64_t step,
                                            int64_t timeout_ms = 30000) {
    v1::WaitSaveRequest w;
    w.set_job("j");
    w.set_step(step);
    w.set_rank(0);
    w.set_timeout_ms(timeout_ms);
    return persister_->Wait(w);
  }

  // Loads `step` of job "j" through libcairn from storage; checks every
  // byte of the `lengths` items.
  void ExpectStored(int64_t step, const std::vector<uint64_t>& lengths) {
    client::CheckpointerOptions o;
    o.coordinator = Address();
    o.job = "j";
    o.store.use_odirect = false;
    auto c = client::Checkpointer::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    std::vector<std::string> blobs(lengths.size());
    client::StateDict state;
    for (size_t i = 0; i < lengths.size(); ++i) {
      ASSERT_TRUE(state.AddBytes(absl::StrCat("b", i), &blobs[i]).ok());
    }
    absl::StatusOr<int64_t> got =
        (*c)->Load(client::LoadRef::Step(step), state);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t i = 0; i < lengths.size(); ++i) {
      ASSERT_EQ(blobs[i].size(), lengths[i]);
      for (uint64_t b = 0; b < lengths[i]; ++b) {
        ASSERT_EQ(blobs[i][b], Fill(i, b)) << "item " << i << " byte " << b;
      }
    }
  }

  std::string dir_;
  std::unique_ptr<coordinator::CoordinatorServer> cairnd_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<protocol::CoordinatorContact> contact_;
  std::unique_ptr<StagingPool> pool_;
  MemoryTier tier_{1};
  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<Persister> persister_;
  absl::Mutex mu_;
  std::vector<std::pair<int64_t, int>> pushes_ ABSL_GUARDED_BY(mu_);
  int fail_push_to_ ABSL_GUARDED_BY(mu_) = -1;
};

TEST_F(PersisterTest, StagedSaveCommitsBecomesTierZeroAndIsPushedToNextNodes) {
  {
    absl::MutexLock l(&mu_);
    fail_push_to_ = 3;  // counted as a failure; the save still commits
  }
  const std::vector<uint64_t> lengths = {1, 4096, 100000, 0, 777};
  auto set = Staged(10, lengths);
  persister_->Expect(*set);
  ASSERT_TRUE(persister_->Persist(set, false).ok());
  absl::StatusOr<v1::CheckpointRecord> r = Wait(10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 10);
  EXPECT_EQ(r->state(), v1::CHECKPOINT_STATE_COMMITTED);
  ExpectStored(10, lengths);
  // Tier 0 holds it, with every item's crc32c.
  EXPECT_EQ(tier_.counts().tier0_sets, 1);
  auto found =
      tier_.Find("j", 10, BytesItem("b2", 100000), set->items[2].crc32c);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->first, set);
  {
    absl::MutexLock l(&mu_);
    EXPECT_THAT(pushes_, ElementsAre(Pair(10, 2), Pair(10, 3)));
  }
  const Persister::Counts n = persister_->counts();
  EXPECT_EQ(n.commits, 1);
  EXPECT_EQ(n.replicas_pushed, 1);
  EXPECT_EQ(persister_->replication_lag().bytes, 0u);
  const std::string text = registry_->Render();
  EXPECT_THAT(text,
              HasSubstr("cairn_agent_persists_total{result=\"committed\"} 1"));
  EXPECT_THAT(text, HasSubstr("cairn_agent_replication_failures_total 1"));
  EXPECT_THAT(text, HasSubstr("cairn_agent_bytes_persisted_total 104874"));
}

TEST_F(PersisterTest, SavesOfOneRankCommitInOrder) {
  Start(/*replicas=*/0);
  std::vector<std::shared_ptr<ItemSet>> sets;
  for (int64_t step = 1; step <= 4; ++step) {
    sets.push_back(Staged(step, {1000, static_cast<uint64_t>(step)}));
    persister_->Expect(*sets.back());
    ASSERT_TRUE(persister_->Persist(sets.back(), false).ok());
  }
  for (int64_t step = 1; step <= 4; ++step) {
    absl::StatusOr<v1::CheckpointRecord> r = Wait(step);
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
  }
  ExpectStored(4, {1000, 4});
  EXPECT_EQ(persister_->counts().commits, 4);
  // Tier 0 keeps the newest set of the rank only.
  EXPECT_EQ(tier_.counts().tier0_sets, 1);
}

TEST_F(PersisterTest, CancelBeforeThePersistStartsSendsNothingToCairnd) {
  auto set = Staged(7, {64});
  persister_->Expect(*set);
  absl::Notification in_prepare, cancelled;
  std::thread t([&] {
    absl::Status s = persister_->Persist(set, false, [&] {
      in_prepare.Notify();
      cancelled.WaitForNotification();
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
  });
  in_prepare.WaitForNotification();
  v1::CancelSaveRequest c;
  c.set_job("j");
  c.set_step(7);
  c.set_rank(0);
  c.set_incarnation(99);  // the set's process is not known (0): it matches
  EXPECT_TRUE(persister_->Cancel(c));
  cancelled.Notify();
  t.join();
  EXPECT_THAT(Wait(7).status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("job 'j' step 7 rank 0: cancelled")));
  // cairnd never heard of step 7.
  client::CheckpointerOptions o;
  o.coordinator = Address();
  o.job = "j";
  auto ckpt = client::Checkpointer::Connect(o);
  ASSERT_TRUE(ckpt.ok());
  auto list = (*ckpt)->List();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->empty());
  EXPECT_EQ(persister_->counts().commits, 0);
}

TEST_F(PersisterTest, CancelOfAnotherProcessOrSaveStopsNothing) {
  auto set = Staged(8, {64});
  set->incarnation = 5;
  persister_->Expect(*set);
  v1::CancelSaveRequest c;
  c.set_job("j");
  c.set_step(8);
  c.set_rank(0);
  c.set_incarnation(6);  // a restarted process of the rank
  absl::Notification in_prepare, go;
  std::thread t([&] {
    EXPECT_TRUE(persister_
                    ->Persist(set, false,
                              [&] {
                                in_prepare.Notify();
                                go.WaitForNotification();
                                return absl::OkStatus();
                              })
                    .ok());
  });
  in_prepare.WaitForNotification();
  EXPECT_FALSE(persister_->Cancel(c));
  c.set_incarnation(5);
  c.set_step(9);
  EXPECT_FALSE(persister_->Cancel(c));
  go.Notify();
  t.join();
  EXPECT_TRUE(Wait(8).ok());
}

TEST_F(PersisterTest, FailedPreparationIsTheSavesOutcome) {
  auto set = Staged(3, {64});
  persister_->Expect(*set);
  EXPECT_THAT(
      persister_->Persist(
          set, false,
          [] { return absl::FailedPreconditionError("no cuda copier"); }),
      StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(Wait(3).status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                         "no cuda copier"));
  // Fail records the outcome of a save that never reached a persist.
  auto dropped = Staged(4, {64});
  persister_->Expect(*dropped);
  persister_->Fail(*dropped, absl::CancelledError("dropped while staged"));
  EXPECT_THAT(Wait(4).status(), StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(PersisterTest, UnknownSaveIsNotFoundAndAPendingOneTimesOut) {
  EXPECT_THAT(Wait(99).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("node 1: no save of job 'j' step 99 rank 0")));
  auto set = Staged(5, {8});
  persister_->Expect(*set);
  EXPECT_THAT(Wait(5, 50).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("not persisted within")));
}

TEST_F(PersisterTest, StoppedPersisterRefusesNewSaves) {
  persister_->Stop();
  auto set = Staged(6, {8});
  persister_->Expect(*set);
  EXPECT_THAT(persister_->Persist(set, false),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("cairn-agent is stopping")));
  EXPECT_THAT(Wait(6).status(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(PersisterTest, StreamedSaveCommitsBitExactAndKeepsNothingInMemory) {
  const std::vector<uint64_t> lengths = {3 * 4096 + 5, 10, 0, 9000};
  auto st = Streaming(12, 77, lengths);
  ASSERT_TRUE(persister_->Stream(st).ok());
  ASSERT_EQ(persister_->FindStream(77), st);
  // The rank.
  uint64_t filled = 0;
  while (true) {
    v1::StageBucketRequest req;
    req.set_save_id(77);
    req.set_filled_bucket(filled);
    absl::StatusOr<v1::StageBucketResponse> r = st->NextBucket(req);
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->end_of_stream()) break;
    auto seg = shm::ShmSegment::Open(r->shm_name(), r->shm_size());
    ASSERT_TRUE(seg.ok()) << seg.status();
    for (const v1::StagePiece& p : r->pieces()) {
      for (uint64_t b = 0; b < p.length(); ++b) {
        (*seg)->data()[p.staging_offset() + b] =
            Fill(p.item(), p.item_offset() + b);
      }
    }
    filled = r->bucket();
  }
  v1::FinishStageRequest fin;
  fin.set_save_id(77);
  ASSERT_TRUE(st->Finish(fin).ok());
  absl::StatusOr<v1::CheckpointRecord> r = Wait(12);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectStored(12, lengths);
  EXPECT_EQ(persister_->FindStream(77), nullptr);
  EXPECT_EQ(persister_->counts().streamed_saves, 1);
  EXPECT_EQ(tier_.counts().tier0_sets, 0);
  absl::MutexLock l(&mu_);
  EXPECT_TRUE(pushes_.empty());
}

TEST_F(PersisterTest, CancelledStreamFailsForTheRankAndIsNotCommitted) {
  auto st = Streaming(13, 78, {5 * 4096});
  ASSERT_TRUE(persister_->Stream(st).ok());
  v1::StageBucketRequest req;
  req.set_save_id(78);
  ASSERT_TRUE(st->NextBucket(req).ok());
  v1::CancelSaveRequest c;
  c.set_job("j");
  c.set_step(13);
  c.set_rank(0);
  EXPECT_TRUE(persister_->Cancel(c));
  req.set_filled_bucket(1);
  EXPECT_THAT(st->NextBucket(req).status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("cancelled (AgentCheckpointer::Cancel)")));
  EXPECT_THAT(Wait(13).status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(persister_->counts().commits, 0);
}

}  // namespace
}  // namespace cairn::agent
