// Tests of PlanPeerLoad (peer_load_plan.h) against a brute-force,
// element-level oracle on many random cases (random shapes, saved layouts
// held by random subsets of nodes incl. replicas, random wanted layouts),
// plus its error paths.
#include "server/agent/peer_load_plan.h"

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/box.h"
#include "proto/convert/plan_convert.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kStep = 7;
constexpr char kJob[] = "jobA";

bool Contains(const planner::ChunkBox& b, const std::vector<int64_t>& e) {
  for (size_t d = 0; d < e.size(); ++d) {
    if (e[d] < b.offsets[d] || e[d] >= b.offsets[d] + b.sizes[d]) return false;
  }
  return true;
}

bool BoxInside(const planner::ChunkBox& inner, const planner::ChunkBox& outer) {
  for (size_t d = 0; d < inner.offsets.size(); ++d) {
    if (inner.offsets[d] < outer.offsets[d] ||
        inner.offsets[d] + inner.sizes[d] > outer.offsets[d] + outer.sizes[d]) {
      return false;
    }
  }
  return true;
}

// Every element (coordinate) of a box.
std::vector<std::vector<int64_t>> Elements(const planner::ChunkBox& b) {
  std::vector<std::vector<int64_t>> out;
  if (planner::Volume(b) == 0) return out;
  std::vector<int64_t> e(b.offsets.begin(), b.offsets.end());
  while (true) {
    out.push_back(e);
    size_t d = e.size();
    while (d > 0) {
      --d;
      if (++e[d] < b.offsets[d] + b.sizes[d]) break;
      e[d] = b.offsets[d];
      if (d == 0) return out;
    }
    if (e.empty()) return out;
  }
}

// A random grid partition of `shape` into boxes.
std::vector<planner::ChunkBox> RandomGrid(const planner::Shape& shape,
                                          std::mt19937& rng) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cuts(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t at = 0;
    while (at < shape[d]) {
      int64_t len =
          std::uniform_int_distribution<int64_t>(1, shape[d] - at)(rng);
      cuts[d].push_back({at, len});
      at += len;
    }
  }
  std::vector<planner::ChunkBox> boxes(1);
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<planner::ChunkBox> next;
    for (const auto& b : boxes) {
      for (auto [o, s] : cuts[d]) {
        planner::ChunkBox nb = b;
        nb.offsets.push_back(o);
        nb.sizes.push_back(s);
        next.push_back(nb);
      }
    }
    boxes = std::move(next);
  }
  return boxes;
}

struct SavedChunk {
  planner::ChunkBox box;
  uint32_t crc;
  std::set<int> holders;
};

struct Case {
  int num_nodes = 1;
  int node_id = 0;
  v1::AgentLoadRequest request;
  v1::Manifest manifest;
  std::vector<std::vector<v1::HeldSet>> held_by;
  // fqn -> its saved chunks (with holders), for the oracle.
  std::map<std::string, std::vector<SavedChunk>> saved;
};

v1::TensorEntry Entry(const std::string& fqn, const planner::Shape& shape) {
  v1::TensorEntry e;
  e.set_fqn(fqn);
  e.set_dtype(convert::DTypeToProto(planner::DType::kFloat32));
  for (int64_t s : shape) e.add_global_shape(s);
  return e;
}

void AddHeld(Case& c, int node, const v1::WriteItem& item) {
  if (c.held_by[node].empty()) {
    c.held_by[node].emplace_back();
    c.held_by[node][0].set_source_rank(node);
  }
  *c.held_by[node][0].add_items()->mutable_item() = item;
}

// A random case; with `full_cover`, every saved chunk has >= 1 holder.
Case RandomCase(std::mt19937& rng, bool full_cover) {
  Case c;
  auto uni = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  c.num_nodes = uni(1, 4);
  c.node_id = uni(0, c.num_nodes - 1);
  c.held_by.resize(c.num_nodes);
  c.request.set_job(kJob);
  c.request.set_step(kStep);
  c.request.set_rank(uni(0, 7));
  uint32_t crc = 100;
  const int ntensors = uni(1, 3);
  for (int t = 0; t < ntensors; ++t) {
    const std::string fqn = absl::StrCat("layer", t, ".w");
    planner::Shape shape;
    const int rank = uni(1, 3);
    int64_t vol = 1;
    for (int d = 0; d < rank; ++d) {
      int64_t s = uni(1, 4);
      if (vol * s > 64) s = 1;
      shape.push_back(s);
      vol *= s;
    }
    v1::ManifestTensor* mt = c.manifest.add_tensors();
    *mt->mutable_entry() = Entry(fqn, shape);
    for (const planner::ChunkBox& b : RandomGrid(shape, rng)) {
      SavedChunk sc{b, ++crc, {}};
      for (int n = 0; n < c.num_nodes; ++n) {
        if (uni(0, 2) == 0) sc.holders.insert(n);  // replicas too
      }
      if (full_cover && sc.holders.empty()) {
        sc.holders.insert(uni(0, c.num_nodes - 1));
      }
      v1::StoredChunk* st = mt->add_chunks();
      convert::BoxToProto(b, st->mutable_box());
      st->set_crc32c(sc.crc);
      v1::WriteItem item;
      item.set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
      *item.mutable_tensor() = mt->entry();
      convert::BoxToProto(b, item.mutable_chunk());
      item.set_length(planner::Volume(b) * 4);
      for (int n : sc.holders) AddHeld(c, n, item);
      c.saved[fqn].push_back(sc);
    }
    // Wanted: a random subset of another grid (maybe a box twice).
    for (const planner::ChunkBox& b : RandomGrid(shape, rng)) {
      const int times = uni(0, 3) == 0 ? 0 : uni(1, 2);
      for (int k = 0; k < times; ++k) {
        v1::WantedChunk* w = c.request.add_wanted();
        *w->mutable_tensor() = mt->entry();
        convert::BoxToProto(b, w->mutable_box());
      }
    }
  }
  if (uni(0, 1) == 0) {  // a bytes entry
    const std::string fqn = "extra_state";
    const int64_t len = uni(1, 40);
    v1::ManifestBytes* mb = c.manifest.add_bytes_entries();
    mb->set_fqn(fqn);
    mb->mutable_location()->set_length(len);
    mb->set_crc32c(++crc);
    SavedChunk sc{planner::ChunkBox{{0}, {len}}, crc, {}};
    for (int n = 0; n < c.num_nodes; ++n) {
      if (uni(0, 1) == 0) sc.holders.insert(n);
    }
    if (full_cover && sc.holders.empty()) sc.holders.insert(0);
    v1::WriteItem item;
    item.set_kind(v1::WriteItem::KIND_BYTES);
    item.set_bytes_fqn(fqn);
    item.set_length(len);
    for (int n : sc.holders) AddHeld(c, n, item);
    c.saved[absl::StrCat("\x01bytes:", fqn)].push_back(sc);
    c.request.add_wanted_bytes(fqn);
  }
  return c;
}

// Which planner fqns have a wanted element no holder has.
std::set<std::string> Uncovered(const Case& c) {
  std::set<std::string> out;
  auto check = [&](const std::string& name, const planner::ChunkBox& want) {
    for (const auto& e : Elements(want)) {
      bool held = false;
      for (const SavedChunk& sc : c.saved.at(name)) {
        if (Contains(sc.box, e) && !sc.holders.empty()) held = true;
      }
      if (!held) out.insert(name);
    }
  };
  for (const v1::WantedChunk& w : c.request.wanted()) {
    check(w.tensor().fqn(), *convert::BoxFromProto(w.box(), ""));
  }
  for (const std::string& fqn : c.request.wanted_bytes()) {
    const std::string name = absl::StrCat("\x01bytes:", fqn);
    check(name, c.saved.at(name)[0].box);
  }
  return out;
}

// The oracle: every wanted element is delivered by exactly one planned send
// (local iff from this node), whose source node really holds it, reading the
// saved copy with the manifest's crc; the segment layout is disjoint.
void CheckPlan(const Case& c, const PeerLoadPlan& p) {
  // Wanted (planner name, box) in request order -> (tensor, dest index).
  std::vector<std::pair<std::string, planner::ChunkBox>> wanted;
  for (const v1::WantedChunk& w : c.request.wanted()) {
    wanted.push_back({w.tensor().fqn(), *convert::BoxFromProto(w.box(), "")});
  }
  for (const std::string& fqn : c.request.wanted_bytes()) {
    const std::string name = absl::StrCat("\x01bytes:", fqn);
    wanted.push_back({name, c.saved.at(name)[0].box});
  }
  ASSERT_EQ(p.response.wanted_offsets_size(), c.request.wanted_size());
  ASSERT_EQ(p.response.wanted_bytes_offsets_size(),
            c.request.wanted_bytes_size());
  std::map<std::string, int> tindex;
  std::map<int, int> next_dest;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // segment [begin, end)
  for (size_t i = 0; i < wanted.size(); ++i) {
    const auto& [name, box] = wanted[i];
    auto it = tindex.find(name);
    if (it == tindex.end()) {
      int ti = -1;
      for (size_t t = 0; t < p.tensors.size(); ++t) {
        if (p.tensors[t].fqn == name) ti = static_cast<int>(t);
      }
      ASSERT_GE(ti, 0) << name;
      it = tindex.emplace(name, ti).first;
    }
    const int ti = it->second;
    const int di = next_dest[ti]++;
    ASSERT_LT(di, static_cast<int>(p.dests[ti].size()));
    EXPECT_EQ(p.dests[ti][di].box, box);
    EXPECT_EQ(p.tensors[ti].destinations[di].rank, c.node_id);
    const uint64_t elem = planner::DTypeSize(p.tensors[ti].dtype);
    const uint64_t off = p.dests[ti][di].offset;
    if (i < static_cast<size_t>(c.request.wanted_size())) {
      EXPECT_EQ(p.response.wanted_offsets(i), off);
    } else {
      const int b = static_cast<int>(i) - c.request.wanted_size();
      EXPECT_EQ(p.response.wanted_bytes_offsets(b), off);
      EXPECT_EQ(p.response.wanted_bytes_lengths(b),
                static_cast<uint64_t>(planner::Volume(box)));
    }
    EXPECT_EQ(off % 64, 0u);
    ranges.push_back({off, off + planner::Volume(box) * elem});
    EXPECT_LE(ranges.back().second, p.total_bytes);

    // Element level: exactly one send delivers each element.
    for (const auto& e : Elements(box)) {
      int found = 0;
      for (const planner::TransferSend& s : p.transfers.sends) {
        if (s.tensor != ti || s.dest_index != di || !Contains(s.box, e)) {
          continue;
        }
        ++found;
        EXPECT_EQ(s.dst_rank, c.node_id);
        EXPECT_EQ(s.local, s.src_rank == c.node_id);
        PeerLoadSource src = p.SourceOf(s);
        EXPECT_TRUE(BoxInside(s.box, src.box));
        bool holds = false;
        for (const SavedChunk& sc : c.saved.at(name)) {
          if (sc.box == src.box) {
            EXPECT_EQ(src.crc32c, sc.crc) << name;
            holds = sc.holders.count(s.src_rank) > 0 && Contains(sc.box, e);
          }
        }
        EXPECT_TRUE(holds) << name << " element from node " << s.src_rank;
        // The item it names is the held one (fqn + box).
        if (src.item.kind() == v1::WriteItem::KIND_BYTES) {
          EXPECT_EQ(absl::StrCat("\x01bytes:", src.item.bytes_fqn()), name);
        } else {
          EXPECT_EQ(src.item.tensor().fqn(), name);
          EXPECT_EQ(*convert::BoxFromProto(src.item.chunk(), ""), src.box);
        }
      }
      EXPECT_EQ(found, 1) << name << " dest " << di;
    }
  }
  // Every send targets a wanted destination (none extra).
  for (const planner::TransferSend& s : p.transfers.sends) {
    ASSERT_LT(s.dest_index, static_cast<int>(p.dests[s.tensor].size()));
    EXPECT_TRUE(BoxInside(s.box, p.dests[s.tensor][s.dest_index].box));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].second > ranges[i - 1].first &&
        ranges[i].second > ranges[i].first) {
      EXPECT_LE(ranges[i - 1].second, ranges[i].first);
    }
  }
}

TEST(PeerLoadPlanTest, RandomCasesMatchOracle) {
  int planned = 0, refused = 0;
  for (int seed = 0; seed < 400; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937 rng(seed);
    Case c = RandomCase(rng, /*full_cover=*/seed % 2 == 0);
    PeerLoadPlanOptions o;
    o.node_id = c.node_id;
    o.bucket_cap_bytes = 1 + seed % 97;
    absl::StatusOr<PeerLoadPlan> p =
        PlanPeerLoad(c.request, kStep, c.manifest, c.held_by, o);
    const std::set<std::string> missing = Uncovered(c);
    if (missing.empty()) {
      ASSERT_TRUE(p.ok()) << p.status();
      CheckPlan(c, *p);
      ++planned;
    } else {
      ASSERT_FALSE(p.ok());
      EXPECT_THAT(p, StatusIs(absl::StatusCode::kFailedPrecondition));
      const std::string msg(p.status().message());
      EXPECT_THAT(msg, HasSubstr("job 'jobA' step 7 rank "));
      EXPECT_THAT(msg, HasSubstr("memory tiers cannot serve it"));
      bool names_one = false;
      for (const std::string& n : missing) {
        if (msg.find(absl::StrCat("'", n, "'")) != std::string::npos) {
          names_one = true;
        }
      }
      EXPECT_TRUE(names_one) << msg;
      ++refused;
    }
  }
  EXPECT_GE(planned, 200);
  EXPECT_GE(refused, 20);
}

// A fixed case: one 1-D tensor [0,8) saved as [0,4) on nodes 0+1 (replica)
// and [4,8) nowhere; wanting [2,6) names job, step, rank, fqn and the gap.
Case GapCase() {
  Case c;
  c.num_nodes = 2;
  c.node_id = 1;
  c.held_by.resize(2);
  c.request.set_job(kJob);
  c.request.set_rank(3);
  v1::ManifestTensor* mt = c.manifest.add_tensors();
  *mt->mutable_entry() = Entry("model.emb", {8});
  for (int64_t o : {0, 4}) {
    v1::StoredChunk* st = mt->add_chunks();
    convert::BoxToProto(planner::ChunkBox{{o}, {4}}, st->mutable_box());
    st->set_crc32c(static_cast<uint32_t>(o + 1));
  }
  v1::WriteItem item;
  item.set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
  *item.mutable_tensor() = mt->entry();
  convert::BoxToProto(planner::ChunkBox{{0}, {4}}, item.mutable_chunk());
  AddHeld(c, 0, item);
  AddHeld(c, 1, item);
  v1::WantedChunk* w = c.request.add_wanted();
  *w->mutable_tensor() = mt->entry();
  convert::BoxToProto(planner::ChunkBox{{2}, {4}}, w->mutable_box());
  return c;
}

TEST(PeerLoadPlanTest, WantedRegionNoHolderHasNamesJobStepFqnAndBox) {
  Case c = GapCase();
  PeerLoadPlanOptions o;
  o.node_id = c.node_id;
  absl::StatusOr<PeerLoadPlan> p =
      PlanPeerLoad(c.request, kStep, c.manifest, c.held_by, o);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p, StatusIs(absl::StatusCode::kFailedPrecondition));
  const std::string msg(p.status().message());
  EXPECT_THAT(msg, HasSubstr("job 'jobA' step 7 rank 3"));
  EXPECT_THAT(msg, HasSubstr("'model.emb'"));
  EXPECT_THAT(msg, HasSubstr(planner::BoxToString(planner::ChunkBox{{4}, {2}})))
      << msg;
}

TEST(PeerLoadPlanTest, HeldRegionIsALocalCopyFromThisNode) {
  Case c = GapCase();
  c.request.mutable_wanted(0)->mutable_box()->set_offsets(0, 1);
  c.request.mutable_wanted(0)->mutable_box()->set_sizes(0, 3);
  PeerLoadPlanOptions o;
  o.node_id = c.node_id;
  absl::StatusOr<PeerLoadPlan> p =
      PlanPeerLoad(c.request, kStep, c.manifest, c.held_by, o);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->transfers.sends.size(), 1u);
  EXPECT_TRUE(p->transfers.sends[0].local);
  EXPECT_EQ(p->SourceOf(p->transfers.sends[0]).crc32c, 1u);
  EXPECT_TRUE(p->transfers.messages.empty());
  EXPECT_EQ(p->total_bytes, 64u);
}

TEST(PeerLoadPlanTest, TensorMissingFromManifestIsNotFound) {
  Case c = GapCase();
  c.request.mutable_wanted(0)->mutable_tensor()->set_fqn("model.nope");
  absl::StatusOr<PeerLoadPlan> p =
      PlanPeerLoad(c.request, kStep, c.manifest, c.held_by, {});
  EXPECT_THAT(p, StatusIs(absl::StatusCode::kNotFound,
                          AllOf(HasSubstr("job 'jobA' step 7 rank 3"),
                                HasSubstr("'model.nope'"))));
}

TEST(PeerLoadPlanTest, BytesEntryMissingFromManifestIsNotFound) {
  Case c = GapCase();
  c.request.clear_wanted();
  c.request.add_wanted_bytes("opt.state");
  absl::StatusOr<PeerLoadPlan> p =
      PlanPeerLoad(c.request, kStep, c.manifest, c.held_by, {});
  EXPECT_THAT(p, StatusIs(absl::StatusCode::kNotFound,
                          AllOf(HasSubstr("job 'jobA' step 7 rank 3"),
                                HasSubstr("bytes entry 'opt.state'"))));
}

TEST(PeerLoadPlanTest, ShapeMismatchIsInvalidArgument) {
  Case c = GapCase();
  c.request.mutable_wanted(0)->mutable_tensor()->set_global_shape(0, 9);
  absl::StatusOr<PeerLoadPlan> p =
      PlanPeerLoad(c.request, kStep, c.manifest, c.held_by, {});
  EXPECT_THAT(p, StatusIs(absl::StatusCode::kInvalidArgument,
                          AllOf(HasSubstr("job 'jobA' step 7 rank 3"),
                                HasSubstr("'model.emb'"))));
}

}  // namespace
}  // namespace cairn::agent
