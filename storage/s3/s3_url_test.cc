// Tests of S3 URL building: path-style vs virtual-hosted, and the SigV4
// percent-encoding of keys and query parameters (checked against a
// reference encoder on many random keys).
#include "storage/s3/s3_url.h"

#include <string>

#include "absl/random/random.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace cairn::storage::s3 {
namespace {

// The SigV4 rule, written independently: unreserved bytes stay, every other
// byte is %XX with uppercase hex.
std::string ReferenceEncode(const std::string& s, bool keep_slash) {
  std::string out;
  for (unsigned char c : s) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
        (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
        c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

S3Config Config(bool path_style, std::string endpoint) {
  S3Config c;
  c.endpoint = std::move(endpoint);
  c.path_style = path_style;
  return c;
}

TEST(S3UrlTest, PathStyle) {
  S3Config c = Config(true, "http://127.0.0.1:7480");
  EXPECT_EQ(ObjectUrl(c, "bkt", "a/b.data"),
            "http://127.0.0.1:7480/bkt/a/b.data");
  EXPECT_EQ(ObjectUrl(c, "bkt", ""), "http://127.0.0.1:7480/bkt");
  EXPECT_EQ(ObjectUrl(c, "bkt", "", {{"list-type", "2"}, {"max-keys", "1"}}),
            "http://127.0.0.1:7480/bkt?list-type=2&max-keys=1");
}

TEST(S3UrlTest, VirtualHosted) {
  S3Config c = Config(false, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(ObjectUrl(c, "bkt", "a/b"),
            "https://bkt.s3.eu-west-1.amazonaws.com/a/b");
  EXPECT_EQ(ObjectUrl(c, "bkt", ""), "https://bkt.s3.eu-west-1.amazonaws.com/");
  EXPECT_EQ(
      ObjectUrl(c, "bkt", "k", {{"uploadId", "x/y"}, {"partNumber", "3"}}),
      "https://bkt.s3.eu-west-1.amazonaws.com/k?partNumber=3&uploadId=x%2Fy");
}

TEST(S3UrlTest, KeyEncoding) {
  EXPECT_EQ(EncodeKeyPath("dir/a b+c=d"), "dir/a%20b%2Bc%3Dd");
  EXPECT_EQ(EncodeKeyPath("ünï/ç"), "%C3%BCn%C3%AF/%C3%A7");
  EXPECT_EQ(EncodeKeyPath("a~b_c-d.e"), "a~b_c-d.e");
  EXPECT_EQ(EncodeKeyPath("q?x#y%z&"), "q%3Fx%23y%25z%26");
  EXPECT_EQ(EncodeKeyPath("a//b/"), "a//b/");
  EXPECT_EQ(UriEncode("a/b"), "a%2Fb");
}

TEST(S3UrlTest, QueryIsSortedAndEncoded) {
  EXPECT_EQ(CanonicalQuery({}), "");
  EXPECT_EQ(CanonicalQuery({{"uploads", ""}}), "uploads=");
  EXPECT_EQ(CanonicalQuery({{"prefix", "a b/+"},
                            {"delimiter", "/"},
                            {"list-type", "2"},
                            {"continuation-token", "1/x=="}}),
            "continuation-token=1%2Fx%3D%3D&delimiter=%2F&list-type=2&"
            "prefix=a%20b%2F%2B");
}

TEST(S3UrlTest, RandomKeysMatchReferenceEncoder) {
  absl::BitGen gen;
  for (int i = 0; i < 2000; ++i) {
    std::string key(absl::Uniform(gen, 0, 40), '\0');
    for (char& ch : key) {
      ch = static_cast<char>(absl::Uniform<int>(gen, 1, 256));
    }
    ASSERT_EQ(EncodeKeyPath(key), ReferenceEncode(key, true)) << key;
    ASSERT_EQ(UriEncode(key), ReferenceEncode(key, false)) << key;
  }
}

}  // namespace
}  // namespace cairn::storage::s3
