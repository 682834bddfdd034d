// CRC-32C (Castagnoli) for every byte Cairn stores.
//
// The values are the standard ones (iSCSI, ext4, RocksDB, Google's crc32c
// library): seed 0, reflected, final xor. The work is done by ISA-L's
// crc32_iscsi (libisal), which picks the fastest kernel for the CPU at run
// time (PCLMULQDQ folding; ~10+ GB/s per core). ISA-L's raw function takes and
// returns the *uninverted* register, so the finalisation lives here:
//   Crc32c(data)               == ~crc32_iscsi(data, n, ~0u)
//   Crc32cExtend(crc, data, n) == ~crc32_iscsi(data, n, ~crc)
// Crc32cCombine joins two CRCs of adjacent buffers without the bytes, by
// multiplying in GF(2) (zlib's crc32_combine, for the Castagnoli polynomial).
//
// Example:
//   uint32_t crc = 0;
//   for (const auto& piece : pieces) crc = Crc32cExtend(crc, piece.data(),
//   piece.size());
//   // crc == Crc32c(whole.data(), whole.size())
#ifndef CAIRN_STORAGE_CHECKSUM_H_
#define CAIRN_STORAGE_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace cairn::storage {

// CRC-32C of n bytes. Crc32c("123456789", 9) == 0xE3069283. Thread-safe.
uint32_t Crc32c(const void* data, size_t n);
inline uint32_t Crc32c(absl::string_view s) {
  return Crc32c(s.data(), s.size());
}

// Streaming: the CRC of (bytes that produced `crc`) followed by data[0, n).
// Crc32cExtend(0, data, n) == Crc32c(data, n).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// The CRC of A followed by B, from crc_a = Crc32c(A), crc_b = Crc32c(B) and
// len_b = |B|. O(log len_b).
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// The CRC of a buffer whose bytes are spread over several processes, none of
// which holds it whole (ranks that each load a strided part of a stored
// chunk). CRC-32C is affine over GF(2): the raw register of a buffer M is
// the seed's term, which depends only on |M|, XOR a term linear in M's bytes.
// Split M into disjoint pieces; each holder computes the linear term of "its
// bytes in place, zeros everywhere else" (Crc32cPieces), and the XOR of all
// holders' terms gives back Crc32c(M) (Crc32cFromPieces) when, and only when,
// the pieces tile M. Cost: the CRC of the held bytes plus O(log gap) per gap.
//
// Example (two holders of a 10-byte buffer):
//   Crc32cPieces a;  a.Add(0, m, 3);  a.Add(6, m + 6, 4);
//   Crc32cPieces b;  b.Add(3, m + 3, 3);
//   Crc32cFromPieces(a.Finish(10) ^ b.Finish(10), 10) == Crc32c(m, 10)
class Crc32cPieces {
 public:
  // Adds n bytes at `offset` of the buffer. Offsets must increase and
  // pieces must not overlap.
  void Add(uint64_t offset, const void* data, size_t n);
  // This holder's term for a buffer of `total` >= the end of the last piece.
  uint32_t Finish(uint64_t total) const;

 private:
  // The linear term of the pieces so far, which end at end_.
  uint32_t raw_ = 0;
  uint64_t end_ = 0;
  // The last gap and its operator: strided pieces repeat one gap.
  uint64_t gap_ = 0;
  uint32_t gap_operator_ = 1u << 31;
};

// Crc32c of a `total`-byte buffer from the XOR of every holder's
// Crc32cPieces::Finish(total).
uint32_t Crc32cFromPieces(uint32_t xor_of_parts, uint64_t total);

// Crc32cFromPieces for many buffers in turn, remembering the last length's
// seed term (its O(log total) part): the chunks of a tensor mostly share one
// length, and a 16k-rank load round checks millions of them.
class Crc32cFromPiecesMemo {
 public:
  uint32_t operator()(uint32_t xor_of_parts, uint64_t total);

 private:
  uint64_t total_ = 0;
  uint32_t seed_term_ = ~0u;  // of total_ == 0: the seed itself
};

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_CHECKSUM_H_
