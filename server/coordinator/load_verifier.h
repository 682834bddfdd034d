// Checks stored chunks that no single loading rank read whole.
//
// A resharding load (rows -> columns, say) leaves most stored chunks split
// across ranks: each rank needs, and reads, a strided part of the chunk, so
// no rank can check the chunk's crc32c alone. Reading the whole chunk to
// check it doubles the bytes read. Instead every rank reports, per partly read
// chunk, the box it read and the linear CRC term of those bytes
// (storage::Crc32cPieces); this library decides per stored chunk:
//
//   1. Pieces with identical boxes are one piece read by several ranks
//      (replicated destinations). Their terms must agree; if they do not,
//      the bytes differed between readers and the chunk is not verified.
//   2. The distinct boxes must tile the stored chunk: pairwise disjoint, their
//      volumes summing to the chunk's. Otherwise part of the chunk was read
//      by nobody (a partial load) and the crc cannot be formed.
//   3. The XOR of the distinct terms, finished by Crc32cFromPieces, must equal
//      the manifest's crc32c.
//
// A chunk that fails any step is answered "verify locally" to every rank that
// read part of it: each re-reads the chunk whole, checks it and copies the
// checked bytes over what it read, so a transient bad read is repaired and
// real damage is reported (DATA_LOSS) by the rank with the chunk named.
//
// Cost: O(k log k + d^2) box work per chunk for k pieces with d distinct
// boxes (d is the number of loading ranks sharing the chunk: small); chunks
// with more than kMaxDistinctPieces distinct boxes are not combined.
#ifndef CAIRN_SERVER_COORDINATOR_LOAD_VERIFIER_H_
#define CAIRN_SERVER_COORDINATOR_LOAD_VERIFIER_H_

#include <cstdint>
#include <vector>

#include "planner/box.h"
#include "storage/checksum.h"

namespace cairn::coordinator {

inline constexpr int kMaxDistinctPieces = 4096;

// One rank's piece of one stored chunk.
struct ChunkPieceReport {
  int rank = 0;
  int index = 0;              // in the rank's VerifyLoadRequest.pieces
  planner::ChunkBox overlap;  // inside the stored chunk's box
  uint32_t crc_term = 0;
};

enum class ChunkVerdict {
  kVerified,        // the pieces tile the chunk and combine to its crc32c
  kNotCovered,      // the pieces do not tile the chunk
  kMismatch,        // they tile it but the bytes read are not the stored ones
  kReadersDisagree  // ranks reading the same box got different bytes
};

const char* ChunkVerdictName(ChunkVerdict v);

// Decides one stored chunk, as the manifest records it (its box, `length`
// bytes: Volume(box) x dtype size, and their crc32c), from every piece of it
// the load's ranks read. `pieces` may be reordered. A caller deciding many
// chunks passes one `memo` for all of them (one per thread).
ChunkVerdict VerifyChunk(const planner::ChunkBox& box, uint64_t length,
                         uint32_t crc32c, std::vector<ChunkPieceReport>& pieces,
                         storage::Crc32cFromPiecesMemo* memo = nullptr);

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_LOAD_VERIFIER_H_
