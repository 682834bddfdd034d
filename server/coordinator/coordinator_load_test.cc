// The load protocol through the coordinator (no gRPC): PlanLoad and its
// cache, load rounds (`latest` once per round, join grace, world-size
// disagreement) and VerifyLoad combining the ranks' pieces.
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "proto/convert/load_request.h"
#include "server/coordinator/coordinator_test_fixture.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(CoordinatorTest, IdenticalLoadPlansComeFromTheCache) {
  Start();
  Save("job", 1, 2);
  v1::PlanLoadRequest req;
  req.set_job("job");
  req.set_latest(true);
  v1::WantedChunk* w = req.add_wanted();
  w->mutable_tensor()->set_fqn("w");
  w->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  w->mutable_tensor()->add_global_shape(8);
  w->mutable_tensor()->add_global_shape(4);
  w->mutable_box()->add_offsets(2);
  w->mutable_box()->add_offsets(0);
  w->mutable_box()->add_sizes(4);
  w->mutable_box()->add_sizes(4);
  req.add_wanted_bytes("rng");
  auto a = coordinator_->PlanLoad(req);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->reads_size(), 2);  // rows 2..5 span both stored chunks
  EXPECT_EQ(a->bytes_entries_size(), 1);
  // A layout asked for once is not cached (most ranks of a sharded load
  // have one of their own); the second ask plans it again and caches it.
  req.set_rank(5);
  auto b = coordinator_->PlanLoad(req);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
  EXPECT_EQ(coordinator_->stats().load_plans_from_cache, 0);
  req.set_rank(7);
  auto b2 = coordinator_->PlanLoad(req);
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ(a->SerializeAsString(), b2->SerializeAsString());
  EXPECT_EQ(coordinator_->stats().load_plans_from_cache, 1);
  // Asking for step 1 by number is the same layout as `latest` (step 1).
  req.set_step(1);
  req.set_rank(0);
  auto d = coordinator_->PlanLoad(req);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(a->SerializeAsString(), d->SerializeAsString());
  EXPECT_EQ(coordinator_->stats().load_plans_from_cache, 2);
  req.add_wanted_bytes("missing");
  auto c = coordinator_->PlanLoad(req);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kNotFound, HasSubstr("'missing'")));
}

TEST_F(CoordinatorTest, VerifyLoadCombinesThePiecesOfEveryRank) {
  Start();
  Save("job", 1, 2);  // "w" [8, 4] stored as rows 0-3 and rows 4-7
  // Two ranks load it by columns: each needs half of both stored chunks.
  v1::VerifyLoadRequest left = Pieces(PlanColumns(0, 0, 2), 0, 2);
  v1::VerifyLoadRequest right = Pieces(PlanColumns(1, 2, 2), 1, 2);
  ASSERT_EQ(left.pieces_size(), 2);
  ASSERT_EQ(right.pieces_size(), 2);
  auto a = Verify(left);
  // Rank 0 is parked until rank 1 reports.
  EXPECT_EQ(a.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout);
  auto b = Verify(right);
  VerifyResult ra = a.get(), rb = b.get();
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(ra->verify_locally_size(), 0);
  EXPECT_EQ(rb->verify_locally_size(), 0);
  EXPECT_EQ(ra->chunks_verified(), 2);
  EXPECT_EQ(rb->chunks_verified(), 2);
  EXPECT_EQ(coordinator_->stats().load_chunks_verified, 2);
  EXPECT_EQ(coordinator_->stats().load_chunks_unverified, 0);
}

TEST_F(CoordinatorTest, VerifyLoadSendsBackPiecesItCannotVerify) {
  Start();
  Save("job", 1, 2);
  v1::VerifyLoadRequest left = Pieces(PlanColumns(0, 0, 2), 0, 2);
  v1::VerifyLoadRequest right = Pieces(PlanColumns(1, 2, 2), 1, 2);
  // Rank 1 read damaged bytes of the second stored chunk (rows 4-7).
  int damaged = -1;
  for (int i = 0; i < right.pieces_size(); ++i) {
    if (right.pieces(i).overlap().offsets(0) == 4) damaged = i;
  }
  ASSERT_GE(damaged, 0);
  right.mutable_pieces(damaged)->set_crc_term(right.pieces(damaged).crc_term() ^
                                              0x100);
  auto a = Verify(left);
  auto b = Verify(right);
  VerifyResult ra = a.get(), rb = b.get();
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  // Both readers of the damaged chunk re-read it; the other chunk passed.
  ASSERT_EQ(ra->verify_locally_size(), 1);
  EXPECT_EQ(left.pieces(ra->verify_locally(0)).overlap().offsets(0), 4);
  EXPECT_THAT(rb->verify_locally(), ::testing::ElementsAre(damaged));
  EXPECT_EQ(ra->chunks_verified(), 1);
  EXPECT_EQ(rb->chunks_verified(), 1);

  // One rank loading only the left half alone covers no chunk completely.
  v1::VerifyLoadRequest alone = Pieces(PlanColumns(0, 0, 2, 1), 0, 1);
  VerifyResult rc = Verify(alone).get();
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(rc->verify_locally_size(), 2);
  EXPECT_EQ(rc->chunks_verified(), 0);
}

TEST_F(CoordinatorTest, VerifyLoadRoundExpiresAtTheDeadlineAndRetriesReplace) {
  options_.load_verify_deadline = absl::Milliseconds(300);
  Start();
  Save("job", 1, 2);
  v1::VerifyLoadRequest left = Pieces(PlanColumns(0, 0, 2), 0, 2);
  PlanColumns(1, 2, 2);  // rank 1 plans, then never reports (it died)
  // A retried call replaces the first; the first is answered ABORTED.
  auto first = Verify(left);
  auto retry = Verify(left);
  EXPECT_THAT(first.get(), StatusIs(absl::StatusCode::kAborted));
  VerifyResult r = retry.get();
  EXPECT_THAT(
      r, StatusIs(absl::StatusCode::kDeadlineExceeded,
                  AllOf(HasSubstr("ranks [1]"), HasSubstr("job 'job' step 1"),
                        HasSubstr("never called VerifyLoad"))));
}

TEST_F(CoordinatorTest, VerifyLoadRejectsBadRequests) {
  options_.load_join_grace = absl::Hours(1);  // rank 1 plans at the end
  Start();
  Save("job", 1, 2);
  const v1::VerifyLoadRequest good = Pieces(PlanColumns(0, 0, 2), 0, 2);
  ASSERT_EQ(good.pieces_size(), 2);
  auto expect = [&](v1::VerifyLoadRequest req, absl::StatusCode code,
                    const std::string& text) {
    VerifyResult r = Verify(req).get();
    EXPECT_THAT(r, StatusIs(code, HasSubstr(text)));
  };
  v1::VerifyLoadRequest req = good;
  req.set_rank(2);
  expect(req, absl::StatusCode::kInvalidArgument, "out of range");
  req = good;
  req.set_step(7);
  expect(req, absl::StatusCode::kNotFound, "step 7");
  req = good;
  req.set_job("../etc");
  expect(req, absl::StatusCode::kInvalidArgument, "../etc");
  req = good;
  req.mutable_pieces(1)->mutable_source()->set_offset(12345);
  expect(req, absl::StatusCode::kInvalidArgument,
         "rank 0 verifying its load of job 'job' step 1: piece 1 of 'w'");
  req = good;
  req.mutable_pieces(0)->set_fqn("b");
  expect(req, absl::StatusCode::kInvalidArgument, "belongs to 'w'");
  req = good;
  req.mutable_pieces(0)->mutable_overlap()->set_sizes(1, 9);
  expect(req, absl::StatusCode::kInvalidArgument, "not inside the stored");
  req = good;
  req.mutable_pieces(0)->mutable_source()->set_length(3);
  expect(req, absl::StatusCode::kInvalidArgument, "length 3");
  req = good;
  req.set_load_round(0);
  expect(req, absl::StatusCode::kFailedPrecondition, "no load round");
  req = good;
  req.set_load_round(good.load_round() + 1);
  expect(req, absl::StatusCode::kNotFound, "is over");
  req = good;
  req.set_world_size(3);
  expect(req, absl::StatusCode::kInvalidArgument, "by 2 ranks");
  req = good;
  req.set_rank(1);
  expect(req, absl::StatusCode::kInvalidArgument, "did not plan");
  // Nothing was parked by the bad calls: a good round still completes.
  auto a = Verify(good);
  VerifyResult b = Verify(Pieces(PlanColumns(1, 2, 2), 1, 2)).get();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->chunks_verified(), 2);
  EXPECT_TRUE(a.get().ok());
}

TEST_F(CoordinatorTest, ReadColumnsExpandToTheFullForm) {
  Start();
  Save("job", 1, 2);
  const v1::PlanLoadResponse full = PlanColumns(0, 1, 2, /*world=*/0);
  EXPECT_FALSE(full.has_read_columns());
  ASSERT_EQ(full.reads_size(), 2);
  EXPECT_FALSE(full.reads(0).has_chunk());
  v1::PlanLoadResponse expanded = PlanColumnsExpanded(0, 1, 2, /*world=*/0);
  ASSERT_EQ(expanded.reads_size(), 2);
  EXPECT_EQ(expanded.objects_size(), 2);  // one object per saving rank
  EXPECT_EQ(expanded.boxes_size(), 2);
  std::vector<uint32_t> chunks;
  for (v1::ReadItem& it : *expanded.mutable_reads()) {
    ASSERT_TRUE(it.has_chunk());
    chunks.push_back(it.chunk());
    it.clear_chunk();
  }
  // "w"'s two chunks, after "b"'s one (tensors in fqn order).
  EXPECT_THAT(chunks, ::testing::UnorderedElementsAre(1u, 2u));
  expanded.clear_objects();
  expanded.clear_boxes();
  EXPECT_EQ(expanded.SerializeAsString(), full.SerializeAsString());
  // The two forms of one layout are cached apart: asked twice more each,
  // each is answered in its own form (PlanColumnsExpanded checks that
  // columns come when asked for).
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(PlanColumns(0, 1, 2, 0).reads(0).has_chunk());
    EXPECT_TRUE(PlanColumnsExpanded(0, 1, 2, 0).reads(0).has_chunk());
  }
  EXPECT_EQ(coordinator_->stats().load_plans_from_cache, 2);
}

TEST_F(CoordinatorTest, ShortFormLoadRequestsArePlannedAsTheFullForm) {
  Start();
  Save("job", 1, 2);
  // Every tensor of the checkpoint ("b", then "w" in fqn order): the short
  // form applies.
  v1::PlanLoadRequest full = ColumnsRequest(0, 1, 2, /*world=*/0);
  v1::WantedChunk* b = full.add_wanted();
  b->mutable_tensor()->set_fqn("b");
  b->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  b->mutable_tensor()->add_global_shape(4);
  b->mutable_box()->add_offsets(1);
  b->mutable_box()->add_sizes(2);
  full.mutable_wanted()->SwapElements(0, 1);
  full.add_wanted_bytes("rng");
  v1::PlanLoadRequest wire;
  ASSERT_TRUE(convert::CompactWanted(full, &wire));
  EXPECT_EQ(wire.wanted_boxes_size(), 6);
  auto from_full = coordinator_->PlanLoad(full);
  auto from_short = coordinator_->PlanLoad(wire);
  ASSERT_TRUE(from_full.ok()) << from_full.status();
  ASSERT_TRUE(from_short.ok()) << from_short.status();
  EXPECT_FALSE(from_short->resend_wanted());
  EXPECT_EQ(from_short->reads_size(), 3);  // "b" from one rank, "w" from two
  EXPECT_EQ(from_short->bytes_entries_size(), 1);
  EXPECT_EQ(from_short->SerializeAsString(), from_full->SerializeAsString());
  // Cached by what was sent: the third short ask comes from the cache.
  ASSERT_TRUE(coordinator_->PlanLoad(wire).ok());
  EXPECT_EQ(coordinator_->stats().load_plans_from_cache, 0);
  auto cached = coordinator_->PlanLoad(wire);
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(coordinator_->stats().load_plans_from_cache, 1);
  EXPECT_EQ(cached->SerializeAsString(), from_full->SerializeAsString());
  EXPECT_EQ(coordinator_->stats().load_requests_short, 3);

  // Fewer tensors than the checkpoint's ("w" only): cairnd asks for them in
  // full, in the rank's load round, and plans nothing.
  const v1::PlanLoadRequest only_w = ColumnsRequest(1, 0, 2, /*world=*/2);
  v1::PlanLoadRequest only_w_wire;
  ASSERT_TRUE(convert::CompactWanted(only_w, &only_w_wire));
  auto resend = coordinator_->PlanLoad(only_w_wire);
  ASSERT_TRUE(resend.ok()) << resend.status();
  EXPECT_TRUE(resend->resend_wanted());
  EXPECT_EQ(resend->step(), 1);
  EXPECT_NE(resend->load_round(), 0u);
  EXPECT_EQ(resend->reads_size(), 0);
  auto again = coordinator_->PlanLoad(only_w);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->resend_wanted());
  EXPECT_EQ(again->load_round(), resend->load_round());
  EXPECT_EQ(again->reads_size(), 2);

  // A dtype other than the checkpoint's: asked in full, then told.
  v1::PlanLoadRequest half = full;
  half.mutable_wanted(1)->mutable_tensor()->set_dtype(v1::DTYPE_BFLOAT16);
  ASSERT_TRUE(convert::CompactWanted(half, &wire));
  auto resend_half = coordinator_->PlanLoad(wire);
  ASSERT_TRUE(resend_half.ok());
  EXPECT_TRUE(resend_half->resend_wanted());
  auto refused = coordinator_->PlanLoad(half);
  EXPECT_THAT(
      refused,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("'w': saved float32 [8, 4], requested bfloat16")));

  // Malformed short forms are refused, naming the rank and the checkpoint.
  ASSERT_TRUE(convert::CompactWanted(full, &wire));
  v1::PlanLoadRequest extra = wire;
  extra.add_wanted_boxes(0);
  auto r = coordinator_->PlanLoad(extra);
  EXPECT_THAT(
      r,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("rank 0 loading job 'job' step 1: wanted_boxes holds "
                         "7 values but the 2 tensors")));
  v1::PlanLoadRequest both = wire;
  *both.add_wanted() = full.wanted(0);
  r = coordinator_->PlanLoad(both);
  EXPECT_THAT(r,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("both tensors_digest and 1 wanted chunks")));
  v1::PlanLoadRequest outside = wire;
  outside.set_wanted_boxes(0, 3);  // "b" [3, 5) of [4]
  r = coordinator_->PlanLoad(outside);
  EXPECT_THAT(
      r,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("'b' wanted chunk 0: chunk [3:5] exceeds shape [4]")));
}

TEST_F(CoordinatorTest, VerifyLoadTakesPiecesByChunkId) {
  options_.load_join_grace = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  // Rank 0 names its chunks by id (read columns), rank 1 by location (a
  // client of the full form): the round combines both.
  const v1::VerifyLoadRequest left = Pieces(PlanColumnsExpanded(0, 0, 2), 0, 2);
  ASSERT_EQ(left.pieces_size(), 2);
  EXPECT_TRUE(left.pieces(0).has_chunk());
  EXPECT_TRUE(left.pieces(0).fqn().empty());
  auto expect = [&](v1::VerifyLoadRequest req, const std::string& text) {
    VerifyResult r = Verify(req).get();
    EXPECT_THAT(r,
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(text)));
  };
  v1::VerifyLoadRequest bad = left;
  bad.mutable_pieces(1)->set_chunk(3);
  expect(bad,
         "rank 0 verifying its load of job 'job' step 1: piece 1 of stored "
         "chunk 3: the checkpoint has 3 stored chunks");
  bad = left;
  bad.mutable_pieces(0)->mutable_overlap()->set_offsets(0, 3);
  expect(bad,
         "piece 0 of stored chunk 1 of 'w': box [3:7, 0:2] is empty or "
         "not inside the stored chunk [0:4, 0:4]");
  // A hostile report: 60,000 pieces, the first with a million dims. cairnd
  // sizes its packed pieces from the first piece's dims (bounded: it once
  // asked for ~250 GB here) and refuses the piece.
  bad = left;
  for (int i = 0; i < (1 << 20); ++i) {
    bad.mutable_pieces(0)->mutable_overlap()->add_offsets(0);
  }
  while (bad.pieces_size() < 60000) *bad.add_pieces() = left.pieces(1);
  expect(bad,
         "piece 0 of stored chunk 1 of 'w': chunk of 'w' has 1048578 "
         "offsets but 2 sizes");
  auto a = Verify(left);
  VerifyResult b = Verify(Pieces(PlanColumns(1, 2, 2), 1, 2)).get();
  VerifyResult ra = a.get();
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(ra->verify_locally_size(), 0);
  EXPECT_EQ(b->verify_locally_size(), 0);
  EXPECT_EQ(ra->chunks_verified(), 2);
  EXPECT_EQ(b->chunks_verified(), 2);
}

// `latest` is resolved once per load round: a commit landing between two
// ranks' PlanLoads does not hand them different steps.
TEST_F(CoordinatorTest, LatestIsResolvedOncePerLoadRoundWhileACommitLands) {
  options_.load_join_grace = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  v1::PlanLoadResponse a = PlanColumns(0, 0, 2, 2, /*step=*/-1);
  EXPECT_EQ(a.step(), 1);
  Save("job", 2, 2);  // commits between the ranks' PlanLoads
  ASSERT_EQ(LatestStep("job"), 2);
  v1::PlanLoadResponse b = PlanColumns(1, 2, 2, 2, /*step=*/-1);
  ASSERT_EQ(b.step(), 1);  // (a wrong step would park rank 1 alone below)
  ASSERT_EQ(b.load_round(), a.load_round());
  // Both report; the round verifies both stored chunks of step 1.
  auto va = Verify(Pieces(a, 0, 2));
  VerifyResult vb = Verify(Pieces(b, 1, 2)).get();
  ASSERT_TRUE(vb.ok()) << vb.status();
  EXPECT_EQ(vb->chunks_verified(), 2);
  ASSERT_TRUE(va.get().ok());
  // The next load is a new round: the newest step.
  EXPECT_EQ(PlanColumns(0, 0, 2, 2, /*step=*/-1).step(), 2);
}

// A retried PlanLoad (its answer was lost) gets the same round and step.
TEST_F(CoordinatorTest, RetriedPlanLoadRejoinsItsRound) {
  options_.load_join_grace = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  v1::PlanLoadResponse a = PlanColumns(0, 0, 2, 2, -1);
  Save("job", 2, 2);
  v1::PlanLoadResponse again = PlanColumns(0, 0, 2, 2, -1);
  ASSERT_EQ(again.step(), 1);
  EXPECT_EQ(again.load_round(), a.load_round());
}

// Ranks of one load that disagree on world_size are refused at once, with
// both sizes named; the rank already waiting in VerifyLoad gets it too
// (it used to wait for the verify deadline and then be told OK).
TEST_F(CoordinatorTest, LoadRanksDisagreeingOnWorldSizeFailAtOnce) {
  options_.load_join_grace = absl::Hours(1);
  options_.load_verify_deadline = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  v1::PlanLoadResponse a = PlanColumns(0, 0, 2, 2);
  auto parked = Verify(Pieces(a, 0, 2));
  absl::StatusOr<v1::PlanLoadResponse> b =
      coordinator_->PlanLoad(ColumnsRequest(1, 2, 2, /*world=*/3));
  ASSERT_THAT(b, StatusIs(absl::StatusCode::kInvalidArgument));
  const std::string msg(b.status().message());
  EXPECT_THAT(msg, HasSubstr("job 'job' step 1"));
  EXPECT_THAT(msg, HasSubstr("rank 1 says world_size 3"));
  EXPECT_THAT(msg, HasSubstr("ranks [0] (1 of 2)"));
  EXPECT_THAT(msg, HasSubstr("say world_size 2"));
  ASSERT_EQ(parked.wait_for(std::chrono::seconds(60)),
            std::future_status::ready);
  VerifyResult r = parked.get();
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("world_size 3")));
}

// A rank loading alone (its peers load later, or never) is not held for
// absent ranks: the round's membership closes after the join grace, and its
// partly read chunks, which nobody else read, are sent back to verify
// locally. The next rank forms its own round.
TEST_F(CoordinatorTest, RanksLoadingOneAfterAnotherWaitOnlyForTheGrace) {
  options_.load_join_grace = absl::Milliseconds(100);
  options_.load_verify_deadline = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    v1::PlanLoadResponse p = PlanColumns(rank, rank * 2, 2);
    auto v = Verify(Pieces(p, rank, 2));
    ASSERT_EQ(v.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    VerifyResult r = v.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->verify_locally_size(), 2);
    EXPECT_EQ(r->chunks_verified(), 0);
  }
}

// A report without pieces (the rank's load failed, or it read every chunk
// whole) is answered at once; a rank whose PlanLoad is refused leaves the
// round, and the others complete without it.
TEST_F(CoordinatorTest, EmptyReportsAreAnsweredAtOnceAndRefusedRanksLeave) {
  options_.load_join_grace = absl::Hours(1);
  options_.load_verify_deadline = absl::Hours(1);
  Start();
  Save("job", 1, 3);
  v1::PlanLoadResponse a = PlanColumns(0, 0, 2, 3);
  v1::PlanLoadResponse b = PlanColumns(1, 2, 2, 3);
  v1::PlanLoadRequest bad = ColumnsRequest(2, 0, 4, 3);
  bad.mutable_wanted(0)->mutable_tensor()->set_fqn("nope");
  EXPECT_THAT(coordinator_->PlanLoad(bad),
              StatusIs(absl::StatusCode::kNotFound));
  v1::VerifyLoadRequest empty = Pieces(a, 0, 3);
  empty.clear_pieces();
  VerifyResult e = Verify(empty).get();  // not parked
  ASSERT_TRUE(e.ok()) << e.status();
  // Rank 2 (refused) is not a member: the round is open (grace) with ranks
  // 0 and 1; rank 2 plans again, fine this time, and completes it.
  auto vb = Verify(Pieces(b, 1, 3));
  v1::PlanLoadResponse c = PlanColumns(2, 0, 2, 3);
  EXPECT_EQ(c.load_round(), a.load_round());
  v1::VerifyLoadRequest vc = Pieces(c, 2, 3);
  vc.clear_pieces();
  ASSERT_TRUE(Verify(vc).get().ok());
  VerifyResult rb = vb.get();
  ASSERT_TRUE(rb.ok()) << rb.status();
}

// A load by 6 ranks that read only "w" of the checkpoint ("b" and "w") and
// verify by reading whole: each rank's short-form PlanLoad is answered
// resend_wanted and it plans again in full. The resends land in the rank's
// first round, whether or not the world completed it in between, so the
// step's next load, by 3 ranks, is its own load (it was refused
// INVALID_ARGUMENT, the resends after the 6th rank's first PlanLoad having
// opened a second round of 6 that never filled).
TEST_F(CoordinatorTest, ResendsOfALoadLeaveNoRoundToRefuseTheNextLoad) {
  options_.load_join_grace = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  const auto plan = [&](int rank, int world) {
    SCOPED_TRACE(absl::StrCat("rank ", rank, " of ", world));
    v1::PlanLoadRequest full = ColumnsRequest(rank, rank % 4, 1, world);
    full.set_verify_in_round(false);
    v1::PlanLoadRequest wire;
    EXPECT_TRUE(convert::CompactWanted(full, &wire));
    auto asked = coordinator_->PlanLoad(wire);
    EXPECT_TRUE(asked.ok()) << asked.status();
    if (!asked.ok()) return asked.status();
    EXPECT_TRUE(asked->resend_wanted());
    auto planned = coordinator_->PlanLoad(full);
    if (!planned.ok()) return planned.status();
    EXPECT_FALSE(planned->resend_wanted());
    EXPECT_EQ(planned->load_round(), asked->load_round());
    EXPECT_EQ(planned->reads_size(), 2);
    return absl::OkStatus();
  };
  for (int rank = 0; rank < 6; ++rank) {
    absl::Status s = plan(rank, 6);
    ASSERT_TRUE(s.ok()) << s;
  }
  for (int rank = 0; rank < 3; ++rank) {
    absl::Status s = plan(rank, 3);
    ASSERT_TRUE(s.ok()) << s;
  }
}

// Live load rounds are capped (max_load_rounds_per_job): a PlanLoad that
// would open one more is refused naming the job and the cap, and the
// rounds' own ranks still plan.
TEST_F(CoordinatorTest, LoadRoundsOfAJobAreCapped) {
  options_.max_load_rounds_per_job = 1;
  options_.load_join_grace = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  Save("job", 2, 2);
  v1::PlanLoadResponse a = PlanColumns(0, 0, 2, 2, 1);
  auto other = coordinator_->PlanLoad(ColumnsRequest(0, 0, 2, 2, 2));
  EXPECT_THAT(
      other,
      StatusIs(
          absl::StatusCode::kResourceExhausted,
          AllOf(HasSubstr("load of job 'job' step 2: rank 0 of 2 would open a "
                          "load round, but job 'job' has 1 live load rounds"),
                HasSubstr("--max-load-rounds-per-job 1"))));
  v1::PlanLoadResponse b = PlanColumns(1, 2, 2, 2, 1);
  EXPECT_EQ(b.load_round(), a.load_round());
}

// A checkpoint of many tensors (more than the reader queues for the
// planner's builder at once) is indexed whole and in order: every tensor,
// asked for whole, is planned from each rank's chunk of it, with its own
// rows and bytes.
TEST_F(CoordinatorTest, CheckpointOfManyTensorsIsPlannedWhole) {
  Start();
  constexpr int kWorld = 3;
  constexpr int kTensors = 70;
  auto rows_of = [](int t) -> int64_t { return 3 + t % 7; };
  std::vector<std::future<BeginResult>> begins;
  for (int r = 0; r < kWorld; ++r) {
    v1::LocalSavePlan p;
    p.set_rank(r);
    for (int t = 0; t < kTensors; ++t) {
      // Rank r holds rows [r * rows / 3, (r + 1) * rows / 3) of tensor t.
      const int64_t rows = rows_of(t);
      const int64_t begin = r * rows / kWorld;
      const int64_t end = (r + 1) * rows / kWorld;
      v1::WriteItem* it = p.add_items();
      it->set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
      it->mutable_tensor()->set_fqn(absl::StrCat("layer", t, ".weight"));
      it->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
      it->mutable_tensor()->add_global_shape(rows);
      it->mutable_tensor()->add_global_shape(2);
      it->mutable_chunk()->add_offsets(begin);
      it->mutable_chunk()->add_offsets(0);
      it->mutable_chunk()->add_sizes(end - begin);
      it->mutable_chunk()->add_sizes(2);
      it->set_length(static_cast<uint64_t>(end - begin) * 2 * 4);
    }
    begins.push_back(Begin("many", 1, r, kWorld, p));
  }
  std::vector<v1::BeginSaveResponse> plans;
  for (auto& f : begins) {
    BeginResult b = f.get();
    ASSERT_TRUE(b.ok()) << b.status();
    plans.push_back(*b);
  }
  std::vector<std::future<CommitResult>> commits;
  for (int r = 0; r < kWorld; ++r) {
    commits.push_back(Commit(Write("many", 1, r, plans[r])));
  }
  for (auto& f : commits) ASSERT_TRUE(f.get().ok());

  v1::PlanLoadRequest req;
  req.set_job("many");
  req.set_step(1);
  for (int t = kTensors - 1; t >= 0; --t) {  // asked for in reverse
    v1::WantedChunk* w = req.add_wanted();
    w->mutable_tensor()->set_fqn(absl::StrCat("layer", t, ".weight"));
    w->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
    w->mutable_tensor()->add_global_shape(rows_of(t));
    w->mutable_tensor()->add_global_shape(2);
    w->mutable_box()->add_offsets(0);
    w->mutable_box()->add_offsets(0);
    w->mutable_box()->add_sizes(rows_of(t));
    w->mutable_box()->add_sizes(2);
  }
  absl::StatusOr<v1::PlanLoadResponse> a = coordinator_->PlanLoad(req);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->reads_size(), kWorld * kTensors);
  std::vector<int64_t> rows_read(kTensors, 0);
  for (const v1::ReadItem& item : a->reads()) {
    const int t = kTensors - 1 - item.dest_index();
    ASSERT_GE(t, 0);
    ASSERT_LT(t, kTensors);
    EXPECT_EQ(item.fqn(), absl::StrCat("layer", t, ".weight"));
    EXPECT_EQ(item.overlap().sizes(1), 2);
    EXPECT_EQ(item.source().length(),
              static_cast<uint64_t>(item.overlap().sizes(0)) * 2 * 4);
    rows_read[t] += item.overlap().sizes(0);
  }
  for (int t = 0; t < kTensors; ++t) EXPECT_EQ(rows_read[t], rows_of(t)) << t;
}

// A MANIFEST damaged on storage after its commit: planning a load from it
// is DATA_LOSS naming the job and step (the index is never built from it),
// and the coordinator goes on planning the job's other checkpoints.
// Waits (up to a minute: a stuck preparation fails the test, it does not
// hang it) until `done` holds.
template <typename Done>
bool Eventually(Done done) {
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Each commit indexes its checkpoint for PlanLoad on a worker, before any
// load asks: the loads of it then build nothing. A newer commit of the job
// drops the job's older indexes (they are built again when loaded), not
// other jobs'.
TEST_F(CoordinatorTest,
       LoadIndexIsPreparedAfterCommitAndOlderStepsLeaveMemory) {
  Start();
  auto prepared = [&](int64_t n) {
    return Eventually(
        [&] { return coordinator_->stats().loads_prepared == n; });
  };
  auto load = [&](const std::string& job, int64_t step) {
    v1::PlanLoadRequest req = ColumnsRequest(0, 0, 4, /*world=*/0, step);
    req.set_job(job);
    req.set_verify_in_round(false);
    absl::StatusOr<v1::PlanLoadResponse> a = coordinator_->PlanLoad(req);
    EXPECT_TRUE(a.ok()) << job << " step " << step << ": " << a.status();
    if (a.ok()) {
      EXPECT_EQ(a->reads_size(), 2) << job << " step " << step;
    }
  };
  Save("job", 1, 2);
  ASSERT_TRUE(prepared(1));
  EXPECT_EQ(coordinator_->stats().manifests_loaded, 1);
  load("job", 1);
  EXPECT_EQ(coordinator_->stats().manifests_loaded, 1);
  EXPECT_THAT(coordinator_->metrics().Render(),
              HasSubstr("cairn_load_indexes_prepared_total 1\n"));
  EXPECT_THAT(coordinator_->metrics().Render(),
              Not(HasSubstr("cairn_load_index_bytes 0\n")));

  Save("other", 1, 2);
  ASSERT_TRUE(prepared(2));
  Save("job", 2, 2);
  ASSERT_TRUE(prepared(3));
  EXPECT_EQ(coordinator_->stats().manifests_loaded, 3);
  load("job", 2);
  load("other", 1);
  EXPECT_EQ(coordinator_->stats().manifests_loaded, 3);
  load("job", 1);  // dropped when step 2 was prepared
  EXPECT_EQ(coordinator_->stats().manifests_loaded, 4);
  load("job", 1);
  EXPECT_EQ(coordinator_->stats().manifests_loaded, 4);
  EXPECT_THAT(coordinator_->metrics().Render(),
              HasSubstr("cairn_load_indexes_built_total 4\n"));
}

// --prepare-loads=false: the first load of a checkpoint builds its index.
// An index larger than --load-index-cache-mib is not kept: each load builds
// it again (and cairnd warns), prepared or not.
TEST_F(CoordinatorTest, LoadIndexesAreBuiltByLoadsWhenNotPreparedOrNotKept) {
  options_.prepare_loads = false;
  Start();
  Save("job", 1, 2);
  EXPECT_EQ(coordinator_->stats().manifests_loaded, 0);
  v1::PlanLoadRequest req = ColumnsRequest(0, 0, 4, /*world=*/0);
  req.set_verify_in_round(false);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::PlanLoadResponse> a = coordinator_->PlanLoad(req);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->reads_size(), 2);
    req.set_rank(i + 1);  // another rank: not an answer from the cache
  }
  EXPECT_EQ(coordinator_->stats().manifests_loaded, 1);
  EXPECT_EQ(coordinator_->stats().loads_prepared, 0);

  coordinator_.reset();
  options_.prepare_loads = true;
  options_.load_index_cache_bytes = 1;
  Start();
  Save("job", 2, 2);
  ASSERT_TRUE(
      Eventually([&] { return coordinator_->stats().loads_prepared == 1; }));
  req.set_step(2);
  for (int i = 0; i < 2; ++i) {
    req.set_rank(10 + i);
    absl::StatusOr<v1::PlanLoadResponse> a = coordinator_->PlanLoad(req);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->reads_size(), 2);
  }
  EXPECT_EQ(coordinator_->stats().manifests_loaded, 3);
  EXPECT_THAT(coordinator_->metrics().Render(),
              HasSubstr("cairn_load_index_bytes 0\n"));
}

TEST_F(CoordinatorTest, DamagedManifestIsDataLossAndOtherStepsStillLoad) {
  UsePosix();
  // Damaged after the commit: a load index prepared at the commit would be
  // the manifest as read back then (see LoadIndexIsPreparedAfterCommit).
  options_.prepare_loads = false;
  Start();
  Save("job", 1, 2);
  Save("job", 2, 2);
  const std::filesystem::path manifest =
      std::filesystem::path(data_dir_) / storage::ManifestKey("job", 2);
  const auto size = std::filesystem::file_size(manifest);
  ASSERT_GT(size, 16u);
  {
    std::fstream f(manifest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(size / 2));
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  v1::PlanLoadRequest req = ColumnsRequest(0, 0, 4, 1, 2);
  req.set_world_size(0);  // not in a load round: each ask is planned
  req.set_verify_in_round(false);
  for (int attempt = 0; attempt < 2; ++attempt) {  // not cached as good
    absl::StatusOr<v1::PlanLoadResponse> bad = coordinator_->PlanLoad(req);
    ASSERT_THAT(bad, StatusIs(absl::StatusCode::kDataLoss,
                              AllOf(HasSubstr("'job'"), HasSubstr("2"))));
  }
  req.set_step(1);
  absl::StatusOr<v1::PlanLoadResponse> good = coordinator_->PlanLoad(req);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->reads_size(), 2);
}

}  // namespace
}  // namespace cairn::coordinator
