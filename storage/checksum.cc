// CRC-32C via ISA-L; see checksum.h for the conventions.
#include "storage/checksum.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <array>
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

constexpr uint32_t kPolyReflected = 0x82F63B78u;  // Castagnoli, reflected
constexpr uint32_t kOne = 1u << 31;  // the polynomial 1 (reflected: bit 31)

// a(x) * b(x) mod P(x), both reflected (bit 31 = x^0, bit 0 = x^31).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = kOne; m != 0 && a != 0; m >>= 1) {
    if (a & m) {
      product ^= b;
      a &= ~m;
    }
    b = (b & 1) ? (b >> 1) ^ kPolyReflected : b >> 1;  // b *= x
  }
  return product;
}

// x^(2^k) mod P for k in [0, 67): squares, so x^(8n) needs one multiply per
// set bit of n.
const uint32_t* PowersOfTwo() {
  static const auto* table = [] {
    auto* t = new std::array<uint32_t, 67>;
    uint32_t p = kOne >> 1;  // x^1
    for (uint32_t& v : *t) {
      v = p;
      p = MultModP(p, p);
    }
    return t;
  }();
  return table->data();
}

// x^(8n) mod P: the operator that appends n zero bytes to a raw register.
uint32_t ZeroBytesOperator(uint64_t n) {
  const uint32_t* powers = PowersOfTwo();
  uint32_t p = kOne;
  for (int k = 3; n != 0; n >>= 1, ++k) {
    if (n & 1) p = MultModP(powers[k], p);
  }
  return p;
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // With seed and final xor both ~0, crc(A . B) = crc(A) x^(8|B|) + crc(B).
  return MultModP(ZeroBytesOperator(len_b), crc_a) ^ crc_b;
}

void Crc32cPieces::Add(uint64_t offset, const void* data, size_t n) {
  if (offset > end_) {
    const uint64_t gap = offset - end_;
    if (gap != gap_) {
      gap_ = gap;
      gap_operator_ = ZeroBytesOperator(gap);
    }
    raw_ = MultModP(gap_operator_, raw_);
  }
  // Crc32cExtend works on inverted registers: ~Extend(~raw) is the raw update.
  raw_ = ~Crc32cExtend(~raw_, data, n);
  end_ = offset + n;
}

uint32_t Crc32cPieces::Finish(uint64_t total) const {
  return MultModP(ZeroBytesOperator(total - end_), raw_);
}

uint32_t Crc32cFromPieces(uint32_t xor_of_parts, uint64_t total) {
  // The raw register of the whole buffer is the seed's contribution (~0
  // shifted over every byte) plus the bytes' contribution, which is linear.
  return ~(MultModP(ZeroBytesOperator(total), ~0u) ^ xor_of_parts);
}

uint32_t Crc32cFromPiecesMemo::operator()(uint32_t xor_of_parts,
                                          uint64_t total) {
  if (total != total_) {
    total_ = total;
    seed_term_ = MultModP(ZeroBytesOperator(total), ~0u);
  }
  return ~(seed_term_ ^ xor_of_parts);
}

}  // namespace cairn::storage
