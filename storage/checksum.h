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

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_CHECKSUM_H_
