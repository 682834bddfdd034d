// The agent as a composition of its components, in one process
// (testing/agent_cluster.h): saves through agents commit and load back
// resharded from memory bit-exact, replicas restore a lost node, loads fall
// back to storage, the budget evicts, saves that do not fit fail on every
// rank, and bad requests (GPU items without a copier, items that do not
// add up, malformed peer requests) are refused. The components' own tests:
// staging_pool_test, memory_tier_test, persister_test, streaming_save_test,
// peer_test; the socket and its users: agent_server_test; streaming saves
// through agents: agent_streaming_test. Multi-process failure tests live in
// tests/agent_e2e_test.cc.
#include "server/agent/agent.h"

#include <sys/mount.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/agent/agent_checkpointer.h"
#include "client/examples/synthetic_model.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "proto/convert/plan_convert.h"
#include "server/agent/agent_server.h"
#include "server/agent/testing/agent_cluster.h"
#include "server/agent/transport/nccl/loopback_device_link.h"
#include "server/agent/transport/nccl/nccl_transport.h"
#include "server/agent/transport/tcp/tcp_transport.h"
#include "server/coordinator/coordinator_server.h"
#include "storage/shard_store.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using AgentTest = ::cairn::agent::testing::AgentCluster;

// --- A store whose writers the test holds at chosen points (registered as
// "gated://<posix root>"; cairnd and the ranks of a test share it). ---

struct Gate {
  // Rank 1's first Append waits for `release`; rank 0's NewWriter waits
  // until rank 1 is in that Append, then fails as a full disk would.
  absl::Notification rank1_in_append;
  absl::Notification release;
};
Gate* g_gate = nullptr;

class GatedWriter : public storage::ObjectWriter {
 public:
  GatedWriter(std::string key, std::unique_ptr<storage::ObjectWriter> base)
      : key_(std::move(key)), base_(std::move(base)) {}
  absl::Status Append(absl::Span<const char> data) override {
    if (g_gate != nullptr && absl::StrContains(key_, "rank-00001")) {
      if (!g_gate->rank1_in_append.HasBeenNotified()) {
        g_gate->rank1_in_append.Notify();
      }
      g_gate->release.WaitForNotification();
    }
    return base_->Append(data);
  }
  absl::Status Close() override { return base_->Close(); }
  uint64_t bytes_written() const override { return base_->bytes_written(); }

 private:
  const std::string key_;
  std::unique_ptr<storage::ObjectWriter> base_;
};

class GatedStore : public storage::ShardStore {
 public:
  GatedStore(std::string uri, std::unique_ptr<storage::ShardStore> base)
      : uri_(std::move(uri)), base_(std::move(base)) {}
  std::string uri() const override { return uri_; }
  using storage::ShardStore::NewWriter;
  absl::StatusOr<std::unique_ptr<storage::ObjectWriter>> NewWriter(
      absl::string_view key, const storage::WriterOptions& options) override {
    if (g_gate != nullptr && absl::StrContains(key, "rank-00000")) {
      g_gate->rank1_in_append.WaitForNotification();
      return absl::ResourceExhaustedError(
          absl::StrCat("no space left on device writing '", key, "' (",
                       options.expected_bytes, " bytes needed, 0 free)"));
    }
    auto w = base_->NewWriter(key, options);
    if (!w.ok()) return w.status();
    return std::unique_ptr<storage::ObjectWriter>(
        new GatedWriter(std::string(key), std::move(*w)));
  }
  absl::Status Put(absl::string_view key,
                   absl::Span<const char> data) override {
    return base_->Put(key, data);
  }
  absl::StatusOr<size_t> Read(absl::string_view key, storage::ByteRange range,
                              absl::Span<char> out) override {
    return base_->Read(key, range, out);
  }
  absl::Status ReadRanges(absl::string_view key,
                          absl::Span<const storage::ByteRange> ranges,
                          absl::Span<const absl::Span<char>> outs) override {
    return base_->ReadRanges(key, ranges, outs);
  }
  absl::StatusOr<uint64_t> Size(absl::string_view key) override {
    return base_->Size(key);
  }
  absl::StatusOr<std::vector<std::string>> List(
      absl::string_view prefix) override {
    return base_->List(prefix);
  }
  absl::Status Delete(absl::string_view key) override {
    return base_->Delete(key);
  }
  absl::Status DeletePrefix(absl::string_view prefix) override {
    return base_->DeletePrefix(prefix);
  }

 private:
  const std::string uri_;
  const std::unique_ptr<storage::ShardStore> base_;
};

void RegisterGatedScheme() {
  static const bool done = [] {
    storage::RegisterShardStoreScheme(
        "gated",
        [](absl::string_view rest, const storage::StoreOptions& o)
            -> absl::StatusOr<std::unique_ptr<storage::ShardStore>> {
          auto base = storage::OpenShardStore(absl::StrCat("file://", rest), o);
          if (!base.ok()) return base.status();
          return std::unique_ptr<storage::ShardStore>(
              new GatedStore(absl::StrCat("gated://", rest), std::move(*base)));
        });
    return true;
  }();
  (void)done;
}

// Agent mode persists through the same storage path: on a real small
// filesystem, a save that does not fit fails on every rank naming the real
// cause, staged or streamed, and the previous checkpoint stays.
TEST_F(AgentTest, SaveThatDoesNotFitFailsOnEveryRankWithNoSpace) {
  const std::string mnt = dir_ + "/small-fs";
  ASSERT_TRUE(std::filesystem::create_directories(mnt));
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=16m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << strerror(errno);
  }
  absl::Cleanup unmount = [&] {
    agents_.clear();
    cairnd_.reset();
    umount2(mnt.c_str(), MNT_DETACH);
  };
  cairnd_.reset();
  coordinator::CoordinatorServer::Spec cs;
  cs.listen_address = "127.0.0.1:0";
  cs.coordinator.storage_uri = absl::StrCat("file://", mnt, "/ckpt");
  cs.coordinator.catalog_path = dir_ + "/small-fs-catalog";
  cs.coordinator.commit_deadline = absl::Seconds(20);
  auto c = coordinator::CoordinatorServer::Start(cs);
  ASSERT_TRUE(c.ok()) << c.status();
  cairnd_ = std::move(*c);

  // Four ranks on two agents save `model` as `step`; their results.
  auto save = [&](const std::string& model_name, int64_t step) {
    auto spec = examples::ModelSpec(model_name);
    auto lay = examples::ParseLayout("4:S0");
    std::vector<absl::Status> out;
    std::vector<std::unique_ptr<client::AgentCheckpointer>> ranks;
    std::vector<std::unique_ptr<examples::ShardedModel>> models;
    for (int r = 0; r < 4; ++r) {
      auto model = examples::ShardedModel::Create(*spec, *lay, r, true, step);
      EXPECT_TRUE(model.ok());
      ranks.push_back(Rank(r / 2, "nospace", r, 4));
      models.push_back(std::move(*model));
    }
    // Concurrently: a streaming rank hands over buckets until the end.
    std::vector<std::thread> threads;
    out.resize(4);
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] {
        auto f = ranks[r]->AsyncSave(step, models[r]->state());
        if (!f.ok()) {
          out[r] = f.status();
          return;
        }
        auto rec = f->Wait(absl::Seconds(60));
        out[r] = rec.status();
      });
    }
    for (auto& t : threads) t.join();
    return out;
  };

  for (const uint64_t budget : {uint64_t{256} << 20, uint64_t{4} << 20}) {
    SCOPED_TRACE(budget > (uint64_t{8} << 20) ? "staged" : "streamed");
    const int64_t base = budget > (uint64_t{8} << 20) ? 1 : 3;
    StartAgent(0, 2, 0, budget);
    StartAgent(1, 2, 0, budget);
    for (const absl::Status& s : save("bench:2e6", base)) {
      ASSERT_TRUE(s.ok()) << s;
    }
    // 24 MB in four 6 MB objects on what is left of 16 MiB.
    const std::vector<absl::Status> failed = save("bench:24e6", base + 1);
    for (int r = 0; r < 4; ++r) {
      EXPECT_FALSE(failed[r].ok()) << "rank " << r;
      EXPECT_THAT(std::string(failed[r].message()),
                  HasSubstr("no space left on device writing 'nospace/"))
          << "rank " << r << ": " << failed[r];
      EXPECT_NE(failed[r].code(), absl::StatusCode::kNotFound) << failed[r];
    }
    // The previous step is still the latest committed one.
    auto stub = v1::Coordinator::NewStub(
        grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::ListCheckpointsRequest req;
    req.set_job("nospace");
    v1::ListCheckpointsResponse resp;
    ASSERT_TRUE(stub->ListCheckpoints(&ctx, req, &resp).ok());
    int64_t latest = -1;
    for (const auto& rec : resp.checkpoints()) {
      if (rec.state() == v1::CHECKPOINT_STATE_COMMITTED) {
        latest = std::max(latest, rec.step());
      }
    }
    EXPECT_EQ(latest, base);
    for (const auto& e : std::filesystem::recursive_directory_iterator(mnt)) {
      EXPECT_FALSE(absl::StartsWith(e.path().filename().string(), ".cairn-tmp"))
          << e.path();
    }
  }
}

// A rank whose temp file an abort deleted under it (the abort's cleanup is
// what it runs into) reports the aborting rank's real cause, not its own
// symptom. Direct mode: the same client path agents persist through.
TEST_F(AgentTest, RankHitByAnotherRanksAbortReportsThatRanksCause) {
  RegisterGatedScheme();
  Gate gate;
  g_gate = &gate;
  absl::Cleanup ungate = [] { g_gate = nullptr; };
  cairnd_.reset();
  coordinator::CoordinatorServer::Spec cs;
  cs.listen_address = "127.0.0.1:0";
  cs.coordinator.storage_uri = absl::StrCat("gated://", dir_, "/gated");
  cs.coordinator.catalog_path = dir_ + "/gated-catalog";
  auto c = coordinator::CoordinatorServer::Start(cs);
  ASSERT_TRUE(c.ok()) << c.status();
  cairnd_ = std::move(*c);

  auto spec = examples::ModelSpec("small");
  auto lay = examples::ParseLayout("2:S0");
  std::vector<absl::Status> result(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      client::CheckpointerOptions o;
      o.coordinator = Address();
      o.job = "gated";
      o.rank = r;
      o.world_size = 2;
      auto ckpt = client::Checkpointer::Connect(o);
      auto model = examples::ShardedModel::Create(*spec, *lay, r, true, 7);
      if (!ckpt.ok() || !model.ok()) {
        result[r] = absl::InternalError("setup");
        return;
      }
      result[r] = (*ckpt)->Save(7, (*model)->state()).status();
      if (r == 0) gate.release.Notify();  // rank 0 has aborted the save
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_THAT(result[0], StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(
      result[1],
      StatusIs(absl::StatusCode::kAborted,
               HasSubstr("rank 1 saving job 'gated' step 7: save of job "
                         "'gated' step 7 aborted by rank 0: no space left on "
                         "device writing 'gated/")));
}

// A peer's requests are checked before the agent allocates or copies by
// them: sizes and indexes that do not add up are errors, not a crash.
TEST_F(AgentTest, MalformedPeerRequestsAreRefusedWithoutCrashing) {
  StartAgent(0, 2, 0);
  // Node 1 is played by a bare transport.
  TcpTransportOptions o;
  o.node_id = 1;
  o.num_nodes = 2;
  o.resolve_peer = [this](int n) -> absl::StatusOr<std::string> {
    return absl::StrCat("127.0.0.1:", ports_[n]);
  };
  auto node1 = TcpTransport::Start(o);
  ASSERT_TRUE(node1.ok()) << node1.status();
  ports_[1] = (*node1)->port();
  uint64_t next_tag = 1000;
  auto call = [&](v1::PeerRequest req) {
    req.set_reply_tag(++next_tag);
    req.set_from_node(1);
    EXPECT_TRUE(
        (*node1)
            ->Send(0, kControlTagBit | ++next_tag, req.SerializeAsString())
            .ok());
    absl::StatusOr<std::string> reply =
        (*node1)->RecvMessage(0, req.reply_tag(), absl::Seconds(20));
    v1::PeerResponse resp;
    EXPECT_TRUE(reply.ok() && resp.ParseFromString(*reply)) << reply.status();
    return absl::Status(static_cast<absl::StatusCode>(resp.code()),
                        resp.message());
  };
  v1::WriteItem huge;
  huge.set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
  huge.mutable_tensor()->set_fqn("w");
  huge.mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  for (int d = 0; d < 2; ++d) {
    huge.mutable_tensor()->add_global_shape(int64_t{1} << 20);
    huge.mutable_chunk()->add_offsets(0);
    huge.mutable_chunk()->add_sizes(int64_t{1} << 20);
  }
  huge.set_length(~uint64_t{0});

  // A push whose items have no message entries.
  v1::PeerRequest a;
  a.mutable_push()->set_job("j");
  *a.mutable_push()->add_items()->mutable_item() = huge;
  absl::Status s = call(a);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("malformed push")));

  // A push claiming a 2^64 - 1 byte item in a 1-byte message.
  v1::PeerRequest b = a;
  b.mutable_push()->add_message_tags(++next_tag);
  b.mutable_push()->add_message_bytes(1);
  b.mutable_push()->add_item_message(0);
  b.mutable_push()->add_item_offset(1);
  ASSERT_TRUE((*node1)->Send(0, next_tag, std::string("x")).ok());
  s = call(b);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("lies outside its message")));
  // ...and its data message does not stay behind in the agent's memory.
  EXPECT_EQ(agents_[0]->agent().peer_mailbox_size_for_test(), 0u);

  // A fetch of a 4 TiB region of something the agent does not hold.
  v1::PeerRequest f;
  f.mutable_fetch()->set_job("j");
  f.mutable_fetch()->set_data_tag(++next_tag);
  v1::FetchPiece* piece = f.mutable_fetch()->add_pieces();
  *piece->mutable_item() = huge;
  *piece->mutable_region() = huge.chunk();
  s = call(f);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));

  // Still serving.
  SaveAll("after", 1, 1, "1:R", 1);
}

TEST_F(AgentTest, AsyncSaveCommitsAndReshardsFromMemoryBitExact) {
  // No replicas: each node's tier 0 is the only copy in memory, so the
  // resharded load must move bytes between the agents.
  StartAgent(0, 2, 0);
  StartAgent(1, 2, 0);
  SaveAll("j1", 4, 2, "2x2:S0,S1", 10);
  EXPECT_GT(DeleteStoredData(), 0);  // memory must serve everything
  std::vector<Loaded> loaded = LoadAll("j1", 4, 2, "4:S1", 10);
  ASSERT_EQ(loaded.size(), 4u);
  uint64_t peers = 0, local = 0;
  for (const Loaded& l : loaded) {
    EXPECT_EQ(l.source, client::LoadSource::kAgentMemory);
    peers += l.peers;
    local += l.local;
  }
  EXPECT_GT(peers, 0u);  // resharding crossed nodes
  EXPECT_GT(local, 0u);
  v1::AgentStatusResponse st = agents_[0]->agent().Status();
  EXPECT_EQ(st.commits(), 2);
  EXPECT_EQ(st.tier0_sets(), 2);
  EXPECT_EQ(st.replica_sets(), 0);
}

// The same save, replication and resharded load with --transport=nccl: the
// agents only see the Transport interface; bulk bytes go through the device
// link (here the loopback one: the NCCL transport's host-side logic runs,
// the GPU copies are not).
TEST_F(AgentTest, NcclTransportReplicatesAndReshardsFromMemoryBitExact) {
  auto fabric = std::make_shared<LoopbackFabric>();
  auto nccl = [&](AgentServer::Spec& spec) {
    spec.agent.transport = AgentOptions::TransportKind::kNccl;
    spec.agent.device_link = std::make_unique<LoopbackDeviceLink>(fabric);
    // Buckets above the inline limit, so data goes through the device.
    spec.agent.bucket_cap_bytes = 4 * NcclTransport::kInlineBytes;
  };
  for (int n = 0; n < 3; ++n) StartAgent(n, 3, 1, uint64_t{256} << 20, nccl);
  SaveAll("jn", 3, 1, "3:S0", 4);
  EXPECT_GT(DeleteStoredData(), 0);  // memory must serve everything
  std::vector<Loaded> loaded = LoadAll("jn", 3, 1, "3:S1", 4);
  ASSERT_EQ(loaded.size(), 3u);
  uint64_t peers = 0;
  for (const Loaded& l : loaded) {
    EXPECT_EQ(l.source, client::LoadSource::kAgentMemory);
    peers += l.peers;
  }
  EXPECT_GT(peers, 0u);
  uint64_t device_sent = 0, device_received = 0;
  for (int n = 0; n < 3; ++n) {
    Transport& t = agents_[n]->agent().peer_transport_for_test();
    EXPECT_EQ(t.name(), "nccl");
    auto& nt = static_cast<NcclTransport&>(t);
    device_sent += nt.device_messages_sent();
    device_received += nt.device_messages_received();
    EXPECT_EQ(agents_[n]->agent().Status().replica_sets(), 1) << "node " << n;
  }
  EXPECT_GT(device_sent, 0u);
  EXPECT_EQ(device_sent, device_received);
}

TEST_F(AgentTest, NcclTransportWithoutDeviceLinkFailsAtStart) {
  AgentServer::Spec spec;
  spec.unix_socket = absl::StrCat(dir_, "/nccl.sock");
  spec.agent.node_id = 0;
  spec.agent.coordinator = Address();
  spec.agent.transport = AgentOptions::TransportKind::kNccl;
  auto s = AgentServer::Start(std::move(spec));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                          HasSubstr("--transport=nccl needs a device link")));
}

// Ranks of one agent-mode load of `latest` agree on its step even when a
// save commits between their loads: the agents resolve it through cairnd's
// load round, and a rank whose agent cannot serve that step falls back to
// storage for the same step (it used to be resolved per rank, and rank 1 got
// step 2).
TEST_F(AgentTest, LatestLoadRacingACommitGivesEveryRankTheSameStep) {
  // A cairnd whose load rounds stay open for the whole test.
  cairnd_.reset();
  coordinator::CoordinatorServer::Spec spec;
  spec.listen_address = "127.0.0.1:0";
  spec.coordinator.storage_uri = absl::StrCat("file://", dir_, "/ckpt");
  spec.coordinator.catalog_path = dir_ + "/catalog";
  spec.coordinator.load_join_grace = absl::Hours(1);
  auto c = coordinator::CoordinatorServer::Start(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  cairnd_ = std::move(*c);
  StartAgent(0, 2, 0);
  StartAgent(1, 2, 0);
  SaveAll("jr", 2, 1, "2:S0", 1);
  auto model_spec = examples::ModelSpec("small");
  ASSERT_TRUE(model_spec.ok());
  auto layout = examples::ParseLayout("2:S1");
  ASSERT_TRUE(layout.ok());
  client::LoadSource source = client::LoadSource::kNone;
  absl::Status agent_error;
  auto load = [&](int rank) -> absl::StatusOr<int64_t> {
    auto model =
        examples::ShardedModel::Create(*model_spec, *layout, rank, false, 0);
    if (!model.ok()) return model.status();
    auto ckpt = Rank(rank, "jr", rank, 2);
    if (ckpt == nullptr) return absl::InternalError("no rank");
    auto step = ckpt->Load(client::LoadRef::Latest(), (*model)->state());
    source = ckpt->last_load_source();
    agent_error = ckpt->last_agent_load_error();
    if (!step.ok()) return step.status();
    absl::Status v = (*model)->Verify(*step);  // the bytes are that step's
    EXPECT_TRUE(v.ok()) << "rank " << rank << ": " << v;
    return step;
  };
  absl::StatusOr<int64_t> first = load(0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 1);
  EXPECT_EQ(source, client::LoadSource::kAgentMemory) << agent_error;
  SaveAll("jr", 2, 1, "2:S0", 2);  // commits between the ranks' loads
  absl::StatusOr<int64_t> second = load(1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, 1) << "rank 1 loaded another step than rank 0";
  // Tier 0 holds each rank's newest save only, so step 1 now comes from
  // storage: the fallback loads the step the agent resolved, not `latest`.
  EXPECT_EQ(source, client::LoadSource::kStorage);
  EXPECT_THAT(agent_error, StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr("job 'jr' step 1 rank 1")));
}

TEST_F(AgentTest, ReplicatesTierZeroToTheNextNodes) {
  StartAgent(0, 3, 2);
  StartAgent(1, 3, 2);
  StartAgent(2, 3, 2);
  SaveAll("j0", 3, 1, "3:S0", 1);
  for (int n = 0; n < 3; ++n) {
    v1::AgentStatusResponse st = agents_[n]->agent().Status();
    EXPECT_EQ(st.tier0_sets(), 1) << "node " << n;
    EXPECT_EQ(st.replica_sets(), 2) << "node " << n;  // never its own
    EXPECT_EQ(st.replicas_pushed(), 2) << "node " << n;
  }
}

TEST_F(AgentTest, LostNodeIsRestoredFromPeerReplica) {
  StartAgent(0, 3, 1);
  StartAgent(1, 3, 1);
  StartAgent(2, 3, 1);
  SaveAll("j2", 3, 1, "3:S0", 5);
  SaveAll("j2", 3, 1, "3:S0", 6);
  EXPECT_GT(DeleteStoredData(), 0);
  StopAgent(1);         // node 1 and its tier 0 are gone
  StartAgent(1, 3, 1);  // a replacement node with empty memory
  std::vector<Loaded> loaded = LoadAll("j2", 3, 1, "3:S0", 6);
  ASSERT_EQ(loaded.size(), 3u);
  for (const Loaded& l : loaded) {
    EXPECT_EQ(l.source, client::LoadSource::kAgentMemory);
  }
  EXPECT_EQ(loaded[1].local, 0u);  // everything rank 1 got came from peers
  EXPECT_GT(loaded[1].peers, 0u);
}

TEST_F(AgentTest, FallsBackToStorageWhenNoMemoryTierHoldsTheData) {
  StartAgent(0, 2, 0);
  StartAgent(1, 2, 0);
  SaveAll("j3", 2, 1, "2:S1", 3);
  StopAgent(1);  // no replicas: rank 1's chunks are only on storage now
  StartAgent(1, 2, 0);
  std::vector<Loaded> loaded = LoadAll("j3", 2, 1, "2:S1", 3);
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[1].source, client::LoadSource::kStorage);
  EXPECT_THAT(last_agent_error_,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("memory tiers cannot serve")));
}

TEST_F(AgentTest, BudgetEvictsOldTiersAndRejectsOversizedSaves) {
  // ~1 MB model on one rank; the budget holds one staged copy only.
  StartAgent(0, 1, 0, /*budget=*/uint64_t{3} << 20 >> 1);
  SaveAll("j4", 1, 1, "1:R", 1);
  SaveAll("j4", 1, 1, "1:R", 2);  // evicts step 1's tier 0 to make room
  SaveAll("j4", 1, 1, "1:R", 3);
  EXPECT_EQ(agents_[0]->agent().Status().tier0_sets(), 1);
  std::vector<Loaded> loaded = LoadAll("j4", 1, 1, "1:R", 3);
  ASSERT_EQ(loaded.size(), 1u);

  StopAgent(0);
  StartAgent(0, 1, 0, /*budget=*/64 << 10);
  auto spec = examples::ModelSpec("small");
  auto lay = examples::ParseLayout("1:R");
  auto model = examples::ShardedModel::Create(*spec, *lay, 0, true, 9);
  ASSERT_TRUE(model.ok());
  // A rank that does not allow streaming is refused (others stream, below).
  auto ckpt = Rank(0, "j4", 0, 1, /*allow_streaming=*/false);
  auto f = ckpt->AsyncSave(9, (*model)->state());
  EXPECT_THAT(f, StatusIs(absl::StatusCode::kResourceExhausted,
                          AllOf(HasSubstr("staging budget"),
                                HasSubstr("job 'j4' step 9"))));
}

TEST_F(AgentTest, GpuItemsWithoutCudaCopierAreRejected) {
  StartAgent(0, 1, 0);
  Agent& a = agents_[0]->agent();
  v1::BeginStageRequest b;
  b.set_job("j5");
  b.set_step(1);
  b.set_rank(0);
  b.set_world_size(1);
  v1::WriteItem* w = b.add_items()->mutable_item();
  w->set_kind(v1::WriteItem::KIND_BYTES);
  w->set_bytes_fqn("x");
  w->set_length(16);
  auto staged = a.BeginStage(b);
  ASSERT_TRUE(staged.ok()) << staged.status();
  v1::FinishStageRequest f;
  f.set_save_id(staged->save_id());
  v1::StageItem* d = f.add_device_items();
  *d = staged->items(0);
  d->mutable_cuda()->set_handle(std::string(64, '\0'));
  absl::Status s = a.FinishStage(f);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                          HasSubstr("cuda copier")));
  v1::WaitSaveRequest wr;
  wr.set_job("j5");
  wr.set_step(1);
  wr.set_rank(0);
  EXPECT_THAT(a.WaitSave(wr), StatusIs(absl::StatusCode::kFailedPrecondition));
  wr.set_step(2);
  EXPECT_THAT(a.WaitSave(wr), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(AgentTest, BeginStageValidatesItems) {
  StartAgent(0, 1, 0);
  v1::BeginStageRequest b;
  b.set_job("j6");
  b.set_step(1);
  b.set_rank(0);
  b.set_world_size(1);
  v1::WriteItem* w = b.add_items()->mutable_item();
  w->set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
  w->mutable_tensor()->set_fqn("model.w");
  w->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  w->mutable_tensor()->add_global_shape(8);
  w->mutable_chunk()->add_offsets(0);
  w->mutable_chunk()->add_sizes(8);
  w->set_length(31);  // should be 32
  auto s = agents_[0]->agent().BeginStage(b);
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'model.w'")));
  b.set_rank(3);
  EXPECT_THAT(agents_[0]->agent().BeginStage(b),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace cairn::agent
