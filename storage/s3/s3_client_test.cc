// S3Client against a real S3 server (Ceph radosgw in CI: scripts/ceph/ceph.sh
// start; the endpoint and keys come from AWS_ENDPOINT_URL,
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY). Every test makes its own bucket
// cairn-test-<random> and deletes it at the end.
#include "storage/s3/s3_client.h"

#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::storage::s3 {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string RandomBytes(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (char& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

absl::Span<const char> Bytes(const std::string& s) {
  return absl::MakeConstSpan(s.data(), s.size());
}

class S3ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("AWS_ENDPOINT_URL") == nullptr) {
      FAIL() << "AWS_ENDPOINT_URL is not set: this test needs an S3 server; "
                "run scripts/ceph/ceph.sh start and "
                "eval \"$(scripts/ceph/ceph.sh env)\" (ctest -L s3 does it)";
    }
    absl::BitGen gen;
    bucket_ = absl::StrFormat("cairn-test-%016x", absl::Uniform<uint64_t>(gen));
    auto config = ParseS3Uri(bucket_, Environment::System());
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto client = S3Client::Create(config_);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    ASSERT_TRUE(client_->CreateBucket(bucket_).ok());
    ASSERT_TRUE(client_->CheckAccess().ok());
  }

  void TearDown() override {
    if (client_ == nullptr) return;
    auto uploads = client_->ListMultipartUploads("");
    if (uploads.ok()) {
      for (const auto& u : *uploads) {
        EXPECT_TRUE(client_->AbortMultipartUpload(u.key, u.upload_id).ok());
      }
    }
    auto objects = client_->ListObjects("");
    ASSERT_TRUE(objects.ok()) << objects.status();
    std::vector<std::string> keys;
    for (const auto& o : *objects) keys.push_back(o.key);
    EXPECT_TRUE(client_->DeleteObjects(keys).ok());
    absl::Status s = client_->DeleteBucket(bucket_);
    EXPECT_TRUE(s.ok()) << s;
  }

  // Puts `n` objects "prefix/NNNNN" with 8 threads.
  void PutMany(const std::string& prefix, int n) {
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int i = t; i < n; i += 8) {
          std::string data = absl::StrCat(i);
          if (!client_
                   ->PutObject(absl::StrFormat("%s%05d", prefix, i),
                               Bytes(data))
                   .ok()) {
            ++failures;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_EQ(failures.load(), 0);
  }

  std::string bucket_;
  S3Config config_;
  std::unique_ptr<S3Client> client_;
};

TEST_F(S3ClientTest, PutHeadAndRangedReadsAtTheEdges) {
  const std::string data = RandomBytes(10000, 1);
  ASSERT_TRUE(client_->PutObject("obj/a", Bytes(data)).ok());
  auto size = client_->HeadObject("obj/a");
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, data.size());

  std::string out(data.size(), '\0');
  struct Case {
    uint64_t offset, length, want;
  };
  for (Case c : {Case{0, 10000, 10000}, Case{0, 1, 1}, Case{9999, 1, 1},
                 Case{1234, 4321, 4321}, Case{9990, 100, 10}, Case{5000, 0, 0},
                 Case{10000, 0, 0}}) {
    auto n =
        client_->GetRange("obj/a", {c.offset, c.length}, absl::MakeSpan(out));
    ASSERT_TRUE(n.ok()) << n.status() << " at " << c.offset;
    ASSERT_EQ(*n, c.want) << c.offset;
    EXPECT_EQ(out.substr(0, *n), data.substr(c.offset, c.want)) << c.offset;
  }
  // Past the end: HTTP 416.
  auto past = client_->GetRange("obj/a", {10000, 5}, absl::MakeSpan(out));
  EXPECT_THAT(
      past, StatusIs(absl::StatusCode::kOutOfRange,
                     AllOf(HasSubstr("s3 GET " + bucket_ + "/obj/a: HTTP 416"),
                           HasSubstr("[bytes 10000..10005)"))));
  EXPECT_THAT(client_->GetRange("obj/a", {10001, 0}, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kOutOfRange));
  // Replacing the object.
  ASSERT_TRUE(client_->PutObject("obj/a", Bytes(std::string("xy"))).ok());
  EXPECT_EQ(*client_->HeadObject("obj/a"), 2u);
  // An empty object.
  ASSERT_TRUE(client_->PutObject("obj/empty", {}).ok());
  EXPECT_EQ(*client_->HeadObject("obj/empty"), 0u);
}

TEST_F(S3ClientTest, MissingKeysAreNotFound) {
  std::string out(10, '\0');
  auto head = client_->HeadObject("no/such");
  EXPECT_THAT(head,
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("s3 HEAD " + bucket_ + "/no/such: HTTP 404")));
  auto get = client_->GetRange("no/such", {0, 10}, absl::MakeSpan(out));
  EXPECT_THAT(get, StatusIs(absl::StatusCode::kNotFound,
                            HasSubstr("HTTP 404 NoSuchKey")));
  EXPECT_TRUE(client_->DeleteObject("no/such").ok());
}

TEST_F(S3ClientTest, KeysThatNeedEncoding) {
  const std::vector<std::string> keys = {
      "sp ace/a b",   "plus+sign",  "eq=ual&amp",  "ünïcødé/ключ/日本",
      "pct%20lit",    "tilde~_-.x", "q?mark#hash", "semi;colon,comma",
      "star*(paren)", "quote'\"dq", "a/./b",       "dollar$at@!"};
  for (const std::string& k : keys) {
    ASSERT_TRUE(client_->PutObject(k, Bytes(k)).ok()) << k;
  }
  for (const std::string& k : keys) {
    std::string out(k.size(), '\0');
    auto n = client_->GetRange(k, {0, k.size()}, absl::MakeSpan(out));
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(out, k);
  }
  auto listed = client_->ListObjects("");
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::set<std::string> got;
  for (const auto& o : *listed) got.insert(o.key);
  EXPECT_EQ(got, std::set<std::string>(keys.begin(), keys.end()));
  // Listing by a prefix that needs encoding.
  auto sp = client_->ListObjects("sp ace/");
  ASSERT_TRUE(sp.ok()) << sp.status();
  ASSERT_EQ(sp->size(), 1u);
  EXPECT_EQ((*sp)[0].key, "sp ace/a b");
  EXPECT_EQ((*sp)[0].size, 10u);
}

TEST_F(S3ClientTest, MultipartUploadOfThreeParts) {
  const uint64_t kPart = 5 << 20;
  const std::string data = RandomBytes(2 * kPart + 777, 2);
  auto id = client_->CreateMultipartUpload("mp/obj");
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::string> etags;
  for (int p = 0; p < 3; ++p) {
    uint64_t begin = p * kPart;
    uint64_t len = std::min<uint64_t>(kPart, data.size() - begin);
    auto etag = client_->UploadPart("mp/obj", *id, p + 1,
                                    Bytes(data).subspan(begin, len));
    ASSERT_TRUE(etag.ok()) << etag.status();
    etags.push_back(*etag);
  }
  // Not visible before Complete.
  EXPECT_THAT(client_->HeadObject("mp/obj"),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_TRUE(client_->CompleteMultipartUpload("mp/obj", *id, etags).ok());
  EXPECT_EQ(*client_->HeadObject("mp/obj"), data.size());
  std::string out(100, '\0');
  auto n = client_->GetRange("mp/obj", {kPart - 50, 100}, absl::MakeSpan(out));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(out, data.substr(kPart - 50, 100));
  std::string all(data.size(), '\0');
  n = client_->GetRange("mp/obj", {0, data.size()}, absl::MakeSpan(all));
  ASSERT_TRUE(n.ok());
  EXPECT_TRUE(all == data);
  EXPECT_GE(client_->stats().bytes_sent, data.size());
  EXPECT_GE(client_->stats().bytes_received, data.size());
}

TEST_F(S3ClientTest, MultipartErrors) {
  auto id = client_->CreateMultipartUpload("mp/small");
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::string> etags;
  for (int p = 1; p <= 2; ++p) {
    auto etag =
        client_->UploadPart("mp/small", *id, p, Bytes(std::string("x")));
    ASSERT_TRUE(etag.ok()) << etag.status();
    etags.push_back(*etag);
  }
  // All parts but the last must be >= 5 MiB.
  absl::Status s = client_->CompleteMultipartUpload("mp/small", *id, etags);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          AllOf(HasSubstr("EntityTooSmall"),
                                HasSubstr(bucket_ + "/mp/small"))));
  EXPECT_TRUE(client_->AbortMultipartUpload("mp/small", *id).ok());
  // Unknown upload id.
  auto part = client_->UploadPart("mp/small", *id, 3, Bytes(std::string("x")));
  EXPECT_THAT(part,
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("NoSuchUpload")));
  EXPECT_THAT(client_->UploadPart("mp/small", *id, 0, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(S3ClientTest, ListMultipartUploadsPagesAndAbort) {
  client_->SetListPageSizeForTest(2);
  std::set<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto id = client_->CreateMultipartUpload(absl::StrCat("up/k", i % 3));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.insert(*id);
  }
  auto other = client_->CreateMultipartUpload("elsewhere");
  ASSERT_TRUE(other.ok());
  auto uploads = client_->ListMultipartUploads("up/");
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  std::set<std::string> listed;
  for (const auto& u : *uploads) {
    listed.insert(u.upload_id);
    EXPECT_THAT(u.key, HasSubstr("up/k"));
    EXPECT_GT(u.initiated, absl::Now() - absl::Hours(1));
  }
  EXPECT_EQ(listed, ids);
  for (const auto& u : *uploads) {
    ASSERT_TRUE(client_->AbortMultipartUpload(u.key, u.upload_id).ok());
  }
  uploads = client_->ListMultipartUploads("up/");
  ASSERT_TRUE(uploads.ok());
  EXPECT_TRUE(uploads->empty());
  // Aborting twice is fine.
  EXPECT_TRUE(client_->AbortMultipartUpload("up/k0", *ids.begin()).ok());
}

TEST_F(S3ClientTest, ListPaginationAndDeleteObjectsInBatches) {
  PutMany("many/", 1500);
  ASSERT_TRUE(client_->PutObject("other", Bytes(std::string("o"))).ok());
  const uint64_t before = client_->stats().requests;
  auto listed = client_->ListObjects("many/");  // pages of 1000
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1500u);
  EXPECT_EQ(client_->stats().requests - before, 2u);
  for (int i = 0; i < 1500; ++i) {
    ASSERT_EQ((*listed)[i].key, absl::StrFormat("many/%05d", i));
    ASSERT_EQ((*listed)[i].size, absl::StrCat(i).size());
  }
  client_->SetListPageSizeForTest(97);
  listed = client_->ListObjects("many/01");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 500u);  // many/01000 .. many/01499

  auto all = client_->ListObjects("many/");
  ASSERT_TRUE(all.ok());
  std::vector<std::string> keys;
  for (const auto& o : *all) keys.push_back(o.key);
  keys.push_back("many/never-existed");
  const uint64_t before_delete = client_->stats().requests;
  ASSERT_TRUE(client_->DeleteObjects(keys).ok());
  EXPECT_EQ(client_->stats().requests - before_delete, 2u);  // 1000 + 501
  listed = client_->ListObjects("many/");
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(*client_->HeadObject("other"), 1u);
  EXPECT_TRUE(client_->DeleteObjects({}).ok());
}

TEST_F(S3ClientTest, CommonPrefixes) {
  for (const char* k : {"d/1", "d/b/2", "d/b/3", "d/c/4", "d/e", "dx"}) {
    ASSERT_TRUE(client_->PutObject(k, Bytes(std::string(k))).ok());
  }
  client_->SetListPageSizeForTest(1);
  std::vector<ObjectInfo> objects;
  auto prefixes = client_->ListCommonPrefixes("d/", &objects);
  ASSERT_TRUE(prefixes.ok()) << prefixes.status();
  EXPECT_EQ(*prefixes, (std::vector<std::string>{"d/b/", "d/c/"}));
  ASSERT_EQ(objects.size(), 2u);
  EXPECT_EQ(objects[0].key, "d/1");
  EXPECT_EQ(objects[1].key, "d/e");
  auto top = client_->ListCommonPrefixes("", nullptr);
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(*top, (std::vector<std::string>{"d/"}));
}

TEST_F(S3ClientTest, CredentialAndBucketErrors) {
  S3Config wrong = config_;
  wrong.secret_key = "not-the-secret";
  auto bad = S3Client::Create(wrong);
  ASSERT_TRUE(bad.ok());
  absl::Status s = (*bad)->CheckAccess();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnauthenticated,
                          AllOf(HasSubstr("SignatureDoesNotMatch"),
                                HasSubstr(bucket_))));
  EXPECT_EQ((*bad)->stats().retries, 0u);

  S3Config unknown = config_;
  unknown.access_key = "nobody-key";
  s = (*S3Client::Create(unknown))->CheckAccess();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnauthenticated,
                          HasSubstr("InvalidAccessKeyId")));

  S3Config missing = config_;
  missing.bucket = bucket_ + "-missing";
  s = (*S3Client::Create(missing))->CheckAccess();
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kNotFound,
                  AllOf(HasSubstr("NoSuchBucket"), HasSubstr(missing.bucket))));

  // Deleting a non-empty bucket.
  ASSERT_TRUE(client_->PutObject("x", Bytes(std::string("x"))).ok());
  s = client_->DeleteBucket(bucket_);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                          HasSubstr("BucketNotEmpty")));
  // Creating our own bucket again is fine.
  EXPECT_TRUE(client_->CreateBucket(bucket_).ok());
}

TEST_F(S3ClientTest, ConcurrentRequestsShareConnections) {
  const std::string data = RandomBytes(100000, 3);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        std::string key = absl::StrCat("c/", t, "/", i);
        std::string out(data.size(), '\0');
        if (!client_->PutObject(key, Bytes(data)).ok()) ++failures;
        auto n = client_->GetRange(key, {0, data.size()}, absl::MakeSpan(out));
        if (!n.ok() || out != data) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace cairn::storage::s3
