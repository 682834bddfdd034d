#include "storage/checksum.h"

#include <random>
#include <string>

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

}  // namespace
}  // namespace cairn::storage
