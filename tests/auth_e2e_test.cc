// Authentication and authorization (issue 16) against a real cairnd started
// with --auth-tokens: checkpoints saved by real ranks (before auth is
// turned on), then every call made over loopback gRPC with the token in the
// `authorization: Bearer <token>` metadata the clients send. Covers: no or
// unknown token (UNAUTHENTICATED), reader vs rm/gc, writer of one job vs
// another, admin, the listing filtered by glob, SIGHUP reloads (and a bad
// file kept out), health open without a token, audit lines naming the
// identity and never the token.
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/e2e_harness.h"
#include "tests/testing/grpc_probe.h"

namespace cairn {
namespace {

using ::cairn::testing::IsOk;
using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::Binaries;

const char kReader[] = "reader-a-token-5f0c2a9e71d4";
const char kReaderAll[] = "reader-all-token-0b8e66a1c3";
const char kWriter[] = "writer-a-token-93d1e07b4f2c";
const char kAdmin[] = "admin-token-6c7f18e2d5a90b";
const char kNew[] = "new-admin-token-a1b2c3d4e5f6";

grpc::StatusCode ListServicesByReflection(const std::string& address);

class AuthE2ETest : public testing::EndToEndTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(EndToEndTest::SetUp());
    tokens_ = dir_ + "/tokens";
    // Checkpoints of jobs a and b (steps 1, 2, 3) saved by real ranks while
    // authentication is off, then cairnd restarted with tokens.
    ASSERT_NO_FATAL_FAILURE(StartAuthCairnd({}));
    // Without auth, reflection is served (the contrast for the check that
    // it is not with auth).
    ASSERT_EQ(ListServicesByReflection(cairnd_->address()),
              grpc::StatusCode::OK);
    for (const char* job : {"a", "b"}) {
      std::vector<int> codes = SaveSteps(job, 2, "1,2,3");
      ASSERT_EQ(codes.size(), 2u);
      ASSERT_THAT(codes, ::testing::Each(0));
    }
    cairnd_->process().Signal(SIGTERM);
    ASSERT_TRUE(cairnd_->process().Wait().ok());
    cairnd_.reset();
    WriteTokens(absl::StrCat("# test tokens\n", kReader, " reader a reader-a\n",
                             kReaderAll, " reader *\n", kWriter,
                             " writer a writer-a\n", kAdmin,
                             " admin * root\n"));
    StartAuthCairnd({"--auth-tokens", tokens_, "--metrics-listen",
                     "127.0.0.1:0", "--metrics-port-file",
                     dir_ + "/metrics-port"});
  }

  void TearDown() override {
    if (cairnd_ != nullptr) {
      cairnd_->process().Signal(SIGTERM);
      (void)cairnd_->process().Wait();
    }
    EndToEndTest::TearDown();
  }

  // cairnd with `flags`; stub_ calls it with no credentials but the
  // metadata Call() adds.
  void StartAuthCairnd(const std::vector<std::string>& flags) {
    ASSERT_NO_FATAL_FAILURE(StartCairnd(flags));
    stub_ = v1::Coordinator::NewStub(grpc::CreateChannel(
        cairnd_->address(), grpc::InsecureChannelCredentials()));
  }

  void WriteTokens(const std::string& text) {
    // Replaced atomically, as a Secret update or an editor's save does.
    const std::string tmp = tokens_ + ".tmp";
    std::ofstream(tmp, std::ios::trunc) << text;
    ASSERT_EQ(chmod(tmp.c_str(), 0600), 0);
    std::filesystem::rename(tmp, tokens_);
  }

  // Calls `method` with `token` (none when empty).
  template <typename Req, typename Resp>
  absl::Status Call(grpc::Status (v1::Coordinator::Stub::*method)(
                        grpc::ClientContext*, const Req&, Resp*),
                    const std::string& token, const Req& request,
                    Resp* response = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    Resp ignored;
    grpc::Status s =
        ((*stub_).*method)(&ctx, request, response ? response : &ignored);
    return FromGrpcStatus(s);
  }

  absl::Status List(const std::string& token, const std::string& job,
                    std::vector<std::string>* jobs = nullptr) {
    v1::ListCheckpointsRequest req;
    req.set_job(job);
    v1::ListCheckpointsResponse resp;
    absl::Status o =
        Call(&v1::Coordinator::Stub::ListCheckpoints, token, req, &resp);
    if (jobs != nullptr) {
      jobs->clear();
      for (const auto& c : resp.checkpoints()) {
        jobs->push_back(absl::StrCat(c.job(), "/", c.step()));
      }
    }
    return o;
  }
  absl::Status Delete(const std::string& token, const std::string& job,
                      int64_t step) {
    v1::DeleteCheckpointRequest req;
    req.set_job(job);
    req.set_step(step);
    return Call(&v1::Coordinator::Stub::DeleteCheckpoint, token, req);
  }
  absl::Status Gc(const std::string& token, const std::string& job,
                  bool dry_run, v1::GarbageCollectResponse* resp = nullptr) {
    v1::GarbageCollectRequest req;
    req.set_job(job);
    req.set_keep_last(1);
    req.set_dry_run(dry_run);
    return Call(&v1::Coordinator::Stub::GarbageCollect, token, req, resp);
  }
  // BeginSave of a one-rank save of a 4 KiB bytes entry.
  absl::Status BeginSave(const std::string& token, const std::string& job,
                         int64_t step, uint64_t incarnation) {
    v1::BeginSaveRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_rank(0);
    req.set_world_size(1);
    req.set_incarnation(incarnation);
    v1::WriteItem* item = req.mutable_local_plan()->add_items();
    item->set_kind(v1::WriteItem::KIND_BYTES);
    item->set_bytes_fqn("extra");
    item->set_length(4096);
    return Call(&v1::Coordinator::Stub::BeginSave, token, req);
  }
  // GET /metrics: the body.
  std::string Metrics() {
    std::ifstream in(dir_ + "/metrics-port");
    int port = 0;
    in >> port;
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(30);
    httplib::Result r = client.Get("/metrics");
    EXPECT_TRUE(r) << "GET /metrics on port " << port;
    return r ? r->body : "";
  }
  absl::Status AbortSave(const std::string& token, const std::string& job,
                         int64_t step, uint64_t incarnation) {
    v1::AbortSaveRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_rank(0);
    req.set_incarnation(incarnation);
    req.set_reason("test");
    return Call(&v1::Coordinator::Stub::AbortSave, token, req);
  }

  // Runs `argv` with CAIRN_TOKEN=`token` (unset when empty); its exit code,
  // its output in `*output`.
  int RunWithToken(const std::string& token, std::vector<std::string> argv,
                   std::string* output) {
    std::vector<std::string> full = {"/usr/bin/env", "-u", "CAIRN_TOKEN", "-u",
                                     "CAIRN_STORAGE"};
    if (!token.empty()) full.push_back(absl::StrCat("CAIRN_TOKEN=", token));
    full.insert(full.end(), argv.begin(), argv.end());
    return Run(full, output, absl::Minutes(3));
  }
  int Cli(const std::string& token, std::vector<std::string> args,
          std::string* output) {
    args.insert(args.begin(), {Binaries().cli, "-c", cairnd_->address()});
    return RunWithToken(token, std::move(args), output);
  }
  int SaveRank(const std::string& token, const std::string& job,
               const std::string& steps, std::string* output) {
    return RunWithToken(
        token, RankArgv(job, 0, 1, "1:S0", {"--save-steps", steps}), output);
  }

  std::string tokens_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// A grpc.reflection list_services request: the call's status code.
grpc::StatusCode ListServicesByReflection(const std::string& address) {
  grpc::GenericStub stub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  // ServerReflectionRequest{list_services = ""}: field 7, length 0. The
  // method is a bidi stream; one request and a half-close is a unary call.
  grpc::Slice list("\x3a\x00", 2);
  grpc::ByteBuffer request(&list, 1), response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  std::promise<grpc::Status> done;
  stub.UnaryCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::StubOptions(), &request, &response,
      [&done](grpc::Status s) { done.set_value(s); });
  return done.get_future().get().error_code();
}

TEST_F(AuthE2ETest, MissingOrUnknownTokensAreUnauthenticatedHealthIsOpen) {
  absl::Status o = List("", "");
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kUnauthenticated,
                          HasSubstr("no credentials")));
  const std::string stranger = "stranger-token-ffffffffffff";
  o = List(stranger, "a");
  EXPECT_THAT(
      o, StatusIs(absl::StatusCode::kUnauthenticated,
                  AllOf(HasSubstr("unknown token"), Not(HasSubstr(stranger)))));
  o = Delete(stranger, "a", 1);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kUnauthenticated));
  // A token that is a prefix of a real one is just as unknown.
  o = List(std::string(kAdmin).substr(0, 20), "a");
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kUnauthenticated));

  absl::StatusOr<int> health = testing::HealthCheck(cairnd_->address());
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, 1);
  // Reflection is not authenticated: off by default with auth.
  EXPECT_EQ(ListServicesByReflection(cairnd_->address()),
            grpc::StatusCode::UNIMPLEMENTED);

  const std::string log = cairnd_->process().Log();
  EXPECT_THAT(log, HasSubstr("audit: auth failure reason=no_credentials"));
  EXPECT_THAT(log, HasSubstr("audit: auth failure reason=unknown_token"));
  const std::string metrics = Metrics();
  EXPECT_THAT(
      metrics,
      HasSubstr("cairn_auth_failures_total{reason=\"no_credentials\"} 1\n"));
  EXPECT_THAT(
      metrics,
      HasSubstr("cairn_auth_failures_total{reason=\"unknown_token\"} 3\n"));
  EXPECT_THAT(log, HasSubstr("method=cairn.v1.Coordinator/DeleteCheckpoint"));
  EXPECT_THAT(log, HasSubstr("authentication on: 4 tokens"));
  for (const char* t : {kReader, kReaderAll, kWriter, kAdmin}) {
    EXPECT_THAT(log, Not(HasSubstr(t)));
  }
  EXPECT_THAT(log, Not(HasSubstr(stranger)));
}

TEST_F(AuthE2ETest, ReaderReadsItsJobsButCannotDeleteOrGc) {
  // The listing of every job is filtered to the reader's glob ("a").
  std::vector<std::string> jobs;
  ASSERT_THAT(List(kReader, "", &jobs), IsOk());
  EXPECT_THAT(jobs, ::testing::ElementsAre("a/1", "a/2", "a/3"));
  ASSERT_THAT(List(kReaderAll, "", &jobs), IsOk());
  EXPECT_EQ(jobs.size(), 6u);
  absl::Status o = List(kReader, "b");
  EXPECT_THAT(o,
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("identity reader-a (role reader) may not read "
                                 "checkpoints of job 'b'")));

  // show, plan a load, verify a load.
  v1::GetCheckpointRequest get;
  get.set_job("a");
  get.set_latest(true);
  v1::GetCheckpointResponse got;
  o = Call(&v1::Coordinator::Stub::GetCheckpoint, std::string(kReader), get,
           &got);
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(got.checkpoint().step(), 3);
  EXPECT_GT(got.manifest().tensors_size(), 0);
  get.set_job("b");
  EXPECT_THAT(Call(&v1::Coordinator::Stub::GetCheckpoint, std::string(kReader),
                   get, &got),
              StatusIs(absl::StatusCode::kPermissionDenied));
  v1::PlanLoadRequest plan;
  plan.set_job("a");
  plan.set_latest(true);
  plan.set_rank(0);
  plan.set_world_size(1);
  plan.set_verify_in_round(true);
  v1::PlanLoadResponse planned;
  o = Call(&v1::Coordinator::Stub::PlanLoad, std::string(kReader), plan,
           &planned);
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(planned.step(), 3);
  v1::VerifyLoadRequest verify;
  verify.set_job("a");
  verify.set_step(3);
  verify.set_rank(0);
  verify.set_world_size(1);
  verify.set_load_round(planned.load_round());
  o = Call(&v1::Coordinator::Stub::VerifyLoad, std::string(kReader), verify);
  EXPECT_THAT(o, IsOk());
  // A dry-run gc only lists: a read.
  v1::GarbageCollectResponse dry;
  o = Gc(kReader, "a", /*dry_run=*/true, &dry);
  ASSERT_THAT(o, IsOk());
  EXPECT_THAT(dry.deleted_steps(), ::testing::UnorderedElementsAre(1, 2));

  o = Delete(kReader, "a", 1);
  EXPECT_THAT(
      o, StatusIs(absl::StatusCode::kPermissionDenied,
                  HasSubstr("identity reader-a (role reader) may not delete "
                            "checkpoints of job 'a' (needs role admin)")));
  o = Gc(kReaderAll, "b", /*dry_run=*/false);
  EXPECT_THAT(
      o, StatusIs(absl::StatusCode::kPermissionDenied,
                  HasSubstr("may not garbage-collect checkpoints of job 'b'")));
  // Nothing was deleted.
  ASSERT_THAT(List(kReaderAll, "", &jobs), IsOk());
  EXPECT_EQ(jobs.size(), 6u);
  // Agent registry: listing needs a grant on every job; forgetting, admin.
  EXPECT_THAT(Call(&v1::Coordinator::Stub::ListAgents, std::string(kReaderAll),
                   v1::ListAgentsRequest()),
              IsOk());
  EXPECT_THAT(Call(&v1::Coordinator::Stub::ListAgents, std::string(kReader),
                   v1::ListAgentsRequest()),
              StatusIs(absl::StatusCode::kPermissionDenied));
  v1::RegisterAgentRequest reg;
  reg.set_node_name("node-1");
  reg.set_num_nodes(4);
  o = Call(&v1::Coordinator::Stub::RegisterAgent, std::string(kWriter), reg);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kPermissionDenied,
                          HasSubstr("needs role agent on job glob '*'")));

  const std::string log = cairnd_->process().Log();
  EXPECT_THAT(log, HasSubstr("audit: identity=reader-a action=delete job=a "
                             "step=1 outcome=denied"));
  // The unnamed token is its fingerprint.
  EXPECT_THAT(log, ::testing::ContainsRegex(
                       "audit: identity=token:[0-9a-f]{8} action=gc job=b "
                       "step=- outcome=denied"));
  EXPECT_THAT(log, HasSubstr("audit: auth failure reason=permission_denied "
                             "identity=reader-a action=delete job=a"));
  for (const char* t : {kReader, kReaderAll, kWriter, kAdmin}) {
    EXPECT_THAT(log, Not(HasSubstr(t)));
  }
}

TEST_F(AuthE2ETest, WriterOfOneJobSavesItButNotAnotherAndAdminDeletes) {
  constexpr uint64_t kProcess = 0x5eed;
  absl::Status o = BeginSave(kWriter, "a", 10, kProcess);
  ASSERT_THAT(o, IsOk());
  o = BeginSave(kWriter, "b", 10, kProcess);
  EXPECT_THAT(o,
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("identity writer-a (role writer) may not save "
                                 "checkpoints of job 'b'")));
  o = BeginSave(kReader, "a", 11, kProcess);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kPermissionDenied,
                          HasSubstr("may not save checkpoints of job 'a'")));
  o = Delete(kWriter, "b", 1);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kPermissionDenied,
                          HasSubstr("may not delete checkpoints of job 'b'")));
  o = Delete(kWriter, "a", 1);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kPermissionDenied));

  // Aborting without the process id aborts anyone's save: admin only.
  o = AbortSave(kWriter, "a", 10, 0);
  EXPECT_THAT(
      o,
      StatusIs(absl::StatusCode::kPermissionDenied,
               HasSubstr("may not abort other processes' saves of job 'a'")));
  // Its own save (its process id): a writer may.
  o = AbortSave(kWriter, "a", 10, kProcess);
  EXPECT_THAT(o, IsOk());
  ASSERT_THAT(BeginSave(kWriter, "a", 12, kProcess), IsOk());
  o = AbortSave(kAdmin, "a", 12, 0);
  EXPECT_THAT(o, IsOk());

  // Admin deletes and collects.
  o = Delete(kAdmin, "b", 1);
  EXPECT_THAT(o, IsOk());
  v1::GarbageCollectResponse gc;
  o = Gc(kAdmin, "a", /*dry_run=*/false, &gc);
  ASSERT_THAT(o, IsOk());
  EXPECT_THAT(gc.deleted_steps(), ::testing::UnorderedElementsAre(1, 2));
  std::vector<std::string> jobs;
  ASSERT_THAT(List(kAdmin, "", &jobs), IsOk());
  EXPECT_THAT(jobs, ::testing::ElementsAre("a/3", "b/2", "b/3"));

  const std::string log = cairnd_->process().Log();
  EXPECT_THAT(log, HasSubstr("audit: identity=writer-a action=abort job=a "
                             "step=10 outcome=denied"));
  EXPECT_THAT(log, HasSubstr("audit: identity=writer-a action=abort_own "
                             "job=a step=10 outcome=ok"));
  EXPECT_THAT(log, HasSubstr("audit: identity=root action=abort job=a "
                             "step=12 outcome=ok"));
  EXPECT_THAT(log, HasSubstr("audit: identity=root action=delete job=b "
                             "step=1 outcome=ok"));
  EXPECT_THAT(log, HasSubstr("audit: identity=root action=gc job=a step=- "
                             "outcome=ok"));
  const std::string metrics = Metrics();
  for (const char* series :
       {"cairn_auth_failures_total{reason=\"permission_denied\"} 5\n",
        "cairn_audit_events_total{action=\"abort\",outcome=\"denied\"} 1\n",
        "cairn_audit_events_total{action=\"abort\",outcome=\"ok\"} 1\n",
        "cairn_audit_events_total{action=\"abort_own\",outcome=\"ok\"} 1\n",
        "cairn_audit_events_total{action=\"delete\",outcome=\"denied\"} 2\n",
        "cairn_audit_events_total{action=\"delete\",outcome=\"ok\"} 1\n",
        "cairn_audit_events_total{action=\"gc\",outcome=\"ok\"} 1\n"}) {
    EXPECT_THAT(metrics, HasSubstr(series));
  }
  for (const char* t : {kReader, kReaderAll, kWriter, kAdmin}) {
    EXPECT_THAT(log, Not(HasSubstr(t)));
  }
}

TEST_F(AuthE2ETest, SighupReloadsTheTokenFileAndABadFileKeepsTheOld) {
  ASSERT_THAT(List(kAdmin, ""), IsOk());
  ASSERT_THAT(List(kNew, ""), StatusIs(absl::StatusCode::kUnauthenticated));
  WriteTokens(absl::StrCat(kNew, " admin * new-root\n", kReader,
                           " reader a reader-a\n"));
  cairnd_->process().Signal(SIGHUP);
  // The reload happens on cairnd's signal thread: wait for it to be used.
  absl::Status o;
  for (int i = 0; i < 600; ++i) {
    o = List(kNew, "");
    if (o.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_THAT(o, IsOk());
  o = List(kAdmin, "");
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kUnauthenticated,
                          HasSubstr("unknown token")));
  EXPECT_THAT(List(kReader, "a"), IsOk());

  // A typo: the old table stays, the log names the line.
  WriteTokens(absl::StrCat("# edited\n", kAdmin, " admn * root\n"));
  cairnd_->process().Signal(SIGHUP);
  std::string log;
  for (int i = 0; i < 600; ++i) {
    log = cairnd_->process().Log();
    if (absl::StrContains(log, "keeping the tokens in use")) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(log,
              HasSubstr(absl::StrCat("keeping the tokens in use: ", tokens_,
                                     " line 2: unknown role "
                                     "'admn'")));
  EXPECT_THAT(List(kNew, ""), IsOk());
  EXPECT_THAT(List(kAdmin, ""), StatusIs(absl::StatusCode::kUnauthenticated));

  // A file others may read is refused the same way.
  WriteTokens(absl::StrCat(kAdmin, " admin *\n"));
  ASSERT_EQ(chmod(tokens_.c_str(), 0644), 0);
  cairnd_->process().Signal(SIGHUP);
  for (int i = 0; i < 600; ++i) {
    log = cairnd_->process().Log();
    if (absl::StrContains(log, "accessible by other users")) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(log, HasSubstr("accessible by other users (mode 0644)"));
  EXPECT_THAT(List(kNew, ""), IsOk());
  for (const char* t : {kNew, kAdmin, kReader}) {
    EXPECT_THAT(log, Not(HasSubstr(t)));
  }
}

TEST_F(AuthE2ETest, ReflectionCanBeForcedOnWithAuth) {
  cairnd_->process().Signal(SIGTERM);
  ASSERT_TRUE(cairnd_->process().Wait().ok());
  cairnd_.reset();
  StartAuthCairnd({"--auth-tokens", tokens_, "--reflection", "on"});
  EXPECT_EQ(ListServicesByReflection(cairnd_->address()), grpc::StatusCode::OK);
  EXPECT_THAT(cairnd_->process().Log(), HasSubstr("reflection on"));
  // The Coordinator service itself still needs a token.
  EXPECT_THAT(List("", ""), StatusIs(absl::StatusCode::kUnauthenticated));
}

// The clients (cairn, libcairn in a rank) send CAIRN_TOKEN.
TEST_F(AuthE2ETest, CliAndRanksSendCairnToken) {
  std::string out;
  EXPECT_NE(Cli("", {"ls"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("no credentials"));
  ASSERT_EQ(Cli(kReader, {"ls"}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("a"));
  EXPECT_THAT(out, Not(::testing::ContainsRegex("(^|\\n)b ")));
  EXPECT_EQ(Cli(kReader, {"show", "a", "latest"}, &out), 0) << out;
  EXPECT_EQ(Cli(kReader, {"verify", "a", "latest"}, &out), 0) << out;
  EXPECT_NE(Cli(kReader, {"show", "b", "latest"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("may not read checkpoints of job 'b'"));
  EXPECT_NE(Cli(kReader, {"rm", "a", "1", "--yes"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("identity reader-a (role reader) may not delete "
                             "checkpoints of job 'a'"));
  EXPECT_NE(Cli(kReader, {"gc", "a", "--keep", "1"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("may not garbage-collect checkpoints of job 'a'"));
  EXPECT_NE(Cli("unknown-token-000000000000", {"ls"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("unknown token"));

  // A rank with the writer token of job a saves a, not b.
  EXPECT_EQ(SaveRank(kWriter, "a", "20", &out), 0) << out;
  EXPECT_NE(SaveRank(kWriter, "b", "20", &out), 0);
  EXPECT_THAT(out, HasSubstr("may not save checkpoints of job 'b'"));
  EXPECT_NE(SaveRank("", "a", "21", &out), 0);
  EXPECT_THAT(out, HasSubstr("no credentials"));

  EXPECT_EQ(Cli(kAdmin, {"rm", "b", "1", "--yes"}, &out), 0) << out;
  EXPECT_EQ(Cli(kAdmin, {"gc", "a", "--keep", "1"}, &out), 0) << out;
  ASSERT_EQ(Cli(kReaderAll, {"ls"}, &out), 0) << out;
  std::vector<std::string> jobs;
  ASSERT_THAT(List(kReaderAll, "", &jobs), IsOk());
  EXPECT_THAT(jobs, ::testing::ElementsAre("a/20", "b/2", "b/3"));
  const std::string log = cairnd_->process().Log();
  EXPECT_THAT(log, HasSubstr("audit: identity=root action=delete job=b "
                             "step=1 outcome=ok"));
  for (const char* t : {kReader, kReaderAll, kWriter, kAdmin}) {
    EXPECT_THAT(log, Not(HasSubstr(t)));
  }
}

TEST_F(AuthE2ETest, CairndRefusesToStartOnABadTokenFile) {
  WriteTokens(absl::StrCat(kAdmin, " admin *\nshort reader *\n"));
  std::string out;
  EXPECT_EQ(Run({Binaries().cairnd, "--listen", "127.0.0.1:0", "--data-dir",
                 dir_ + "/other", "--auth-tokens", tokens_},
                &out),
            1);
  EXPECT_THAT(out, HasSubstr(absl::StrCat("--auth-tokens: ", tokens_,
                                          " line 2: token of 5 "
                                          "characters")));
  EXPECT_THAT(out, Not(HasSubstr(kAdmin)));
}

}  // namespace
}  // namespace cairn
