#include "storage/checksum.h"

#include <algorithm>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace cairn::storage {
namespace {

// Bitwise CRC-32C: the oracle.
uint32_t SlowCrc32c(const std::string& s) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) {
      crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
  }
  return ~crc;
}

TEST(Crc32cTest, StandardVectors) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
}

TEST(Crc32cTest, MatchesBitwiseOracleOnRandomInputs) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 300; ++i) {
    std::string s(rng() % 5000, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    ASSERT_EQ(Crc32c(s), SlowCrc32c(s)) << "length " << s.size();
  }
}

TEST(Crc32cTest, ExtendAndCombineEqualWholeBuffer) {
  std::mt19937_64 rng(12);
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 20000, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    const size_t cut = s.empty() ? 0 : rng() % (s.size() + 1);
    const uint32_t whole = Crc32c(s);
    const uint32_t a = Crc32c(s.data(), cut);
    const uint32_t b = Crc32c(s.data() + cut, s.size() - cut);
    ASSERT_EQ(Crc32cExtend(a, s.data() + cut, s.size() - cut), whole);
    ASSERT_EQ(Crc32cCombine(a, b, s.size() - cut), whole);
  }
}

TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::string s = "model.layers.3.attn.wq.weight";
  const uint32_t good = Crc32c(s);
  for (size_t i = 0; i < s.size() * 8; ++i) {
    s[i / 8] ^= static_cast<char>(1 << (i % 8));
    EXPECT_NE(Crc32c(s), good) << "bit " << i;
    s[i / 8] ^= static_cast<char>(1 << (i % 8));
  }
}

// Random tilings of a buffer into pieces dealt to several holders: the XOR of
// the holders' terms must give the whole buffer's CRC (checked against the
// bitwise oracle), and leaving out or doubling any piece must not.
TEST(Crc32cPiecesTest, HoldersOfATilingRecoverTheWholeCrc) {
  std::mt19937_64 rng(77);
  for (int i = 0; i < 500; ++i) {
    std::string s(1 + rng() % 5000, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    const uint32_t want = SlowCrc32c(s);
    // Cut into pieces, each dealt to one of `holders`.
    const int holders = 1 + static_cast<int>(rng() % 4);
    std::vector<std::pair<size_t, size_t>> pieces;  // offset, length
    for (size_t at = 0; at < s.size();) {
      const size_t n = std::min<size_t>(s.size() - at, 1 + rng() % 700);
      pieces.emplace_back(at, n);
      at += n;
    }
    std::vector<int> owner(pieces.size());
    for (int& o : owner) o = static_cast<int>(rng() % holders);
    auto xor_of_parts = [&](size_t skip, size_t twice) {
      uint32_t x = 0;
      for (int h = 0; h < holders; ++h) {
        Crc32cPieces part;
        for (size_t p = 0; p < pieces.size(); ++p) {
          if (owner[p] != h || p == skip) continue;
          part.Add(pieces[p].first, s.data() + pieces[p].first,
                   pieces[p].second);
        }
        x ^= part.Finish(s.size());
      }
      if (twice < pieces.size()) {
        Crc32cPieces extra;
        extra.Add(pieces[twice].first, s.data() + pieces[twice].first,
                  pieces[twice].second);
        x ^= extra.Finish(s.size());
      }
      return x;
    };
    const size_t none = pieces.size();
    ASSERT_EQ(Crc32cFromPieces(xor_of_parts(none, none), s.size()), want)
        << "case " << i;
    const size_t p = rng() % pieces.size();
    EXPECT_NE(Crc32cFromPieces(xor_of_parts(p, none), s.size()), want)
        << "case " << i << " without piece " << p;
    EXPECT_NE(Crc32cFromPieces(xor_of_parts(none, p), s.size()), want)
        << "case " << i << " with piece " << p << " twice";
  }
}

// Gaps and totals beyond 4 GiB (chunk offsets of multi-GB objects): zeros of
// length 2n are zeros of length n twice, so Combine must agree with itself.
// The memo gives Crc32cFromPieces' answer for any sequence of lengths:
// repeated, changing, zero, and back to one seen before.
TEST(Crc32cPiecesTest, MemoAgreesWithCrc32cFromPieces) {
  std::mt19937_64 rng(17);
  Crc32cFromPiecesMemo memo;
  const uint64_t lengths[] = {0, 1, 4096, 1 << 20, uint64_t{3} << 33};
  for (int i = 0; i < 2000; ++i) {
    const uint64_t total = i % 3 == 0 ? rng() % (uint64_t{1} << 40)
                                      : lengths[rng() % std::size(lengths)];
    const uint32_t terms = static_cast<uint32_t>(rng());
    ASSERT_EQ(memo(terms, total), Crc32cFromPieces(terms, total))
        << "length " << total << " at step " << i;
  }
}

TEST(Crc32cPiecesTest, LargeGapsAgreeWithCombine) {
  const std::string head = "abc", tail = "xyz";
  uint32_t zeros = Crc32c(std::string(1, '\0'));  // crc of 1 zero byte
  uint64_t n = 1;
  while (n < (uint64_t{5} << 30)) {
    zeros = Crc32cCombine(zeros, zeros, n);
    n *= 2;
  }
  // head . zeros(n) . tail, as one holder with a gap of n bytes.
  const uint32_t want =
      Crc32cCombine(Crc32cCombine(Crc32c(head), zeros, n), Crc32c(tail), 3);
  Crc32cPieces part;
  part.Add(0, head.data(), 3);
  part.Add(3 + n, tail.data(), 3);
  EXPECT_EQ(Crc32cFromPieces(part.Finish(n + 6), n + 6), want);
  // Two holders, the second with a trailing gap.
  Crc32cPieces a, b;
  a.Add(0, head.data(), 3);
  b.Add(3 + n, tail.data(), 3);
  EXPECT_EQ(Crc32cFromPieces(a.Finish(n + 6) ^ b.Finish(n + 6), n + 6), want);
  // The zeros themselves: 1 zero byte doubled agrees with a short oracle.
  EXPECT_EQ(Crc32cCombine(Crc32c(std::string(1, '\0')),
                          Crc32c(std::string(1, '\0')), 1),
            SlowCrc32c(std::string(2, '\0')));
}

}  // namespace
}  // namespace cairn::storage
