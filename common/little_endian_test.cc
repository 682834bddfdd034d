#include "common/little_endian.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace cairn {
namespace {

TEST(LittleEndianTest, StoresTheLeastSignificantByteFirst) {
  unsigned char b[12] = {};
  little_endian::Store32(b, 0x04030201u);
  little_endian::Store64(b + 4, 0x0c0b0a0908070605ull);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(b[i], i + 1) << "byte " << i;
}

TEST(LittleEndianTest, LoadsWhatItStoresAtAnyAlignment) {
  char b[16] = {};
  for (int at = 0; at < 8; ++at) {
    little_endian::Store64(b + at, 0x8877665544332211ull);
    EXPECT_EQ(little_endian::Load64(b + at), 0x8877665544332211ull);
    little_endian::Store32(b + at, 0xfedcba98u);
    EXPECT_EQ(little_endian::Load32(b + at), 0xfedcba98u);
  }
}

TEST(LittleEndianTest, AppendsTheSameBytesStoreWrites) {
  std::string s = "x";
  little_endian::Append32(&s, 0x44434241u);
  little_endian::Append64(&s, 0x3837363534333231ull);
  EXPECT_EQ(s, "xABCD12345678");
}

}  // namespace
}  // namespace cairn
