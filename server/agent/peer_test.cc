// Tests of the agent's peer side (peer_client.h, peer_server.h,
// replicator.h, peer_loader.h) between real TCP transports on loopback:
// pushes kept as replicas byte for byte and refused when damaged, malformed
// or over budget; fetches checked against what is held; loads from memory
// checked element by element against the saved tensor on random layouts
// held by random nodes.
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/box.h"
#include "proto/convert/plan_convert.h"
#include "server/agent/items.h"
#include "server/agent/memory_tier.h"
#include "server/agent/peer_client.h"
#include "server/agent/peer_loader.h"
#include "server/agent/peer_server.h"
#include "server/agent/replicator.h"
#include "server/agent/staging_pool.h"
#include "server/agent/testing/item_sets.h"
#include "server/agent/transport/tcp/tcp_transport.h"
#include "storage/checksum.h"

namespace cairn::agent {
namespace {

using ::cairn::agent::testing::BytesItem;
using ::cairn::testing::IsOk;
using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kJob[] = "jobP";

// One node's peer side: pool, tier, transport and the four components.
struct Node {
  std::unique_ptr<StagingPool> pool;
  std::unique_ptr<MemoryTier> tier;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<PeerClient> client;
  std::unique_ptr<PeerServer> server;
  std::unique_ptr<Replicator> replicator;
  std::unique_ptr<PeerLoader> loader;
  metrics::Registry registry;
  metrics::Counter* received = nullptr;
};

class PeerTest : public ::testing::Test {
 protected:
  // Starts `n` nodes (ports resolved once all listen); node i's budget is
  // budgets[i] (default 64 MiB), the bucket cap `bucket`.
  void StartNodes(int n, std::vector<uint64_t> budgets = {},
                  uint64_t bucket = 4096) {
    ports_.assign(n, 0);
    for (int i = 0; i < n; ++i) nodes_.push_back(std::make_unique<Node>());
    for (int i = 0; i < n; ++i) {
      Node& node = *nodes_[i];
      StagingPool::Options po;
      po.node_id = 9000 + static_cast<int>(getpid() % 500) * 8 + i;
      po.budget_bytes = i < static_cast<int>(budgets.size())
                            ? budgets[i]
                            : uint64_t{64} << 20;
      absl::StatusOr<std::unique_ptr<StagingPool>> pool =
          StagingPool::Create(po);
      ASSERT_TRUE(pool.ok()) << pool.status();
      node.pool = std::move(*pool);
      node.tier = std::make_unique<MemoryTier>(i);
      node.received = node.registry.AddCounter("received_bytes", "test");
      TcpTransportOptions t;
      t.node_id = i;
      t.num_nodes = n;
      t.resolve_peer = [this](int peer) -> absl::StatusOr<std::string> {
        if (peer < 0 || peer >= static_cast<int>(ports_.size()) ||
            ports_[peer] == 0) {
          return absl::NotFoundError(absl::StrCat("no node ", peer));
        }
        return absl::StrCat("127.0.0.1:", ports_[peer]);
      };
      t.connect_timeout = absl::Milliseconds(300);
      t.control_threads = 4;
      t.control_handler = [&node](int peer, uint64_t tag, std::string m) {
        node.server->Handle(peer, tag, m);
      };
      // The server exists before the transport can deliver to it.
      absl::StatusOr<std::unique_ptr<TcpTransport>> tr =
          TcpTransport::Start(std::move(t));
      ASSERT_TRUE(tr.ok()) << tr.status();
      node.transport = std::move(*tr);
      PeerServer::Options so;
      so.node_id = i;
      so.peer_timeout = absl::Seconds(5);
      so.received_bytes = node.received;
      node.server = std::make_unique<PeerServer>(so, *node.transport,
                                                 *node.tier, *node.pool);
      node.client =
          std::make_unique<PeerClient>(*node.transport, i, absl::Seconds(5));
      node.replicator = std::make_unique<Replicator>(*node.client, bucket);
      PeerLoader::Options lo;
      lo.node_id = i;
      lo.num_nodes = n;
      lo.bucket_cap_bytes = bucket;
      lo.peer_timeout = absl::Seconds(5);
      lo.fetch_threads = 3;
      node.loader = std::make_unique<PeerLoader>(lo, *node.client, *node.tier,
                                                 *node.pool);
      ports_[i] = node.transport->port();
    }
  }

  // A node that never started (its peers cannot reach it).
  void MarkDown(int node) { ports_[node] = 0; }

  void TearDown() override {
    for (auto& n : nodes_) n->transport.reset();  // stop calls into the rest
    for (auto& n : nodes_) {
      if (n->loader) n->loader->Clear();
      if (n->tier) n->tier->Clear();
    }
  }

  // A set of (kJob, step, rank) on node `node`'s pool holding `items`, each
  // filled by fill(item index, byte index) and checksummed.
  std::shared_ptr<ItemSet> MakeSet(
      int node, int64_t step, int rank, const std::vector<v1::WriteItem>& items,
      const std::function<char(size_t, uint64_t)>& fill) {
    return testing::MakeFilledSet(*nodes_[node]->pool, kJob, step, rank,
                                  /*replica=*/false, items, fill);
  }

  std::vector<int> ports_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

v1::WriteItem TensorItem(const std::string& fqn, v1::DType dtype,
                         const planner::Shape& shape,
                         const planner::ChunkBox& box) {
  v1::WriteItem w;
  w.set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
  w.mutable_tensor()->set_fqn(fqn);
  w.mutable_tensor()->set_dtype(dtype);
  for (int64_t s : shape) w.mutable_tensor()->add_global_shape(s);
  convert::BoxToProto(box, w.mutable_chunk());
  absl::StatusOr<planner::DType> d = convert::DTypeFromProto(dtype, fqn);
  w.set_length(planner::Volume(box) * planner::DTypeSize(*d));
  return w;
}

char Pattern(size_t item, uint64_t b) {
  return static_cast<char>(item * 131 + b * 7 + (b >> 8));
}

// What the tier of `node` holds of (kJob, step): every item's bytes, by
// (fqn, box text), found through Find (crc checked against memory).
std::map<std::string, std::string> HeldBytes(const MemoryTier& tier,
                                             int64_t step) {
  std::map<std::string, std::string> out;
  v1::InventoryResponse inv = tier.Inventory(kJob, step);
  for (const v1::HeldSet& s : inv.sets()) {
    for (const v1::HeldItem& h : s.items()) {
      auto found = tier.Find(kJob, step, h.item(), h.crc32c());
      EXPECT_TRUE(found.ok()) << found.status();
      if (!found.ok()) continue;
      const char* p = found->first->segment->data() + found->second->offset;
      out[absl::StrCat(internal::ItemFqn(h.item()), " ",
                       planner::BoxToString(internal::ItemBox(h.item())))] =
          std::string(p, h.item().length());
    }
  }
  return out;
}

TEST_F(PeerTest, PushIsKeptAsAReplicaByteForByte) {
  StartNodes(2);
  // Small items sharing a message, one larger than the bucket cap (split),
  // a bytes entry and an empty chunk.
  std::vector<v1::WriteItem> items = {
      TensorItem("a", v1::DTYPE_FLOAT32, {8, 4}, {{0, 0}, {8, 4}}),
      TensorItem("b", v1::DTYPE_BFLOAT16, {3, 5}, {{1, 0}, {2, 5}}),
      TensorItem("big", v1::DTYPE_FLOAT32, {1024, 4}, {{0, 0}, {1024, 4}}),
      TensorItem("empty", v1::DTYPE_FLOAT32, {0, 4}, {{0, 0}, {0, 4}}),
      BytesItem("extra", 77),
  };
  auto set = MakeSet(0, 5, 3, items, Pattern);
  ASSERT_THAT(nodes_[0]->replicator->Push(*set, 1), IsOk());
  std::map<std::string, std::string> got = HeldBytes(*nodes_[1]->tier, 5);
  v1::InventoryResponse inv = nodes_[1]->tier->Inventory(kJob, 5);
  ASSERT_EQ(inv.sets_size(), 1);
  EXPECT_EQ(inv.sets(0).source_rank(), 3);
  EXPECT_EQ(nodes_[1]->tier->counts().replica_sets, 1);
  EXPECT_EQ(nodes_[1]->tier->counts().tier0_sets, 0);
  uint64_t total = 0;
  for (const StagedItem& it : set->items) {
    const std::string key =
        absl::StrCat(internal::ItemFqn(it.item), " ",
                     planner::BoxToString(internal::ItemBox(it.item)));
    ASSERT_EQ(got.count(key), 1u) << key;
    EXPECT_EQ(got[key],
              std::string(set->segment->data() + it.offset, it.item.length()))
        << key;
    total += it.item.length();
  }
  EXPECT_EQ(nodes_[1]->received->value(), static_cast<double>(total));
  EXPECT_TRUE(nodes_[0]->tier->Inventory(kJob, 5).sets().empty());
}

TEST_F(PeerTest, DamagedPushIsRefusedNamingTheItemAndNothingIsKept) {
  StartNodes(2);
  auto set =
      MakeSet(0, 2, 0,
              {TensorItem("w", v1::DTYPE_FLOAT32, {4, 4}, {{0, 0}, {4, 4}}),
               TensorItem("v", v1::DTYPE_FLOAT32, {4, 4}, {{0, 0}, {2, 4}})},
              Pattern);
  set->items[1].crc32c ^= 0x5a;  // what the source claims differs
  EXPECT_THAT(nodes_[0]->replicator->Push(*set, 1),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("'v'"), HasSubstr("from node 0"),
                             HasSubstr("crc32c"))));
  EXPECT_TRUE(nodes_[1]->tier->Inventory(kJob, 2).sets().empty());
  EXPECT_EQ(nodes_[1]->tier->counts().replica_sets, 0);
  EXPECT_EQ(nodes_[1]->received->value(), 0.0);
}

TEST_F(PeerTest, PushOverTheReceiversBudgetIsRefused) {
  StartNodes(2, {uint64_t{64} << 20, uint64_t{1} << 20});
  auto set = MakeSet(
      0, 1, 0,
      {TensorItem("w", v1::DTYPE_FLOAT32, {1024, 512}, {{0, 0}, {1024, 512}})},
      Pattern);
  EXPECT_THAT(nodes_[0]->replicator->Push(*set, 1),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("staging budget")));
  EXPECT_TRUE(nodes_[1]->tier->Inventory(kJob, 1).sets().empty());
  // The refused push's data messages are dropped, not left in the mailbox.
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (nodes_[1]->transport->mailbox_size() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(nodes_[1]->transport->mailbox_size(), 0u);
}

TEST_F(PeerTest, MalformedPushesAreRefused) {
  StartNodes(2);
  v1::PeerRequest base;
  v1::PushReplica* push = base.mutable_push();
  push->set_job(kJob);
  push->set_step(1);
  v1::HeldItem* h = push->add_items();
  *h->mutable_item() = BytesItem("x", 100);
  push->add_message_tags(nodes_[0]->client->NewTag());
  push->add_message_bytes(64);  // the item does not fit its message
  push->add_item_message(0);
  push->add_item_offset(0);
  absl::StatusOr<v1::PeerResponse> r = nodes_[0]->client->Call(1, base);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(PeerClient::StatusOf(*r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'x'"), HasSubstr("outside"))));

  v1::PeerRequest bad_index = base;
  bad_index.mutable_push()->set_item_message(0, 7);  // no message 7
  r = nodes_[0]->client->Call(1, bad_index);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(PeerClient::StatusOf(*r),
              StatusIs(absl::StatusCode::kInvalidArgument));

  v1::PeerRequest counts = base;
  counts.mutable_push()->add_item_offset(5);  // more offsets than items
  r = nodes_[0]->client->Call(1, counts);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(PeerClient::StatusOf(*r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("malformed push")));

  v1::PeerRequest empty;  // no kind
  r = nodes_[0]->client->Call(1, empty);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(PeerClient::StatusOf(*r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown peer request")));
  EXPECT_TRUE(nodes_[1]->tier->Inventory(kJob, 1).sets().empty());
}

TEST_F(PeerTest, FetchIsCheckedAgainstWhatIsHeld) {
  StartNodes(2);
  const planner::Shape shape = {6, 4};
  v1::WriteItem item =
      TensorItem("w", v1::DTYPE_FLOAT32, shape, {{0, 0}, {3, 4}});
  auto set = MakeSet(1, 4, 0, {item}, Pattern);
  nodes_[1]->tier->Keep(set);
  const uint32_t crc = set->items[0].crc32c;
  auto fetch = [&](const planner::ChunkBox& region, uint32_t expected,
                   v1::WriteItem it) {
    v1::PeerRequest pr;
    v1::FetchRequest* f = pr.mutable_fetch();
    f->set_job(kJob);
    f->set_step(4);
    f->set_data_tag(nodes_[0]->client->NewTag());
    v1::FetchPiece* p = f->add_pieces();
    *p->mutable_item() = it;
    p->set_expected_crc32c(expected);
    convert::BoxToProto(region, p->mutable_region());
    return std::make_pair(nodes_[0]->client->Call(1, pr), f->data_tag());
  };
  // A region inside the held chunk: exactly its bytes come back.
  auto [ok, tag] = fetch({{1, 1}, {2, 2}}, crc, item);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_THAT(PeerClient::StatusOf(*ok), IsOk());
  EXPECT_EQ(ok->fetch_bytes(), 16u);
  absl::StatusOr<std::string> data = nodes_[0]->client->Receive(1, tag);
  ASSERT_TRUE(data.ok()) << data.status();
  std::string want;
  for (int r = 1; r < 3; ++r) {
    want.append(set->segment->data() + (r * 4 + 1) * 4, 8);
  }
  EXPECT_EQ(*data, want);
  // Outside the held chunk; a crc the tier does not hold; a step it lacks.
  auto [outside, t1] = fetch({{2, 0}, {2, 4}}, crc, item);
  ASSERT_TRUE(outside.ok());
  EXPECT_THAT(PeerClient::StatusOf(*outside),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("outside held chunk")));
  auto [wrong_crc, t2] = fetch({{0, 0}, {1, 4}}, crc ^ 1, item);
  ASSERT_TRUE(wrong_crc.ok());
  EXPECT_FALSE(PeerClient::StatusOf(*wrong_crc).ok());
  v1::WriteItem other =
      TensorItem("w", v1::DTYPE_FLOAT32, shape, {{3, 0}, {3, 4}});
  auto [not_held, t3] = fetch({{3, 0}, {1, 4}}, crc, other);
  ASSERT_TRUE(not_held.ok());
  EXPECT_THAT(PeerClient::StatusOf(*not_held),
              StatusIs(absl::StatusCode::kNotFound));
  // Calls to a node that is not there fail with the transport's error.
  MarkDown(1);
  v1::PeerRequest inv;
  inv.mutable_inventory()->set_job(kJob);
  EXPECT_TRUE(nodes_[0]->client->Call(1, inv).ok());  // connected already
}

// The saved tensor's element at `e` (a float32 value unique per element).
float Value(const std::vector<int64_t>& e, const planner::Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < e.size(); ++d) flat = flat * shape[d] + e[d];
  return static_cast<float>(flat) + 0.5f;
}

std::vector<planner::ChunkBox> RandomGrid(const planner::Shape& shape,
                                          std::mt19937& rng) {
  std::vector<planner::ChunkBox> boxes(1);
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<planner::ChunkBox> next;
    int64_t at = 0;
    while (at < shape[d]) {
      const int64_t len =
          std::uniform_int_distribution<int64_t>(1, shape[d] - at)(rng);
      for (const planner::ChunkBox& b : boxes) {
        planner::ChunkBox nb = b;
        nb.offsets.push_back(at);
        nb.sizes.push_back(len);
        next.push_back(nb);
      }
      at += len;
    }
    boxes = std::move(next);
  }
  return boxes;
}

// Every element of `box` in row-major order, calling fn(coordinates, index).
void ForEachElement(
    const planner::ChunkBox& box,
    const std::function<void(const std::vector<int64_t>&, int64_t)>& fn) {
  if (planner::Volume(box) == 0) return;
  std::vector<int64_t> e(box.offsets.begin(), box.offsets.end());
  for (int64_t i = 0;; ++i) {
    fn(e, i);
    size_t d = e.size();
    while (d > 0) {
      --d;
      if (++e[d] < box.offsets[d] + box.sizes[d]) break;
      e[d] = box.offsets[d];
      if (d == 0) return;
    }
  }
}

// The saved values of `box` (Value of each element, row-major).
std::vector<float> BoxValues(const planner::ChunkBox& box,
                             const planner::Shape& shape) {
  std::vector<float> values;
  ForEachElement(box, [&](const std::vector<int64_t>& e, int64_t) {
    values.push_back(Value(e, shape));
  });
  return values;
}

// A float32 tensor `fqn` of `shape` in `manifest`, without chunks yet.
v1::ManifestTensor* AddTensor(v1::Manifest& manifest, const std::string& fqn,
                              const planner::Shape& shape) {
  v1::ManifestTensor* mt = manifest.add_tensors();
  mt->mutable_entry()->set_fqn(fqn);
  mt->mutable_entry()->set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t s : shape) mt->mutable_entry()->add_global_shape(s);
  return mt;
}

// A stored chunk `box` of `mt` with the crc32c of its saved values.
void AddStoredChunk(v1::ManifestTensor* mt, const planner::ChunkBox& box,
                    const planner::Shape& shape) {
  const std::vector<float> values = BoxValues(box, shape);
  v1::StoredChunk* sc = mt->add_chunks();
  convert::BoxToProto(box, sc->mutable_box());
  sc->set_crc32c(storage::Crc32c(values.data(), values.size() * 4));
}

// Loads from memory on random cases: a 2-D float32 tensor saved as a random
// grid of chunks, each held by a random non-empty set of the 3 nodes (tier 0
// of one source rank per node), loaded by a random node into another random
// grid's boxes; every loaded element must be the saved one, and the bytes
// moved locally and over the network must add up to the bytes wanted.
TEST_F(PeerTest, LoadsFromMemoryMatchTheSavedTensorOnRandomLayouts) {
  StartNodes(3, {}, 256);
  std::mt19937 rng(20261203);
  for (int round = 0; round < 40; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const int64_t step = round + 1;
    const planner::Shape shape = {
        std::uniform_int_distribution<int64_t>(1, 24)(rng),
        std::uniform_int_distribution<int64_t>(1, 9)(rng)};
    const std::string fqn = "model.w";
    v1::Manifest manifest;
    v1::ManifestTensor* mt = AddTensor(manifest, fqn, shape);
    std::vector<std::vector<v1::WriteItem>> held(3);
    for (const planner::ChunkBox& b : RandomGrid(shape, rng)) {
      v1::WriteItem item = TensorItem(fqn, v1::DTYPE_FLOAT32, shape, b);
      AddStoredChunk(mt, b, shape);
      int mask = std::uniform_int_distribution<int>(1, 7)(rng);
      for (int n = 0; n < 3; ++n) {
        if (mask & (1 << n)) held[n].push_back(item);
      }
    }
    for (int n = 0; n < 3; ++n) {
      if (held[n].empty()) continue;
      std::vector<std::vector<float>> values;
      for (const v1::WriteItem& w : held[n]) {
        values.push_back(BoxValues(internal::ItemBox(w), shape));
      }
      auto set = MakeSet(n, step, n, held[n], [&](size_t i, uint64_t b) {
        return reinterpret_cast<const char*>(values[i].data())[b];
      });
      nodes_[n]->tier->Keep(set);
    }
    const int loader = std::uniform_int_distribution<int>(0, 2)(rng);
    v1::AgentLoadRequest request;
    request.set_job(kJob);
    request.set_step(step);
    request.set_rank(loader);
    std::vector<planner::ChunkBox> wanted;
    for (const planner::ChunkBox& b : RandomGrid(shape, rng)) {
      if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) continue;
      v1::WantedChunk* w = request.add_wanted();
      *w->mutable_tensor() = mt->entry();
      convert::BoxToProto(b, w->mutable_box());
      wanted.push_back(b);
    }
    absl::StatusOr<v1::AgentLoadResponse> r =
        nodes_[loader]->loader->Load(request, step, manifest);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->wanted_offsets_size(), static_cast<int>(wanted.size()));
    absl::StatusOr<std::unique_ptr<shm::ShmSegment>> seg =
        shm::ShmSegment::Open(r->shm_name(), r->shm_size());
    ASSERT_TRUE(seg.ok()) << seg.status();
    uint64_t wanted_bytes = 0;
    for (size_t w = 0; w < wanted.size(); ++w) {
      const char* base =
          (*seg)->data() + r->wanted_offsets(static_cast<int>(w));
      ForEachElement(wanted[w], [&](const std::vector<int64_t>& e, int64_t i) {
        float got;
        std::memcpy(&got, base + i * 4, 4);
        ASSERT_EQ(got, Value(e, shape))
            << "wanted " << planner::BoxToString(wanted[w]) << " element "
            << e[0] << "," << e[1];
      });
      wanted_bytes += planner::Volume(wanted[w]) * 4;
    }
    EXPECT_EQ(r->bytes_local() + r->bytes_peers(), wanted_bytes);
    ASSERT_THAT(nodes_[loader]->loader->Release(r->load_id()), IsOk());
    EXPECT_THAT(nodes_[loader]->loader->Release(r->load_id()),
                StatusIs(absl::StatusCode::kNotFound));
  }
}

TEST_F(PeerTest, LoadSkipsAnUnreachablePeerAndFailsWhatOnlyItHolds) {
  StartNodes(3);
  const planner::Shape shape = {4, 2};
  v1::Manifest manifest;
  v1::ManifestTensor* mt = AddTensor(manifest, "w", shape);
  const planner::ChunkBox top{{0, 0}, {2, 2}}, bottom{{2, 0}, {2, 2}};
  for (const planner::ChunkBox& b : {top, bottom}) AddStoredChunk(mt, b, shape);
  auto fill_for = [&](const planner::ChunkBox& box) {
    return [values = BoxValues(box, shape)](size_t, uint64_t b) {
      return reinterpret_cast<const char*>(values.data())[b];
    };
  };
  nodes_[1]->tier->Keep(
      MakeSet(1, 3, 1, {TensorItem("w", v1::DTYPE_FLOAT32, shape, top)},
              fill_for(top)));
  nodes_[2]->tier->Keep(
      MakeSet(2, 3, 2, {TensorItem("w", v1::DTYPE_FLOAT32, shape, bottom)},
              fill_for(bottom)));
  nodes_[2]->transport.reset();  // node 2 is lost
  MarkDown(2);
  v1::AgentLoadRequest top_only;
  top_only.set_job(kJob);
  top_only.set_step(3);
  v1::WantedChunk* w = top_only.add_wanted();
  *w->mutable_tensor() = mt->entry();
  convert::BoxToProto(top, w->mutable_box());
  absl::StatusOr<v1::AgentLoadResponse> r =
      nodes_[0]->loader->Load(top_only, 3, manifest);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_peers(), 16u);

  v1::AgentLoadRequest all = top_only;
  convert::BoxToProto(bottom, all.add_wanted()->mutable_box());
  *all.mutable_wanted(1)->mutable_tensor() = mt->entry();
  EXPECT_THAT(nodes_[0]->loader->Load(all, 3, manifest),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("memory tiers cannot serve it"),
                             HasSubstr("'w'"))));
}

}  // namespace
}  // namespace cairn::agent
