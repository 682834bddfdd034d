// StreamingSave on its own: a rank thread (NextBucket / Finish, writing
// through its own mapping of each bucket, as a rank process does) and a
// persist thread (SetPlan / TakeFilled / AwaitFinished) over a real
// StagingPool, checked against the bytes the rank staged on many random
// plans; and each refusal and failure of the protocol.
#include "server/agent/streaming_save.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/shm/shm_segment.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/staging_pool.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kGranule = StagingPool::kSegmentGranule;

v1::WriteItem Bytes(const std::string& fqn, uint64_t length) {
  v1::WriteItem w;
  w.set_kind(v1::WriteItem::KIND_BYTES);
  w.set_bytes_fqn(fqn);
  w.set_length(length);
  return w;
}

// Byte b of item i as the rank stages it.
char Fill(size_t i, uint64_t b) {
  return static_cast<char>((i * 131 + b * 7 + (b >> 9)) & 0xff);
}

std::shared_ptr<ItemSet> SetOf(const std::vector<uint64_t>& lengths) {
  auto set = std::make_shared<ItemSet>();
  set->job = "j";
  set->step = 5;
  set->rank = 1;
  set->world_size = 2;
  for (size_t i = 0; i < lengths.size(); ++i) {
    StagedItem it;
    it.item = Bytes(absl::StrCat("item", i), lengths[i]);
    set->items.push_back(std::move(it));
  }
  return set;
}

// cairnd's plan for the set: every item once, in `order`, spread over
// `objects` objects (each object's writes in plan order).
struct Plan {
  v1::RankSavePlan rank;
  std::vector<protocol::PlannedObject> objects;
};
Plan PlanOf(const ItemSet& set, const std::vector<int>& order, int objects,
            std::mt19937& rng) {
  Plan p;
  p.objects.resize(objects);
  for (int o = 0; o < objects; ++o) p.objects[o].key = absl::StrCat("obj", o);
  for (int item : order) {
    v1::PlannedWrite* w = p.rank.add_writes();
    *w->mutable_item() = set.items[item].item;
    w->mutable_location()->set_length(set.items[item].item.length());
    const int o = static_cast<int>(rng() % objects);
    w->mutable_location()->set_offset(p.objects[o].size);
    p.objects[o].size += set.items[item].item.length();
    p.objects[o].writes.push_back(p.rank.writes_size() - 1);
  }
  return p;
}

class StreamingSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StagingPool::Options o;
    o.node_id = 7;
    o.budget_bytes = 8 * kGranule * 4;
    auto p = StagingPool::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = std::move(*p);
  }

  std::shared_ptr<StreamingSave> Make(std::shared_ptr<ItemSet> set,
                                      uint64_t bucket_bytes,
                                      absl::Duration idle = absl::Seconds(30)) {
    StreamingSave::Options o;
    o.save_id = 42;
    o.bucket_bytes = bucket_bytes;
    o.wait_for_space = absl::Seconds(10);
    o.idle_timeout = idle;
    return std::make_shared<StreamingSave>(std::move(set), o, *pool_);
  }

  // The rank: takes buckets until end_of_stream, writing each piece's bytes
  // of its item through its own mapping, then Finish.
  static absl::Status StageAll(StreamingSave& st) {
    uint64_t filled = 0;
    while (true) {
      v1::StageBucketRequest req;
      req.set_save_id(st.save_id());
      req.set_filled_bucket(filled);
      absl::StatusOr<v1::StageBucketResponse> r = st.NextBucket(req);
      if (!r.ok()) return r.status();
      if (r->end_of_stream()) break;
      auto seg = shm::ShmSegment::Open(r->shm_name(), r->shm_size());
      if (!seg.ok()) return seg.status();
      for (const v1::StagePiece& p : r->pieces()) {
        if (p.staging_offset() + p.length() > r->shm_size()) {
          return absl::InternalError("piece outside its bucket");
        }
        char* out = (*seg)->data() + p.staging_offset();
        for (uint64_t b = 0; b < p.length(); ++b) {
          out[b] = Fill(p.item(), p.item_offset() + b);
        }
      }
      filled = r->bucket();
    }
    v1::FinishStageRequest fin;
    fin.set_save_id(st.save_id());
    return st.Finish(fin);
  }

  std::unique_ptr<StagingPool> pool_;
  std::atomic<bool> stopping_{false};
};

TEST_F(StreamingSaveTest, PersistSideReceivesEveryStagedByteInPlanOrder) {
  std::mt19937 rng(20261203);
  for (int trial = 0; trial < 60; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    const int n = 1 + static_cast<int>(rng() % 12);
    std::vector<uint64_t> lengths;
    for (int i = 0; i < n; ++i) {
      // Empty, small, and larger than a bucket.
      const int kind = static_cast<int>(rng() % 4);
      lengths.push_back(kind == 0   ? rng() % 3
                        : kind == 1 ? 1 + rng() % 300
                                    : 1 + rng() % (5 * kGranule));
    }
    auto set = SetOf(lengths);
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    const Plan plan = PlanOf(*set, order, 1 + static_cast<int>(rng() % 3), rng);
    const uint64_t bucket = kGranule * (1 + rng() % 3);
    auto st = Make(set, bucket);

    absl::Status staged;
    std::thread rank([&] { staged = StageAll(*st); });
    absl::StatusOr<std::vector<StreamingSave::Piece>> pieces =
        st->SetPlan(plan.rank, plan.objects);
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    // What the persist side receives, per plan write.
    std::vector<std::string> got(plan.rank.writes_size());
    size_t pi = 0;
    while (pi < pieces->size()) {
      absl::StatusOr<StreamingSave::Bucket> b = st->TakeFilled(stopping_);
      ASSERT_TRUE(b.ok()) << b.status();
      ASSERT_EQ(b->begin, pi);
      ASSERT_GT(b->end, b->begin);
      for (size_t k = b->begin; k < b->end; ++k) {
        const StreamingSave::Piece& p = (*pieces)[k];
        EXPECT_LE(p.length, bucket);
        EXPECT_EQ(p.item_offset, got[p.write].size());
        got[p.write].append(b->segment->data() + b->offsets[k - b->begin],
                            p.length);
      }
      pi = b->end;
    }
    absl::StatusOr<bool> die = st->AwaitFinished(stopping_);
    rank.join();
    ASSERT_TRUE(staged.ok()) << staged;
    ASSERT_TRUE(die.ok()) << die.status();
    EXPECT_FALSE(*die);
    // Pieces come object by object, each object's writes in its order.
    std::vector<int> write_order;
    for (const StreamingSave::Piece& p : *pieces) {
      if (write_order.empty() || write_order.back() != p.write) {
        write_order.push_back(p.write);
      }
    }
    std::vector<int> want_order;
    for (const protocol::PlannedObject& o : plan.objects) {
      for (int w : o.writes) {
        if (plan.rank.writes(w).location().length() > 0)
          want_order.push_back(w);
      }
    }
    EXPECT_EQ(write_order, want_order);
    for (int w = 0; w < plan.rank.writes_size(); ++w) {
      const int item = order[w];
      std::string want(lengths[item], '\0');
      for (uint64_t b = 0; b < lengths[item]; ++b) want[b] = Fill(item, b);
      EXPECT_EQ(got[w], want) << "write " << w << " (item " << item << ")";
    }
    st->End(absl::OkStatus());
  }
  // Every bucket went back to the pool (kept for reuse, not leaked).
  EXPECT_LE(pool_->stats().used_bytes, pool_->budget());
}

TEST_F(StreamingSaveTest, PlanNamingAnItemTheRankDidNotStageIsRefused) {
  auto set = SetOf({100, 200});
  std::mt19937 rng(1);
  Plan plan = PlanOf(*set, {0, 1}, 1, rng);
  plan.rank.mutable_writes(1)->mutable_item()->set_bytes_fqn("other");
  auto st = Make(set, kGranule);
  EXPECT_THAT(
      st->SetPlan(plan.rank, plan.objects).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("'other'")));
  // The same item with another length.
  plan = PlanOf(*set, {0, 1}, 1, rng);
  plan.rank.mutable_writes(0)->mutable_location()->set_length(99);
  EXPECT_THAT(st->SetPlan(plan.rank, plan.objects).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("did not stage it with that length")));
}

TEST_F(StreamingSaveTest, RankCallsOutOfProtocolAreRefused) {
  auto set = SetOf({3 * kGranule});
  std::mt19937 rng(2);
  const Plan plan = PlanOf(*set, {0}, 1, rng);
  auto st = Make(set, kGranule);
  v1::FinishStageRequest fin;
  fin.set_save_id(42);
  // Before the plan, and while pieces are still to be handed out.
  EXPECT_THAT(st->Finish(fin),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("job 'j' step 5 rank 1: streaming save is "
                                 "not fully staged")));
  ASSERT_TRUE(st->SetPlan(plan.rank, plan.objects).ok());
  v1::StageBucketRequest req;
  req.set_save_id(42);
  absl::StatusOr<v1::StageBucketResponse> first = st->NextBucket(req);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->bucket(), 1u);
  // Asking again without returning the bucket.
  EXPECT_THAT(st->NextBucket(req).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("bucket 1 was handed out and not returned")));
  // Returning another bucket than the one handed out.
  req.set_filled_bucket(7);
  EXPECT_THAT(st->NextBucket(req).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("bucket 7 is not the one handed out")));
  EXPECT_THAT(st->Finish(fin), StatusIs(absl::StatusCode::kFailedPrecondition));
  // GPU items cannot be streamed: the save fails for both sides.
  fin.add_device_items();
  EXPECT_THAT(st->Finish(fin), StatusIs(absl::StatusCode::kUnimplemented,
                                        HasSubstr("GPU items")));
  req.set_filled_bucket(1);
  EXPECT_THAT(st->NextBucket(req).status(),
              StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_THAT(st->TakeFilled(stopping_).status(),
              StatusIs(absl::StatusCode::kUnimplemented));
  st->End(absl::OkStatus());
}

TEST_F(StreamingSaveTest, RankThatStopsCallingAbortsThePersistSide) {
  auto set = SetOf({2 * kGranule});
  std::mt19937 rng(3);
  const Plan plan = PlanOf(*set, {0}, 1, rng);
  auto st = Make(set, kGranule, absl::Milliseconds(200));
  ASSERT_TRUE(st->SetPlan(plan.rank, plan.objects).ok());
  v1::StageBucketRequest req;
  req.set_save_id(42);
  ASSERT_TRUE(st->NextBucket(req).ok());  // and never returns it
  EXPECT_THAT(st->TakeFilled(stopping_).status(),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("the rank made no streaming call for")));
  // The rank's bucket is discarded, not kept for reuse.
  const uint64_t used = pool_->stats().used_bytes;
  st->End(absl::AbortedError("persist failed"));
  EXPECT_LT(pool_->stats().used_bytes, used);
  req.set_filled_bucket(1);
  EXPECT_THAT(st->NextBucket(req).status(),
              StatusIs(absl::StatusCode::kAborted));
}

TEST_F(StreamingSaveTest, FailAndStoppingEndTheWaitsOfBothSides) {
  auto set = SetOf({kGranule});
  std::mt19937 rng(4);
  const Plan plan = PlanOf(*set, {0}, 1, rng);
  {
    // The rank waiting for cairnd's plan.
    auto st = Make(set, kGranule);
    std::thread failer([&] {
      absl::SleepFor(absl::Milliseconds(50));
      st->Fail(absl::CancelledError("cancelled by the rank"));
    });
    v1::StageBucketRequest req;
    req.set_save_id(42);
    EXPECT_THAT(st->NextBucket(req).status(),
                StatusIs(absl::StatusCode::kCancelled));
    failer.join();
    // The first failure stays.
    st->Fail(absl::InternalError("later"));
    EXPECT_THAT(st->TakeFilled(stopping_).status(),
                StatusIs(absl::StatusCode::kCancelled));
  }
  {
    // No plan within the rank's wait.
    auto st = Make(set, kGranule);
    v1::StageBucketRequest req;
    req.set_save_id(42);
    req.set_wait_for_space_ms(50);
    EXPECT_THAT(st->NextBucket(req).status(),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         HasSubstr("cairnd's plan did not arrive in time")));
  }
  {
    // The agent stopping while the persist side waits for the rank.
    auto st = Make(set, kGranule);
    ASSERT_TRUE(st->SetPlan(plan.rank, plan.objects).ok());
    std::atomic<bool> stopping{true};
    EXPECT_THAT(st->AwaitFinished(stopping).status(),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr("cairn-agent is stopping")));
  }
}

TEST_F(StreamingSaveTest, DieBeforeCommitIsPassedToThePersistSide) {
  auto set = SetOf({10});
  std::mt19937 rng(5);
  const Plan plan = PlanOf(*set, {0}, 1, rng);
  auto st = Make(set, kGranule);
  ASSERT_TRUE(st->SetPlan(plan.rank, plan.objects).ok());
  v1::StageBucketRequest req;
  req.set_save_id(42);
  absl::StatusOr<v1::StageBucketResponse> b = st->NextBucket(req);
  ASSERT_TRUE(b.ok());
  req.set_filled_bucket(b->bucket());
  absl::StatusOr<v1::StageBucketResponse> end = st->NextBucket(req);
  ASSERT_TRUE(end.ok());
  EXPECT_TRUE(end->end_of_stream());
  v1::FinishStageRequest fin;
  fin.set_save_id(42);
  fin.set_die_before_commit_for_test(true);
  ASSERT_TRUE(st->Finish(fin).ok());
  ASSERT_TRUE(st->TakeFilled(stopping_).ok());
  absl::StatusOr<bool> die = st->AwaitFinished(stopping_);
  ASSERT_TRUE(die.ok());
  EXPECT_TRUE(*die);
}

}  // namespace
}  // namespace cairn::agent
