#include "server/coordinator/load_verifier.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/checksum.h"

namespace cairn::coordinator {
namespace {

using planner::ChunkBox;

// The term a rank reports for the bytes of `piece` inside a chunk holding
// `data` (row-major over `chunk`), as the client computes it.
uint32_t TermOf(const ChunkBox& chunk, const ChunkBox& piece,
                const std::string& data, size_t elem) {
  storage::Crc32cPieces pieces;
  for (const planner::CopySegment& s :
       planner::CopySegments(chunk, piece, piece, elem)) {
    pieces.Add(s.src_offset, data.data() + s.src_offset, s.length);
  }
  return pieces.Finish(data.size());
}

// Splits [off, off + size) at random cut points.
std::vector<std::pair<int64_t, int64_t>> Cuts(std::mt19937_64& rng, int64_t off,
                                              int64_t size) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t at = off; at < off + size;) {
    const int64_t n =
        std::min<int64_t>(off + size - at, 1 + static_cast<int64_t>(rng() % 4));
    out.emplace_back(at, n);
    at += n;
  }
  return out;
}

// Every piece of a random grid tiling of `chunk`.
std::vector<ChunkBox> GridTiling(std::mt19937_64& rng, const ChunkBox& chunk) {
  std::vector<ChunkBox> boxes{ChunkBox{{}, {}}};
  for (size_t d = 0; d < chunk.offsets.size(); ++d) {
    std::vector<ChunkBox> next;
    for (const auto& [o, n] : Cuts(rng, chunk.offsets[d], chunk.sizes[d])) {
      for (ChunkBox b : boxes) {
        b.offsets.push_back(o);
        b.sizes.push_back(n);
        next.push_back(std::move(b));
      }
    }
    boxes = std::move(next);
  }
  return boxes;
}

enum class Damage {
  kNone,
  kDropPiece,
  kDuplicatePiece,
  kDuplicateWithOtherBytes,
  kCorruptPiece,
  kExtraOverlappingPiece,
  kPieceOutsideChunk,
  kPieceShifted,  // same volume, overlaps a neighbour and leaves a gap
};

// Brute force: what the pieces say about the chunk, by counting how often
// each element is covered and whether any piece's bytes were not the stored
// ones.
ChunkVerdict Oracle(const ChunkBox& chunk,
                    const std::vector<ChunkPieceReport>& pieces,
                    const std::vector<bool>& corrupt) {
  for (size_t i = 0; i < pieces.size(); ++i) {
    for (size_t j = 0; j < pieces.size(); ++j) {
      if (pieces[i].overlap == pieces[j].overlap &&
          pieces[i].crc_term != pieces[j].crc_term) {
        return ChunkVerdict::kReadersDisagree;
      }
    }
  }
  // Coverage by distinct boxes, element by element (absolute coordinates
  // over a generous bounding range, so pieces outside the chunk count).
  std::vector<ChunkBox> distinct;
  bool any_corrupt = false;
  for (size_t i = 0; i < pieces.size(); ++i) {
    bool seen = false;
    for (const ChunkBox& b : distinct) seen |= b == pieces[i].overlap;
    if (!seen) {
      distinct.push_back(pieces[i].overlap);
      any_corrupt |= corrupt[i];
    }
  }
  const size_t dims = chunk.offsets.size();
  std::vector<int64_t> idx(dims, 0);
  const int64_t kRange = 16;  // every coordinate in tests is < 16
  int64_t cells = 1;
  for (size_t d = 0; d < dims; ++d) cells *= kRange;
  for (int64_t cell = 0; cell < cells; ++cell) {
    int64_t rest = cell;
    bool in_chunk = true;
    for (size_t d = 0; d < dims; ++d) {
      idx[d] = rest % kRange;
      rest /= kRange;
      in_chunk &= idx[d] >= chunk.offsets[d] &&
                  idx[d] < chunk.offsets[d] + chunk.sizes[d];
    }
    int covered = 0;
    for (const ChunkBox& b : distinct) {
      bool in = true;
      for (size_t d = 0; d < dims; ++d) {
        in &= idx[d] >= b.offsets[d] && idx[d] < b.offsets[d] + b.sizes[d];
      }
      covered += in;
    }
    if (covered != (in_chunk ? 1 : 0)) return ChunkVerdict::kNotCovered;
  }
  return any_corrupt ? ChunkVerdict::kMismatch : ChunkVerdict::kVerified;
}

TEST(LoadVerifierTest, MatchesBruteForceOnRandomTilingsAndDamage) {
  std::mt19937_64 rng(2026);
  int seen[4] = {0, 0, 0, 0};
  storage::Crc32cFromPiecesMemo memo;
  for (int round = 0; round < 3000; ++round) {
    const size_t dims = 1 + rng() % 3;
    ChunkBox chunk;
    for (size_t d = 0; d < dims; ++d) {
      chunk.offsets.push_back(static_cast<int64_t>(rng() % 5));
      chunk.sizes.push_back(1 + static_cast<int64_t>(rng() % 6));
    }
    const size_t elem = size_t{1} << (rng() % 4);
    std::string data(static_cast<size_t>(planner::Volume(chunk)) * elem, '\0');
    for (char& c : data) c = static_cast<char>(rng());

    std::vector<ChunkBox> boxes = GridTiling(rng, chunk);
    std::vector<bool> corrupt(boxes.size(), false);
    std::vector<std::string> seen_data(boxes.size(), data);
    const auto damage = static_cast<Damage>(rng() % 8);
    const size_t victim = rng() % boxes.size();
    auto corrupt_copy = [&](size_t i) {
      // Flip a byte that lies inside piece i.
      std::vector<planner::CopySegment> segs =
          planner::CopySegments(chunk, boxes[i], boxes[i], elem);
      const planner::CopySegment& s = segs[rng() % segs.size()];
      seen_data[i][s.src_offset + rng() % s.length] ^= 0x10;
      corrupt[i] = true;
    };
    switch (damage) {
      case Damage::kNone:
        break;
      case Damage::kDropPiece:
        boxes.erase(boxes.begin() + victim);
        corrupt.erase(corrupt.begin() + victim);
        seen_data.erase(seen_data.begin() + victim);
        break;
      case Damage::kDuplicatePiece:
      case Damage::kDuplicateWithOtherBytes:
        boxes.push_back(boxes[victim]);
        corrupt.push_back(false);
        seen_data.push_back(data);
        if (damage == Damage::kDuplicateWithOtherBytes) {
          corrupt_copy(boxes.size() - 1);
        }
        break;
      case Damage::kCorruptPiece:
        corrupt_copy(victim);
        break;
      case Damage::kExtraOverlappingPiece: {
        ChunkBox extra = chunk;  // a random non-empty sub-box
        for (size_t d = 0; d < dims; ++d) {
          const int64_t lo = static_cast<int64_t>(rng() % chunk.sizes[d]);
          extra.offsets[d] += lo;
          extra.sizes[d] =
              1 + static_cast<int64_t>(
                      rng() % static_cast<uint64_t>(chunk.sizes[d] - lo));
        }
        boxes.push_back(extra);
        corrupt.push_back(false);
        seen_data.push_back(data);
        break;
      }
      case Damage::kPieceOutsideChunk:
        boxes[victim].sizes[0] += 1;  // reaches one row past the chunk
        break;
      case Damage::kPieceShifted:
        for (size_t d = 0; d < dims; ++d) {
          ChunkBox& b = boxes[victim];
          if (b.offsets[d] > chunk.offsets[d]) {
            --b.offsets[d];
            break;
          }
          if (b.offsets[d] + b.sizes[d] < chunk.offsets[d] + chunk.sizes[d]) {
            ++b.offsets[d];
            break;
          }
        }
        break;
    }
    std::vector<ChunkPieceReport> pieces;
    for (size_t i = 0; i < boxes.size(); ++i) {
      ChunkPieceReport p;
      p.rank = static_cast<int>(rng() % 3);
      p.index = static_cast<int>(i);
      p.overlap = boxes[i];
      // A box outside the chunk has no bytes in it to hash: its term is
      // whatever the rank sent; the verdict must not depend on it.
      ChunkBox inside;
      p.crc_term = planner::Intersect(chunk, boxes[i], &inside)
                       ? TermOf(chunk, inside, seen_data[i], elem)
                       : 0;
      pieces.push_back(p);
    }
    const ChunkVerdict want = Oracle(chunk, pieces, corrupt);
    std::vector<ChunkPieceReport> shuffled = pieces;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    std::vector<ChunkPieceReport> reshuffled = shuffled;
    ASSERT_EQ(VerifyChunk(chunk, data.size(), storage::Crc32c(data), shuffled),
              want)
        << "round " << round << " chunk " << planner::BoxToString(chunk)
        << " damage " << static_cast<int>(damage);
    // The same with the memo every round shares, as a load round's does.
    ASSERT_EQ(VerifyChunk(chunk, data.size(), storage::Crc32c(data), reshuffled,
                          &memo),
              want)
        << "round " << round << " (memo)";
    ++seen[static_cast<int>(want)];
  }
  // Every verdict was exercised many times.
  for (int v = 0; v < 4; ++v) {
    EXPECT_GT(seen[v], 100) << ChunkVerdictName(static_cast<ChunkVerdict>(v));
  }
}

TEST(LoadVerifierTest, ColumnHalvesOfARowBlockVerifyAndAMissingHalfDoesNot) {
  // The benchmark's case: rows saved, columns loaded by two ranks.
  const ChunkBox chunk{{100, 0}, {50, 64}};
  std::string data(50 * 64 * 4, '\0');
  std::mt19937_64 rng(5);
  for (char& c : data) c = static_cast<char>(rng());
  const ChunkBox left{{100, 0}, {50, 32}}, right{{100, 32}, {50, 32}};
  std::vector<ChunkPieceReport> pieces{
      {0, 0, left, TermOf(chunk, left, data, 4)},
      {1, 0, right, TermOf(chunk, right, data, 4)}};
  const uint32_t crc = storage::Crc32c(data);
  EXPECT_EQ(VerifyChunk(chunk, data.size(), crc, pieces),
            ChunkVerdict::kVerified);
  std::vector<ChunkPieceReport> half{pieces[0]};
  EXPECT_EQ(VerifyChunk(chunk, data.size(), crc, half),
            ChunkVerdict::kNotCovered);
  EXPECT_EQ(VerifyChunk(chunk, data.size(), crc ^ 1, pieces),
            ChunkVerdict::kMismatch);
}

}  // namespace
}  // namespace cairn::coordinator
