#include "server/coordinator/auth.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"
#include "gtest/gtest.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const char kAlice[] = "alice-token-0123456789abcdef";
const char kBob[] = "bob-token-0123456789abcdef-xyz";
const char kRoot[] = "root-token-0123456789abcdef";

// What a parse error says, asserting it is INVALID_ARGUMENT.
std::string ParseError(const std::string& text) {
  absl::StatusOr<AuthTable> t = AuthTable::Parse(text, "tokens.txt");
  EXPECT_FALSE(t.ok()) << text;
  if (t.ok()) return "";
  EXPECT_THAT(t, StatusIs(absl::StatusCode::kInvalidArgument));
  return std::string(t.status().message());
}

TEST(AuthTableTest, ParsesGrantsCommentsNamesAndRepeatedCredentials) {
  absl::StatusOr<AuthTable> t = AuthTable::Parse(
      absl::StrCat("# team a\n\n", kAlice, " writer team-a-* alice\n", "  ",
                   kAlice, "\treader *\n", kBob, " reader team-b\n",
                   "cert:CN=trainer-7 agent *\n"),
      "tokens.txt");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_tokens(), 2u);
  EXPECT_EQ(t->num_certificates(), 1u);
  const Principal* alice = t->FindToken(kAlice);
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->name, "alice");
  EXPECT_TRUE(alice->Allows(Action::kSave, "team-a-llm"));
  EXPECT_TRUE(alice->Allows(Action::kRead, "team-b"));  // reader on *
  EXPECT_FALSE(alice->Allows(Action::kSave, "team-b"));
  EXPECT_FALSE(alice->Allows(Action::kDelete, "team-a-llm"));
  EXPECT_EQ(alice->MaxRole(), Role::kWriter);
  // Unnamed: the token's fingerprint, never the token.
  const Principal* bob = t->FindToken(kBob);
  ASSERT_NE(bob, nullptr);
  EXPECT_EQ(bob->name, absl::StrCat("token:", TokenFingerprint(kBob)));
  EXPECT_THAT(bob->name, Not(HasSubstr("bob-token")));
  const Principal* cert = t->FindCertificate("CN=trainer-7");
  ASSERT_NE(cert, nullptr);
  EXPECT_EQ(cert->name, "cert:CN=trainer-7");
  EXPECT_TRUE(cert->Allows(Action::kRegisterAgent, ""));
  EXPECT_EQ(t->FindCertificate("SAN=trainer-7"), nullptr);
}

TEST(AuthTableTest, FindsOnlyTheExactToken) {
  absl::StatusOr<AuthTable> t =
      AuthTable::Parse(absl::StrCat(kAlice, " admin *\n"), "f");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_NE(t->FindToken(kAlice), nullptr);
  const std::string alice = kAlice;
  EXPECT_EQ(t->FindToken(alice.substr(0, alice.size() - 1)), nullptr);
  EXPECT_EQ(t->FindToken(alice + "0"), nullptr);
  EXPECT_EQ(t->FindToken(""), nullptr);
  std::string flipped = alice;
  flipped[5] ^= 1;
  EXPECT_EQ(t->FindToken(flipped), nullptr);
}

TEST(AuthTableTest, ErrorsNameTheLineAndNeverTheToken) {
  const std::string secret = "s3cr3t";  // shorter than 16
  std::string e = ParseError(
      absl::StrCat("# c\n", kAlice, " reader *\n", secret, " reader *\n"));
  EXPECT_THAT(e, HasSubstr("tokens.txt line 3"));
  EXPECT_THAT(e, HasSubstr("6 characters"));
  EXPECT_THAT(e, Not(HasSubstr(secret)));

  e = ParseError(absl::StrCat(kAlice, " superuser *\n"));
  EXPECT_THAT(e, HasSubstr("line 1: unknown role 'superuser'"));
  EXPECT_THAT(e, Not(HasSubstr(kAlice)));

  e = ParseError(absl::StrCat("\n", kAlice, " reader\n"));
  EXPECT_THAT(e,
              HasSubstr("line 2: expected 'CREDENTIAL ROLE JOBGLOB [NAME]'"));
  EXPECT_THAT(e, Not(HasSubstr(kAlice)));

  e = ParseError(absl::StrCat(kAlice, " reader team/a\n"));
  EXPECT_THAT(e, HasSubstr("line 1: job glob 'team/a'"));

  e = ParseError(absl::StrCat(kAlice, " reader * al ice\n"));
  EXPECT_THAT(e, HasSubstr("5 fields"));

  e = ParseError(absl::StrCat(kAlice, " reader * al!ce\n"));
  EXPECT_THAT(e, HasSubstr("name 'al!ce'"));

  e = ParseError("0123456789abcdef\x01xyz reader *\n");
  EXPECT_THAT(e, HasSubstr("position 17"));
  EXPECT_THAT(e, Not(HasSubstr("0123456789abcdef")));

  e = ParseError("cert:OU=x reader *\n");
  EXPECT_THAT(e, HasSubstr("cert:CN=<common name> or cert:SAN=<name>"));
  e = ParseError("cert:CN= reader *\n");
  EXPECT_THAT(e, HasSubstr("cert:CN=<common name>"));

  e = ParseError(
      absl::StrCat(kAlice, " reader * alice\n", kAlice, " writer a bob\n"));
  EXPECT_THAT(e, HasSubstr("line 2: name 'bob' differs"));
  EXPECT_THAT(e, HasSubstr("line 1 ('alice')"));
}

TEST(AuthTableTest, RolesIncludeTheLowerOnesAndJoblessActionsNeedStar) {
  absl::StatusOr<AuthTable> t =
      AuthTable::Parse(absl::StrCat(kAlice, " reader *\n", kBob,
                                    " admin team-a\n", kRoot, " admin *\n"),
                       "f");
  ASSERT_TRUE(t.ok()) << t.status();
  const Principal& reader = *t->FindToken(kAlice);
  const Principal& team_admin = *t->FindToken(kBob);
  const Principal& root = *t->FindToken(kRoot);
  for (Action a : {Action::kRead, Action::kListAgents}) {
    EXPECT_TRUE(reader.Allows(a, a == Action::kRead ? "x" : ""));
  }
  for (Action a : {Action::kSave, Action::kDelete, Action::kGarbageCollect,
                   Action::kAbort}) {
    EXPECT_FALSE(reader.Allows(a, "x")) << ActionName(a);
    EXPECT_TRUE(team_admin.Allows(a, "team-a")) << ActionName(a);
    EXPECT_FALSE(team_admin.Allows(a, "team-ab")) << ActionName(a);
    EXPECT_TRUE(root.Allows(a, "anything")) << ActionName(a);
  }
  EXPECT_FALSE(reader.Allows(Action::kRegisterAgent, ""));
  EXPECT_FALSE(team_admin.Allows(Action::kForgetAgent, ""));
  EXPECT_FALSE(team_admin.Allows(Action::kListAgents, ""));
  EXPECT_TRUE(root.Allows(Action::kForgetAgent, ""));
}

// Reference glob matcher: the definition, by recursion.
bool ReferenceMatch(const std::string& g, const std::string& s) {
  if (g.empty()) return s.empty();
  if (g[0] == '*') {
    for (size_t i = 0; i <= s.size(); ++i) {
      if (ReferenceMatch(g.substr(1), s.substr(i))) return true;
    }
    return false;
  }
  if (s.empty()) return false;
  return (g[0] == '?' || g[0] == s[0]) &&
         ReferenceMatch(g.substr(1), s.substr(1));
}

TEST(GlobMatchTest, AgreesWithTheReferenceOnRandomPatterns) {
  std::mt19937 rng(20240611);
  const std::string glob_chars = "ab-**?";
  const std::string job_chars = "ab-";
  int matches = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string g(rng() % 7, ' '), s(rng() % 9, ' ');
    for (char& c : g) c = glob_chars[rng() % glob_chars.size()];
    for (char& c : s) c = job_chars[rng() % job_chars.size()];
    const bool want = ReferenceMatch(g, s);
    ASSERT_EQ(GlobMatch(g, s), want) << "glob '" << g << "' job '" << s << "'";
    matches += want;
  }
  // Both outcomes are exercised.
  EXPECT_GT(matches, 10000);
  EXPECT_LT(matches, 190000);
  EXPECT_TRUE(GlobMatch("*", "x"));
  EXPECT_TRUE(GlobMatch("team-a-*", "team-a-"));
  EXPECT_FALSE(GlobMatch("team-a-*", "team-b-1"));
  EXPECT_FALSE(GlobMatch("a", "ab"));
}

class AuthFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    path_ = dir_ + "/tokens";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& text, mode_t mode = 0600) {
    std::ofstream(path_, std::ios::trunc) << text;
    ASSERT_EQ(chmod(path_.c_str(), mode), 0);
  }

  std::string dir_, path_;
};

TEST_F(AuthFileTest, RefusesAFileOthersMayRead) {
  Write(absl::StrCat(kAlice, " admin *\n"), 0644);
  absl::StatusOr<AuthTable> t = AuthTable::Load(path_);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t, StatusIs(absl::StatusCode::kFailedPrecondition,
                          AllOf(HasSubstr("mode 0644"), HasSubstr(path_))));
  Write(absl::StrCat(kAlice, " admin *\n"), 0640);
  EXPECT_TRUE(AuthTable::Load(path_).ok());
  t = AuthTable::Load(dir_ + "/missing");
  EXPECT_THAT(t, StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(AuthFileTest, AuthenticatesBearerTokensAndNamesEachFailure) {
  Write(absl::StrCat(kAlice, " reader * alice\n"));
  absl::StatusOr<std::unique_ptr<Authorizer>> a = Authorizer::Create(path_);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::string_view reason;
  absl::StatusOr<Caller> c =
      (*a)->Authenticate(absl::StrCat("Bearer ", kAlice), nullptr, &reason);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->principal->name, "alice");
  // The scheme is case-insensitive (RFC 6750).
  EXPECT_TRUE(
      (*a)->Authenticate(absl::StrCat("bearer ", kAlice), nullptr).ok());

  c = (*a)->Authenticate("", nullptr, &reason);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kUnauthenticated,
                          HasSubstr("no credentials")));
  EXPECT_EQ(reason, "no_credentials");

  c = (*a)->Authenticate(absl::StrCat("Bearer ", kBob), nullptr, &reason);
  EXPECT_THAT(
      c, StatusIs(absl::StatusCode::kUnauthenticated,
                  AllOf(HasSubstr("unknown token"), Not(HasSubstr(kBob)))));
  EXPECT_EQ(reason, "unknown_token");

  c = (*a)->Authenticate(absl::StrCat("Basic ", kAlice), nullptr, &reason);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kUnauthenticated,
                          AllOf(HasSubstr("'Bearer <token>'"),
                                Not(HasSubstr(kAlice)))));
  EXPECT_EQ(reason, "malformed");
}

TEST_F(AuthFileTest, ReloadSwapsTheTableAndABadFileKeepsTheOldOne) {
  Write(absl::StrCat(kAlice, " reader *\n"));
  absl::StatusOr<std::unique_ptr<Authorizer>> a = Authorizer::Create(path_);
  ASSERT_TRUE(a.ok()) << a.status();
  // A call in flight keeps its table across a reload.
  absl::StatusOr<Caller> before =
      (*a)->Authenticate(absl::StrCat("Bearer ", kAlice), nullptr);
  ASSERT_TRUE(before.ok());

  Write(absl::StrCat(kBob, " writer *\n"));
  ASSERT_TRUE((*a)->Reload().ok());
  EXPECT_FALSE(
      (*a)->Authenticate(absl::StrCat("Bearer ", kAlice), nullptr).ok());
  EXPECT_TRUE((*a)->Authenticate(absl::StrCat("Bearer ", kBob), nullptr).ok());
  EXPECT_EQ(before->principal->grants.at(0).role, Role::kReader);

  Write(absl::StrCat(kRoot, " admin *\n", kAlice, " wrter *\n"));
  absl::Status s = (*a)->Reload();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          AllOf(HasSubstr(absl::StrCat(path_, " line 2")),
                                Not(HasSubstr(kAlice)))));
  EXPECT_TRUE((*a)->Authenticate(absl::StrCat("Bearer ", kBob), nullptr).ok());
  EXPECT_FALSE(
      (*a)->Authenticate(absl::StrCat("Bearer ", kRoot), nullptr).ok());
}

// An AuthContext as gRPC's TLS transport fills it for a client certificate
// (property names from grpc_security_constants.h).
class CertificateContext : public grpc::AuthContext {
 public:
  explicit CertificateContext(bool authenticated)
      : authenticated_(authenticated) {}
  bool IsPeerAuthenticated() const override { return authenticated_; }
  std::vector<grpc::string_ref> GetPeerIdentity() const override {
    return FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  }
  std::string GetPeerIdentityPropertyName() const override {
    return GRPC_X509_CN_PROPERTY_NAME;
  }
  std::vector<grpc::string_ref> FindPropertyValues(
      const std::string& name) const override {
    std::vector<grpc::string_ref> out;
    for (const auto& [k, v] : properties_) {
      if (k == name) out.emplace_back(v);
    }
    return out;
  }
  grpc::AuthPropertyIterator begin() const override { return Iterator(); }
  grpc::AuthPropertyIterator end() const override { return Iterator(); }
  void AddProperty(const std::string& key,
                   const grpc::string_ref& value) override {
    properties_.emplace_back(key, std::string(value.data(), value.size()));
  }
  bool SetPeerIdentityPropertyName(const std::string&) override {
    return false;
  }

 private:
  struct Iterator : grpc::AuthPropertyIterator {};
  bool authenticated_;
  std::vector<std::pair<std::string, std::string>> properties_;
};

TEST_F(AuthFileTest, MapsClientCertificatesByCommonNameOrSan) {
  Write(absl::StrCat("cert:CN=trainer writer team-a-*\n",
                     "cert:SAN=agent.cairn.svc agent *\n", kAlice,
                     " admin * alice\n"));
  absl::StatusOr<std::unique_ptr<Authorizer>> a = Authorizer::Create(path_);
  ASSERT_TRUE(a.ok()) << a.status();

  CertificateContext trainer(true);
  trainer.AddProperty(GRPC_X509_CN_PROPERTY_NAME, "trainer");
  trainer.AddProperty(GRPC_X509_SAN_PROPERTY_NAME, "trainer.example");
  EXPECT_THAT(CertificateIdentities(trainer),
              ::testing::ElementsAre("CN=trainer", "SAN=trainer.example"));
  absl::StatusOr<Caller> c = (*a)->Authenticate("", &trainer);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->principal->name, "cert:CN=trainer");
  EXPECT_TRUE(c->principal->Allows(Action::kSave, "team-a-1"));
  EXPECT_FALSE(c->principal->Allows(Action::kSave, "team-b"));

  CertificateContext agent(true);
  agent.AddProperty(GRPC_X509_CN_PROPERTY_NAME, "some-node");
  agent.AddProperty(GRPC_PEER_DNS_PROPERTY_NAME, "agent.cairn.svc");
  c = (*a)->Authenticate("", &agent);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->principal->name, "cert:SAN=agent.cairn.svc");

  // A token wins over the certificate.
  c = (*a)->Authenticate(absl::StrCat("Bearer ", kAlice), &agent);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->principal->name, "alice");

  absl::string_view reason;
  CertificateContext stranger(true);
  stranger.AddProperty(GRPC_X509_CN_PROPERTY_NAME, "mallory");
  c = (*a)->Authenticate("", &stranger, &reason);
  EXPECT_THAT(
      c, StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("CN=mallory")));
  EXPECT_EQ(reason, "unknown_certificate");

  // A peer gRPC did not authenticate (no TLS, or no client certificate)
  // has no certificate identity even if properties are present.
  CertificateContext plain(false);
  plain.AddProperty(GRPC_X509_CN_PROPERTY_NAME, "trainer");
  c = (*a)->Authenticate("", &plain, &reason);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(reason, "no_credentials");
}

TEST(TokenFingerprintTest, IsTheSha256Prefix) {
  // SHA-256("abc") = ba7816bf...
  EXPECT_EQ(TokenFingerprint("abc"), "ba7816bf");
}

}  // namespace
}  // namespace cairn::coordinator
