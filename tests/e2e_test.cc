// End-to-end: a real cairnd process and real rank processes
// (cairn_train_example) on loopback, saving and loading a sharded model.
// Storage is file:// under the test's temp dir, or a fresh S3 bucket with
// CAIRN_TEST_STORAGE=s3 (tests/testing/test_storage.h).
//
// Binaries come from --cairnd=PATH and --rank=PATH (Bazel passes them as
// args), else from the paths CMake compiled in.
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "client/cli/cli.h"
#include "common/grpc_status.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_layout.h"
#include "storage/shard_store.h"
#include "tests/testing/cli_in_process.h"
#include "tests/testing/e2e_harness.h"

namespace cairn {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::ContainsRegex;
using ::testing::Each;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::Binaries;

class E2ETest : public testing::EndToEndTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(EndToEndTest::SetUp());
    ASSERT_NO_FATAL_FAILURE(CreateStorage());
  }

  // Starts one rank without waiting for it.
  testing::Subprocess StartRank(const std::string& job, int rank, int world,
                                const std::string& layout,
                                std::vector<std::string> extra,
                                const std::string& log_name) {
    absl::StatusOr<testing::Subprocess> p =
        testing::Subprocess::Start(RankArgv(job, rank, world, layout, extra),
                                   absl::StrCat(dir_, "/", log_name, ".log"));
    EXPECT_TRUE(p.ok()) << p.status();
    return std::move(*p);
  }

  // Waits for `path` to exist (a rank's test hook writes it); its contents.
  std::string WaitForHook(const std::string& path, testing::Subprocess& p) {
    absl::StatusOr<std::string> contents =
        testing::WaitForFile(path, p, absl::Minutes(3));
    EXPECT_TRUE(contents.ok()) << contents.status();
    return contents.value_or("");
  }

  // Runs `world` ranks of the example job; returns their exit codes. Rank
  // `odd_rank` gets `odd_extra` as well (fault injection). The output of
  // ranks that fail is added to last_logs_.
  std::vector<int> RunRanks(const std::string& job, int world,
                            const std::string& layout,
                            std::vector<std::string> extra, int odd_rank = -1,
                            std::vector<std::string> odd_extra = {
                                "--die-before-commit"}) {
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < world; ++r) {
      argvs.push_back(RankArgv(job, r, world, layout, extra));
      if (r == odd_rank) {
        argvs.back().insert(argvs.back().end(), odd_extra.begin(),
                            odd_extra.end());
      }
    }
    std::vector<int> codes = RunAll(argvs);
    for (size_t r = 0; r < codes.size(); ++r) {
      if (codes[r] != 0) {
        last_logs_ += absl::StrCat("rank ", r, ": ", RankLog(r));
      }
    }
    return codes;
  }

  // Runs `cairn ARGS` until `done` holds for its output, at most a minute,
  // and returns the last output. For what cairnd does after it has answered
  // the ranks: an aborted save is recorded, and its objects deleted, off the
  // ranks' calls.
  template <typename Pred>
  std::string CliUntil(const std::vector<std::string>& args, Pred done) {
    std::string out;
    const absl::Time end = absl::Now() + absl::Minutes(1);
    while (true) {
      EXPECT_EQ(Cli(args, &out), 0) << out;
      if (done(out) || absl::Now() > end) return out;
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  static int Cli(std::vector<std::string> args, std::string* out,
                 std::string* err = nullptr) {
    return testing::RunCliInProcess(std::move(args), out, err);
  }

  std::string StorageUri() const { return storage_->uri(); }

  std::string last_logs_;
};

TEST_F(E2ETest, EightRankDTensorSaveLoadsBitExactIntoOtherLayouts) {
  StartCairnd();
  // FSDP x TP on a 2x4 mesh; uneven dims; bf16, fp32, fp64, int64; bytes.
  std::vector<int> codes =
      RunRanks("llama", 8, "2x4:S0,S1", {"--save-steps", "100,200"});
  ASSERT_THAT(codes, Each(Eq(0))) << last_logs_;

  struct Target {
    int world;
    const char* layout;
  };
  for (const Target& t : {Target{1, "1:R"}, Target{3, "3:S1"},
                          Target{4, "2x2:S1,S0"}, Target{16, "4x4:S0,S1"}}) {
    codes = RunRanks("llama", t.world, t.layout, {"--load", "latest"});
    EXPECT_THAT(codes, Each(Eq(0))) << t.world << " ranks " << t.layout << "\n"
                                    << last_logs_;
  }
  // An explicit older step loads too (bytes entries differ per step).
  codes = RunRanks("llama", 2, "2:S0", {"--load", "100"});
  EXPECT_THAT(codes, Each(Eq(0))) << last_logs_;

  std::string out;
  ASSERT_EQ(Cli({"--coordinator", cairnd_->address(), "ls"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("llama"));
  EXPECT_THAT(out, HasSubstr("COMMITTED"));
  ASSERT_EQ(
      Cli({"--coordinator", cairnd_->address(), "show", "llama", "latest"},
          &out),
      0);
  EXPECT_THAT(out, HasSubstr("model.layers.0.attn.wq.weight"));
  EXPECT_THAT(out, HasSubstr("bfloat16"));
  EXPECT_THAT(out, HasSubstr("[257, 130]"));
  EXPECT_THAT(out, HasSubstr("rng_state"));
  ASSERT_EQ(Cli({"--coordinator", cairnd_->address(), "verify", "llama", "200"},
                &out),
            0);
  EXPECT_THAT(out, HasSubstr("OK"));
  // Offline: the same answers straight from storage.
  ASSERT_EQ(
      Cli({"--storage", StorageUri(), "show", "llama", "100", "--json"}, &out),
      0);
  EXPECT_THAT(out, HasSubstr("\"model.embed.weight\""));
  // Loads are logged by cairnd, one line per load round, like saves.
  const std::string log = cairnd_->process().Log();
  EXPECT_THAT(log, HasSubstr("job 'llama' step 200: load round"));
  EXPECT_THAT(log, HasSubstr("of 16 ranks (latest)"));
  EXPECT_THAT(log, HasSubstr("job 'llama' step 100: load round"));
  // So is each checkpoint cairnd indexes for planning loads, once.
  EXPECT_THAT(log, ContainsRegex("job 'llama' step 200: checkpoint loaded for "
                                 "planning: [0-9]+ tensors, [1-9][0-9]* "
                                 "stored chunks, [1-9][0-9]* tilings, "));
  const std::string indexed = "job 'llama' step 200: checkpoint loaded";
  EXPECT_EQ(log.find(indexed), log.rfind(indexed)) << log;
}

TEST_F(E2ETest, RankKilledMidSaveLeavesPreviousCheckpointLatest) {
  StartCairnd({"--commit-deadline", "3"});
  ASSERT_THAT(RunRanks("job", 4, "4:S0", {"--save-steps", "1"}), Each(Eq(0)))
      << last_logs_;
  // Rank 2 dies after writing its bytes, before committing.
  std::vector<int> codes =
      RunRanks("job", 4, "4:S0", {"--save-steps", "2"}, /*odd_rank=*/2);
  ASSERT_EQ(codes.size(), 4u);
  EXPECT_EQ(codes[2], 137);
  for (int r : {0, 1, 3}) EXPECT_EQ(codes[r], 1) << "rank " << r;
  EXPECT_THAT(last_logs_, HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_THAT(last_logs_, HasSubstr("[2]"));

  // latest is still step 1, and it loads bit-exact (Verify checks the step's
  // bytes entries too).
  std::vector<int> load = RunRanks("job", 2, "2:S1", {"--load", "latest"});
  EXPECT_THAT(load, Each(Eq(0))) << last_logs_;
  std::string out = CliUntil(
      {"--coordinator", cairnd_->address(), "ls", "job", "--all"},
      [](const std::string& o) { return absl::StrContains(o, "ABORTED"); });
  EXPECT_THAT(out, HasSubstr("ABORTED"));
  // The aborted attempt's bytes are gone: step 2 has nothing on storage.
  out = CliUntil(
      {"--storage", StorageUri(), "ls", "job", "--all"},
      [](const std::string& o) { return !absl::StrContains(o, "WRITING"); });
  EXPECT_THAT(out, Not(HasSubstr("WRITING"))) << out;
  // A new attempt at step 2 succeeds.
  EXPECT_THAT(RunRanks("job", 4, "4:S0", {"--save-steps", "2"}), Each(Eq(0)))
      << last_logs_;
}

// A restarted job re-saves a step whose old attempt is still open: rank 0's
// old process reported its writes and waits, rank 1's old process died after
// writing. The new rank 0 process holds different values for the same step.
// It must never rewrite the object whose crc32c the old process reported
// (that committed a checkpoint failing verify): the old attempt is aborted,
// the new processes save in a fresh one, and every byte verifies.
TEST_F(E2ETest, RestartedRanksNeverCommitBytesThatFailVerify) {
  StartCairnd();
  auto rank_argv = [&](int rank, std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--save-steps", "1"});
    return RankArgv("job", rank, 2, "2:S0", extra);
  };
  absl::StatusOr<testing::Subprocess> old0 =
      testing::Subprocess::Start(rank_argv(0, {}), dir_ + "/old-rank0.log");
  absl::StatusOr<testing::Subprocess> old1 = testing::Subprocess::Start(
      rank_argv(1, {"--die-before-commit"}), dir_ + "/old-rank1.log");
  ASSERT_TRUE(old0.ok() && old1.ok());
  absl::StatusOr<int> died = old1->Wait();
  ASSERT_TRUE(died.ok());
  ASSERT_EQ(*died, 137) << old1->Log();
  // Rank 0 reports right after its object is durable: wait for the object.
  auto store = storage_->Store();
  ASSERT_TRUE(store.ok()) << store.status();
  bool written = false;
  for (int i = 0; i < 3000 && !written; ++i) {
    auto keys = (*store)->List("job/0000000000000001/");
    ASSERT_TRUE(keys.ok());
    for (const std::string& k : *keys) {
      written = written || absl::StrContains(k, "rank-00000");
    }
    if (!written) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(written) << old0->Log();

  // The job restarts: new processes for both ranks save step 1 again.
  std::vector<int> codes = RunRanks("job", 2, "2:S0", {"--save-steps", "1"},
                                    /*odd_rank=*/0, {"--fill-step", "9"});
  EXPECT_THAT(codes, Each(Eq(0))) << last_logs_;
  absl::StatusOr<int> old_rc = old0->Wait();
  ASSERT_TRUE(old_rc.ok());
  EXPECT_EQ(*old_rc, 1) << old0->Log();
  // Whichever new process arrived first aborted the old attempt (or, if the
  // old rank 0 reported only after that, its CommitSave met the new one).
  EXPECT_THAT(
      old0->Log(),
      ::testing::AnyOf(HasSubstr("save of job 'job' step 1 aborted: rank 0 "
                                 "restarted during the save"),
                       HasSubstr("save of job 'job' step 1 aborted: rank 1 "
                                 "restarted during the save"),
                       HasSubstr("rank 0 of job 'job' step 1 called CommitSave "
                                 "before the plan was built"),
                       HasSubstr("rank 0 of job 'job' step 1: this process")))
      << old0->Log();
  std::string out, err;
  EXPECT_EQ(Cli({"--coordinator", cairnd_->address(), "verify", "job", "1"},
                &out, &err),
            0)
      << out << err;
  ASSERT_EQ(
      Cli({"--coordinator", cairnd_->address(), "ls", "job", "--all"}, &out),
      0);
  EXPECT_THAT(out, HasSubstr("COMMITTED")) << out;
  // Only the committed attempt is left on storage.
  auto keys = (*store)->List("job/0000000000000001/");
  ASSERT_TRUE(keys.ok());
  std::set<std::string> attempts;
  for (const std::string& k : *keys) {
    const std::string rest = k.substr(strlen("job/0000000000000001/"));
    if (rest != "MANIFEST") attempts.insert(rest.substr(0, rest.find('/')));
  }
  EXPECT_EQ(attempts.size(), 1u) << absl::StrJoin(*keys, "\n");
}

TEST_F(E2ETest, CairndKilledAndRestartedLosesNoCommittedCheckpoint) {
  StartCairnd();
  ASSERT_THAT(RunRanks("job", 3, "3:S0", {"--save-steps", "5,6"}), Each(Eq(0)))
      << last_logs_;
  cairnd_->process().Signal(SIGKILL);
  ASSERT_TRUE(cairnd_->process().Wait().ok());
  StartCairnd();
  std::string out;
  ASSERT_EQ(Cli({"--coordinator", cairnd_->address(), "ls", "job"}, &out), 0);
  EXPECT_THAT(out, HasSubstr(" 5 "));
  EXPECT_THAT(out, HasSubstr(" 6 "));
  EXPECT_THAT(RunRanks("job", 2, "2:S1", {"--load", "latest"}), Each(Eq(0)))
      << last_logs_;

  // Even with the catalog lost, the MANIFESTs on storage are the truth.
  cairnd_->process().Signal(SIGTERM);
  absl::StatusOr<int> rc = cairnd_->process().Wait();
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0);  // SIGTERM drains and exits cleanly
  std::filesystem::remove_all(dir_ + "/cairnd/catalog");
  StartCairnd();
  ASSERT_EQ(Cli({"--coordinator", cairnd_->address(), "ls", "job"}, &out), 0);
  EXPECT_THAT(out, HasSubstr(" 6 "));
  EXPECT_THAT(RunRanks("job", 1, "1:R", {"--load", "5"}), Each(Eq(0)))
      << last_logs_;
}

TEST_F(E2ETest, CorruptedByteIsDetectedByVerifyAndLoad) {
  StartCairnd();
  ASSERT_THAT(RunRanks("job", 2, "2:S0", {"--save-steps", "1"}), Each(Eq(0)))
      << last_logs_;
  // Flip one byte in a data object.
  absl::StatusOr<std::vector<std::string>> objects =
      storage_->DataObjects("job/");
  ASSERT_TRUE(objects.ok()) << objects.status();
  ASSERT_FALSE(objects->empty());
  ASSERT_TRUE(storage_->FlipBits(objects->front(), 10, 0x40).ok());
  std::string out, err;
  EXPECT_EQ(Cli({"--coordinator", cairnd_->address(), "verify", "job", "1"},
                &out, &err),
            1);
  EXPECT_THAT(err, HasSubstr("DATA_LOSS"));
  std::vector<int> codes = RunRanks("job", 2, "2:S0", {"--load", "1"});
  EXPECT_THAT(codes, ::testing::Contains(1));
  EXPECT_THAT(last_logs_, HasSubstr("DATA_LOSS"));
}

// Rows saved, columns loaded: every stored chunk of a matrix is split between
// the two loading ranks. Each reads only the bytes it needs, cairnd combines
// their crc32c terms, and a damaged byte is still caught.
TEST_F(E2ETest, ReshardedLoadReadsOnlyNeededBytesAndStillCatchesDamage) {
  StartCairnd();
  ASSERT_THAT(RunRanks("job", 2, "2:S0", {"--save-steps", "1"}), Each(Eq(0)))
      << last_logs_;
  ASSERT_THAT(RunRanks("job", 2, "2:S1", {"--load", "1", "--json"}),
              Each(Eq(0)))
      << last_logs_;
  for (int r = 0; r < 2; ++r) {
    const std::string log = RankLog(r);
    // {"op":"load",...,"bytes":N,"storage_bytes":N,...}
    auto field = [&](const std::string& name) -> int64_t {
      const size_t at = log.find(absl::StrCat("\"", name, "\":"));
      if (at == std::string::npos) return -1;
      return std::stoll(log.substr(at + name.size() + 3));
    };
    EXPECT_GT(field("bytes"), 0) << log;
    EXPECT_EQ(field("storage_bytes"), field("bytes")) << log;
    EXPECT_GT(field("chunks_verified_by_cairnd"), 0) << log;
    EXPECT_EQ(field("chunks_verified_locally"), 0) << log;
  }

  // Damage one byte in the middle of the largest stored chunk of a matrix.
  auto stub = Stub();
  grpc::ClientContext ctx;
  v1::GetCheckpointRequest get;
  get.set_job("job");
  get.set_step(1);
  v1::GetCheckpointResponse got;
  ASSERT_TRUE(stub->GetCheckpoint(&ctx, get, &got).ok());
  const v1::StoredChunk* victim = nullptr;
  std::string fqn;
  for (const v1::ManifestTensor& t : got.manifest().tensors()) {
    if (t.entry().global_shape_size() != 2) continue;
    for (const v1::StoredChunk& c : t.chunks()) {
      if (victim == nullptr ||
          c.location().length() > victim->location().length()) {
        victim = &c;
        fqn = t.entry().fqn();
      }
    }
  }
  ASSERT_NE(victim, nullptr);
  const std::string key =
      storage::ObjectKey("job", 1, victim->location().object_key());
  const uint64_t at =
      victim->location().offset() + victim->location().length() / 2 + 3;
  absl::Status flipped = storage_->FlipBits(key, at, 0x01);
  ASSERT_TRUE(flipped.ok()) << flipped;
  std::vector<int> codes = RunRanks("job", 2, "2:S1", {"--load", "1"});
  EXPECT_THAT(codes, ::testing::Contains(1));
  EXPECT_THAT(last_logs_, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(last_logs_, HasSubstr(fqn));
}

// A rank whose load cairnd refuses (it asks for tensors the checkpoint does
// not hold) still leaves the VerifyLoad round, so the rank whose load is fine
// is not held until the deadline (an hour here: RunRanks gives up after 3
// minutes and the test fails). Its partly read chunks, which the failed rank
// would have covered, are verified by reading them whole.
TEST_F(E2ETest, RankRefusedAtPlanLoadDoesNotHoldUpTheOthers) {
  StartCairnd({"--load-verify-deadline", "3600"});
  ASSERT_THAT(RunRanks("job", 2, "2:S0", {"--save-steps", "1"}), Each(Eq(0)))
      << last_logs_;
  for (const std::string ref : {"1", "latest"}) {
    SCOPED_TRACE(ref);
    last_logs_.clear();
    std::vector<int> codes =
        RunRanks("job", 2, "2:S1", {"--load", ref, "--json"}, /*odd_rank=*/1,
                 {"--model", "llm:1000000"});
    ASSERT_EQ(codes.size(), 2u);
    EXPECT_EQ(codes[0], 0) << last_logs_;
    EXPECT_EQ(codes[1], 1);
    EXPECT_THAT(RankLog(1), HasSubstr("job"));
    const std::string log = RankLog(0);
    const size_t at = log.find("\"chunks_verified_locally\":");
    ASSERT_NE(at, std::string::npos) << log;
    EXPECT_GT(std::stoll(log.substr(at + 26)), 0) << log;
  }
}

TEST_F(E2ETest, RawClientBadRequestsGetDocumentedErrors) {
  StartCairnd({"--begin-deadline", "1"});
  auto stub = Stub();
  auto begin = [&](const std::string& job, int64_t step, int rank, int world,
                   std::vector<std::pair<int64_t, int64_t>> rows) {
    v1::BeginSaveRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_rank(rank);
    req.set_world_size(world);
    v1::LocalSavePlan* plan = req.mutable_local_plan();
    plan->set_rank(rank);
    for (auto [off, size] : rows) {
      v1::WriteItem* item = plan->add_items();
      item->set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
      item->mutable_tensor()->set_fqn("model.w");
      item->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
      item->mutable_tensor()->add_global_shape(10);
      item->mutable_tensor()->add_global_shape(4);
      item->mutable_chunk()->add_offsets(off);
      item->mutable_chunk()->add_offsets(0);
      item->mutable_chunk()->add_sizes(size);
      item->mutable_chunk()->add_sizes(4);
      item->set_length(static_cast<uint64_t>(size) * 4 * 4);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    v1::BeginSaveResponse resp;
    return FromGrpcStatus(stub->BeginSave(&ctx, req, &resp));
  };

  absl::Status s = begin("../../etc", 1, 0, 1, {{0, 10}});
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("../../etc")));
  s = begin("job", 1, 3, 2, {{0, 10}});
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 3")));
  s = begin("job", -5, 0, 1, {{0, 10}});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  // Out of bounds chunk.
  s = begin("job", 1, 0, 1, {{5, 10}});
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.w")));
  // A missing rank: the one that came waits, then DEADLINE_EXCEEDED naming
  // the missing rank.
  s = begin("job", 2, 0, 2, {{0, 5}});
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("[1]")));

  grpc::ClientContext c1;
  v1::PlanLoadRequest load;
  load.set_job("nope");
  load.set_latest(true);
  v1::PlanLoadResponse lr;
  s = FromGrpcStatus(stub->PlanLoad(&c1, load, &lr));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));

  grpc::ClientContext c2;
  v1::CommitSaveRequest commit;
  commit.set_job("job");
  commit.set_step(77);
  v1::CommitSaveResponse cr;
  s = FromGrpcStatus(stub->CommitSave(&c2, commit, &cr));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));

  grpc::ClientContext c3;
  v1::DeleteCheckpointRequest del;
  del.set_job("job");
  del.set_step(12345);
  v1::DeleteCheckpointResponse dr;
  s = FromGrpcStatus(stub->DeleteCheckpoint(&c3, del, &dr));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));

  grpc::ClientContext c4;
  v1::GarbageCollectRequest gc;
  gc.set_job("job");
  gc.set_keep_last(0);
  v1::GarbageCollectResponse gr;
  s = FromGrpcStatus(stub->GarbageCollect(&c4, gc, &gr));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));

  // After all that, cairnd still serves: a real save and a dtype-mismatched
  // load.
  ASSERT_THAT(RunRanks("ok", 2, "2:S0", {"--save-steps", "1"}), Each(Eq(0)))
      << last_logs_;
  grpc::ClientContext c5;
  v1::PlanLoadRequest bad;
  bad.set_job("ok");
  bad.set_step(1);
  v1::WantedChunk* w = bad.add_wanted();
  w->mutable_tensor()->set_fqn("model.embed.weight");
  w->mutable_tensor()->set_dtype(v1::DTYPE_BFLOAT16);
  w->mutable_tensor()->add_global_shape(1000);
  w->mutable_tensor()->add_global_shape(64);
  w->mutable_box()->add_offsets(0);
  w->mutable_box()->add_offsets(0);
  w->mutable_box()->add_sizes(10);
  w->mutable_box()->add_sizes(64);
  s = FromGrpcStatus(stub->PlanLoad(&c5, bad, &lr));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("model.embed.weight")));
}

// A real small filesystem (a 64 MiB tmpfs): a save that does not fit fails
// on every rank naming the real cause, the previous checkpoint stays
// loadable, and nothing of the failed attempt is left behind.
TEST_F(E2ETest, SaveThatDoesNotFitFailsOnEveryRankWithNoSpace) {
  const std::string mnt = dir_ + "/small-fs";
  ASSERT_TRUE(std::filesystem::create_directories(mnt));
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << strerror(errno);
  }
  absl::Cleanup unmount = [&] {
    cairnd_.reset();
    umount2(mnt.c_str(), MNT_DETACH);
  };
  StartCairnd({"--storage", absl::StrCat("file://", mnt, "/ckpt")});
  // Step 1: 16 MB, fits.
  ASSERT_THAT(RunRanks("job", 4, "4:S0",
                       {"--model", "bench:16e6", "--save-steps", "1"}),
              Each(Eq(0)))
      << last_logs_;
  // Step 2: 120 MB in four 30 MB objects, with about 48 MB free: the first
  // ranks to reserve get their space, the others cannot.
  std::vector<int> codes = RunRanks(
      "job", 4, "4:S0", {"--model", "bench:120e6", "--save-steps", "2"});
  ASSERT_EQ(codes.size(), 4u);
  int out_of_space = 0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(codes[r], 1) << "rank " << r;
    const std::string log = RankLog(r);
    // Every rank names the real cause, its own or the rank's that aborted.
    EXPECT_THAT(log, HasSubstr("no space left on device writing 'job/"))
        << "rank " << r << ": " << log;
    EXPECT_THAT(log, HasSubstr("bytes needed")) << "rank " << r;
    EXPECT_THAT(log, Not(HasSubstr("renaming the temp file")));
    EXPECT_THAT(log, Not(HasSubstr("NOT_FOUND")));
    if (absl::StrContains(log, "RESOURCE_EXHAUSTED")) ++out_of_space;
  }
  EXPECT_GE(out_of_space, 1);

  // The previous checkpoint is still latest, loads and verifies.
  EXPECT_THAT(
      RunRanks("job", 2, "2:S1", {"--model", "bench:16e6", "--load", "latest"}),
      Each(Eq(0)))
      << last_logs_;
  std::string out;
  EXPECT_EQ(
      Cli({"--coordinator", cairnd_->address(), "verify", "job", "latest"},
          &out),
      0)
      << out;
  EXPECT_THAT(out, HasSubstr("OK"));
  EXPECT_EQ(
      Cli({"--coordinator", cairnd_->address(), "ls", "job", "--all"}, &out),
      0);
  EXPECT_THAT(out, HasSubstr("ABORTED"));
  // No temp file of the failed attempt remains.
  for (const auto& e : std::filesystem::recursive_directory_iterator(mnt)) {
    EXPECT_FALSE(absl::StartsWith(e.path().filename().string(), ".cairn-tmp"))
        << e.path();
  }
}

TEST_F(E2ETest, CliRmAndGcApplyRetention) {
  StartCairnd();
  ASSERT_THAT(RunRanks("job", 2, "2:S0", {"--save-steps", "1,2,3,4"}),
              Each(Eq(0)))
      << last_logs_;
  std::string out, err;
  EXPECT_EQ(
      Cli({"--coordinator", cairnd_->address(), "rm", "job", "2", "-y"}, &out),
      0);
  EXPECT_EQ(Cli({"--coordinator", cairnd_->address(), "gc", "job", "--keep",
                 "1", "--dry-run"},
                &out),
            0);
  EXPECT_THAT(out, HasSubstr("would delete 2"));
  EXPECT_EQ(
      Cli({"--coordinator", cairnd_->address(), "gc", "job", "--keep", "1"},
          &out),
      0);
  EXPECT_THAT(out, HasSubstr("steps 3, 1"));
  EXPECT_EQ(Cli({"--storage", StorageUri(), "ls", "job"}, &out), 0);
  EXPECT_THAT(out, HasSubstr(" 4 "));
  EXPECT_THAT(out, Not(HasSubstr(" 3 ")));
  EXPECT_EQ(Cli({"--coordinator", cairnd_->address(), "show", "job", "3"}, &out,
                &err),
            1);
  EXPECT_THAT(err, HasSubstr("NOT_FOUND"));
  EXPECT_EQ(Cli({"ls"}, &out, &err), 2);  // neither --coordinator nor --storage
}

// Load(latest) racing a commit: rank 0 plans (step 1 is the newest), step 2
// commits, then rank 1 plans. Both must load step 1 (they used to get
// different steps: each bit-exact for its own step, a mixed model).
TEST_F(E2ETest, LatestLoadRacingACommitGivesEveryRankTheSameStep) {
  StartCairnd();
  ASSERT_THAT(RunRanks("job", 2, "2:S0", {"--save-steps", "1"}), Each(Eq(0)))
      << last_logs_;
  const std::string hold0 = dir_ + "/hold0", hold1 = dir_ + "/hold1";
  testing::Subprocess r0 =
      StartRank("job", 0, 2, "2:S1",
                {"--load", "latest", "--pause-after-plan-load", hold0}, "r0");
  EXPECT_EQ(WaitForHook(hold0 + ".planned", r0), "1\n");
  // A save of step 2 commits between the ranks' PlanLoads.
  ASSERT_THAT(RunRanks("job", 2, "2:S0", {"--save-steps", "2"}), Each(Eq(0)))
      << last_logs_;
  std::string out;
  ASSERT_EQ(Cli({"--coordinator", cairnd_->address(), "ls", "job"}, &out), 0);
  ASSERT_THAT(out, HasSubstr(" 2 "));
  testing::Subprocess r1 =
      StartRank("job", 1, 2, "2:S1",
                {"--load", "latest", "--pause-after-plan-load", hold1}, "r1");
  EXPECT_EQ(WaitForHook(hold1 + ".planned", r1), "1\n");
  std::ofstream(hold0 + ".go") << "go";
  std::ofstream(hold1 + ".go") << "go";
  for (testing::Subprocess* p : {&r0, &r1}) {
    absl::StatusOr<int> rc = p->Wait(absl::Minutes(3));
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 0) << p->Log();
    // Verify() checked every byte against step 1's values.
    EXPECT_THAT(p->Log(), HasSubstr("load step 1:")) << p->Log();
  }
}

// A rank starting its load after the join grace, while the first one is still
// reading, joins its round: every chunk the two read in part is verified by
// cairnd combining their terms, none re-read whole (in a round of its own,
// the late rank would make both read every stored chunk again).
TEST_F(E2ETest, ALateRankJoinsTheLoadRoundOfTheRanksStillReading) {
  StartCairnd({"--load-join-grace", "1"});
  ASSERT_THAT(RunRanks("job", 2, "2:S0", {"--save-steps", "1"}), Each(Eq(0)))
      << last_logs_;
  const std::string hold0 = dir_ + "/hold0";
  testing::Subprocess r0 = StartRank(
      "job", 0, 2, "2:S1",
      {"--load", "1", "--json", "--pause-after-plan-load", hold0}, "r0");
  EXPECT_EQ(WaitForHook(hold0 + ".planned", r0), "1\n");
  absl::SleepFor(absl::Seconds(2));  // twice the grace: rank 0 "reading"
  testing::Subprocess r1 =
      StartRank("job", 1, 2, "2:S1", {"--load", "1", "--json"}, "r1");
  absl::SleepFor(absl::Seconds(1));
  std::ofstream(hold0 + ".go") << "go";
  for (testing::Subprocess* p : {&r0, &r1}) {
    absl::StatusOr<int> rc = p->Wait(absl::Minutes(3));
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 0) << p->Log();
    const std::string log = p->Log();
    auto field = [&](const std::string& name) -> int64_t {
      const size_t at = log.find(absl::StrCat("\"", name, "\":"));
      if (at == std::string::npos) return -1;
      return std::stoll(log.substr(at + name.size() + 3));
    };
    EXPECT_GT(field("chunks_verified_by_cairnd"), 0) << log;
    EXPECT_EQ(field("chunks_verified_locally"), 0) << log;
  }
}

// Ranks of a load that disagree on world size fail at once with both sizes
// named (they used to load and get OK after the verify deadline).
TEST_F(E2ETest, LoadRanksDisagreeingOnWorldSizeFailAtOnce) {
  StartCairnd({"--load-verify-deadline", "3600", "--load-join-grace", "3600"});
  ASSERT_THAT(RunRanks("job", 2, "2:S0", {"--save-steps", "1"}), Each(Eq(0)))
      << last_logs_;
  std::vector<int> codes =
      RunAll({RankArgv("job", 0, 2, "2:S1", {"--load", "1"}),
              RankArgv("job", 1, 3, "2:S1", {"--load", "1"})});
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_THAT(codes, Each(Eq(1)));
  for (int r = 0; r < 2; ++r) {
    const std::string log = RankLog(r);
    EXPECT_THAT(log, HasSubstr("INVALID_ARGUMENT")) << log;
    EXPECT_THAT(log, HasSubstr("job 'job' step 1")) << log;
    EXPECT_THAT(log, HasSubstr("says world_size")) << log;
  }
}

// A save where one rank says another world size fails every rank at once
// with the real reason (the others used to wait for the begin deadline and
// then hear that a rank which did call BeginSave never had).
TEST_F(E2ETest, SaveRanksDisagreeingOnWorldSizeFailAtOnce) {
  StartCairnd({"--begin-deadline", "3600"});
  std::vector<int> codes =
      RunAll({RankArgv("job", 0, 3, "3:S0", {"--save-steps", "1"}),
              RankArgv("job", 1, 2, "2:S0", {"--save-steps", "1"}),
              RankArgv("job", 2, 3, "3:S0", {"--save-steps", "1"})});
  ASSERT_EQ(codes.size(), 3u);
  EXPECT_THAT(codes, Each(Eq(1)));
  for (int r = 0; r < 3; ++r) {
    const std::string log = RankLog(r);
    EXPECT_THAT(log, HasSubstr("INVALID_ARGUMENT")) << log;
    EXPECT_THAT(log, HasSubstr("says world_size")) << log;
    EXPECT_THAT(log, Not(HasSubstr("never called BeginSave")));
  }
}

// With cairnd's defaults, a rank loading alone (its peers load later, one
// after another) is not held for the ranks that are not loading: each
// finishes, verified, within the join grace (it used to wait 10 minutes).
TEST_F(E2ETest, RanksLoadingOneAfterAnotherDoNotWaitForAbsentPeers) {
  StartCairnd();
  ASSERT_THAT(RunRanks("job", 2, "2:S0", {"--save-steps", "1"}), Each(Eq(0)))
      << last_logs_;
  for (int r = 0; r < 2; ++r) {
    testing::Subprocess p =
        StartRank("job", r, 2, "2:S1", {"--load", "latest", "--json"},
                  absl::StrCat("alone", r));
    absl::StatusOr<int> rc = p.Wait(absl::Minutes(3));
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 0) << p.Log();
    // Its partly read chunks, which nobody else read, were checked whole.
    const std::string log = p.Log();
    const size_t at = log.find("\"chunks_verified_locally\":");
    ASSERT_NE(at, std::string::npos) << log;
    EXPECT_GT(std::stoll(log.substr(at + 26)), 0) << log;
  }
}

// A data object of a committed checkpoint that is truncated, or replaced by
// a FIFO, is DATA_LOSS naming the tensor and the object, for loads and for
// `cairn verify` alike (they were OUT_OF_RANGE, NOT_FOUND, or a hang). On S3,
// which has no FIFOs, the second object is deleted instead.
TEST_F(E2ETest, TruncatedOrNonRegularObjectIsDataLossForLoadAndVerify) {
  StartCairnd();
  ASSERT_THAT(RunRanks("job", 1, "1:R", {"--save-steps", "1,2"}), Each(Eq(0)))
      << last_logs_;
  auto object_of = [&](int64_t step) {
    absl::StatusOr<std::vector<std::string>> objects =
        storage_->DataObjects(storage::StepPrefix("job", step));
    EXPECT_TRUE(objects.ok()) << objects.status();
    return objects.ok() && !objects->empty() ? objects->back() : "";
  };
  const std::string truncated = object_of(1), replaced = object_of(2);
  ASSERT_FALSE(truncated.empty());
  ASSERT_FALSE(replaced.empty());
  absl::StatusOr<storage::ShardStore*> store = storage_->Store();
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<uint64_t> size = (*store)->Size(truncated);
  ASSERT_TRUE(size.ok()) << size.status();
  ASSERT_TRUE(storage_->Truncate(truncated, *size / 2).ok());
  if (storage_->is_s3()) {
    ASSERT_TRUE(storage_->Remove(replaced).ok());
  } else {
    const std::string fifo = storage_->FilePath(replaced);
    std::filesystem::remove(fifo);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  }
  for (const auto& [step, key] :
       {std::pair<std::string, std::string>{"1", truncated}, {"2", replaced}}) {
    SCOPED_TRACE(step);
    // The object's key inside the step: attempt-.../data/rank-....bin.
    const std::string name =
        key.substr(storage::StepPrefix("job", std::stoll(step)).size());
    std::string out, err;
    EXPECT_EQ(Cli({"--coordinator", cairnd_->address(), "verify", "job", step},
                  &out, &err),
              1);
    EXPECT_THAT(err, HasSubstr("DATA_LOSS"));
    EXPECT_THAT(err, HasSubstr(name));
    last_logs_.clear();
    std::vector<int> codes = RunRanks("job", 1, "1:R", {"--load", step});
    EXPECT_THAT(codes, Each(Eq(1)));
    EXPECT_THAT(last_logs_, HasSubstr("DATA_LOSS"));
    EXPECT_THAT(last_logs_, HasSubstr(name));
    EXPECT_THAT(last_logs_, HasSubstr(absl::StrCat(
                                "rank 0 loading job 'job' step ", step)));
  }
}

}  // namespace
}  // namespace cairn
