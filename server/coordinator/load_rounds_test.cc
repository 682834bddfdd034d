// Load rounds alone (load_rounds.h), driven with explicit times and an inline
// scheduler: membership by full world or join grace after every report,
// `latest` once per round, world-size disagreement, report deadlines,
// retries, and the pieces of several ranks combined against a hand-made
// stored tensor.
#include "server/coordinator/load_rounds.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/box.h"
#include "storage/checksum.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::StatusIs;
using planner::ChunkBox;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using VerifyResult = absl::StatusOr<v1::VerifyLoadResponse>;

const absl::Time kT0 = absl::FromUnixSeconds(2000000);
constexpr size_t kElem = 4;  // float32

// "w" [8, 4] float32 stored as rows 0-3 and rows 4-7, and their bytes.
struct Stored {
  std::unique_ptr<planner::LoadPlanner> planner;
  std::string bytes[2];
  ChunkBox boxes[2] = {ChunkBox{{0, 0}, {4, 4}}, ChunkBox{{4, 0}, {4, 4}}};
};

std::shared_ptr<const Stored> MakeStored() {
  auto s = std::make_shared<Stored>();
  planner::StoredTensor t;
  t.fqn = "w";
  t.dtype = planner::DType::kFloat32;
  t.global_shape = {8, 4};
  for (int c = 0; c < 2; ++c) {
    s->bytes[c].resize(4 * 4 * kElem);
    for (size_t i = 0; i < s->bytes[c].size(); ++i) {
      s->bytes[c][i] = static_cast<char>(i * 7 + c * 13);
    }
    planner::StoredChunk& chunk = t.chunks.emplace_back();
    chunk.box = s->boxes[c];
    chunk.location = {"data-0", c * s->bytes[c].size(), s->bytes[c].size()};
    chunk.crc32c = storage::Crc32c(s->bytes[c]);
  }
  s->planner = planner::LoadPlanner::Create({std::move(t)}).value();
  return s;
}

class LoadRoundsTest : public ::testing::Test {
 protected:
  LoadRoundsTest() : stored_(MakeStored()) { Make(); }

  void Make(absl::Duration grace = absl::Seconds(2),
            absl::Duration deadline = absl::Seconds(10)) {
    rounds_ = std::make_unique<LoadRounds>(
        LoadRounds::Options{grace, deadline}, 100,
        [](std::function<void()> work) { work(); });
  }
  LoadRounds::Joined Join(int rank, int world = 2, int64_t step = 5,
                          absl::Time now = kT0, int64_t newest = 5) {
    auto j = rounds_->Join("job", rank, world, true, step, newest, now);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? *j : LoadRounds::Joined();
  }
  // The pieces `rank` read of the first `chunks` stored chunks: columns
  // [2 * rank, 2 * rank + 2), with chunk 1's term damaged when `damage`.
  LoadRounds::Pieces Pieces(int rank, bool damage = false, int chunks = 2) {
    LoadRounds::Pieces pieces;
    for (int c = 0; c < chunks; ++c) {
      const ChunkBox& box = stored_->boxes[c];
      ChunkBox piece{{box.offsets[0], 2 * rank}, {4, 2}};
      storage::Crc32cPieces crc;
      for (const planner::CopySegment& s :
           planner::CopySegments(box, piece, piece, kElem)) {
        crc.Add(s.src_offset, stored_->bytes[c].data() + s.src_offset,
                s.length);
      }
      uint32_t term = crc.Finish(stored_->bytes[c].size());
      if (damage && c == 1) term ^= 1;
      pieces.Add(stored_->planner->Id(0, c), box, term, piece.offsets,
                 piece.sizes);
    }
    return pieces;
  }
  // Rank `rank` reports; its answer lands in results_[rank].
  void Report(const LoadRounds::Joined& j, int rank, LoadRounds::Pieces pieces,
              int world = 2, absl::Time now = kT0, int64_t step = 5) {
    rounds_->Report(
        j.round, "job", step, rank, world, "rank " + std::to_string(rank),
        std::shared_ptr<const planner::LoadPlanner>(stored_,
                                                    stored_->planner.get()),
        std::move(pieces), now,
        [this, rank](VerifyResult r) { results_[rank].push_back(r); });
  }

  std::shared_ptr<const Stored> stored_;
  std::unique_ptr<LoadRounds> rounds_;
  std::map<int, std::vector<VerifyResult>> results_;
};

// Packed pieces give back every box, id and term as added: boxes of 0-5
// dims anywhere in int64's range (1- to 10-byte varints), stored boxes
// reaching 2^63 - 1.
TEST(LoadRoundsPiecesTest, EveryPieceComesBackAsAdded) {
  std::mt19937_64 rng(20261128);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  struct Added {
    uint32_t id;
    uint32_t term;
    ChunkBox stored, piece;
  };
  std::vector<Added> added;
  LoadRounds::Pieces pieces;
  pieces.Reserve(5000);
  for (int i = 0; i < 5000; ++i) {
    Added a{static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()), {}, {}};
    const int dims = static_cast<int>(rng() % 6);
    for (int d = 0; d < dims; ++d) {
      // Sizes from 1 to ~2^62, by a random number of bits.
      const int64_t size = 1 + static_cast<int64_t>(rng() >> (2 + rng() % 62));
      const int64_t offset = rng() % 4 == 0
                                 ? kMax - size
                                 : static_cast<int64_t>(rng() % (kMax - size));
      a.stored.offsets.push_back(offset);
      a.stored.sizes.push_back(size);
      const int64_t piece_size = 1 + static_cast<int64_t>(rng() % size);
      a.piece.offsets.push_back(
          offset + static_cast<int64_t>(rng() % (size - piece_size + 1)));
      a.piece.sizes.push_back(piece_size);
    }
    pieces.Add(a.id, a.stored, a.term, a.piece.offsets, a.piece.sizes);
    added.push_back(std::move(a));
  }
  ASSERT_EQ(pieces.size(), added.size());
  ChunkPieceReport report;
  for (size_t i = 0; i < added.size(); ++i) {
    const size_t j = (i * 7919) % added.size();  // out of order, as Finish
    pieces.ReportInto(j, 3, added[j].stored, &report);
    EXPECT_EQ(pieces.chunk_id(j), added[j].id);
    EXPECT_EQ(report.rank, 3);
    EXPECT_EQ(report.index, static_cast<int>(j));
    EXPECT_EQ(report.crc_term, added[j].term);
    EXPECT_EQ(report.overlap, added[j].piece)
        << j << ": " << planner::BoxToString(report.overlap) << " vs "
        << planner::BoxToString(added[j].piece);
  }
}

TEST_F(LoadRoundsTest, FullRoundCombinesThePiecesOfEveryRank) {
  LoadRounds::Joined a = Join(0), b = Join(1);
  EXPECT_EQ(a.round, 100u);
  EXPECT_EQ(b.round, a.round);
  EXPECT_EQ(b.step, 5);
  Report(a, 0, Pieces(0));
  EXPECT_TRUE(results_[0].empty());  // parked until rank 1 reports
  Report(b, 1, Pieces(1));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results_[r].size(), 1u) << r;
    ASSERT_TRUE(results_[r][0].ok()) << results_[r][0].status();
    EXPECT_EQ(results_[r][0]->chunks_verified(), 2);
    EXPECT_THAT(results_[r][0]->verify_locally(), IsEmpty());
  }
  const LoadRounds::Stats stats = rounds_->stats();
  EXPECT_EQ(stats.reports, 2);
  EXPECT_EQ(stats.chunks_verified, 2);
  EXPECT_EQ(stats.chunks_unverified, 0);
  EXPECT_EQ(stats.live_rounds, 0);
}

// A round over many tensors combined on 1-5 threads (shards of tensors)
// gives every rank the answer an oracle expects: a stored chunk is verified
// when both ranks read their half with the right terms, else each reader
// gets its piece's index back, in the order the rank reported them.
TEST(LoadRoundsShardsTest, CombiningOnSeveralThreadsAnswersAsTheOracle) {
  std::mt19937_64 rng(23);
  constexpr int kTensors = 37;
  // Tensor t: [8, 4] float32 stored as rows 0-3 and 4-7, random bytes.
  std::vector<planner::StoredTensor> tensors;
  std::vector<std::string> bytes;  // by 2 * t + c
  for (int t = 0; t < kTensors; ++t) {
    planner::StoredTensor& st = tensors.emplace_back();
    // Zero-padded: the planner orders tensors by fqn, and Id(t, c) below
    // names them in this order.
    st.fqn = (t < 10 ? "t0" : "t") + std::to_string(t);
    st.dtype = planner::DType::kFloat32;
    st.global_shape = {8, 4};
    for (int c = 0; c < 2; ++c) {
      std::string& b = bytes.emplace_back(4 * 4 * kElem, '\0');
      for (char& x : b) x = static_cast<char>(rng());
      planner::StoredChunk& chunk = st.chunks.emplace_back();
      chunk.box = ChunkBox{{4 * c, 0}, {4, 4}};
      chunk.location = {"data-0", (2 * t + c) * b.size(), b.size()};
      chunk.crc32c = storage::Crc32c(b);
    }
  }
  std::shared_ptr<const planner::LoadPlanner> planner =
      planner::LoadPlanner::Create(std::move(tensors)).value();
  // What each rank reads of each chunk: 0 = nothing, 1 = its half, 2 = its
  // half with a damaged term.
  std::vector<int> reads[2];
  for (int rank = 0; rank < 2; ++rank) {
    for (int i = 0; i < 2 * kTensors; ++i) {
      const uint64_t r = rng() % 8;
      reads[rank].push_back(r == 0 ? 0 : r == 1 ? 2 : 1);
    }
  }
  std::vector<int> expected_local[2];
  int64_t expected_verified[2] = {0, 0};
  int64_t verified_chunks = 0;
  int index[2] = {0, 0};
  for (int i = 0; i < 2 * kTensors; ++i) {
    const bool ok = reads[0][i] == 1 && reads[1][i] == 1;
    verified_chunks += ok;
    for (int rank = 0; rank < 2; ++rank) {
      if (reads[rank][i] == 0) continue;
      if (ok) {
        ++expected_verified[rank];
      } else {
        expected_local[rank].push_back(index[rank]);
      }
      ++index[rank];
    }
  }
  for (int threads : {1, 2, 3, 5}) {
    LoadRounds::Options options;
    options.combine_threads = threads;
    options.min_pieces_per_thread = 1;
    LoadRounds rounds(options, 100, [](std::function<void()> work) { work(); });
    std::map<int, VerifyResult> results;
    std::vector<LoadRounds::Joined> joined;
    for (int rank = 0; rank < 2; ++rank) {
      joined.push_back(rounds.Join("job", rank, 2, true, 5, 5, kT0).value());
    }
    for (int rank = 0; rank < 2; ++rank) {
      LoadRounds::Pieces pieces;
      for (int i = 0; i < 2 * kTensors; ++i) {
        if (reads[rank][i] == 0) continue;
        const int t = i / 2, c = i % 2;
        const ChunkBox box{{4 * c, 0}, {4, 4}};
        const ChunkBox piece{{4 * c, 2 * rank}, {4, 2}};
        storage::Crc32cPieces crc;
        for (const planner::CopySegment& s :
             planner::CopySegments(box, piece, piece, kElem)) {
          crc.Add(s.src_offset, bytes[i].data() + s.src_offset, s.length);
        }
        uint32_t term = crc.Finish(bytes[i].size());
        // Different damage for each rank: two damaged halves must not
        // cancel out.
        if (reads[rank][i] == 2) term ^= 1u << rank;
        pieces.Add(planner->Id(t, c), box, term, piece.offsets, piece.sizes);
      }
      rounds.Report(joined[rank].round, "job", 5, rank, 2, "rank", planner,
                    std::move(pieces), kT0,
                    [&results, rank](VerifyResult r) { results[rank] = r; });
    }
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_EQ(results.count(rank), 1u) << threads;
      ASSERT_TRUE(results[rank].ok()) << results[rank].status();
      EXPECT_EQ(results[rank]->chunks_verified(), expected_verified[rank])
          << threads << " threads, rank " << rank;
      EXPECT_THAT(results[rank]->verify_locally(),
                  ::testing::ElementsAreArray(expected_local[rank]))
          << threads << " threads, rank " << rank;
    }
    EXPECT_EQ(rounds.stats().chunks_verified, verified_chunks) << threads;
  }
}

TEST_F(LoadRoundsTest, RoundOfRanksThatDoNotVerifyFinishesWithoutAManifest) {
  // Ranks that only take the round's step never call Report: the complete
  // round finishes with no manifest and nothing to combine (cairnd crashed
  // here once Finish indexed the manifest's chunks).
  for (int rank = 0; rank < 3; ++rank) {
    auto j = rounds_->Join("job", rank, 3, /*reports=*/false, 5, 5, kT0);
    ASSERT_TRUE(j.ok()) << j.status();
  }
  const LoadRounds::Stats stats = rounds_->stats();
  EXPECT_EQ(stats.live_rounds, 0);
  EXPECT_EQ(stats.chunks_verified, 0);
  EXPECT_EQ(stats.chunks_unverified, 0);
  // One rank reports (pieces of one chunk), the other two do not verify.
  LoadRounds::Joined a = Join(0, 3, 5, kT0 + absl::Seconds(5));
  for (int rank = 1; rank < 3; ++rank) {
    ASSERT_TRUE(rounds_
                    ->Join("job", rank, 3, /*reports=*/false, 5, 5,
                           kT0 + absl::Seconds(5))
                    .ok());
  }
  Report(a, 0, Pieces(0, /*damage=*/false, /*chunks=*/1), 3,
         kT0 + absl::Seconds(5));
  ASSERT_EQ(results_[0].size(), 1u);
  ASSERT_TRUE(results_[0][0].ok()) << results_[0][0].status();
  EXPECT_EQ(results_[0][0]->chunks_verified(), 0);
  EXPECT_THAT(results_[0][0]->verify_locally(), ElementsAre(0));
}

TEST_F(LoadRoundsTest, DamagedChunkIsSentBackToEveryReader) {
  LoadRounds::Joined a = Join(0), b = Join(1);
  Report(a, 0, Pieces(0));
  Report(b, 1, Pieces(1, /*damage=*/true));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results_[r].size(), 1u);
    ASSERT_TRUE(results_[r][0].ok());
    EXPECT_EQ(results_[r][0]->chunks_verified(), 1);
    EXPECT_THAT(results_[r][0]->verify_locally(), ElementsAre(1)) << r;
  }
  EXPECT_EQ(rounds_->stats().chunks_unverified, 1);
}

TEST_F(LoadRoundsTest, LatestIsResolvedOncePerRound) {
  EXPECT_THAT(rounds_->Join("job", 0, 2, true, -1, -1, kT0),
              StatusIs(absl::StatusCode::kNotFound));
  LoadRounds::Joined a = Join(0, 2, -1, kT0, /*newest=*/5);
  EXPECT_EQ(a.step, 5);
  // A commit of step 6 lands before rank 1 plans: it still gets step 5.
  LoadRounds::Joined b = Join(1, 2, -1, kT0 + absl::Seconds(1), 6);
  EXPECT_EQ(b.step, 5);
  EXPECT_EQ(b.round, a.round);
  // A retry of rank 0 finds its round and step again.
  LoadRounds::Joined again = Join(0, 2, -1, kT0 + absl::Seconds(1), 6);
  EXPECT_EQ(again.round, a.round);
  EXPECT_EQ(again.step, 5);
  Report(a, 0, {});
  Report(b, 1, {});
  // The next load is a new round of the newest step.
  LoadRounds::Joined next = Join(0, 2, -1, kT0 + absl::Seconds(2), 6);
  EXPECT_EQ(next.step, 6);
  EXPECT_NE(next.round, a.round);
}

TEST_F(LoadRoundsTest, WorldSizeDisagreementFailsTheRoundAndItsWaiters) {
  LoadRounds::Joined a = Join(0, 3);
  Report(a, 0, Pieces(0), 3);
  EXPECT_TRUE(results_[0].empty());
  auto b = rounds_->Join("job", 1, 2, true, 5, 5, kT0);
  ASSERT_THAT(
      b, StatusIs(
             absl::StatusCode::kInvalidArgument,
             "load of job 'job' step 5: rank 1 says world_size 2 but ranks "
             "[0] (1 of 3) of the load say world_size 3; every rank of a load "
             "must pass the same world_size"));
  ASSERT_EQ(results_[0].size(), 1u);
  EXPECT_EQ(results_[0][0].status(), b.status());
  // The failed round answers its other members the same way.
  auto c = rounds_->Join("job", 2, 3, true, 5, 5, kT0);
  EXPECT_EQ(c.status(), b.status());
}

TEST_F(LoadRoundsTest, MembershipClosesAfterTheGraceOnly) {
  LoadRounds::Joined a = Join(0);
  Report(a, 0, Pieces(0));
  rounds_->Advance(kT0 + absl::Seconds(2));  // the grace is not over
  EXPECT_TRUE(results_[0].empty());
  rounds_->Advance(kT0 + absl::Seconds(2) + absl::Microseconds(1));
  ASSERT_EQ(results_[0].size(), 1u);
  ASSERT_TRUE(results_[0][0].ok());
  // Alone, it covered no chunk whole: both pieces go back to it.
  EXPECT_THAT(results_[0][0]->verify_locally(), UnorderedElementsAre(0, 1));
  EXPECT_EQ(results_[0][0]->chunks_verified(), 0);
  // The next rank forms its own round.
  LoadRounds::Joined b = Join(1, 2, 5, kT0 + absl::Seconds(3));
  EXPECT_NE(b.round, a.round);
}

// A rank starting after the grace still joins the round while its members
// read: every chunk is verified by combining, none re-read whole (a rank 3 s
// late used to make both ranks read every chunk again).
TEST_F(LoadRoundsTest, ALateRankJoinsTheRoundWhileItsMembersRead) {
  LoadRounds::Joined a = Join(0, 3);
  rounds_->Advance(kT0 + absl::Seconds(5));  // rank 0 still reading
  LoadRounds::Joined b = Join(1, 3, 5, kT0 + absl::Seconds(5));
  EXPECT_EQ(b.round, a.round);
  Report(a, 0, Pieces(0), 3, kT0 + absl::Seconds(6));
  Report(b, 1, Pieces(1), 3, kT0 + absl::Seconds(6));
  // Both reported, within the grace of rank 1's join: rank 2 may still come.
  rounds_->Advance(kT0 + absl::Seconds(7));
  EXPECT_TRUE(results_[0].empty());
  LoadRounds::Joined c = Join(2, 3, 5, kT0 + absl::Seconds(7));
  EXPECT_EQ(c.round, a.round);
  Report(c, 2, {}, 3, kT0 + absl::Seconds(8));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results_[r].size(), 1u) << r;
    ASSERT_TRUE(results_[r][0].ok()) << results_[r][0].status();
    EXPECT_EQ(results_[r][0]->chunks_verified(), 2) << r;
    EXPECT_THAT(results_[r][0]->verify_locally(), IsEmpty()) << r;
  }
  EXPECT_EQ(rounds_->stats().live_rounds, 0);
}

// Once every member has reported and the grace is over, the round finishes
// at the last report (no tick needed) and a later rank starts a new one.
TEST_F(LoadRoundsTest, RoundFinishesAtTheLastReportAfterTheGrace) {
  LoadRounds::Joined a = Join(0, 3), b = Join(1, 3);
  Report(a, 0, Pieces(0), 3, kT0 + absl::Seconds(5));
  EXPECT_TRUE(results_[0].empty());
  Report(b, 1, Pieces(1), 3, kT0 + absl::Seconds(6));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results_[r].size(), 1u) << r;
    ASSERT_TRUE(results_[r][0].ok()) << results_[r][0].status();
    EXPECT_EQ(results_[r][0]->chunks_verified(), 2) << r;
  }
  LoadRounds::Joined c = Join(2, 3, 5, kT0 + absl::Seconds(7));
  EXPECT_NE(c.round, a.round);
}

// Another world size after the grace is another load of the step (an
// evaluation, say): its own round, the first one unharmed. A round failed
// for disagreeing ranks takes nobody after the grace.
TEST_F(LoadRoundsTest, AnotherWorldSizeAfterTheGraceLoadsInItsOwnRound) {
  LoadRounds::Joined a = Join(0, 3);
  LoadRounds::Joined eval = Join(0, 1, 5, kT0 + absl::Seconds(3));
  EXPECT_NE(eval.round, a.round);
  Report(eval, 0, Pieces(0, false, 1), 1, kT0 + absl::Seconds(4));
  ASSERT_EQ(results_[0].size(), 1u);
  ASSERT_TRUE(results_[0][0].ok()) << results_[0][0].status();
  EXPECT_THAT(results_[0][0]->verify_locally(), ElementsAre(0));
  LoadRounds::Joined b = Join(1, 3, 5, kT0 + absl::Seconds(4));
  EXPECT_EQ(b.round, a.round);
  // Within the grace of rank 1's join a world of 2 is a disagreement...
  auto bad = rounds_->Join("job", 2, 2, true, 5, 5, kT0 + absl::Seconds(5));
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument));
  auto c = rounds_->Join("job", 2, 3, true, 5, 5, kT0 + absl::Seconds(5));
  EXPECT_EQ(c.status(), bad.status());
  // ...until the grace after the failure (at +5 s) is over: then ranks
  // starting again find a new round.
  EXPECT_EQ(
      rounds_->Join("job", 2, 3, true, 5, 5, kT0 + absl::Seconds(7)).status(),
      bad.status());
  rounds_->Advance(kT0 + absl::Seconds(8));
  LoadRounds::Joined again = Join(2, 3, 5, kT0 + absl::Seconds(8));
  EXPECT_NE(again.round, a.round);
}

// A round that never filled expires too when a member stops reporting.
TEST_F(LoadRoundsTest, OpenRoundExpiresAfterTheVerifyDeadline) {
  LoadRounds::Joined a = Join(0, 3);
  Join(1, 3, 5, kT0 + absl::Seconds(1));               // and never reports
  Report(a, 0, Pieces(0), 3, kT0 + absl::Seconds(2));  // deadline kT0 + 12s
  rounds_->Advance(kT0 + absl::Seconds(12));
  EXPECT_TRUE(results_[0].empty());
  rounds_->Advance(kT0 + absl::Seconds(12) + absl::Microseconds(1));
  ASSERT_EQ(results_[0].size(), 1u);
  EXPECT_THAT(results_[0][0],
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("ranks [1] (1 of 3) planned their reads")));
  EXPECT_EQ(rounds_->stats().live_rounds, 0);
}

TEST_F(LoadRoundsTest, ClosedRoundExpiresAfterTheVerifyDeadline) {
  LoadRounds::Joined a = Join(0);
  Join(1);  // the world is complete: closed, deadline kT0 + 10s
  Report(a, 0, Pieces(0), 2, kT0 + absl::Seconds(1));  // now kT0 + 11s
  rounds_->Advance(kT0 + absl::Seconds(11));
  EXPECT_TRUE(results_[0].empty());
  rounds_->Advance(kT0 + absl::Seconds(11) + absl::Microseconds(1));
  ASSERT_EQ(results_[0].size(), 1u);
  EXPECT_THAT(
      results_[0][0],
      StatusIs(
          absl::StatusCode::kDeadlineExceeded,
          "load of job 'job' step 5 by 2 ranks: ranks [1] (1 of 2) planned "
          "their reads but never called VerifyLoad within 10s of the "
          "round's previous PlanLoad or report; verify partly read chunks "
          "locally"));
  EXPECT_EQ(rounds_->stats().live_rounds, 0);
}

TEST_F(LoadRoundsTest, EmptyReportsAreAnsweredAtOnceAndLeaversReopen) {
  LoadRounds::Joined a = Join(0, 3), b = Join(1, 3), c = Join(2, 3);
  EXPECT_EQ(c.round, a.round);                         // complete: closed
  rounds_->Leave(c.round, 2, kT0 + absl::Seconds(1));  // its plan failed
  Report(a, 0, {}, 3);
  ASSERT_EQ(results_[0].size(), 1u);
  EXPECT_TRUE(results_[0][0].ok());
  EXPECT_EQ(results_[0][0]->chunks_verified(), 0);
  // Within the grace the round took rank 2 back.
  LoadRounds::Joined c2 = Join(2, 3, 5, kT0 + absl::Seconds(1));
  EXPECT_EQ(c2.round, a.round);
  Report(b, 1, Pieces(1), 3);
  EXPECT_TRUE(results_[1].empty());
  Report(c2, 2, {}, 3);
  ASSERT_EQ(results_[1].size(), 1u);
  ASSERT_TRUE(results_[1][0].ok());
  EXPECT_THAT(results_[1][0]->verify_locally(), UnorderedElementsAre(0, 1));
}

TEST_F(LoadRoundsTest, ReportsAreCheckedAndARetryReplacesTheFirst) {
  LoadRounds::Joined a = Join(0);
  Report({a.round + 7, 5}, 0, Pieces(0));
  ASSERT_EQ(results_[0].size(), 1u);
  EXPECT_THAT(results_[0][0],
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("rank 0: load round 107 is over")));
  Report(a, 0, Pieces(0), /*world=*/3);
  EXPECT_THAT(std::string(results_[0][1].status().message()),
              HasSubstr("rank 0 by 3 ranks: load round 100 is the load of "
                        "job 'job' step 5 by 2 ranks"));
  Report(a, 0, Pieces(0), 2, kT0, /*step=*/4);
  EXPECT_THAT(results_[0][2], StatusIs(absl::StatusCode::kInvalidArgument));
  Report(a, 1, Pieces(1));
  EXPECT_THAT(std::string(results_[1][0].status().message()),
              HasSubstr("rank 1: the rank did not plan in load round 100"));
  // Parked, then retried: the first call is answered ABORTED.
  Report(a, 0, Pieces(0));
  Report(a, 0, Pieces(0));
  ASSERT_EQ(results_[0].size(), 4u);
  EXPECT_THAT(results_[0][3], StatusIs(absl::StatusCode::kAborted,
                                       HasSubstr("superseded by a retry")));
  EXPECT_EQ(rounds_->stats().reports, 2);
}

TEST_F(LoadRoundsTest, ShutdownAnswersParkedReportsAndRefusesNewCalls) {
  LoadRounds::Joined a = Join(0);
  Report(a, 0, Pieces(0));
  rounds_->Shutdown();
  ASSERT_EQ(results_[0].size(), 1u);
  EXPECT_THAT(results_[0][0], StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(rounds_->Join("job", 1, 2, true, 5, 5, kT0),
              StatusIs(absl::StatusCode::kUnavailable));
  Report(a, 0, {});
  EXPECT_THAT(results_[0][1], StatusIs(absl::StatusCode::kUnavailable));
}

// Ranks that read only some of the checkpoint's tensors plan twice (the
// first answer asks for their wanted chunks in full). A load by 6 ranks
// that do not verify in the round completes at its 6th first PlanLoad; the
// resends after it find that round again instead of opening one that never
// fills, and a load of the step by 3 ranks right after is its own load (it
// was refused: "rank 1 says world_size 3 but ranks [0, 2, 3, 4, 5] (5 of
// 6) of the load say world_size 6").
TEST_F(LoadRoundsTest, ResendsAfterAFullRoundLeaveNoRoundBehind) {
  const auto join = [&](int rank, int world, absl::Duration at) {
    return rounds_->Join("job", rank, world, /*reports=*/false, 5, 5, kT0 + at);
  };
  std::map<int, LoadRounds::Joined> first;
  for (int rank = 0; rank < 5; ++rank) {
    first[rank] = join(rank, 6, absl::Milliseconds(rank)).value();
  }
  const auto resend = [&](int rank, absl::Duration at) {
    SCOPED_TRACE(rank);
    absl::StatusOr<LoadRounds::Joined> again = join(rank, 6, at);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->round, first[rank].round);
    EXPECT_EQ(again->step, 5);
  };
  resend(1, absl::Milliseconds(6));
  first[5] = join(5, 6, absl::Milliseconds(7)).value();  // the world is full
  EXPECT_EQ(first[5].round, first[0].round);
  for (int rank : {0, 2, 3, 4, 5}) resend(rank, absl::Milliseconds(8));
  EXPECT_EQ(rounds_->stats().live_rounds, 0);
  absl::StatusOr<LoadRounds::Joined> eval = join(1, 3, absl::Milliseconds(9));
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_NE(eval->round, first[0].round);
  EXPECT_EQ(rounds_->stats().live_rounds, 1);
}

// A job whose load failed (a rank said another world size) and that is
// restarted after the grace loads: its ranks, members of the failed round
// that never reported (their processes died), open a fresh round instead of
// getting the old error until the failed round's verify deadline.
TEST_F(LoadRoundsTest, ARestartedLoadAfterAFailedRoundGetsAFreshRound) {
  Make(absl::Seconds(2), absl::Minutes(1));
  LoadRounds::Joined a = Join(0, 3), b = Join(1, 3);
  auto bad = rounds_->Join("job", 2, 2, true, 5, 5, kT0 + absl::Seconds(1));
  ASSERT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument));
  // Within the grace a member calling again still gets the failure.
  EXPECT_EQ(
      rounds_->Join("job", 0, 3, true, 5, 5, kT0 + absl::Seconds(2)).status(),
      bad.status());
  // Ranks 0 and 1 died without reporting; the job starts again at +4 s.
  const absl::Time restart = kT0 + absl::Seconds(4);
  rounds_->Advance(restart);
  std::vector<LoadRounds::Joined> joined;
  for (int rank : {1, 0, 2}) {
    SCOPED_TRACE(rank);
    absl::StatusOr<LoadRounds::Joined> j =
        rounds_->Join("job", rank, 3, true, 5, 5, restart);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_NE(j->round, a.round);
    joined.push_back(*j);
  }
  EXPECT_EQ(joined[1].round, joined[0].round);
  EXPECT_EQ(joined[2].round, joined[0].round);
  Report(joined[0], 1, Pieces(1), 3, restart);
  Report(joined[1], 0, Pieces(0), 3, restart);
  Report(joined[2], 2, {}, 3, restart);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results_[r].size(), 1u) << r;
    ASSERT_TRUE(results_[r][0].ok()) << results_[r][0].status();
    EXPECT_EQ(results_[r][0]->chunks_verified(), 2) << r;
  }
  // A member of the failed round still reading is told at its report.
  Report(b, 1, Pieces(1), 3, restart);
  ASSERT_EQ(results_[1].size(), 2u);
  EXPECT_EQ(results_[1][1].status(), bad.status());
}

// A rank asked to resend finds its round when it plans again, later than
// the grace and after the round retired, with the round's step for
// `latest` (no commit since: a commit after the round makes a later
// `latest` a new load, of the new step); then another load of the step by
// another world size is its own. Once the verify deadline is over the rank
// is forgotten: its next load is a new round.
TEST_F(LoadRoundsTest, ASlowResendFindsItsRoundAfterItRetired) {
  Make(absl::Seconds(2), absl::Seconds(10));
  std::vector<LoadRounds::Joined> first;
  for (int rank = 0; rank < 2; ++rank) {
    first.push_back(
        rounds_->Join("job", rank, 2, /*reports=*/false, -1, 5, kT0).value());
    rounds_->Resend(first.back(), "job", rank, 2, false, kT0);
  }
  EXPECT_EQ(first[1].round, first[0].round);
  EXPECT_EQ(rounds_->stats().live_rounds, 0);  // complete: retired
  for (int rank = 0; rank < 2; ++rank) {
    const absl::Time later = kT0 + absl::Seconds(5);
    rounds_->Advance(later);
    absl::StatusOr<LoadRounds::Joined> again =
        rounds_->Join("job", rank, 2, false, -1, /*newest=*/5, later);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->round, first[0].round) << rank;
    EXPECT_EQ(again->step, 5) << rank;
  }
  absl::StatusOr<LoadRounds::Joined> eval = rounds_->Join(
      "job", 1, 3, false, 5, 5, kT0 + absl::Seconds(5) + absl::Milliseconds(1));
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_NE(eval->round, first[0].round);
  const absl::Time next = kT0 + absl::Seconds(16);
  rounds_->Advance(next);
  absl::StatusOr<LoadRounds::Joined> fresh =
      rounds_->Join("job", 0, 2, false, -1, 6, next);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_NE(fresh->round, first[0].round);
  EXPECT_EQ(fresh->step, 6);
}

// A rank that does not report, retrying a PlanLoad whose answer was lost
// after its round completed, gets that round within the grace of its join
// (it opened a round of its own, which refused another load of the step).
TEST_F(LoadRoundsTest, ARetryAfterTheRoundCompletedFindsIt) {
  LoadRounds::Joined a = rounds_->Join("job", 0, 2, false, 5, 5, kT0).value();
  LoadRounds::Joined b = rounds_->Join("job", 1, 2, false, 5, 5, kT0).value();
  EXPECT_EQ(b.round, a.round);
  EXPECT_EQ(rounds_->stats().live_rounds, 0);
  absl::StatusOr<LoadRounds::Joined> retry =
      rounds_->Join("job", 1, 2, false, 5, 5, kT0 + absl::Milliseconds(500));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->round, a.round);
  EXPECT_EQ(rounds_->stats().live_rounds, 0);
  EXPECT_TRUE(
      rounds_->Join("job", 1, 3, false, 5, 5, kT0 + absl::Seconds(1)).ok());
  // A collective rank of the same number is not that rank retrying.
  absl::StatusOr<LoadRounds::Joined> other =
      rounds_->Join("job", 1, 2, true, 5, 5, kT0 + absl::Seconds(3));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->round, a.round);
}

// Live rounds are capped per job and over all jobs: a join that would open
// one more is refused naming the job and the cap; joins of live rounds and
// retries still go through, and a round ending makes room.
TEST_F(LoadRoundsTest, LiveRoundsAreCappedPerJobAndOverall) {
  LoadRounds::Options options;
  options.max_rounds_per_job = 2;
  options.max_rounds = 3;
  rounds_ = std::make_unique<LoadRounds>(
      options, 100, [](std::function<void()> work) { work(); });
  const auto join = [&](const std::string& job, int rank, int64_t step) {
    return rounds_->Join(job, rank, 2, true, step, step, kT0);
  };
  LoadRounds::Joined a1 = join("a", 0, 1).value();
  ASSERT_TRUE(join("a", 0, 2).ok());
  absl::StatusOr<LoadRounds::Joined> third = join("a", 0, 3);
  EXPECT_THAT(
      third,
      StatusIs(absl::StatusCode::kResourceExhausted,
               "load of job 'a' step 3: rank 0 of 2 would open a load round, "
               "but job 'a' has 2 live load rounds, the most cairnd keeps for "
               "one job (--max-load-rounds-per-job 2); they end when their "
               "ranks have reported or at the verify deadline"));
  EXPECT_EQ(join("a", 0, 1)->round, a1.round);  // a retry
  EXPECT_EQ(join("a", 1, 1)->round, a1.round);  // a member of a live round
  ASSERT_TRUE(join("b", 0, 1).ok());
  absl::StatusOr<LoadRounds::Joined> c = join("c", 0, 1);
  EXPECT_THAT(
      c,
      StatusIs(absl::StatusCode::kResourceExhausted,
               "load of job 'c' step 1: rank 0 of 2 would open a load round, "
               "but cairnd has 3 live load rounds of all jobs, the most it "
               "keeps (--max-load-rounds 3); they end when their ranks have "
               "reported or at the verify deadline"));
  EXPECT_EQ(rounds_->stats().live_rounds, 3);
  for (int rank = 0; rank < 2; ++rank) {
    rounds_->Report(a1.round, "a", 1, rank, 2, "rank", nullptr, {}, kT0,
                    [this, rank](VerifyResult r) {
                      results_[rank].push_back(std::move(r));
                    });
    ASSERT_EQ(results_[rank].size(), 1u);
    EXPECT_TRUE(results_[rank][0].ok()) << results_[rank][0].status();
  }
  EXPECT_EQ(rounds_->stats().live_rounds, 2);
  EXPECT_TRUE(join("a", 0, 3).ok());
}

// Many loads of one step, one after another and overlapping while their
// ranks read and report: world sizes of 1 to 6, every rank or some of them,
// verification in the round, by reading whole or none (the last two do not
// report), ranks planning twice (asked to resend, soon or late), retrying a
// call whose answer was lost, or dying before they report, and `latest` or
// the step by number. Loads of different world sizes start more than the
// grace apart (else they are one load whose ranks disagree). Some loads are
// wrong: one rank says another world size within the grace of the others'
// joins; the members still reading then report or die, and the job often
// starts again (a correct load of that world size after the grace). The
// oracle: every call of a correct load joins (a resend or retry
// the round it had) and every report is answered OK or with a code on which
// the rank verifies locally; the disagreeing rank of a wrong load is
// refused naming itself, both sizes and the ranks that joined before it, and
// every later call of the load gets that error. Seeds are printed on
// failure; the figures at the end.
TEST_F(LoadRoundsTest, RandomOverlappingLoadsOfOneStep) {
  constexpr int kSeeds = 400;
  constexpr int kLoadsPerSeed = 12;
  const absl::Duration grace = absl::Seconds(2);
  const absl::Duration deadline = absl::Seconds(30);
  struct Figures {
    int64_t loads = 0, wrong = 0, refused = 0, refused_later = 0, joins = 0,
            resends = 0, retries = 0, reports = 0, answered_ok = 0,
            verify_locally = 0;
  } figures;
  for (uint64_t seed = 1; seed <= kSeeds && !HasFailure(); ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937_64 rng(seed);
    const auto uniform = [&rng](absl::Duration lo, absl::Duration hi) {
      const int64_t span = absl::ToInt64Microseconds(hi - lo);
      return lo + absl::Microseconds(span <= 0 ? 0 : rng() % span);
    };
    const auto chance = [&rng](int percent) {
      return static_cast<int>(rng() % 100) < percent;
    };
    Make(grace, deadline);
    struct Event {
      absl::Time at;
      int seq;
      std::function<void()> run;
    };
    std::vector<Event> events;
    const auto at = [&events](absl::Time t, std::function<void()> run) {
      events.push_back({t, static_cast<int>(events.size()), std::move(run)});
    };
    // One rank of one load.
    struct Rank {
      int load = 0, rank = 0, world = 0;
      bool wrong = false;  // of a wrong load
      bool reports = false;
      int64_t step = 5;  // -1: latest
      std::optional<LoadRounds::Joined> first, last;
      bool stopped = false;  // refused: the rank gives up
      bool reported = false;
      std::vector<VerifyResult> answers;
      int pieces = 0;
    };
    // A wrong load's failure, once its disagreeing rank has joined.
    struct Wrong {
      absl::Status failure;
      bool failed = false;
      std::string expected;  // the disagreeing rank's error message
    };
    std::vector<std::unique_ptr<Rank>> ranks;
    std::vector<std::unique_ptr<Wrong>> wrongs;
    absl::Time busy_until = kT0;  // the previous load's last join
    int restart_world = 0;        // the next load's, when a restart
    for (int load = 0; load < kLoadsPerSeed; ++load) {
      const absl::Time start =
          busy_until + grace + uniform(absl::Milliseconds(1), 2 * grace);
      const int64_t step = chance(30) ? -1 : 5;
      const int mode = static_cast<int>(rng() % 3);  // collective, whole, none
      const bool reports = mode == 0;
      const bool plans_twice = chance(50);
      ++figures.loads;
      const auto join_event = [&, step, reports](Rank* r, absl::Time t,
                                                 bool resend_after,
                                                 Wrong* wrong, bool expect_same,
                                                 bool expect_first) {
        at(t, [&, r, t, step, reports, resend_after, wrong, expect_same,
               expect_first] {
          if (r->stopped) return;
          ++figures.joins;
          absl::StatusOr<LoadRounds::Joined> j =
              rounds_->Join("job", r->rank, r->world, reports, step, 5, t);
          SCOPED_TRACE(absl::StrCat("load ", r->load, " rank ", r->rank, " of ",
                                    r->world, " at ",
                                    absl::FormatDuration(t - kT0)));
          if (wrong != nullptr && wrong->failed) {
            EXPECT_EQ(j.status(), wrong->failure);
            if (!j.ok()) ++figures.refused_later;
            r->stopped = true;
            return;
          }
          ASSERT_TRUE(j.ok()) << j.status();
          EXPECT_EQ(j->step, 5);
          if (expect_same) {
            EXPECT_EQ(j->round, (expect_first ? r->first : r->last)->round);
          }
          if (!r->first) r->first = *j;
          r->last = *j;
          // The coordinator asks the rank to resend in the same call.
          if (resend_after) {
            rounds_->Resend(*j, "job", r->rank, r->world, reports, t);
          }
        });
      };
      const auto report_event = [&](Rank* r, absl::Time t) {
        at(t, [&, r, t] {
          if (r->stopped || !r->last) return;
          ++figures.reports;
          r->reported = true;
          const bool empty = chance(20);
          r->pieces = empty ? 0 : 2;
          rounds_->Report(
              r->last->round, "job", 5, r->rank, r->world,
              absl::StrCat("rank ", r->rank),
              std::shared_ptr<const planner::LoadPlanner>(
                  stored_, stored_->planner.get()),
              empty ? LoadRounds::Pieces() : Pieces(r->rank % 2), t,
              [r](VerifyResult v) { r->answers.push_back(std::move(v)); });
        });
      };
      const auto add_rank = [&](int rank, int world, bool wrong = false) {
        auto r = std::make_unique<Rank>();
        r->wrong = wrong;
        r->load = load;
        r->rank = rank;
        r->world = world;
        r->reports = reports;
        r->step = step;
        ranks.push_back(std::move(r));
        return ranks.back().get();
      };
      if (restart_world > 0 || !chance(20)) {
        // A correct load: `world` ranks, all or some of them. After a wrong
        // load, often that job restarted: its world size again.
        const int world =
            restart_world > 0 ? restart_world : 1 + static_cast<int>(rng() % 6);
        restart_world = 0;
        std::vector<int> members(world);
        for (int i = 0; i < world; ++i) members[i] = i;
        std::shuffle(members.begin(), members.end(), rng);
        if (chance(50)) members.resize(1 + rng() % world);
        // Usually within the grace of each other; some start late.
        const absl::Duration spread = chance(20) ? 3 * grace : grace / 2;
        for (int rank : members) {
          Rank* r = add_rank(rank, world);
          absl::Time t = start + uniform(absl::ZeroDuration(), spread);
          join_event(r, t, plans_twice, nullptr, false, false);
          busy_until = std::max(busy_until, t);
          if (plans_twice) {
            // Soon, or later than the grace (a rank slow to send its
            // wanted chunks in full).
            t += chance(70) ? uniform(absl::Milliseconds(1), grace / 4)
                            : uniform(grace, 3 * grace);
            ++figures.resends;
            join_event(r, t, false, nullptr, true, true);
            busy_until = std::max(busy_until, t);
          }
          if (chance(15)) {  // the answer was lost: the rank retries
            t += uniform(absl::Milliseconds(1), grace / 2);
            ++figures.retries;
            join_event(r, t, false, nullptr, true, false);
            busy_until = std::max(busy_until, t);
          }
          if (reports && !chance(10)) {  // else it dies before reporting
            report_event(r, t + uniform(absl::Milliseconds(1), 4 * grace));
          }
        }
        continue;
      }
      // A wrong load: a world size of its own (no round of another load
      // takes its ranks), ranks joining within the grace of each other, one
      // of them saying another world size of its own.
      ++figures.wrong;
      wrongs.push_back(std::make_unique<Wrong>());
      if (chance(50)) restart_world = 7 + static_cast<int>(wrongs.size());
      Wrong* wrong = wrongs.back().get();
      const int world = 7 + static_cast<int>(wrongs.size());
      const int bad_world = 40 + static_cast<int>(wrongs.size());
      std::vector<int> order(world);
      for (int i = 0; i < world; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      const int before = 1 + static_cast<int>(rng() % (world - 1));
      const int after =
          static_cast<int>(rng() % std::min(3, world - before));  // 0-2
      absl::Time t = start;
      std::vector<int> joined_before(order.begin(), order.begin() + before);
      for (int i = 0; i < before; ++i) {
        Rank* r = add_rank(order[i], world, /*wrong=*/true);
        join_event(r, t, plans_twice, wrong, false, false);
        if (plans_twice) {
          // A resend soon after (before or after the failure).
          join_event(r, t + uniform(absl::Milliseconds(1), grace / 20), false,
                     wrong, true, true);
        }
        t += uniform(absl::Milliseconds(1), grace / (2 * before));
      }
      const int bad = order[before];
      std::sort(joined_before.begin(), joined_before.end());
      wrong->expected = absl::StrCat(
          "load of job 'job' step 5: rank ", bad, " says world_size ",
          bad_world, " but ranks [", absl::StrJoin(joined_before, ", "), "] (",
          joined_before.size(), " of ", world, ") of the load say world_size ",
          world, "; every rank of a load must pass the same world_size");
      const absl::Time failed_at = t;
      at(t, [&, wrong, bad, bad_world, step, reports, t] {
        ++figures.joins;
        absl::StatusOr<LoadRounds::Joined> j =
            rounds_->Join("job", bad, bad_world, reports, step, 5, t);
        ASSERT_THAT(
            j, StatusIs(absl::StatusCode::kInvalidArgument, wrong->expected));
        ++figures.refused;
        wrong->failure = j.status();
        wrong->failed = true;
      });
      if (chance(30)) {  // the disagreeing rank retries
        Rank* r = add_rank(bad, bad_world, /*wrong=*/true);
        join_event(r, t + uniform(absl::Milliseconds(1), grace / 2), false,
                   wrong, false, false);
      }
      // Its other ranks, within the grace of the failure.
      for (int i = before + 1; i <= before + after; ++i) {
        Rank* r = add_rank(order[i], world, /*wrong=*/true);
        join_event(r, failed_at + uniform(absl::Milliseconds(1), grace / 2),
                   false, wrong, false, false);
      }
      // Members reading when it failed are told at their report, unless
      // they die first (the job restarts).
      if (reports) {
        for (auto& r : ranks) {
          if (r->load != load || r->world != world || chance(50)) continue;
          Rank* member = r.get();
          const absl::Time t =
              failed_at + uniform(absl::Milliseconds(1), 4 * grace);
          at(t, [&, member, wrong, t] {
            if (member->stopped || !member->last) return;
            ++figures.reports;
            rounds_->Report(member->last->round, "job", 5, member->rank,
                            member->world, absl::StrCat("rank ", member->rank),
                            std::shared_ptr<const planner::LoadPlanner>(
                                stored_, stored_->planner.get()),
                            Pieces(member->rank % 2), t,
                            [member](VerifyResult v) {
                              member->answers.push_back(std::move(v));
                            });
            ASSERT_EQ(member->answers.size(), 1u);
            EXPECT_EQ(member->answers[0].status(), wrong->failure);
            member->stopped = true;  // answered: checked here
          });
        }
      }
      busy_until = failed_at + grace;
    }
    std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
      return a.at != b.at ? a.at < b.at : a.seq < b.seq;
    });
    for (Event& e : events) {
      if (chance(30)) rounds_->Advance(e.at);
      e.run();
      if (HasFatalFailure()) break;
    }
    // Every round ends: complete, or expired at its verify deadline.
    rounds_->Advance(busy_until + 3 * deadline);
    EXPECT_EQ(rounds_->stats().live_rounds, 0);
    for (const auto& r : ranks) {
      if (r->stopped || !r->reports || r->wrong) continue;
      SCOPED_TRACE(
          absl::StrCat("load ", r->load, " rank ", r->rank, " of ", r->world));
      if (!r->reported) continue;  // it died before reporting
      ASSERT_EQ(r->answers.size(), 1u);
      const VerifyResult& v = r->answers[0];
      if (v.ok()) {
        ++figures.answered_ok;
        for (int i : v->verify_locally()) {
          EXPECT_LT(i, r->pieces);
        }
        continue;
      }
      // Not verified in the round: the rank reads its partial chunks
      // whole (the round expired, its report was superseded, or it is over).
      ++figures.verify_locally;
      EXPECT_THAT(v, StatusIs(AnyOf(absl::StatusCode::kDeadlineExceeded,
                                    absl::StatusCode::kAborted,
                                    absl::StatusCode::kNotFound)));
    }
  }
  std::cout << "[ figures  ] " << figures.loads << " loads (" << figures.wrong
            << " wrong), " << figures.joins << " joins (" << figures.resends
            << " resends, " << figures.retries << " retries), "
            << figures.refused << " disagreeing ranks refused, "
            << figures.refused_later << " later calls of wrong loads refused; "
            << figures.reports << " reports: " << figures.answered_ok
            << " answered, " << figures.verify_locally << " verified locally\n";
}

}  // namespace
}  // namespace cairn::coordinator
