// TLS between cairnd and its clients (issue 16), with real cairnd processes
// on loopback and certificates made by the openssl CLI
// (tests/testing/make_test_certs.sh) in the test's temp dir: plaintext,
// wrong-CA and expired-certificate connections refused, mutual TLS, reload
// on SIGHUP (new handshakes see the new certificate, open connections and
// the service stay; a bad file keeps the old one), bad files at start,
// plaintext off loopback, the bearer token's metadata, and the end-to-end
// save + resharded load and `cairn ls` over mutual TLS.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "protocol/coordinator_call.h"
#include "tests/testing/cli_in_process.h"
#include "tests/testing/e2e_harness.h"
#include "tests/testing/grpc_probe.h"

namespace cairn {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::Each;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::Binaries;

void CopyFile(const std::string& from, const std::string& to) {
  std::filesystem::copy_file(from, to,
                             std::filesystem::copy_options::overwrite_existing);
}

class TlsTest : public testing::EndToEndTest {
 protected:
  static void SetUpTestSuite() {
    certs_ = new std::string(testing::MakeTempDir("tls-certs"));
    const std::string cmd =
        absl::StrCat("sh '", Binaries().make_certs, "' '", *certs_, "'");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*certs_);
    delete certs_;
  }

  static std::string Cert(const std::string& name) {
    return absl::StrCat(*certs_, "/", name, ".crt");
  }
  static std::string Key(const std::string& name) {
    return absl::StrCat(*certs_, "/", name, ".key");
  }

  // cairnd serving TLS with the certificate `name` (signed by ca), mutual
  // TLS with `client_ca`.
  void StartTlsCairnd(const std::string& name = "server",
                      const std::string& client_ca = "") {
    std::vector<std::string> flags = {"--tls-cert", Cert(name), "--tls-key",
                                      Key(name)};
    if (!client_ca.empty()) {
      flags.insert(flags.end(), {"--tls-client-ca", Cert(client_ca)});
    }
    StartCairnd(flags);
  }

  // A channel to cairnd as libcairn makes it.
  std::shared_ptr<grpc::Channel> Channel(const protocol::ClientSecurity& s) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> c =
        protocol::NewCoordinatorChannel(cairnd_->address(), s);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }
  static protocol::ClientSecurity TrustCa(const std::string& ca,
                                          const std::string& client = "") {
    protocol::ClientSecurity s;
    s.ca_file = Cert(ca);
    if (!client.empty()) {
      s.cert_file = Cert(client);
      s.key_file = Key(client);
    }
    return s;
  }

  // One ListCheckpoints over `channel`, bounded by a short deadline so a
  // refused handshake fails instead of waiting.
  static absl::Status List(const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = v1::Coordinator::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::ListCheckpointsResponse resp;
    return FromGrpcStatus(
        stub->ListCheckpoints(&ctx, v1::ListCheckpointsRequest(), &resp));
  }
  absl::Status List(const protocol::ClientSecurity& s) {
    return List(Channel(s));
  }

  // Waits until cairnd's log holds `text` (or cairnd exits).
  bool WaitForLog(const std::string& text) {
    return cairnd_->process().WaitForLog(text, absl::InfiniteDuration());
  }

  // Runs cairnd with `flags` (no --listen added) and expects it to exit;
  // returns its exit code and log.
  std::pair<int, std::string> RunCairndToExit(std::vector<std::string> flags) {
    flags.insert(flags.begin(),
                 {Binaries().cairnd, "--data-dir", dir_ + "/bad"});
    std::string log;
    const int rc = Run(flags, &log, absl::Seconds(60));
    return {rc, log};
  }

  static int Cli(std::vector<std::string> args, std::string* out,
                 std::string* err) {
    return testing::RunCliInProcess(std::move(args), out, err);
  }

  static std::string* certs_;
};

std::string* TlsTest::certs_ = nullptr;

TEST_F(TlsTest, TlsServerAcceptsItsCaAndRefusesPlaintext) {
  StartTlsCairnd();
  EXPECT_TRUE(List(TrustCa("ca")).ok());
  const absl::Status plain = List(protocol::ClientSecurity());
  EXPECT_THAT(plain, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(cairnd_->process().Log(), HasSubstr("port"));
}

// Kubernetes' gRPC probes speak neither TLS nor tokens: --health-listen
// gives them a plaintext port with the TLS port's status and nothing else.
TEST_F(TlsTest, HealthListenServesPlaintextHealthBesideTls) {
  const std::string health =
      absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort());
  StartCairnd({"--tls-cert", Cert("server"), "--tls-key", Key("server"),
               "--tls-client-ca", Cert("ca"), "--health-listen", health});
  absl::StatusOr<int> status = testing::HealthCheck(health);
  ASSERT_TRUE(status.ok()) << status.status() << cairnd_->process().Log();
  EXPECT_EQ(*status, 1);  // SERVING
  // The probe's plaintext call cannot reach the TLS port...
  EXPECT_FALSE(testing::HealthCheck(cairnd_->address(), absl::Seconds(5)).ok());
  // ...and nothing but health is served on the health port.
  EXPECT_EQ(testing::CallEmpty(health, "/cairn.v1.Coordinator/ListCheckpoints")
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(cairnd_->process().Log(),
              HasSubstr("grpc.health.v1 in plaintext on port"));
  // A health port in use fails the start, naming the flag.
  const auto [code, log] =
      RunCairndToExit({"--listen", "127.0.0.1:0", "--health-listen", health});
  EXPECT_EQ(code, 1);
  EXPECT_THAT(log, HasSubstr("--health-listen: cannot serve health on"));

  cairnd_->process().Signal(SIGTERM);
  absl::StatusOr<int> rc = cairnd_->process().Wait(absl::Minutes(1));
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0) << cairnd_->process().Log();
  EXPECT_FALSE(testing::HealthCheck(health, absl::Seconds(5)).ok());
}

TEST_F(TlsTest, WrongCaIsRefusedAsAHandshakeFailure) {
  StartTlsCairnd();
  const absl::Status s = List(TrustCa("other-ca"));
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("andshake")));
}

TEST_F(TlsTest, ExpiredServerCertificateIsRefused) {
  StartTlsCairnd("expired");
  EXPECT_THAT(cairnd_->process().Log(), HasSubstr("expired on"));
  const absl::Status s = List(TrustCa("ca"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsTest, MutualTlsNeedsAClientCertificateOfTheClientCa) {
  StartTlsCairnd("server", /*client_ca=*/"ca");
  EXPECT_TRUE(List(TrustCa("ca", "client")).ok());
  absl::Status s = List(TrustCa("ca"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable))
      << "no client certificate: " << s;
  s = List(TrustCa("ca", "other-client"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable))
      << "client of another CA: " << s;
}

TEST_F(TlsTest, SighupReloadsCertificateKeepingConnectionsAndService) {
  // cairnd reads the files at these paths; the test replaces their contents.
  const std::string cert = dir_ + "/tls.crt", key = dir_ + "/tls.key";
  CopyFile(Cert("server"), cert);
  CopyFile(Key("server"), key);
  StartCairnd({"--tls-cert", cert, "--tls-key", key});
  std::shared_ptr<grpc::Channel> before = Channel(TrustCa("ca"));
  ASSERT_TRUE(List(before).ok());

  CopyFile(Cert("other-server"), cert);
  CopyFile(Key("other-server"), key);
  cairnd_->process().Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog("SIGHUP: TLS certificate, key and CA reloaded"))
      << cairnd_->process().Log();
  // New connections see the new certificate (of other-ca) ...
  EXPECT_TRUE(List(TrustCa("other-ca")).ok());
  EXPECT_THAT(List(TrustCa("ca")), StatusIs(absl::StatusCode::kUnavailable));
  // ... the connection made before keeps working over its session.
  EXPECT_TRUE(List(before).ok());

  // A bad file: an error naming it, and the previous certificate stays.
  { std::ofstream(cert, std::ios::trunc) << "not a certificate\n"; }
  cairnd_->process().Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(absl::StrCat("--tls-cert ", cert)))
      << cairnd_->process().Log();
  EXPECT_THAT(cairnd_->process().Log(),
              HasSubstr("still serving with the previous TLS files"));
  EXPECT_TRUE(List(TrustCa("other-ca")).ok());
  EXPECT_TRUE(List(before).ok());
  // A key that is not the certificate's is refused the same way.
  CopyFile(Cert("server"), cert);
  cairnd_->process().Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(absl::StrCat("--tls-key ", key,
                                      " is not the private "
                                      "key of --tls-cert ",
                                      cert)))
      << cairnd_->process().Log();
  EXPECT_TRUE(List(TrustCa("other-ca")).ok());
}

// Kubernetes updates a Secret volume by pointing the symlink ..data at a new
// directory, and sends no signal: --reload-every notices and reloads.
TEST_F(TlsTest, ReloadEveryPicksUpASecretVolumeSwapWithoutASignal) {
  const std::string vol = dir_ + "/secret";
  auto write_version = [&](const std::string& version,
                           const std::string& name) {
    std::filesystem::create_directories(vol + "/" + version);
    CopyFile(Cert(name), vol + "/" + version + "/tls.crt");
    CopyFile(Key(name), vol + "/" + version + "/tls.key");
    std::filesystem::create_directory_symlink(version, vol + "/..data_tmp");
    std::filesystem::rename(vol + "/..data_tmp", vol + "/..data");
  };
  write_version("..v1", "server");
  std::filesystem::create_symlink("..data/tls.crt", vol + "/tls.crt");
  std::filesystem::create_symlink("..data/tls.key", vol + "/tls.key");
  StartCairnd({"--tls-cert", vol + "/tls.crt", "--tls-key", vol + "/tls.key",
               "--reload-every", "0.1"});
  ASSERT_TRUE(List(TrustCa("ca")).ok());

  write_version("..v2", "other-server");
  ASSERT_TRUE(WaitForLog("changed files: TLS certificate, key and CA reloaded"))
      << cairnd_->process().Log();
  EXPECT_TRUE(List(TrustCa("other-ca")).ok());
  EXPECT_THAT(List(TrustCa("ca")), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(cairnd_->process().Log(), Not(HasSubstr("SIGHUP")));
}

TEST_F(TlsTest, BadFilesAtStartExitNamingTheFile) {
  const std::string missing = dir_ + "/missing.crt";
  auto [rc, log] = RunCairndToExit({"--listen", "127.0.0.1:0", "--tls-cert",
                                    missing, "--tls-key", Key("server")});
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(log,
              HasSubstr(absl::StrCat("--tls-cert ", missing, ": cannot read")));

  std::tie(rc, log) =
      RunCairndToExit({"--listen", "127.0.0.1:0", "--tls-cert", Cert("server"),
                       "--tls-key", Key("client")});
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(log, HasSubstr("is not the private key of --tls-cert"));

  std::tie(rc, log) = RunCairndToExit(
      {"--listen", "127.0.0.1:0", "--tls-cert", Cert("server")});
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(log, HasSubstr("--tls-cert and --tls-key go together"));

  std::tie(rc, log) = RunCairndToExit(
      {"--listen", "127.0.0.1:0", "--tls-cert", Cert("server"), "--tls-key",
       Key("server"), "--tls-client-ca", Key("ca")});
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(log, HasSubstr(absl::StrCat("--tls-client-ca ", Key("ca"),
                                          ": no PEM certificate")));
}

TEST_F(TlsTest, PlaintextOffLoopbackNeedsAllowInsecure) {
  auto [rc, log] = RunCairndToExit({"--listen", "0.0.0.0:0"});
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(log, HasSubstr("refusing to serve plaintext on 0.0.0.0:0"));

  // With --allow-insecure (or TLS) it serves; the port file says so.
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--allow-insecure"},
        std::vector<std::string>{"--tls-cert", Cert("server"), "--tls-key",
                                 Key("server")}}) {
    const std::string port_file = dir_ + "/port";
    std::filesystem::remove(port_file);
    std::vector<std::string> argv = {
        Binaries().cairnd, "--listen",    "0.0.0.0:0", "--data-dir",
        dir_ + "/ok",      "--port-file", port_file};
    argv.insert(argv.end(), extra.begin(), extra.end());
    absl::StatusOr<testing::Subprocess> p = testing::Subprocess::Start(
        argv, absl::StrCat(dir_, "/ok-", extra.size(), ".log"));
    ASSERT_TRUE(p.ok()) << p.status();
    absl::StatusOr<std::string> port_text =
        testing::WaitForFile(port_file, *p, absl::Minutes(1));
    ASSERT_TRUE(port_text.ok()) << port_text.status();
    int port = 0;
    EXPECT_TRUE(
        absl::SimpleAtoi(absl::StripAsciiWhitespace(*port_text), &port));
    EXPECT_GT(port, 0);
    const bool insecure = extra.front() == "--allow-insecure";
    EXPECT_EQ(absl::StrContains(p->Log(), "serving WITHOUT TLS on 0.0.0.0:0"),
              insecure)
        << p->Log();
    p->Signal(SIGTERM);
    EXPECT_EQ(*p->Wait(), 0);
  }
}

// A Coordinator that records the metadata of ListCheckpoints calls: what
// cairnd's authorization sees of the token.
class MetadataRecorder : public v1::Coordinator::Service {
 public:
  grpc::Status ListCheckpoints(grpc::ServerContext* ctx,
                               const v1::ListCheckpointsRequest*,
                               v1::ListCheckpointsResponse*) override {
    absl::MutexLock lock(&mu_);
    last_.clear();
    for (const auto& [k, v] : ctx->client_metadata()) {
      last_.emplace(std::string(k.data(), k.size()),
                    std::string(v.data(), v.size()));
    }
    return grpc::Status::OK;
  }
  std::multimap<std::string, std::string> last() {
    absl::MutexLock lock(&mu_);
    return last_;
  }

 private:
  absl::Mutex mu_;
  std::multimap<std::string, std::string> last_;
};

TEST_F(TlsTest, TokenTravelsAsBearerAuthorizationOverPlaintextLoopback) {
  MetadataRecorder recorder;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&recorder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  protocol::ClientSecurity s;
  s.token = "s3cr3t-token";
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      protocol::NewCoordinatorChannel(absl::StrCat("127.0.0.1:", port), s);
  ASSERT_TRUE(channel.ok()) << channel.status();
  ASSERT_TRUE(List(*channel).ok());
  EXPECT_EQ(recorder.last().count("authorization"), 1u);
  EXPECT_EQ(recorder.last().find("authorization")->second,
            "Bearer s3cr3t-token");
  // No token, no header.
  ASSERT_TRUE(
      List(protocol::NewCoordinatorChannel(absl::StrCat("127.0.0.1:", port)))
          .ok());
  EXPECT_EQ(recorder.last().count("authorization"), 0u);
  server->Shutdown();
}

TEST_F(TlsTest, ClientFilesAreCheckedNamingTheFile) {
  protocol::ClientSecurity s;
  s.ca_file = dir_ + "/nope.pem";
  absl::StatusOr<std::shared_ptr<grpc::Channel>> c =
      protocol::NewCoordinatorChannel("127.0.0.1:1", s);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr(absl::StrCat(dir_, "/nope.pem: cannot read")));
  s = TrustCa("ca");
  s.cert_file = Cert("client");
  c = protocol::NewCoordinatorChannel("127.0.0.1:1", s);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("needs both a certificate and a key"));
}

// The end-to-end path over mutual TLS: ranks (the example training job,
// libcairn's TLS settings from CAIRN_TLS_*) save on 2 ranks and load
// resharded on 4, and `cairn ls` lists the checkpoint over TLS.
TEST_F(TlsTest, SaveAndReshardedLoadOverMutualTls) {
  StartTlsCairnd("server", /*client_ca=*/"ca");
  setenv("CAIRN_TLS_CA", Cert("ca").c_str(), 1);
  setenv("CAIRN_TLS_CERT", Cert("client").c_str(), 1);
  setenv("CAIRN_TLS_KEY", Key("client").c_str(), 1);
  auto run = [&](int world, const std::string& layout,
                 const std::vector<std::string>& extra) {
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < world; ++r) {
      argvs.push_back(RankArgv("tlsjob", r, world, layout, extra));
    }
    return RunAll(argvs);
  };
  EXPECT_THAT(run(2, "2:S0", {"--save-steps", "7"}), Each(Eq(0))) << RankLogs();
  EXPECT_THAT(run(4, "2x2:S0,S1", {"--load", "latest"}), Each(Eq(0)))
      << RankLogs();

  std::string out, err;
  EXPECT_EQ(Cli({"--coordinator", cairnd_->address(), "ls"}, &out, &err), 0)
      << err;
  EXPECT_THAT(out, HasSubstr("tlsjob"));
  // Without a client certificate the same command is refused.
  unsetenv("CAIRN_TLS_CERT");
  unsetenv("CAIRN_TLS_KEY");
  EXPECT_NE(Cli({"--coordinator", cairnd_->address(), "ls"}, &out, &err), 0);
  EXPECT_THAT(err, HasSubstr("cannot reach cairnd"));
  // And the rank's own error names the missing file.
  setenv("CAIRN_TLS_CERT", (dir_ + "/gone.crt").c_str(), 1);
  setenv("CAIRN_TLS_KEY", Key("client").c_str(), 1);
  EXPECT_THAT(run(1, "1:S0", {"--load", "latest"}), Each(Eq(1))) << RankLogs();
  EXPECT_THAT(RankLogs(),
              HasSubstr(absl::StrCat(dir_, "/gone.crt: cannot read")));
  unsetenv("CAIRN_TLS_CA");
  unsetenv("CAIRN_TLS_CERT");
  unsetenv("CAIRN_TLS_KEY");
}

}  // namespace
}  // namespace cairn
