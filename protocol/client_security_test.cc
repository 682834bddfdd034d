#include "protocol/client_security.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::protocol {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class ReadTokenFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  std::filesystem::path dir_ = testing::MakeTempDir("client-security");
  ~ReadTokenFileTest() override { std::filesystem::remove_all(dir_); }
};

TEST_F(ReadTokenFileTest, DropsOnlyTrailingWhitespace) {
  absl::StatusOr<std::string> token =
      ReadTokenFile("--token-file", Write("t", " s3cr et\r\n\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, " s3cr et");
}

TEST_F(ReadTokenFileTest, EmptyOrMissingFileNamesTheFlagAndPath) {
  std::string empty = Write("empty", " \n\t\n");
  absl::StatusOr<std::string> token = ReadTokenFile("--token-file", empty);
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token, StatusIs(absl::StatusCode::kInvalidArgument,
                              AllOf(HasSubstr("--token-file " + empty),
                                    HasSubstr("holds no token"))));

  std::string missing = (dir_ / "absent").string();
  token = ReadTokenFile("--peer-token-file", missing);
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(),
              HasSubstr("--peer-token-file " + missing));

  // A directory cannot be read as a token either.
  token = ReadTokenFile("--token-file", dir_.string());
  EXPECT_FALSE(token.ok());
}

TEST_F(ReadTokenFileTest, TooLongIsRefusedWithoutEchoingTheToken) {
  std::string path = Write("long", "abcdefghij\n");
  EXPECT_TRUE(ReadTokenFile("--peer-token-file", path, 10).ok());
  absl::StatusOr<std::string> token =
      ReadTokenFile("--peer-token-file", path, 9);
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token, StatusIs(absl::StatusCode::kInvalidArgument,
                              AllOf(HasSubstr("10 bytes; at most 9"),
                                    Not(HasSubstr("abcdefghij")))));
}

TEST_F(ReadTokenFileTest, TheFileWinsOverTheEnvironmentWhichIsTheFallback) {
  ::setenv("CAIRN_TEST_TOKEN", "from-env", 1);
  const std::string file = Write("t", "from-file\n");
  absl::StatusOr<std::string> token =
      TokenFromFileOrEnv("--token-file", file, "CAIRN_TEST_TOKEN");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "from-file");
  token = TokenFromFileOrEnv("--token-file", "", "CAIRN_TEST_TOKEN");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "from-env");
  ::unsetenv("CAIRN_TEST_TOKEN");
  token = TokenFromFileOrEnv("--token-file", "", "CAIRN_TEST_TOKEN");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "");
  // A named file that cannot be read is an error even with the variable
  // set: the operator asked for that file.
  ::setenv("CAIRN_TEST_TOKEN", "from-env", 1);
  token = TokenFromFileOrEnv("--peer-token-file", (dir_ / "missing").string(),
                             "CAIRN_TEST_TOKEN");
  ::unsetenv("CAIRN_TEST_TOKEN");
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(), HasSubstr("--peer-token-file"));
  // The size bound applies to the file.
  token = TokenFromFileOrEnv("--token-file", Write("big", "0123456789"),
                             "CAIRN_TEST_TOKEN", 4);
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(), HasSubstr("at most 4"));
}

TEST(ClientSecurityTest, FromEnvironmentReadsTheFourVariables) {
  ::setenv("CAIRN_TLS_CA", "/ca.pem", 1);
  ::setenv("CAIRN_TLS_CERT", "/cert.pem", 1);
  ::setenv("CAIRN_TLS_KEY", "/key.pem", 1);
  ::setenv("CAIRN_TOKEN", "tok", 1);
  ClientSecurity s = ClientSecurity::FromEnvironment();
  EXPECT_EQ(s.ca_file, "/ca.pem");
  EXPECT_EQ(s.cert_file, "/cert.pem");
  EXPECT_EQ(s.key_file, "/key.pem");
  EXPECT_EQ(s.token, "tok");
  EXPECT_TRUE(s.tls());
  for (const char* v :
       {"CAIRN_TLS_CA", "CAIRN_TLS_CERT", "CAIRN_TLS_KEY", "CAIRN_TOKEN"}) {
    ::unsetenv(v);
  }
  s = ClientSecurity::FromEnvironment();
  EXPECT_TRUE(s.ca_file.empty() && s.token.empty());
  EXPECT_FALSE(s.tls());
}

}  // namespace
}  // namespace cairn::protocol
