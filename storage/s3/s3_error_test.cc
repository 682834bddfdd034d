// Tests of S3 error parsing and mapping, on error bodies as AWS S3 and Ceph
// radosgw send them.
#include "storage/s3/s3_error.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::storage::s3 {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kAwsNoSuchKey[] =
    R"(<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message><Key>job/0000000100/rank-3.data</Key><RequestId>4442587FB7D0A2F9</RequestId><HostId>8qBvhl+4yQ=</HostId></Error>)";
constexpr char kRgwNoSuchBucket[] =
    R"(<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchBucket</Code><Message></Message><BucketName>cairn-missing</BucketName><RequestId>tx00000a4b1c2d3e4f5-0065-1010-default</RequestId><HostId>1010-default-default</HostId></Error>)";
constexpr char kSignature[] =
    R"(<?xml version="1.0" encoding="UTF-8"?>
<Error>
  <Code>SignatureDoesNotMatch</Code>
  <Message>The request signature we calculated does not match the signature you provided. Check your key and signing method.</Message>
  <AWSAccessKeyId>AKIAEXAMPLE</AWSAccessKeyId>
  <StringToSign>AWS4-HMAC-SHA256...</StringToSign>
  <RequestId>tx0001</RequestId>
</Error>)";
constexpr char kInvalidAccessKeyId[] =
    R"(<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code><Message></Message><RequestId>tx0002</RequestId><HostId>h</HostId></Error>)";
constexpr char kAccessDenied[] =
    R"(<Error><Code>AccessDenied</Code><Message>Access Denied</Message><RequestId>R</RequestId></Error>)";
constexpr char kInvalidRange[] =
    R"(<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidRange</Code><Message>The requested range is not satisfiable</Message><RangeRequested>bytes=100-199</RangeRequested><ActualObjectSize>50</ActualObjectSize><RequestId>R</RequestId></Error>)";
constexpr char kSlowDown[] =
    R"(<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><RequestId>R</RequestId></Error>)";
constexpr char kInternal[] =
    R"(<Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message></Error>)";
constexpr char kBucketNotEmpty[] =
    R"(<Error><Code>BucketNotEmpty</Code><Message>The bucket you tried to delete is not empty</Message><BucketName>b</BucketName></Error>)";
constexpr char kAlreadyExists[] =
    R"(<Error><Code>BucketAlreadyExists</Code><Message>The requested bucket name is not available.</Message></Error>)";
constexpr char kEntityTooSmall[] =
    R"(<Error><Code>EntityTooSmall</Code><Message>Your proposed upload is smaller than the minimum allowed object size.</Message></Error>)";
constexpr char kNoSuchUpload[] =
    R"(<Error><Code>NoSuchUpload</Code><Message>The specified upload does not exist.</Message><UploadId>2~abc</UploadId></Error>)";
constexpr char kNotImplemented[] =
    R"(<Error><Code>NotImplemented</Code><Message>A header you provided implies functionality that is not implemented</Message></Error>)";
constexpr char kMalformedXml[] =
    R"(<Error><Code>MalformedXML</Code><Message>The XML you provided was not well-formed</Message></Error>)";
constexpr char kEntities[] =
    R"(<Error><Code>InvalidArgument</Code><Message>a &lt;b&gt; &amp; &quot;c&quot;</Message></Error>)";

TEST(S3ErrorTest, ParsesFields) {
  auto e = ParseS3ErrorXml(kAwsNoSuchKey);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "NoSuchKey");
  EXPECT_EQ(e->message, "The specified key does not exist.");
  EXPECT_EQ(e->request_id, "4442587FB7D0A2F9");
  EXPECT_EQ(e->resource, "job/0000000100/rank-3.data");
  e = ParseS3ErrorXml(kRgwNoSuchBucket);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "NoSuchBucket");
  EXPECT_EQ(e->message, "");
  EXPECT_EQ(e->resource, "cairn-missing");
  e = ParseS3ErrorXml(kSignature);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "SignatureDoesNotMatch");
  EXPECT_EQ(e->request_id, "tx0001");
  e = ParseS3ErrorXml(kEntities);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->message, "a <b> & \"c\"");
}

TEST(S3ErrorTest, RejectsNonErrorBodies) {
  EXPECT_FALSE(ParseS3ErrorXml("").has_value());
  EXPECT_FALSE(
      ParseS3ErrorXml("<html><body>502 Bad Gateway</body></html>").has_value());
  EXPECT_FALSE(ParseS3ErrorXml("<Error><Code>NoSu").has_value());
  EXPECT_FALSE(
      ParseS3ErrorXml("<Error><Message>m</Message></Error>").has_value());
  EXPECT_FALSE(ParseS3ErrorXml("not xml at all").has_value());
  EXPECT_FALSE(
      ParseS3ErrorXml("<ListBucketResult></ListBucketResult>").has_value());
}

TEST(S3ErrorTest, Mapping) {
  const S3RequestName put{"PUT", "cairn-ckpt", "job/0000000100/rank-3.data"};
  struct Case {
    long http;
    const char* body;
    absl::StatusCode want;
    const char* code;
  };
  const Case cases[] = {
      {404, kAwsNoSuchKey, absl::StatusCode::kNotFound, "NoSuchKey"},
      {404, kRgwNoSuchBucket, absl::StatusCode::kNotFound, "NoSuchBucket"},
      {404, kNoSuchUpload, absl::StatusCode::kNotFound, "NoSuchUpload"},
      {403, kSignature, absl::StatusCode::kUnauthenticated,
       "SignatureDoesNotMatch"},
      {403, kInvalidAccessKeyId, absl::StatusCode::kUnauthenticated,
       "InvalidAccessKeyId"},
      {403, kAccessDenied, absl::StatusCode::kPermissionDenied, "AccessDenied"},
      {416, kInvalidRange, absl::StatusCode::kOutOfRange, "InvalidRange"},
      {503, kSlowDown, absl::StatusCode::kUnavailable, "SlowDown"},
      {500, kInternal, absl::StatusCode::kUnavailable, "InternalError"},
      {409, kBucketNotEmpty, absl::StatusCode::kFailedPrecondition,
       "BucketNotEmpty"},
      {409, kAlreadyExists, absl::StatusCode::kAlreadyExists,
       "BucketAlreadyExists"},
      {400, kEntityTooSmall, absl::StatusCode::kInvalidArgument,
       "EntityTooSmall"},
      {400, kMalformedXml, absl::StatusCode::kInvalidArgument, "MalformedXML"},
      {501, kNotImplemented, absl::StatusCode::kUnimplemented,
       "NotImplemented"},
  };
  for (const Case& c : cases) {
    absl::Status s = S3ErrorToStatus(put, c.http, c.body, 1);
    EXPECT_THAT(
        s, StatusIs(
               c.want,
               AllOf(HasSubstr("s3 PUT cairn-ckpt/job/0000000100/rank-3.data: "
                               "HTTP " +
                               std::to_string(c.http) + " " + c.code),
                     ::testing::Not(HasSubstr("attempts")))))
        << c.body;
  }
  absl::Status sig = S3ErrorToStatus(put, 403, kSignature, 1);
  EXPECT_THAT(sig.message(), HasSubstr("does not match the signature"));
  EXPECT_THAT(sig.message(), HasSubstr("(request id tx0001)"));
}

TEST(S3ErrorTest, BodilessAndNonXmlResponses) {
  const S3RequestName head{"HEAD", "b", "k/x"};
  absl::Status s = S3ErrorToStatus(head, 404, "", 1);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound,
                          HasSubstr("s3 HEAD b/k/x: HTTP 404")));
  s = S3ErrorToStatus(head, 403, "", 1);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied));
  s = S3ErrorToStatus(head, 503, "", 6);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                          HasSubstr("after 6 attempts")));
  const S3RequestName get{"GET", "b", ""};
  s = S3ErrorToStatus(get, 502, "<html>Bad Gateway</html>", 3);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                          HasSubstr("s3 GET b: HTTP 502 (non-S3 body: "
                                    "<html>Bad Gateway</html>) (after 3")));
  s = S3ErrorToStatus(get, 302, std::string(1000, 'x'), 1);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnknown, HasSubstr("...)")));
  EXPECT_LT(s.message().size(), 400u);
}

TEST(S3ErrorTest, TransportError) {
  absl::Status s =
      TransportErrorToStatus({"GET", "b", "k"}, "Couldn't connect to server",
                             "http://127.0.0.1:1/b/k", 6);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(s.message(),
            "s3 GET b/k: Couldn't connect to server (http://127.0.0.1:1/b/k) "
            "(after 6 attempts)");
}

}  // namespace
}  // namespace cairn::storage::s3
