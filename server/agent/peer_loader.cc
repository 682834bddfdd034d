// PeerLoader (peer_loader.h): a load served from the agents' memory.
#include "server/agent/peer_loader.h"

#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/task_group.h"
#include "planner/load_plan.h"
#include "planner/transfer_plan.h"
#include "proto/convert/plan_convert.h"
#include "server/agent/items.h"
#include "server/agent/peer_load_plan.h"

namespace cairn::agent {

using internal::Where;
using shm::ShmSegment;

PeerLoader::PeerLoader(Options options, PeerClient& peers, MemoryTier& tier,
                       StagingPool& pool)
    : options_(options),
      peers_(peers),
      tier_(tier),
      pool_(pool),
      fetch_pool_(options.fetch_threads) {}

absl::StatusOr<v1::AgentLoadResponse> PeerLoader::Load(
    const v1::AgentLoadRequest& request, int64_t step,
    const v1::Manifest& manifest) {
  const std::string where = Where(request.job(), step, request.rank());

  // Who holds what, in memory: every reachable agent (this one directly).
  std::vector<std::vector<v1::HeldSet>> held_by(options_.num_nodes);
  {
    v1::InventoryRequest inv;
    inv.set_job(request.job());
    inv.set_step(step);
    v1::InventoryResponse mine = tier_.Inventory(inv.job(), inv.step());
    held_by[options_.node_id].assign(mine.sets().begin(), mine.sets().end());
    for (int n = 0; n < options_.num_nodes; ++n) {
      if (n == options_.node_id) continue;
      v1::PeerRequest pr;
      *pr.mutable_inventory() = inv;
      absl::StatusOr<v1::PeerResponse> r = peers_.Call(n, std::move(pr));
      if (!r.ok() || !PeerClient::StatusOf(*r).ok()) {
        CAIRN_LOG(info, "node {}: peer node {} unavailable for {}: {}",
                  options_.node_id, n, where,
                  r.ok() ? PeerClient::StatusOf(*r).ToString()
                         : r.status().ToString());
        continue;
      }
      held_by[n].assign(r->inventory().sets().begin(),
                        r->inventory().sets().end());
    }
  }
  PeerLoadPlanOptions plan_options;
  plan_options.node_id = options_.node_id;
  plan_options.bucket_cap_bytes = options_.bucket_cap_bytes;
  CAIRN_ASSIGN_OR_RETURN(
      PeerLoadPlan planned,
      PlanPeerLoad(request, step, manifest, held_by, plan_options));
  const planner::TransferPlan* plan = &planned.transfers;
  const auto& dests = planned.dests;
  v1::AgentLoadResponse& response = planned.response;
  auto held_item = [&](const planner::TransferSend& send) {
    PeerLoadSource s = planned.SourceOf(send);
    return std::make_tuple(std::move(s.item), std::move(s.box), s.crc32c);
  };
  // The copy segments below, counted before any is built or anything
  // allocated, with the same cap as cairnd's load plans: the boxes come
  // from peers' inventories and the rank's request, and a box cutting a
  // chunk into single elements needs one segment (24 bytes) per element.
  {
    uint64_t segments = 0;
    for (const planner::TransferSend& send : plan->sends) {
      const PeerLoadDest& d = dests[send.tensor][send.dest_index];
      uint64_t n = 0;
      if (send.local) {
        n = planner::NumCopySegments(std::get<1>(held_item(send)), d.box,
                                     send.box);
      } else {
        n = planner::NumCopySegments(send.box, d.box, send.box);
      }
      if (n > planner::kMaxCopySegmentsPerPlan - segments) {
        return absl::ResourceExhaustedError(absl::StrCat(
            where, ": '", internal::ItemFqn(std::get<0>(held_item(send))), "' ",
            planner::BoxToString(send.box), " into wanted ",
            planner::BoxToString(d.box), " needs ", n,
            " copy segments; with the load's others more than the ",
            planner::kMaxCopySegmentsPerPlan,
            " one load may build (load it as larger chunks)"));
      }
      segments += n;
    }
  }
  CAIRN_ASSIGN_OR_RETURN(
      std::shared_ptr<ShmSegment> seg,
      pool_.Allocate(planned.total_bytes, absl::Now() + options_.peer_timeout));

  std::vector<planner::CopySegment> segs;
  // Local pieces: from this agent's own memory.
  for (const planner::TransferSend& send : plan->sends) {
    if (!send.local) continue;
    auto [item, src_box, crc] = held_item(send);
    CAIRN_ASSIGN_OR_RETURN(auto held,
                           tier_.Find(request.job(), step, item, crc));
    const PeerLoadDest& d = dests[send.tensor][send.dest_index];
    segs.clear();
    const size_t elem = planner::DTypeSize(send.dtype);
    planner::AppendCopySegments(src_box, d.box, send.box, elem, &segs);
    const char* src = held.first->segment->data() + held.second->offset;
    for (const auto& s : segs) {
      std::memcpy(seg->data() + d.offset + s.dst_offset, src + s.src_offset,
                  s.length);
    }
    response.set_bytes_local(response.bytes_local() + send.bytes);
  }
  // Remote pieces: one Fetch per planned message, peers in parallel on the
  // agent's bounded fetch pool (this thread runs the ones not started yet).
  std::vector<absl::Status> results(plan->messages.size());
  auto fetch = [&](size_t m) {
    const planner::TransferMessage& msg = plan->messages[m];
    v1::PeerRequest pr;
    v1::FetchRequest* f = pr.mutable_fetch();
    f->set_job(request.job());
    f->set_step(step);
    f->set_data_tag(peers_.NewTag());
    for (const auto& part : msg.parts) {
      const planner::TransferSend& send = plan->sends[part.send];
      auto [item, src_box, crc] = held_item(send);
      v1::FetchPiece* p = f->add_pieces();
      *p->mutable_item() = item;
      p->set_expected_crc32c(crc);
      convert::BoxToProto(send.box, p->mutable_region());
    }
    absl::StatusOr<v1::PeerResponse> r =
        peers_.Call(msg.src_rank, std::move(pr));
    if (!r.ok()) {
      results[m] = r.status();
      return;
    }
    if (!PeerClient::StatusOf(*r).ok()) {
      results[m] = PeerClient::StatusOf(*r);
      return;
    }
    absl::StatusOr<std::string> payload =
        peers_.Receive(msg.src_rank, f->data_tag());
    if (!payload.ok() || payload->size() != msg.bytes) {
      results[m] = payload.ok()
                       ? absl::DataLossError(absl::StrCat(
                             "fetch from node ", msg.src_rank, " returned ",
                             payload->size(), " bytes, planned ", msg.bytes))
                       : payload.status();
      return;
    }
    std::vector<planner::CopySegment> local_segs;
    for (const auto& part : msg.parts) {
      const planner::TransferSend& send = plan->sends[part.send];
      const PeerLoadDest& d = dests[send.tensor][send.dest_index];
      local_segs.clear();
      planner::AppendCopySegments(send.box, d.box, send.box,
                                  planner::DTypeSize(send.dtype), &local_segs);
      for (const auto& s : local_segs) {
        std::memcpy(seg->data() + d.offset + s.dst_offset,
                    payload->data() + part.payload_offset + s.src_offset,
                    s.length);
      }
    }
  };
  TaskGroup fetches(&fetch_pool_);
  for (size_t m = 0; m < plan->messages.size(); ++m) {
    fetches.Run([&fetch, m] {
      fetch(m);
      return absl::OkStatus();  // errors are kept per message in `results`
    });
  }
  fetches.Wait().IgnoreError();
  for (const absl::Status& s : results) {
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
    }
  }
  response.set_bytes_peers(plan->network_bytes);
  response.set_step(step);
  response.set_shm_name(seg->name());
  response.set_shm_size(seg->size());
  const uint64_t id = next_id_.fetch_add(1);
  response.set_load_id(id);
  absl::MutexLock l(&mu_);
  loads_[id] = std::move(seg);
  return response;
}

absl::Status PeerLoader::Release(uint64_t load_id) {
  absl::MutexLock l(&mu_);
  if (loads_.erase(load_id) == 0) {
    return absl::NotFoundError(absl::StrCat("no load with id ", load_id));
  }
  return absl::OkStatus();
}

void PeerLoader::Clear() {
  std::map<uint64_t, std::shared_ptr<ShmSegment>> loads;
  {
    absl::MutexLock l(&mu_);
    loads.swap(loads_);
  }
}

}  // namespace cairn::agent
