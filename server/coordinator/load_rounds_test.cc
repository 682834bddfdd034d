// Load rounds alone (load_rounds.h), driven with explicit times and an inline
// scheduler: membership by full world or join grace after every report,
// `latest` once per round, world-size disagreement, report deadlines,
// retries, and the pieces of several ranks combined against a hand-made
// stored tensor.
#include "server/coordinator/load_rounds.h"

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/box.h"
#include "storage/checksum.h"

namespace cairn::coordinator {
namespace {

using planner::ChunkBox;
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
  EXPECT_EQ(rounds_->Join("job", 0, 2, true, -1, -1, kT0).status().code(),
            absl::StatusCode::kNotFound);
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
  ASSERT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.status().message(),
            "load of job 'job' step 5: rank 1 says world_size 2 but ranks "
            "[0] (1 of 3) of the load say world_size 3; every rank of a load "
            "must pass the same world_size");
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
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  auto c = rounds_->Join("job", 2, 3, true, 5, 5, kT0 + absl::Seconds(5));
  EXPECT_EQ(c.status(), bad.status());
  // ...and ranks starting again after the grace find a new round.
  rounds_->Advance(kT0 + absl::Seconds(7));
  LoadRounds::Joined again = Join(2, 3, 5, kT0 + absl::Seconds(7));
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
  EXPECT_EQ(results_[0][0].status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(results_[0][0].status().message()),
              HasSubstr("ranks [1] (1 of 3) planned their reads"));
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
  EXPECT_EQ(results_[0][0].status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(results_[0][0].status().message(),
            "load of job 'job' step 5 by 2 ranks: ranks [1] (1 of 2) planned "
            "their reads but never called VerifyLoad within 10s of the "
            "round's previous PlanLoad or report; verify partly read chunks "
            "locally");
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
  EXPECT_EQ(results_[0][0].status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(results_[0][0].status().message()),
              HasSubstr("rank 0: load round 107 is over"));
  Report(a, 0, Pieces(0), /*world=*/3);
  EXPECT_THAT(std::string(results_[0][1].status().message()),
              HasSubstr("rank 0 by 3 ranks: load round 100 is the load of "
                        "job 'job' step 5 by 2 ranks"));
  Report(a, 0, Pieces(0), 2, kT0, /*step=*/4);
  EXPECT_EQ(results_[0][2].status().code(), absl::StatusCode::kInvalidArgument);
  Report(a, 1, Pieces(1));
  EXPECT_THAT(std::string(results_[1][0].status().message()),
              HasSubstr("rank 1: the rank did not plan in load round 100"));
  // Parked, then retried: the first call is answered ABORTED.
  Report(a, 0, Pieces(0));
  Report(a, 0, Pieces(0));
  ASSERT_EQ(results_[0].size(), 4u);
  EXPECT_EQ(results_[0][3].status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(results_[0][3].status().message()),
              HasSubstr("superseded by a retry"));
  EXPECT_EQ(rounds_->stats().reports, 2);
}

TEST_F(LoadRoundsTest, ShutdownAnswersParkedReportsAndRefusesNewCalls) {
  LoadRounds::Joined a = Join(0);
  Report(a, 0, Pieces(0));
  rounds_->Shutdown();
  ASSERT_EQ(results_[0].size(), 1u);
  EXPECT_EQ(results_[0][0].status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(rounds_->Join("job", 1, 2, true, 5, 5, kT0).status().code(),
            absl::StatusCode::kUnavailable);
  Report(a, 0, {});
  EXPECT_EQ(results_[0][1].status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace cairn::coordinator
