#include "server/coordinator/load_verifier.h"

#include <algorithm>

#include "storage/checksum.h"

namespace cairn::coordinator {

const char* ChunkVerdictName(ChunkVerdict v) {
  switch (v) {
    case ChunkVerdict::kVerified:
      return "verified";
    case ChunkVerdict::kNotCovered:
      return "not read completely by the load's ranks";
    case ChunkVerdict::kMismatch:
      return "crc32c mismatch";
    case ChunkVerdict::kReadersDisagree:
      return "ranks reading the same bytes got different data";
  }
  return "unknown";
}

ChunkVerdict VerifyChunk(const planner::ChunkBox& box, uint64_t length,
                         uint32_t crc32c, std::vector<ChunkPieceReport>& pieces,
                         storage::Crc32cFromPiecesMemo* memo) {
  std::sort(pieces.begin(), pieces.end(),
            [](const ChunkPieceReport& a, const ChunkPieceReport& b) {
              return planner::CompareBoxes(a.overlap, b.overlap) < 0;
            });
  // Distinct boxes (with one term each) in sorted order.
  std::vector<const ChunkPieceReport*> distinct;
  for (const ChunkPieceReport& p : pieces) {
    if (!distinct.empty() && distinct.back()->overlap == p.overlap) {
      if (distinct.back()->crc_term != p.crc_term) {
        return ChunkVerdict::kReadersDisagree;
      }
      continue;
    }
    distinct.push_back(&p);
  }
  if (distinct.empty() ||
      distinct.size() > static_cast<size_t>(kMaxDistinctPieces)) {
    return ChunkVerdict::kNotCovered;
  }
  int64_t volume = 0;
  for (const ChunkPieceReport* p : distinct) {
    if (!planner::Contains(box, p->overlap)) {
      return ChunkVerdict::kNotCovered;
    }
    volume += planner::Volume(p->overlap);
  }
  if (volume != planner::Volume(box)) return ChunkVerdict::kNotCovered;
  // Equal total volume and pairwise disjoint: the boxes tile the chunk.
  for (size_t i = 0; i < distinct.size(); ++i) {
    for (size_t j = i + 1; j < distinct.size(); ++j) {
      planner::ChunkBox both;
      if (planner::Intersect(distinct[i]->overlap, distinct[j]->overlap,
                             &both)) {
        return ChunkVerdict::kNotCovered;
      }
    }
  }
  uint32_t terms = 0;
  for (const ChunkPieceReport* p : distinct) terms ^= p->crc_term;
  const uint32_t crc = memo != nullptr
                           ? (*memo)(terms, length)
                           : storage::Crc32cFromPieces(terms, length);
  return crc == crc32c ? ChunkVerdict::kVerified : ChunkVerdict::kMismatch;
}

}  // namespace cairn::coordinator
