// Peer service: control messages between agents (CallPeer, HandleControl)
// and the requests peers serve: Inventory (what this agent holds) and Fetch
// (send held regions).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/crash_point.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "planner/load_plan.h"
#include "planner/transfer_plan.h"
#include "proto/convert/plan_convert.h"
#include "server/agent/agent.h"
#include "server/agent/agent_internal.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"

namespace cairn::agent {

using internal::ItemBox;
using internal::ItemElemSize;
using internal::ItemFqn;
using internal::SameItem;

absl::StatusOr<v1::PeerResponse> Agent::CallPeer(
    int peer, v1::PeerRequest request,
    const std::function<absl::Status()>& after_send) {
  const uint64_t reply_tag = NewTag();
  request.set_reply_tag(reply_tag);
  request.set_from_node(options_.node_id);
  CAIRN_RETURN_IF_ERROR(transport_->Send(peer, kControlTagBit | NewTag(),
                                         request.SerializeAsString()));
  if (after_send) CAIRN_RETURN_IF_ERROR(after_send());
  CAIRN_ASSIGN_OR_RETURN(
      std::string reply,
      transport_->RecvMessage(peer, reply_tag, options_.peer_timeout));
  v1::PeerResponse response;
  if (!response.ParseFromString(reply)) {
    return absl::DataLossError(
        absl::StrCat("unparsable reply from peer node ", peer));
  }
  return response;
}

void Agent::HandleControl(int peer, uint64_t tag, std::string payload) {
  (void)tag;
  v1::PeerRequest request;
  v1::PeerResponse response;
  if (!request.ParseFromString(payload)) {
    CAIRN_LOG(warn, "node {}: unparsable control message from node {}",
              options_.node_id, peer);
    return;
  }
  absl::Status s;
  switch (request.kind_case()) {
    case v1::PeerRequest::kPush:
      s = HandlePush(peer, request.push());
      break;
    case v1::PeerRequest::kInventory:
      *response.mutable_inventory() = tier_.Inventory(
          request.inventory().job(), request.inventory().step());
      break;
    case v1::PeerRequest::kFetch: {
      absl::StatusOr<uint64_t> n = HandleFetch(peer, request.fetch());
      if (n.ok()) {
        response.set_fetch_bytes(*n);
      } else {
        s = n.status();
      }
      break;
    }
    default:
      s = absl::InvalidArgumentError("unknown peer request");
  }
  response.set_code(static_cast<int>(s.code()));
  response.set_message(std::string(s.message()));
  absl::Status sent =
      transport_->Send(peer, request.reply_tag(), response.SerializeAsString());
  if (!sent.ok()) {
    CAIRN_LOG(warn, "node {}: reply to node {} failed: {}", options_.node_id,
              peer, sent.ToString());
  }
}

absl::StatusOr<uint64_t> Agent::HandleFetch(int peer,
                                            const v1::FetchRequest& req) {
  // Every piece is checked (held here, region inside the held chunk) before
  // the reply is allocated: its size comes from the network.
  struct Piece {
    std::shared_ptr<const Set> set;
    const Item* item;
    planner::ChunkBox region;
    size_t elem;
  };
  std::vector<Piece> pieces;
  uint64_t total = 0;
  uint64_t segments = 0;
  for (const v1::FetchPiece& p : req.pieces()) {
    CAIRN_ASSIGN_OR_RETURN(
        auto held,
        tier_.Find(req.job(), req.step(), p.item(), p.expected_crc32c()));
    planner::ChunkBox region;
    CAIRN_ASSIGN_OR_RETURN(
        region, convert::BoxFromProto(p.region(), ItemFqn(p.item())));
    const size_t elem = ItemElemSize(p.item());
    const planner::ChunkBox src_box = ItemBox(held.second->item);
    if (!planner::Contains(src_box, region) ||
        elem != ItemElemSize(held.second->item)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fetch of '", ItemFqn(p.item()), "' region ",
                       planner::BoxToString(region), " outside held chunk ",
                       planner::BoxToString(src_box)));
    }
    // The copy segments the reply is built with, counted before any is:
    // a region cutting a chunk into single elements would otherwise need
    // one each (24 bytes in memory per element copied).
    const uint64_t n = planner::NumCopySegments(src_box, region, region);
    if (n > planner::kMaxCopySegmentsPerPlan - segments) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "fetch from node ", peer, " of job '", req.job(), "' step ",
          req.step(), ": '", ItemFqn(p.item()), "' region ",
          planner::BoxToString(region), " of held chunk ",
          planner::BoxToString(src_box), " needs ", n,
          " copy segments; with the fetch's other pieces more than the ",
          planner::kMaxCopySegmentsPerPlan, " one fetch may build"));
    }
    segments += n;
    const uint64_t bytes =
        static_cast<uint64_t>(planner::Volume(region)) * elem;
    if (total + bytes > pool_->budget()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "fetch from node ", peer, " of more than the staging budget of ",
          pool_->budget(), " bytes"));
    }
    total += bytes;
    pieces.push_back({std::move(held.first), held.second, region, elem});
  }
  std::string payload(total, '\0');
  uint64_t cursor = 0;
  std::vector<planner::CopySegment> segs;
  for (const Piece& piece : pieces) {
    const planner::ChunkBox& region = piece.region;
    const size_t elem = piece.elem;
    const planner::ChunkBox src_box = ItemBox(piece.item->item);
    segs.clear();
    planner::AppendCopySegments(src_box, region, region, elem, &segs);
    const char* src = piece.set->segment->data() + piece.item->offset;
    for (const auto& s : segs) {
      std::memcpy(payload.data() + cursor + s.dst_offset, src + s.src_offset,
                  s.length);
    }
    cursor += static_cast<uint64_t>(planner::Volume(region)) * elem;
  }
  CAIRN_RETURN_IF_ERROR(transport_->Send(peer, req.data_tag(), payload));
  return total;
}

}  // namespace cairn::agent
