#include "common/copier/host_copier.h"

#include <random>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::copier {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

TEST(HostCopierTest, CopiesExactBytesSingleAndMultiThreaded) {
  for (int threads : {1, 3}) {
    HostCopier copier({threads, /*parallel_min_bytes=*/1000});
    for (size_t n : {size_t{0}, size_t{1}, size_t{999}, size_t{1000},
                     size_t{4097}, size_t{3 * 4096 + 5}, size_t{1 << 20}}) {
      const std::string src = RandomBytes(n, static_cast<uint32_t>(n));
      std::string dst(n + 2, '\x7f');
      ASSERT_TRUE(copier
                      .Copy(CopySource::Host(src.data()),
                            absl::MakeSpan(dst.data() + 1, n))
                      .ok());
      ASSERT_TRUE(copier.Flush().ok());
      EXPECT_EQ(dst.substr(1, n), src) << "threads " << threads << " n " << n;
      EXPECT_EQ(dst[0], '\x7f');
      EXPECT_EQ(dst[n + 1], '\x7f');  // nothing written past the end
    }
  }
}

TEST(HostCopierTest, RejectsCudaSourcesAndNull) {
  HostCopier copier;
  CopySource cuda;
  cuda.kind = CopySource::Kind::kCudaIpc;
  char buf[8];
  absl::Status s = copier.Copy(cuda, absl::MakeSpan(buf, 8));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          ::testing::HasSubstr("cuda copier")));
  EXPECT_THAT(copier.Copy(CopySource::Host(nullptr), absl::MakeSpan(buf, 8)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(copier.name(), "host");
}

}  // namespace
}  // namespace cairn::copier
