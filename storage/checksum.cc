// CRC-32C via ISA-L; see checksum.h for the conventions.
#include "storage/checksum.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>

namespace cairn::storage {

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  // crc32_iscsi takes an int length: feed it at most 1 GiB at a time.
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t reg = ~crc;
  while (n > 0) {
    const size_t piece = std::min<size_t>(n, size_t{1} << 30);
    reg = crc32_iscsi(const_cast<unsigned char*>(p), static_cast<int>(piece),
                      reg);
    p += piece;
    n -= piece;
  }
  return ~reg;
}

uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

namespace {

// GF(2) matrix helpers for Crc32cCombine (as zlib's crc32_combine).
uint32_t Gf2MatrixTimes(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  while (vec != 0) {
    if (vec & 1) sum ^= *mat;
    vec >>= 1;
    ++mat;
  }
  return sum;
}

void Gf2MatrixSquare(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = Gf2MatrixTimes(mat, mat[n]);
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  if (len_b == 0) return crc_a;
  uint32_t even[32];
  uint32_t odd[32];
  odd[0] = 0x82F63B78u;  // reflected Castagnoli polynomial
  uint32_t row = 1;
  for (int n = 1; n < 32; ++n) {
    odd[n] = row;
    row <<= 1;
  }
  Gf2MatrixSquare(even, odd);  // 2 zero bits
  Gf2MatrixSquare(odd, even);  // 4 zero bits
  do {
    Gf2MatrixSquare(even, odd);
    if (len_b & 1) crc_a = Gf2MatrixTimes(even, crc_a);
    len_b >>= 1;
    if (len_b == 0) break;
    Gf2MatrixSquare(odd, even);
    if (len_b & 1) crc_a = Gf2MatrixTimes(odd, crc_a);
    len_b >>= 1;
  } while (len_b != 0);
  return crc_a ^ crc_b;
}

}  // namespace cairn::storage
