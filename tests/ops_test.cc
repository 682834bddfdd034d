// Operations, through the real binaries as processes: --version and usage
// errors of cairnd, cairn-agent and cairn; a second cairnd on a port or a
// catalog already in use; malformed requests; SIGTERM while ranks are
// parked; the CLI on damaged, missing and unreachable storage.
// Storage is file:// under the test's temp dir, or a fresh S3 bucket with
// CAIRN_TEST_STORAGE=s3 (tests/testing/test_storage.h); the tests that move
// or replace the storage root's directory are posix-only (their S3
// counterparts are in s3_e2e_test.cc).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "common/gpu/gpu_info.h"
#include "common/grpc_status.h"
#include "common/testing/status_matchers.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint_layout.h"
#include "tests/testing/e2e_harness.h"
#include "tests/testing/grpc_probe.h"

namespace cairn {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::Binaries;

class OpsTest : public testing::EndToEndTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(EndToEndTest::SetUp());
    ASSERT_NO_FATAL_FAILURE(CreateStorage());
  }

  // The file:// root (posix-only tests).
  std::string StorageRoot() const { return dir_ + "/cairnd/checkpoints"; }
  std::string StepDir(const std::string& job, int64_t step) const {
    return absl::StrFormat("%s/%s/%016d", StorageRoot(), job, step);
  }
};

TEST_F(OpsTest, EveryBinaryPrintsItsVersion) {
  for (const auto& [binary, name] :
       std::vector<std::pair<std::string, std::string>>{
           {Binaries().cairnd, "cairnd"},
           {Binaries().agent, "cairn-agent"},
           {Binaries().cli, "cairn"}}) {
    std::string out;
    EXPECT_EQ(Run({binary, "--version"}, &out), 0) << name << ": " << out;
    EXPECT_THAT(out, HasSubstr(absl::StrCat(name, " ", CairnVersion()))) << out;
  }
}

TEST_F(OpsTest, OutOfRangeFlagsAreUsageErrorsWithClearMessages) {
  struct Case {
    std::vector<std::string> argv;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{Binaries().cli, "-s", "file:///nonexistent", "gc", "job", "--keep",
        "0"},
       "--keep: must be >= 1, got 0"},
      {{Binaries().cairnd, "--keep-last", "-1"},
       "--keep-last: must be >= 0, got -1"},
      {{Binaries().cairnd, "--begin-deadline", "0"},
       "--begin-deadline: must be > 0, got 0"},
      {{Binaries().cairnd, "--workers", "0"},
       "--workers: must be in [1, 256], got 0"},
      {{Binaries().cairnd, "--no-such-flag"}, "--no-such-flag"},
      {{Binaries().agent, "--node-id", "0", "--listen-unix", dir_ + "/a.sock",
        "--coordinator", "127.0.0.1:1", "--io-threads", "0"},
       "--io-threads: must be in [1, 256], got 0"},
      {{Binaries().agent, "--node-id", "-3", "--listen-unix", dir_ + "/a.sock",
        "--coordinator", "127.0.0.1:1"},
       "--node-id: must be >= 0 or 'auto', got -3"},
      {{Binaries().agent, "--node-id", "first", "--listen-unix",
        dir_ + "/a.sock", "--coordinator", "127.0.0.1:1"},
       "--node-id: must be >= 0 or 'auto', got first"},
      {{Binaries().agent, "--node-id", "auto", "--peers", "h:1,h:2",
        "--listen-unix", dir_ + "/a.sock", "--coordinator", "127.0.0.1:1"},
       "--node-id auto finds peers through cairnd; drop --peers"},
      {{Binaries().agent, "--node-id", "1", "--node-name", "n", "--listen-unix",
        dir_ + "/a.sock", "--coordinator", "127.0.0.1:1"},
       "--node-name and --peer-advertise need --node-id auto"},
      {{Binaries().agent, "--node-id", "auto", "--peer-advertise", "10.0.0.1:0",
        "--listen-unix", dir_ + "/a.sock", "--coordinator", "127.0.0.1:1"},
       "--peer-advertise '10.0.0.1:0': the port must be 1 to 65535"},
      {{Binaries().agent, "--node-id", "0", "--listen-unix", dir_ + "/a.sock",
        "--coordinator", "127.0.0.1:1", "--peer-tls-ca", "/ca.pem",
        "--peer-tls-cert", "/cert.pem"},
       "peer TLS needs --peer-tls-ca, --peer-tls-cert and --peer-tls-key "
       "together; --peer-tls-key is missing"},
  };
  for (const Case& c : cases) {
    std::string out;
    EXPECT_EQ(Run(c.argv, &out), 2) << c.argv[1] << ": " << out;
    EXPECT_THAT(out, HasSubstr(c.message));
    EXPECT_THAT(out, HasSubstr("--help"));
    // CLI11's own range checks printed DBL_MAX as 309 digits.
    EXPECT_THAT(out, Not(HasSubstr("17976931348623157")));
  }
}

// Every daemon flag --foo-bar is also CAIRN_FOO_BAR (what a Kubernetes
// ConfigMap sets): the command line wins over the environment, which wins
// over the default; environment values get the flags' checks and a bad one
// is a usage error naming the variable; --print-config shows each value and
// its source.
TEST_F(OpsTest, EnvironmentSetsFlagsWithPrecedenceChecksAndPrintConfig) {
  const std::string env = "/usr/bin/env";
  std::string out;
  // Environment over default.
  ASSERT_EQ(Run({env, "CAIRN_KEEP_LAST=7", "CAIRN_WORKERS=3", Binaries().cairnd,
                 "--print-config"},
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("--keep-last=7  # CAIRN_KEEP_LAST"));
  EXPECT_THAT(out, HasSubstr("--workers=3  # CAIRN_WORKERS"));
  EXPECT_THAT(out, HasSubstr("--begin-deadline=60  # default"));
  // Command line over environment.
  ASSERT_EQ(Run({env, "CAIRN_KEEP_LAST=7", Binaries().cairnd, "--keep-last",
                 "2", "--print-config"},
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("--keep-last=2  # command line"));
  // A CAIRN_* variable that is no setting (a typo) is reported, not ignored.
  ASSERT_EQ(Run({env, "CAIRN_KEEP_LASTT=3", "CAIRN_KEEP_LAST=4",
                 Binaries().cairnd, "--print-config"},
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("cairnd: warning: CAIRN_KEEP_LASTT is set but "
                             "is not a cairnd setting (ignored)"));
  EXPECT_THAT(out, Not(HasSubstr("CAIRN_KEEP_LAST is set")));
  EXPECT_THAT(out, HasSubstr("--keep-last=4  # CAIRN_KEEP_LAST"));
  // Checked like flags, naming the variable.
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{env, "CAIRN_KEEP_LAST=-1", Binaries().cairnd},
       "--keep-last: must be >= 0, got -1 (from the environment: "
       "CAIRN_KEEP_LAST=-1)"},
      {{env, "CAIRN_LOG_LEVEL=loud", Binaries().cairnd},
       "(from the environment: CAIRN_LOG_LEVEL=loud)"},
      {{env, "CAIRN_IO_THREADS=0", Binaries().agent, "--node-id", "0",
        "--listen-unix", dir_ + "/a.sock", "--coordinator", "127.0.0.1:1"},
       "--io-threads: must be in [1, 256], got 0 (from the environment: "
       "CAIRN_IO_THREADS=0)"},
      {{env, "KUBERNETES_SERVICE_HOST=10.96.0.1", Binaries().agent, "--node-id",
        "auto", "--listen-unix", dir_ + "/a.sock", "--coordinator",
        "127.0.0.1:1"},
       "--node-id auto in Kubernetes needs --node-name"},
  };
  for (const auto& [argv, message] : bad) {
    EXPECT_EQ(Run(argv, &out), 2) << argv[1] << ": " << out;
    EXPECT_THAT(out, HasSubstr(message));
  }
  // The agent's required flags may come from the environment too.
  ASSERT_EQ(
      Run({env, "CAIRN_NODE_ID=2", "CAIRN_NUM_NODES=4",
           "CAIRN_LISTEN_UNIX=" + dir_ + "/b.sock",
           "CAIRN_COORDINATOR=127.0.0.1:1", Binaries().agent, "--print-config"},
          &out),
      0)
      << out;
  EXPECT_THAT(out, HasSubstr("--node-id=2  # CAIRN_NODE_ID"));
  EXPECT_THAT(out, HasSubstr("--coordinator=127.0.0.1:1  # CAIRN_COORDINATOR"));
  // Kubernetes' downward API: the node name and the pod IP.
  ASSERT_EQ(
      Run({env, "CAIRN_NODE_ID=auto", "CAIRN_NODE_NAME=gpu-node-7",
           "CAIRN_PEER_ADVERTISE=10.4.0.17", "CAIRN_NUM_NODES=4",
           "CAIRN_LISTEN_UNIX=" + dir_ + "/b.sock",
           "CAIRN_COORDINATOR=127.0.0.1:1", Binaries().agent, "--print-config"},
          &out),
      0)
      << out;
  EXPECT_THAT(out, HasSubstr("--node-id=auto  # CAIRN_NODE_ID"));
  EXPECT_THAT(out, HasSubstr("--node-name=gpu-node-7  # CAIRN_NODE_NAME"));
  EXPECT_THAT(out,
              HasSubstr("--peer-advertise=10.4.0.17  # CAIRN_PEER_ADVERTISE"));
  // The peer TLS files too; one that cannot be read fails the start,
  // naming it (before the agent registers anywhere).
  ASSERT_EQ(
      Run({env, "CAIRN_PEER_TLS_CA=" + dir_ + "/nope.pem",
           "CAIRN_PEER_TLS_CERT=/c.pem", "CAIRN_PEER_TLS_KEY=/k.pem",
           "CAIRN_NODE_ID=0", "CAIRN_LISTEN_UNIX=" + dir_ + "/b.sock",
           "CAIRN_COORDINATOR=127.0.0.1:1", Binaries().agent, "--print-config"},
          &out),
      0)
      << out;
  EXPECT_THAT(out, HasSubstr("--peer-tls-ca=" + dir_ +
                             "/nope.pem  # CAIRN_PEER_TLS_CA"));
  EXPECT_THAT(out, HasSubstr("--peer-tls-cert=/c.pem  # CAIRN_PEER_TLS_CERT"));
  EXPECT_THAT(out, HasSubstr("--peer-tls-key=/k.pem  # CAIRN_PEER_TLS_KEY"));
  EXPECT_EQ(Run({env, "CAIRN_PEER_TLS_CA=" + dir_ + "/nope.pem",
                 "CAIRN_PEER_TLS_CERT=/c.pem", "CAIRN_PEER_TLS_KEY=/k.pem",
                 "CAIRN_NODE_ID=0", "CAIRN_LISTEN_UNIX=" + dir_ + "/b.sock",
                 "CAIRN_COORDINATOR=127.0.0.1:1", Binaries().agent},
                &out),
            2)
      << out;
  EXPECT_THAT(out, HasSubstr("--peer-tls-ca " + dir_ +
                             "/nope.pem: cannot read: No such file"));
}

// --log-format json: everything cairnd writes to stderr, its own events and
// gRPC's, is one JSON object per line.
TEST_F(OpsTest, JsonLogFormatIsOneJsonObjectPerLine) {
  absl::StatusOr<std::unique_ptr<testing::CairndProcess>> c =
      testing::CairndProcess::Start(
          Binaries().cairnd, dir_ + "/json",
          {"--log-format", "json", "--log-level", "debug"});
  ASSERT_TRUE(c.ok()) << c.status();
  (*c)->process().Signal(SIGTERM);
  absl::StatusOr<int> code = (*c)->process().Wait(absl::Minutes(1));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  const std::vector<std::string> lines =
      absl::StrSplit((*c)->process().Log(), '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 2u);
  bool drained = false, grpc = false;
  for (const std::string& line : lines) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    EXPECT_TRUE(j.contains("time") && j.contains("level") && j.contains("msg"))
        << line;
    const std::string msg = j.value("msg", "");
    drained |= msg.find("draining") != std::string::npos;
    grpc |= msg.rfind("grpc ", 0) == 0;
  }
  EXPECT_TRUE(drained) << "no drain event";
  EXPECT_TRUE(grpc) << "no gRPC log line at debug";
}

TEST_F(OpsTest, AgentTransportFlagIsCheckedAndNcclFailsFastWithItsReason) {
  const std::vector<std::string> base = {
      Binaries().agent, "--node-id",     "0",          "--listen-unix",
      dir_ + "/a.sock", "--coordinator", "127.0.0.1:1"};
  std::string out;
  std::vector<std::string> argv = base;
  argv.insert(argv.end(), {"--transport", "udp"});
  EXPECT_EQ(Run(argv, &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("--transport: udp not in {tcp,nccl}"));
  // No GPU here (or no CUDA build): the agent refuses at start, saying why,
  // instead of waiting for peers.
  absl::StatusOr<int> devices = gpu::DeviceCount();
  ASSERT_TRUE(devices.ok());
  if (*devices > 0) GTEST_SKIP() << "host has a CUDA device";
  argv = base;
  argv.insert(argv.end(), {"--transport", "nccl"});
  EXPECT_EQ(Run(argv, &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("--transport=nccl: "));
  EXPECT_THAT(out, gpu::BuiltWithCuda() ? HasSubstr("no CUDA device")
                                        : HasSubstr("built without CUDA"));
}

TEST_F(OpsTest, SecondCairndOnAPortInUseRefusesToStart) {
  StartCairnd();
  std::string out;
  const std::string address = cairnd_->address();
  EXPECT_EQ(Run({Binaries().cairnd, "--listen", address, "--data-dir",
                 dir_ + "/other"},
                &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("cannot listen on ", address)));
  EXPECT_THAT(out, HasSubstr("in use"));
  // It gave up before touching its data directory's catalog.
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/other/catalog/CURRENT"));
}

TEST_F(OpsTest, SecondCairndOnACatalogInUseRefusesToStart) {
  StartCairnd();
  std::string out;
  EXPECT_EQ(Run({Binaries().cairnd, "--listen", "127.0.0.1:0", "--data-dir",
                 dir_ + "/cairnd"},
                &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("catalog '", dir_,
                                          "/cairnd/catalog' is in use by "
                                          "another process")));
}

// Both daemons answer grpc.health.v1 (the agent on --health-listen, which
// serves nothing else) and stop cleanly on SIGTERM.
TEST_F(OpsTest, BothDaemonsServeGrpcHealth) {
  StartCairnd();
  absl::StatusOr<int> status = testing::HealthCheck(cairnd_->address());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, 1);  // SERVING

  const std::string health =
      absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort());
  std::unique_ptr<testing::Subprocess> agent;
  ASSERT_NO_FATAL_FAILURE(StartCairnAgent(
      {"--node-id", "0", "--listen-unix", testing::SocketPath("ops-health"),
       "--coordinator", cairnd_->address(), "--health-listen", health},
      "agent", &agent));
  status = testing::HealthCheck(health);
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << agent->Log();
  EXPECT_EQ(*status, 1);
  // The Agent service itself is not reachable over TCP.
  EXPECT_EQ(testing::CallEmpty(health, "/cairn.v1.Agent/Status").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  agent->Signal(SIGTERM);
  absl::StatusOr<int> code = agent->Wait(absl::Minutes(1));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << agent->Log();
  EXPECT_FALSE(testing::HealthCheck(health).ok());  // gone with the agent
}

TEST_F(OpsTest, MalformedRequestsAreInvalidArgument) {
  StartCairnd();
  auto channel = grpc::CreateChannel(cairnd_->address(),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  // 0xff... is an invalid protobuf tag: no message type parses it.
  const std::string garbage(64, '\xff');
  for (const std::string method :
       {"BeginSave", "PlanLoad", "VerifyLoad", "ListCheckpoints"}) {
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, absl::StrCat("/cairn.v1.Coordinator/", method),
                   grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status s) { done.set_value(s); });
    grpc::Status s = done.get_future().get();
    EXPECT_THAT(
        FromGrpcStatus(s),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr(absl::StrCat("cairn.v1.Coordinator/", method)),
                       HasSubstr("64 bytes"))))
        << method << ": " << s.error_message();
  }
}

// A 1e6-item plan used to be accepted (2.6 GB RSS left behind); a request
// over the receive limit is refused by gRPC before it is parsed.
TEST_F(OpsTest, OversizedPlansAndRequestsAreResourceExhausted) {
  StartCairnd();
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto stub = v1::Coordinator::NewStub(grpc::CreateCustomChannel(
      cairnd_->address(), grpc::InsecureChannelCredentials(), args));
  auto begin = [&](const v1::BeginSaveRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    v1::BeginSaveResponse resp;
    return stub->BeginSave(&ctx, req, &resp);
  };
  v1::BeginSaveRequest req;
  req.set_job("big");
  req.set_step(1);
  req.set_rank(0);
  req.set_world_size(1);
  v1::LocalSavePlan* plan = req.mutable_local_plan();
  plan->set_rank(0);
  for (int i = 0; i < 1000000; ++i) {
    v1::WriteItem* item = plan->add_items();
    item->set_kind(v1::WriteItem::KIND_BYTES);
    item->set_bytes_fqn(absl::StrCat("b", i));
    item->set_length(1);
  }
  grpc::Status s = begin(req);
  EXPECT_THAT(
      FromGrpcStatus(s),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("rank 0 of job 'big' step 1: the local plan has "
                         "1000000 items; at most 65536")));
  req.clear_local_plan();
  req.set_plan_fingerprint(std::string(129 << 20, 'f'));
  s = begin(req);
  EXPECT_THAT(FromGrpcStatus(s), StatusIs(absl::StatusCode::kResourceExhausted,
                                          HasSubstr("larger than max")));
}

// Issue 11: 20 BeginSave calls claiming a world of 2^20, then aborted, grew
// cairnd by 1.5 GB for good (world-sized vectors per session, sessions kept
// after the abort).
TEST_F(OpsTest, AbortedHugeWorldSavesLeaveNoMemoryBehind) {
  StartCairnd();
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(
      cairnd_->address(), grpc::InsecureChannelCredentials()));
  const int64_t before =
      testing::ProcStatusBytes(cairnd_->process().pid(), "VmRSS");
  ASSERT_GT(before, 0);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::promise<grpc::Status>> done(20);
  std::vector<v1::BeginSaveResponse> responses(20);
  for (int step = 0; step < 20; ++step) {
    v1::BeginSaveRequest req;
    req.set_job(absl::StrCat("huge", step));  // under --max-sessions-per-job
    req.set_step(1);
    req.set_rank(0);
    req.set_world_size(1 << 20);
    req.mutable_local_plan()->set_rank(0);
    v1::WriteItem* item = req.mutable_local_plan()->add_items();
    item->set_kind(v1::WriteItem::KIND_BYTES);
    item->set_bytes_fqn("rng");
    item->set_length(16);
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    // Every call ends (so the test never hangs on a failure).
    contexts.back()->set_deadline(std::chrono::system_clock::now() +
                                  std::chrono::seconds(60));
    stub->async()->BeginSave(
        contexts.back().get(), &req, &responses[step],
        [&done, step](grpc::Status s) { done[step].set_value(s); });
  }
  for (int step = 0; step < 20; ++step) {
    grpc::ClientContext ctx;
    v1::AbortSaveRequest abort;
    abort.set_job(absl::StrCat("huge", step));
    abort.set_step(1);
    abort.set_reason("test");
    v1::AbortSaveResponse resp;
    // The BeginSave may still be on its way: retry NOT_FOUND briefly.
    grpc::Status s;
    for (int i = 0; i < 500; ++i) {
      grpc::ClientContext c;
      s = stub->AbortSave(&c, abort, &resp);
      if (s.error_code() != grpc::StatusCode::NOT_FOUND) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  for (int step = 0; step < 20; ++step) {
    grpc::Status s = done[step].get_future().get();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  }
  const int64_t after =
      testing::ProcStatusBytes(cairnd_->process().pid(), "VmRSS");
  EXPECT_LT(after - before, int64_t{200} << 20)
      << "cairnd grew from " << before << " to " << after << " bytes";
}

// SIGTERM while a rank waits in BeginSave: docs/operations.md promises
// UNAVAILABLE and a retry; ranks used to print CANCELLED (their retry reached
// the draining cairnd) and exit 1. Now the rank retries until cairnd is back on
// the same address, and the save completes there.
TEST_F(OpsTest, SigtermWhileARankWaitsThenRestartTheSaveCompletes) {
  StartCairnd({"--log-level", "debug"});
  const std::string address = cairnd_->address();
  auto rank_argv = [&](int rank) {
    return RankArgv("job", rank, 2, "2:S0", {"--save-steps", "1"});
  };
  absl::StatusOr<testing::Subprocess> rank0 =
      testing::Subprocess::Start(rank_argv(0), dir_ + "/rank0.log");
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(cairnd_->process().WaitForLog(
      "rank 0 of job 'job' step 1 joined the save"))
      << cairnd_->process().Log();
  cairnd_->process().Signal(SIGTERM);
  absl::StatusOr<int> stopped = cairnd_->process().Wait(absl::Seconds(60));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, 0);
  EXPECT_THAT(cairnd_->process().Log(),
              HasSubstr("UNAVAILABLE: cairnd is shutting down"));

  // The same cairnd comes back on the same address.
  const std::string port_file = dir_ + "/cairnd2.port";
  std::vector<std::string> argv = {
      Binaries().cairnd, "--listen",         address,
      "--data-dir",      dir_ + "/cairnd",   "--port-file",
      port_file,         "--begin-deadline", "30"};
  for (const std::string& f : storage_->CairndFlags()) argv.push_back(f);
  absl::StatusOr<testing::Subprocess> restarted =
      testing::Subprocess::Start(argv, dir_ + "/cairnd2.log");
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  absl::StatusOr<std::string> port =
      testing::WaitForFile(port_file, *restarted, absl::Seconds(30));
  ASSERT_TRUE(port.ok()) << port.status();

  std::string out;
  EXPECT_EQ(Run(rank_argv(1), &out), 0) << out;
  absl::StatusOr<int> r0 = rank0->Wait(absl::Minutes(2));
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_EQ(*r0, 0) << rank0->Log();
  EXPECT_EQ(Run({Binaries().cli, "-c", address, "ls", "job"}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("COMMITTED"));
  restarted->Signal(SIGTERM);
  EXPECT_TRUE(restarted->Wait(absl::Seconds(60)).ok());
}

// Offline, one damaged MANIFEST used to fail `ls` outright and `verify
// latest` picked it.
TEST_F(OpsTest, CliOfflineReportsDamagedStepsAndUsesTheNewestValidOne) {
  StartCairnd();
  ASSERT_THAT(SaveSteps("job", 2, "1,2"), ::testing::Each(0));
  ASSERT_TRUE(
      storage_->Overwrite(storage::ManifestKey("job", 2), "not a manifest")
          .ok());
  const std::string uri = storage_->uri();
  std::string out;
  EXPECT_EQ(Run({Binaries().cli, "-s", uri, "ls", "job"}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("COMMITTED"));  // step 1
  EXPECT_THAT(out, HasSubstr("DAMAGED: job job step 2: DATA_LOSS"));
  EXPECT_EQ(Run({Binaries().cli, "-s", uri, "verify", "job", "latest"}, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("skipping damaged job 'job' step 2"));
  EXPECT_THAT(out, HasSubstr("OK: job job step 1"));
  // gc keeps the newest valid one and leaves the damaged one alone. An
  // offline gc needs the storage to itself: cairnd stops first (while it
  // runs, it holds the storage's lease).
  cairnd_->process().Signal(SIGTERM);
  ASSERT_TRUE(cairnd_->process().Wait(absl::Seconds(60)).ok());
  EXPECT_EQ(Run({Binaries().cli, "-s", uri, "gc", "job", "--keep", "1"}, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("deleted 0 checkpoints"));
}

// `cairn -s file:///typo ls` said "no checkpoints" (and created /typo).
// Posix-only (a directory); on S3: s3_e2e_test's missing bucket.
TEST_F(OpsTest, CliOfflineMissingStorageRootIsAnError) {
  const std::string typo = dir_ + "/typo";
  std::string out;
  EXPECT_EQ(Run({Binaries().cli, "-s", "file://" + typo, "ls"}, &out), 1)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("storage root '", typo, "' (file://",
                                          typo, ") does not exist")));
  EXPECT_FALSE(std::filesystem::exists(typo));
}

// `cairn -c ADDR verify` reads storage from the CLI's host: where it is not
// mounted that used to be DATA_LOSS "object not found". Posix-only (moves the
// root directory); on S3: s3_e2e_test's unreachable endpoint.
TEST_F(OpsTest, CliVerifyWhereStorageIsNotMountedSaysUnreachable) {
  StartCairnd();
  ASSERT_THAT(SaveSteps("job", 2, "1"), ::testing::Each(0));
  const std::string moved = dir_ + "/elsewhere";
  std::filesystem::rename(StorageRoot(), moved);  // cairnd keeps its fd
  std::string out;
  EXPECT_EQ(
      Run({Binaries().cli, "-c", cairnd_->address(), "verify", "job", "1"},
          &out),
      1)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat(
                       "FAILED_PRECONDITION: storage file://", StorageRoot(),
                       " of job 'job' step 1 is not "
                       "reachable from this host")));
  EXPECT_THAT(out, HasSubstr("does not exist"));
  EXPECT_THAT(out, Not(HasSubstr("DATA_LOSS")));
  // Another (empty) filesystem mounted there: no object of the step.
  std::filesystem::create_directories(StorageRoot());
  EXPECT_EQ(
      Run({Binaries().cli, "-c", cairnd_->address(), "verify", "job", "1"},
          &out),
      1)
      << out;
  EXPECT_THAT(out, HasSubstr("not reachable from this host"));
  EXPECT_THAT(out,
              HasSubstr("neither its MANIFEST nor any of its 2 data objects"));
  std::filesystem::remove(StorageRoot());
  std::filesystem::rename(moved, StorageRoot());
  EXPECT_EQ(
      Run({Binaries().cli, "-c", cairnd_->address(), "verify", "job", "1"},
          &out),
      0)
      << out;
  // A data object really missing is still data loss.
  std::vector<std::filesystem::path> objects;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(StepDir("job", 1))) {
    if (e.is_regular_file() && e.path().extension() == ".bin") {
      objects.push_back(e.path());
    }
  }
  ASSERT_EQ(objects.size(), 2u);
  std::filesystem::remove(objects[0]);
  EXPECT_EQ(
      Run({Binaries().cli, "-c", cairnd_->address(), "verify", "job", "1"},
          &out),
      1)
      << out;
  EXPECT_THAT(out, HasSubstr("DATA_LOSS"));
}

}  // namespace
}  // namespace cairn
