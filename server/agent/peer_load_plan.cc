// Peer load planning (see peer_load_plan.h): inventories + manifest + wanted
// chunks -> load segment layout and transfer plan. Pure: no I/O.
#include "server/agent/peer_load_plan.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/dtype.h"
#include "proto/convert/plan_convert.h"
#include "server/agent/items.h"

namespace cairn::agent {

using internal::AlignUp;
using internal::DTypeOf;
using internal::ItemBox;
using internal::kAlign;
using internal::PlanName;
using internal::Where;

PeerLoadSource PeerLoadPlan::SourceOf(const planner::TransferSend& send) const {
  const planner::ChunkBox& src_box =
      tensors[send.tensor].sources[send.source_index].box;
  const std::string& name = tensors[send.tensor].fqn;
  PeerLoadSource s;
  auto it = items.find({name, src_box});
  if (it != items.end()) s.item = it->second;
  s.box = src_box;
  auto e = expected.find({name, src_box});
  if (e != expected.end()) s.crc32c = e->second;
  return s;
}

absl::StatusOr<PeerLoadPlan> PlanPeerLoad(
    const v1::AgentLoadRequest& request, int64_t step,
    const v1::Manifest& manifest,
    const std::vector<std::vector<v1::HeldSet>>& held_by,
    const PeerLoadPlanOptions& options) {
  const std::string where = Where(request.job(), step, request.rank());
  PeerLoadPlan out;
  // (plan name, box) -> holder nodes whose copy claims the manifest's crc.
  std::map<std::pair<std::string, planner::ChunkBox>, std::vector<int>> holders;
  for (size_t n = 0; n < held_by.size(); ++n) {
    for (const v1::HeldSet& s : held_by[n]) {
      for (const v1::HeldItem& h : s.items()) {
        auto key = std::make_pair(PlanName(h.item()), ItemBox(h.item()));
        std::vector<int>& v = holders[key];
        if (std::find(v.begin(), v.end(), static_cast<int>(n)) == v.end()) {
          v.push_back(static_cast<int>(n));
        }
        out.items[key] = h.item();
      }
    }
  }
  absl::flat_hash_map<std::string, const v1::ManifestTensor*> mtensors;
  for (const v1::ManifestTensor& t : manifest.tensors()) {
    mtensors[t.entry().fqn()] = &t;
  }
  absl::flat_hash_map<std::string, const v1::ManifestBytes*> mbytes;
  for (const v1::ManifestBytes& b : manifest.bytes_entries()) {
    mbytes[b.fqn()] = &b;
  }

  // The transfer plan: sources = holders of the manifest's chunks,
  // destinations = this rank's wanted boxes (all on this node).
  std::vector<planner::TransferTensor>& tensors = out.tensors;
  std::map<std::string, int> tindex;
  uint64_t total = 0;
  v1::AgentLoadResponse& response = out.response;
  auto tensor_for = [&](const std::string& name, planner::DType dtype,
                        planner::Shape shape) -> int {
    auto [it, inserted] =
        tindex.emplace(name, static_cast<int>(tensors.size()));
    if (inserted) {
      planner::TransferTensor t;
      t.fqn = name;
      t.dtype = dtype;
      t.global_shape = std::move(shape);
      tensors.push_back(std::move(t));
      out.dests.emplace_back();
    }
    return it->second;
  };
  auto add_sources = [&](int ti, const planner::ChunkBox& box, uint32_t crc) {
    const std::string& name = tensors[ti].fqn;
    out.expected[{name, box}] = crc;
    auto h = holders.find({name, box});
    if (h == holders.end()) return;
    for (int n : h->second) tensors[ti].sources.push_back({n, box});
  };
  for (const v1::WantedChunk& w : request.wanted()) {
    const std::string& fqn = w.tensor().fqn();
    auto mt = mtensors.find(fqn);
    if (mt == mtensors.end()) {
      return absl::NotFoundError(
          absl::StrCat(where, ": checkpoint has no tensor '", fqn, "'"));
    }
    const v1::TensorEntry& e = mt->second->entry();
    if (e.dtype() != w.tensor().dtype() ||
        !std::equal(e.global_shape().begin(), e.global_shape().end(),
                    w.tensor().global_shape().begin(),
                    w.tensor().global_shape().end())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", fqn,
                       "' dtype or shape differs from the saved "
                       "one"));
    }
    CAIRN_ASSIGN_OR_RETURN(planner::ChunkBox box,
                           convert::BoxFromProto(w.box(), fqn));
    const planner::DType dtype = DTypeOf(e.dtype());
    const bool first = tindex.count(fqn) == 0;
    const int ti = tensor_for(
        fqn, dtype,
        planner::Shape(e.global_shape().begin(), e.global_shape().end()));
    if (first) {
      for (const v1::StoredChunk& c : mt->second->chunks()) {
        CAIRN_ASSIGN_OR_RETURN(planner::ChunkBox cb,
                               convert::BoxFromProto(c.box(), fqn));
        add_sources(ti, cb, c.crc32c());
      }
    }
    out.dests[ti].push_back({total, box});
    tensors[ti].destinations.push_back({options.node_id, box});
    response.add_wanted_offsets(total);
    total = AlignUp(total + static_cast<uint64_t>(planner::Volume(box)) *
                                planner::DTypeSize(dtype),
                    kAlign);
  }
  for (const std::string& fqn : request.wanted_bytes()) {
    auto mb = mbytes.find(fqn);
    if (mb == mbytes.end()) {
      return absl::NotFoundError(
          absl::StrCat(where, ": checkpoint has no bytes entry '", fqn, "'"));
    }
    const uint64_t len = mb->second->location().length();
    response.add_wanted_bytes_offsets(total);
    response.add_wanted_bytes_lengths(len);
    if (len > 0) {
      const std::string name = absl::StrCat("\x01bytes:", fqn);
      planner::ChunkBox box{{0}, {static_cast<int64_t>(len)}};
      const bool first = tindex.count(name) == 0;
      const int ti =
          tensor_for(name, planner::DType::kUInt8, {static_cast<int64_t>(len)});
      if (first) add_sources(ti, box, mb->second->crc32c());
      out.dests[ti].push_back({total, box});
      tensors[ti].destinations.push_back({options.node_id, box});
    }
    total = AlignUp(total + len, kAlign);
  }
  out.total_bytes = total;
  planner::TransferPlanOptions po;
  po.bucket_cap_bytes = options.bucket_cap_bytes;
  absl::StatusOr<planner::TransferPlan> plan =
      planner::BuildTransferPlan(tensors, po);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat(where, ": memory tiers cannot serve it: ",
                                     plan.status().message()));
  }
  out.transfers = *std::move(plan);
  return out;
}

}  // namespace cairn::agent
