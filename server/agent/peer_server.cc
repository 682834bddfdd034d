// PeerServer (peer_server.h): a peer's Push kept as a replica, Inventory
// and Fetch answered from the memory tier.
#include "server/agent/peer_server.h"

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "planner/box.h"
#include "planner/load_plan.h"
#include "proto/convert/plan_convert.h"
#include "server/agent/items.h"
#include "storage/checksum.h"

namespace cairn::agent {

using internal::AlignUp;
using internal::ItemBox;
using internal::ItemElemSize;
using internal::ItemFqn;
using internal::kAlign;
using internal::Where;
using shm::ShmSegment;
using Item = StagedItem;
using Set = ItemSet;

void PeerServer::Handle(int peer, uint64_t tag, const std::string& payload) {
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
      transport_.Send(peer, request.reply_tag(), response.SerializeAsString());
  if (!sent.ok()) {
    CAIRN_LOG(warn, "node {}: reply to node {} failed: {}", options_.node_id,
              peer, sent.ToString());
  }
}

absl::Status PeerServer::HandlePush(int peer, const v1::PushReplica& push) {
  const std::string where = absl::StrCat(
      "replica of ", Where(push.job(), push.step(), push.source_rank()),
      " from node ", peer);
  auto set = std::make_shared<Set>();
  set->job = push.job();
  set->step = push.step();
  set->rank = push.source_rank();
  set->replica = true;
  set->memory_tier = push.memory_tier();
  // Everything below indexes and sizes by what the peer sent: check it all
  // before anything is allocated or copied. A refused push's data messages
  // are abandoned (dropped as they arrive).
  auto refuse = [&](absl::Status s) {
    for (uint64_t tag : push.message_tags()) transport_.Abandon(peer, tag);
    return s;
  };
  if (push.item_message_size() != push.items_size() ||
      push.item_offset_size() != push.items_size() ||
      push.message_bytes_size() != push.message_tags_size()) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        where, ": malformed push (", push.items_size(), " items, ",
        push.item_message_size(), " item messages, ", push.item_offset_size(),
        " item offsets, ", push.message_tags_size(), " message tags, ",
        push.message_bytes_size(), " message sizes)")));
  }
  const uint64_t budget = pool_.budget();
  uint64_t total = 0;
  for (int i = 0; i < push.items_size(); ++i) {
    const v1::HeldItem& h = push.items(i);
    const uint64_t n = h.item().length();
    const int m = push.item_message(i);
    // An empty item (an empty local shard) travels in no message: the
    // replicator sends it with message -1.
    const bool in_message = m >= 0 && m < push.message_tags_size() &&
                            n <= push.message_bytes(m) &&
                            push.item_offset(i) <= push.message_bytes(m) - n;
    if (!in_message && !(n == 0 && m == -1)) {
      return refuse(absl::InvalidArgumentError(
          absl::StrCat(where, ": item '", ItemFqn(h.item()), "' (", n,
                       " bytes) lies outside its message")));
    }
    if (n > budget || total > budget - n) {
      return refuse(absl::ResourceExhaustedError(absl::StrCat(
          where, ": more than the staging budget of ", budget, " bytes")));
    }
    Item it;
    it.item = h.item();
    it.crc32c = h.crc32c();
    it.offset = total;
    total = AlignUp(total + n, kAlign);
    set->items.push_back(std::move(it));
  }
  // The segment first, then each message placed and verified as it comes
  // (the next ones keep arriving meanwhile), so the push ends soon after its
  // last byte and at most one message is held beside the segment. On a
  // failure the remaining messages are still received (and dropped): the
  // mailbox is left empty.
  absl::StatusOr<std::shared_ptr<ShmSegment>> seg =
      pool_.Allocate(total, absl::Now() + options_.peer_timeout);
  if (!seg.ok()) {
    return refuse(
        absl::Status(seg.status().code(),
                     absl::StrCat(where, ": ", seg.status().message())));
  }
  set->segment = std::move(*seg);
  std::vector<std::vector<int>> items_of(push.message_tags_size());
  for (int i = 0; i < push.items_size(); ++i) {
    if (set->items[i].item.length() > 0) {
      items_of[push.item_message(i)].push_back(i);
    }
  }
  absl::Status first;
  for (int m = 0; m < push.message_tags_size(); ++m) {
    absl::StatusOr<std::string> msg = transport_.RecvMessage(
        peer, push.message_tags(m), options_.peer_timeout);
    if (!msg.ok()) {
      first.Update(msg.status());
      continue;
    }
    if (msg->size() != push.message_bytes(m)) {
      first.Update(absl::DataLossError(
          absl::StrCat(where, ": message ", m, " has ", msg->size(),
                       " bytes, expected ", push.message_bytes(m))));
      continue;
    }
    if (!first.ok()) continue;
    for (int i : items_of[m]) {
      const Item& it = set->items[i];
      const uint64_t n = it.item.length();
      char* dst = set->segment->data() + it.offset;
      std::memcpy(dst, msg->data() + push.item_offset(i), n);
      const uint32_t crc = storage::Crc32c(dst, n);
      if (crc != it.crc32c) {
        first.Update(absl::DataLossError(absl::StrFormat(
            "%s: item '%s' %s has crc32c 0x%08x, source said 0x%08x", where,
            ItemFqn(it.item), planner::BoxToString(ItemBox(it.item)), crc,
            it.crc32c)));
        break;
      }
    }
  }
  CAIRN_RETURN_IF_ERROR(first);
  uint64_t received = 0;
  for (const Item& it : set->items) received += it.item.length();
  if (options_.received_bytes != nullptr) {
    options_.received_bytes->Increment(static_cast<double>(received));
  }
  tier_.Keep(std::move(set));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PeerServer::HandleFetch(int peer,
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
    if (total + bytes > pool_.budget()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "fetch from node ", peer, " of more than the staging budget of ",
          pool_.budget(), " bytes"));
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
  CAIRN_RETURN_IF_ERROR(transport_.Send(peer, req.data_tag(), payload));
  return total;
}

}  // namespace cairn::agent
