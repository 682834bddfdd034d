// Tests of ParseS3Uri: URI syntax, query overrides, env precedence, AWS
// profiles from the shared files, and the errors for bad URIs.
#include "storage/s3/s3_config.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::storage::s3 {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

MapEnvironment EnvWithKeys() {
  MapEnvironment env;
  env.vars = {{"HOME", "/home/u"},
              {"AWS_ACCESS_KEY_ID", "envkey"},
              {"AWS_SECRET_ACCESS_KEY", "envsecret"}};
  return env;
}

TEST(S3ConfigTest, BucketAndPrefix) {
  MapEnvironment env = EnvWithKeys();
  auto c = ParseS3Uri("my-bucket/ckpt/job1", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bucket, "my-bucket");
  EXPECT_EQ(c->prefix, "ckpt/job1/");
  EXPECT_EQ(c->original_query, "");
  auto root = ParseS3Uri("my-bucket", env);
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->prefix, "");
  auto slash = ParseS3Uri("my-bucket/", env);
  ASSERT_TRUE(slash.ok());
  EXPECT_EQ(slash->prefix, "");
  auto trailing = ParseS3Uri("my-bucket/a/b/", env);
  ASSERT_TRUE(trailing.ok());
  EXPECT_EQ(trailing->prefix, "a/b/");
}

TEST(S3ConfigTest, AwsDefaults) {
  MapEnvironment env = EnvWithKeys();
  auto c = ParseS3Uri("b12/p", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->region, "us-east-1");
  EXPECT_EQ(c->endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_FALSE(c->path_style);
  EXPECT_EQ(c->access_key, "envkey");
  EXPECT_EQ(c->secret_key, "envsecret");
  EXPECT_EQ(c->session_token, "");
  EXPECT_EQ(c->credentials_source, "env");
  EXPECT_EQ(c->part_bytes, 16u << 20);
  EXPECT_EQ(c->max_attempts, 6);
}

TEST(S3ConfigTest, EndpointFromEnvMeansPathStyle) {
  MapEnvironment env = EnvWithKeys();
  env.vars["AWS_ENDPOINT_URL"] = "http://127.0.0.1:7480/";
  env.vars["AWS_REGION"] = "eu-west-3";
  env.vars["AWS_SESSION_TOKEN"] = "tok";
  auto c = ParseS3Uri("bkt/x", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->endpoint, "http://127.0.0.1:7480");
  EXPECT_TRUE(c->path_style);
  EXPECT_EQ(c->region, "eu-west-3");
  EXPECT_EQ(c->session_token, "tok");
  // The S3-specific variable wins over the generic one.
  env.vars["AWS_ENDPOINT_URL_S3"] = "https://s3.example.com";
  c = ParseS3Uri("bkt/x", env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->endpoint, "https://s3.example.com");
}

TEST(S3ConfigTest, RegionPrecedence) {
  MapEnvironment env = EnvWithKeys();
  env.files["/home/u/.aws/config"] = "[default]\nregion = ap-south-1\n";
  auto c = ParseS3Uri("bkt", env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->region, "ap-south-1");
  EXPECT_EQ(c->endpoint, "https://s3.ap-south-1.amazonaws.com");
  env.vars["AWS_DEFAULT_REGION"] = "us-west-1";
  c = ParseS3Uri("bkt", env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->region, "us-west-1");
  env.vars["AWS_REGION"] = "us-west-2";
  c = ParseS3Uri("bkt", env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->region, "us-west-2");
  c = ParseS3Uri("bkt?region=sa-east-1", env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->region, "sa-east-1");
}

TEST(S3ConfigTest, QueryOverridesEnv) {
  MapEnvironment env = EnvWithKeys();
  env.vars["AWS_ENDPOINT_URL"] = "http://envhost:1";
  env.vars["AWS_CA_BUNDLE"] = "/env/ca.pem";
  const std::string q =
      "endpoint=https%3A%2F%2Fminio.local%3A9000&region=r1&addressing=virtual"
      "&ca_bundle=/etc/ca.pem&part_bytes=8388608&upload_concurrency=3"
      "&read_concurrency=5&single_put_max_bytes=1000&coalesce_gap_bytes=7"
      "&max_attempts=2";
  auto c = ParseS3Uri("bkt/pre?" + q, env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->endpoint, "https://minio.local:9000");
  EXPECT_EQ(c->region, "r1");
  EXPECT_FALSE(c->path_style);
  EXPECT_EQ(c->ca_bundle, "/etc/ca.pem");
  EXPECT_EQ(c->part_bytes, 8388608u);
  EXPECT_EQ(c->upload_concurrency, 3);
  EXPECT_EQ(c->read_concurrency, 5);
  EXPECT_EQ(c->single_put_max_bytes, 1000u);
  EXPECT_EQ(c->coalesce_gap_bytes, 7u);
  EXPECT_EQ(c->max_attempts, 2);
  EXPECT_EQ(c->original_query, q);
  EXPECT_EQ(c->prefix, "pre/");
  // Unescaped endpoint works too.
  c = ParseS3Uri("bkt?endpoint=http://h:80&addressing=path", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->endpoint, "http://h:80");
  EXPECT_TRUE(c->path_style);
  EXPECT_EQ(c->ca_bundle, "/env/ca.pem");
}

TEST(S3ConfigTest, DefaultProfileFromCredentialsFile) {
  MapEnvironment env;
  env.vars["HOME"] = "/home/u";
  env.files["/home/u/.aws/credentials"] =
      "# comment\n[default]\naws_access_key_id = AKID\n"
      "aws_secret_access_key=SECRET \n\n[other]\naws_access_key_id=O\n"
      "aws_secret_access_key=OS\naws_session_token=OT\n";
  auto c = ParseS3Uri("bkt", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key, "AKID");
  EXPECT_EQ(c->secret_key, "SECRET");
  EXPECT_EQ(c->credentials_source,
            "profile default (/home/u/.aws/credentials)");
  env.vars["AWS_PROFILE"] = "other";
  c = ParseS3Uri("bkt", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key, "O");
  EXPECT_EQ(c->session_token, "OT");
}

TEST(S3ConfigTest, EnvKeysBeatProfileUnlessProfileIsExplicit) {
  MapEnvironment env = EnvWithKeys();
  env.files["/home/u/.aws/credentials"] =
      "[default]\naws_access_key_id=D\naws_secret_access_key=DS\n"
      "[p2]\naws_access_key_id=P\naws_secret_access_key=PS\n";
  auto c = ParseS3Uri("bkt", env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key, "envkey");
  env.vars["AWS_PROFILE"] = "p2";
  c = ParseS3Uri("bkt", env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key, "envkey");
  c = ParseS3Uri("bkt?profile=p2", env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key, "P");
  EXPECT_EQ(c->secret_key, "PS");
}

TEST(S3ConfigTest, CustomFilesAndConfigFileProfile) {
  MapEnvironment env;
  env.vars["AWS_SHARED_CREDENTIALS_FILE"] = "/etc/creds";
  env.vars["AWS_CONFIG_FILE"] = "/etc/awsconf";
  env.vars["AWS_PROFILE"] = "team";
  env.files["/etc/creds"] = "[default]\naws_access_key_id=D\n";
  env.files["/etc/awsconf"] =
      "[profile team]\nregion = eu-central-1\naws_access_key_id = T\n"
      "aws_secret_access_key = TS\n";
  auto c = ParseS3Uri("bkt", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key, "T");
  EXPECT_EQ(c->region, "eu-central-1");
  EXPECT_EQ(c->credentials_source, "profile team (/etc/awsconf)");
}

TEST(S3ConfigTest, NoCredentialsNamesWhereItLooked) {
  MapEnvironment env;
  env.vars["HOME"] = "/home/u";
  auto c = ParseS3Uri("bkt/p", env);
  EXPECT_THAT(
      c, StatusIs(absl::StatusCode::kUnauthenticated,
                  AllOf(HasSubstr("s3://bkt/p"), HasSubstr("AWS_ACCESS_KEY_ID"),
                        HasSubstr("/home/u/.aws/credentials"))));
}

TEST(S3ConfigTest, BadUris) {
  MapEnvironment env = EnvWithKeys();
  struct Case {
    std::string rest, want;
  };
  const Case cases[] = {
      {"", "no bucket"},
      {"/prefix", "no bucket"},
      {"ab", "not a valid bucket name"},
      {"Upper", "not a valid bucket name"},
      {"bad_bucket", "not a valid bucket name"},
      {"-bkt", "not a valid bucket name"},
      {"bkt//x", "empty path segment"},
      {"bkt?colour=red", "unknown query parameter 'colour'"},
      {"bkt?region", "has no value"},
      {"bkt?region=a&region=b", "given twice"},
      {"bkt?part_bytes=1048576", "below S3's minimum part size of 5 MiB"},
      {"bkt?part_bytes=lots", "part_bytes=lots is not an integer"},
      {"bkt?max_attempts=0", "max_attempts=0"},
      {"bkt?addressing=sideways", "addressing=sideways"},
      {"bkt?endpoint=ftp://h", "must start with http:// or https://"},
      {"bkt?endpoint=http://h/path", "no path"},
      {"bkt?endpoint=http%3", "bad percent escape"},
      {"bkt?profile=nobody", "profile 'nobody' is in neither"},
  };
  for (const Case& c : cases) {
    auto r = ParseS3Uri(c.rest, env);
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                            AllOf(HasSubstr(c.want),
                                  HasSubstr("'s3://" + c.rest + "'"))))
        << c.rest << c.rest << c.rest;
  }
}

TEST(S3ConfigTest, ParseAwsIni) {
  auto ini = ParseAwsIni(
      "ignored = before section\n[a]\n x = 1 \n;c\n#c\nY=2\n[ profile b ]\n"
      "z=a=b\n");
  EXPECT_EQ(ini.size(), 2u);
  EXPECT_EQ(ini["a"]["x"], "1");
  EXPECT_EQ(ini["a"]["y"], "2");
  EXPECT_EQ(ini["profile b"]["z"], "a=b");
}

}  // namespace
}  // namespace cairn::storage::s3
