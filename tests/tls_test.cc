// TLS between cairnd and its clients (issue 16), with real cairnd processes
// on loopback and certificates made by the openssl CLI
// (tests/testing/make_test_certs.sh) in the test's temp dir: plaintext,
// wrong-CA and expired-certificate connections refused, mutual TLS, reload
// on SIGHUP (new handshakes see the new certificate, open connections and
// the service stay; a bad file keeps the old one), bad files at start,
// plaintext off loopback, the bearer token's metadata, and the end-to-end
// save + resharded load and `cairn ls` over mutual TLS.
//
// Binaries and the script come from --cairnd=, --rank=, --make-certs=
// (Bazel passes them as args), else from the paths CMake compiled in.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "client/cli/cli.h"
#include "client/protocol/coordinator_call.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/testing/cairnd_process.h"
#include "tests/testing/grpc_probe.h"
#include "tests/testing/path_flags.h"
#include "tests/testing/subprocess.h"

#ifndef CAIRN_CAIRND_PATH
#define CAIRN_CAIRND_PATH ""
#endif
#ifndef CAIRN_RANK_PATH
#define CAIRN_RANK_PATH ""
#endif
#ifndef CAIRN_MAKE_CERTS_PATH
#define CAIRN_MAKE_CERTS_PATH ""
#endif

namespace cairn {
namespace {

using ::testing::Each;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;

std::string g_cairnd = CAIRN_CAIRND_PATH;
std::string g_rank = CAIRN_RANK_PATH;
std::string g_make_certs = CAIRN_MAKE_CERTS_PATH;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void CopyFile(const std::string& from, const std::string& to) {
  std::filesystem::copy_file(from, to,
                             std::filesystem::copy_options::overwrite_existing);
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new std::string(testing::MakeTempDir("tls-certs"));
    const std::string cmd =
        absl::StrCat("sh '", g_make_certs, "' '", *certs_, "'");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*certs_);
    delete certs_;
  }

  void SetUp() override {
    dir_ = testing::MakeTempDir(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    cairnd_.reset();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  static std::string Cert(const std::string& name) {
    return absl::StrCat(*certs_, "/", name, ".crt");
  }
  static std::string Key(const std::string& name) {
    return absl::StrCat(*certs_, "/", name, ".key");
  }

  // cairnd on loopback with `flags` (CairndProcess adds --listen 127.0.0.1:0).
  void StartCairnd(const std::vector<std::string>& flags) {
    absl::StatusOr<std::unique_ptr<testing::CairndProcess>> c =
        testing::CairndProcess::Start(g_cairnd, dir_ + "/cairnd", flags);
    ASSERT_TRUE(c.ok()) << c.status();
    cairnd_ = std::move(*c);
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
    for (;;) {
      if (absl::StrContains(cairnd_->process().Log(), text)) return true;
      if (cairnd_->process().Wait(absl::Milliseconds(20)).ok()) return false;
    }
  }

  // Runs cairnd with `flags` (no --listen added) and expects it to exit;
  // returns its exit code and log.
  std::pair<int, std::string> RunCairndToExit(std::vector<std::string> flags) {
    flags.insert(flags.begin(), {g_cairnd, "--data-dir", dir_ + "/bad"});
    const std::string log = dir_ + "/bad.log";
    absl::StatusOr<testing::Subprocess> p =
        testing::Subprocess::Start(flags, log);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {-1, ""};
    absl::StatusOr<int> rc = p->Wait(absl::Seconds(60));
    EXPECT_TRUE(rc.ok()) << "cairnd did not exit: " << p->Log();
    return {rc.ok() ? *rc : -1, p->Log()};
  }

  int Cli(std::vector<std::string> args, std::string* out, std::string* err) {
    args.insert(args.begin(), "cairn");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    std::ostringstream o, e;
    const int rc =
        cli::RunCli(static_cast<int>(argv.size()), argv.data(), o, e);
    *out = o.str();
    *err = e.str();
    return rc;
  }

  static std::string* certs_;
  std::string dir_;
  std::unique_ptr<testing::CairndProcess> cairnd_;
};

std::string* TlsTest::certs_ = nullptr;

TEST_F(TlsTest, TlsServerAcceptsItsCaAndRefusesPlaintext) {
  StartTlsCairnd();
  EXPECT_TRUE(List(TrustCa("ca")).ok());
  const absl::Status plain = List(protocol::ClientSecurity());
  EXPECT_TRUE(absl::IsUnavailable(plain)) << plain;
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
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("andshake")) << s;
}

TEST_F(TlsTest, ExpiredServerCertificateIsRefused) {
  StartTlsCairnd("expired");
  EXPECT_THAT(cairnd_->process().Log(), HasSubstr("expired on"));
  const absl::Status s = List(TrustCa("ca"));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

TEST_F(TlsTest, MutualTlsNeedsAClientCertificateOfTheClientCa) {
  StartTlsCairnd("server", /*client_ca=*/"ca");
  EXPECT_TRUE(List(TrustCa("ca", "client")).ok());
  absl::Status s = List(TrustCa("ca"));
  EXPECT_TRUE(absl::IsUnavailable(s)) << "no client certificate: " << s;
  s = List(TrustCa("ca", "other-client"));
  EXPECT_TRUE(absl::IsUnavailable(s)) << "client of another CA: " << s;
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
  EXPECT_TRUE(absl::IsUnavailable(List(TrustCa("ca"))));
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
  EXPECT_TRUE(absl::IsUnavailable(List(TrustCa("ca"))));
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
    std::vector<std::string> argv = {g_cairnd,     "--listen",   "0.0.0.0:0",
                                     "--data-dir", dir_ + "/ok", "--port-file",
                                     port_file};
    argv.insert(argv.end(), extra.begin(), extra.end());
    absl::StatusOr<testing::Subprocess> p = testing::Subprocess::Start(
        argv, absl::StrCat(dir_, "/ok-", extra.size(), ".log"));
    ASSERT_TRUE(p.ok()) << p.status();
    int port = 0;
    while (!(std::ifstream(port_file) >> port)) {
      ASSERT_FALSE(p->Wait(absl::Milliseconds(20)).ok()) << p->Log();
    }
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
                 std::vector<std::string> extra) {
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> a = {g_rank,
                                    "--coordinator",
                                    cairnd_->address(),
                                    "--job",
                                    "tlsjob",
                                    "--rank",
                                    std::to_string(r),
                                    "--world-size",
                                    std::to_string(world),
                                    "--layout",
                                    layout};
      a.insert(a.end(), extra.begin(), extra.end());
      argvs.push_back(std::move(a));
    }
    const std::string prefix = absl::StrCat(dir_, "/rank-", world, "-");
    absl::StatusOr<std::vector<int>> codes =
        testing::RunAll(argvs, prefix, absl::Minutes(3));
    EXPECT_TRUE(codes.ok()) << codes.status();
    std::string logs;
    for (int r = 0; r < world; ++r)
      logs += ReadAll(absl::StrCat(prefix, r, ".log"));
    return std::make_pair(codes.ok() ? *codes : std::vector<int>{}, logs);
  };
  auto [saved, save_logs] = run(2, "2:S0", {"--save-steps", "7"});
  EXPECT_THAT(saved, Each(Eq(0))) << save_logs;
  auto [loaded, load_logs] = run(4, "2x2:S0,S1", {"--load", "latest"});
  EXPECT_THAT(loaded, Each(Eq(0))) << load_logs;

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
  auto [failed, fail_logs] = run(1, "1:S0", {"--load", "latest"});
  EXPECT_THAT(failed, Each(Eq(1))) << fail_logs;
  EXPECT_THAT(fail_logs,
              HasSubstr(absl::StrCat(dir_, "/gone.crt: cannot read")));
  unsetenv("CAIRN_TLS_CA");
  unsetenv("CAIRN_TLS_CERT");
  unsetenv("CAIRN_TLS_KEY");
}

}  // namespace
}  // namespace cairn

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  cairn::testing::ParsePathFlags(argc, argv,
                                 {
                                     {"cairnd", &cairn::g_cairnd},
                                     {"rank", &cairn::g_rank},
                                     {"make-certs", &cairn::g_make_certs},
                                 });
  return RUN_ALL_TESTS();
}
