// Replicator: pushes a committed tier 0 set to a peer agent (Replicate) and
// receives peers' pushes as replicas (HandlePush).
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
#include "planner/transfer_plan.h"
#include "proto/convert/plan_convert.h"
#include "server/agent/agent.h"
#include "server/agent/agent_internal.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"

namespace cairn::agent {

using internal::AlignUp;
using internal::DTypeOf;
using internal::IsBytes;
using internal::ItemBox;
using internal::ItemFqn;
using internal::kAlign;
using internal::PlanName;
using internal::ToStatus;
using internal::Where;
using shm::ShmSegment;

absl::Status Agent::Replicate(const std::shared_ptr<const Set>& set, int peer) {
  // The transfer schedule from this node to `peer` of every item (same
  // boxes): the planner buckets small items into messages by dtype.
  std::vector<planner::TransferTensor> tensors;
  std::map<std::string, int> tensor_index;
  std::vector<std::vector<int>> dest_item;  // tensor -> dest index -> item
  for (size_t i = 0; i < set->items.size(); ++i) {
    const v1::WriteItem& w = set->items[i].item;
    if (w.length() == 0) continue;
    const std::string name = PlanName(w);
    auto [it, inserted] =
        tensor_index.emplace(name, static_cast<int>(tensors.size()));
    if (inserted) {
      planner::TransferTensor t;
      t.fqn = name;
      if (IsBytes(w)) {
        t.dtype = planner::DType::kUInt8;
        t.global_shape = {static_cast<int64_t>(w.length())};
      } else {
        t.dtype = DTypeOf(w.tensor().dtype());
        t.global_shape.assign(w.tensor().global_shape().begin(),
                              w.tensor().global_shape().end());
      }
      tensors.push_back(std::move(t));
      dest_item.emplace_back();
    }
    planner::TransferTensor& t = tensors[it->second];
    t.sources.push_back({options_.node_id, ItemBox(w)});
    t.destinations.push_back({peer, ItemBox(w)});
    dest_item[it->second].push_back(static_cast<int>(i));
  }
  planner::TransferPlanOptions po;
  po.bucket_cap_bytes = options_.bucket_cap_bytes;
  CAIRN_ASSIGN_OR_RETURN(planner::TransferPlan plan,
                         planner::BuildTransferPlan(tensors, po));

  v1::PeerRequest request;
  v1::PushReplica* push = request.mutable_push();
  push->set_job(set->job);
  push->set_step(set->step);
  push->set_source_rank(set->rank);
  push->set_source_node(options_.node_id);
  std::vector<int> item_message(set->items.size(), -1);
  std::vector<uint64_t> item_offset(set->items.size(), 0);
  std::vector<std::string> payloads;
  for (size_t m = 0; m < plan.messages.size(); ++m) {
    const planner::TransferMessage& msg = plan.messages[m];
    std::string payload(msg.bytes, '\0');
    for (const auto& part : msg.parts) {
      const planner::TransferSend& send = plan.sends[part.send];
      const int item = dest_item[send.tensor][send.dest_index];
      const Item& it = set->items[item];
      item_message[item] = static_cast<int>(m);
      item_offset[item] = part.payload_offset;
      std::memcpy(payload.data() + part.payload_offset,
                  set->segment->data() + it.offset, it.item.length());
    }
    push->add_message_tags(NewTag());
    push->add_message_bytes(msg.bytes);
    payloads.push_back(std::move(payload));
  }
  for (size_t i = 0; i < set->items.size(); ++i) {
    v1::HeldItem* h = push->add_items();
    *h->mutable_item() = set->items[i].item;
    h->set_crc32c(set->items[i].crc32c);
    push->add_item_message(item_message[i]);
    push->add_item_offset(item_offset[i]);
  }
  CAIRN_ASSIGN_OR_RETURN(
      v1::PeerResponse response,
      CallPeer(peer, std::move(request), [&]() -> absl::Status {
        for (size_t m = 0; m < payloads.size(); ++m) {
          CAIRN_RETURN_IF_ERROR(transport_->Send(
              peer, push->message_tags(static_cast<int>(m)), payloads[m]));
        }
        return absl::OkStatus();
      }));
  return ToStatus(response);
}

absl::Status Agent::HandlePush(int peer, const v1::PushReplica& push) {
  const std::string where = absl::StrCat(
      "replica of ", Where(push.job(), push.step(), push.source_rank()),
      " from node ", peer);
  auto set = std::make_shared<Set>();
  set->job = push.job();
  set->step = push.step();
  set->rank = push.source_rank();
  set->replica = true;
  // Everything below indexes and sizes by what the peer sent: check it all
  // before anything is allocated or copied. A refused push's data messages
  // are abandoned (dropped as they arrive).
  auto refuse = [&](absl::Status s) {
    for (uint64_t tag : push.message_tags()) transport_->Abandon(peer, tag);
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
  const uint64_t budget = pool_->budget();
  uint64_t total = 0;
  for (int i = 0; i < push.items_size(); ++i) {
    const v1::HeldItem& h = push.items(i);
    const uint64_t n = h.item().length();
    const int m = push.item_message(i);
    if (m < 0 || m >= push.message_tags_size() || n > push.message_bytes(m) ||
        push.item_offset(i) > push.message_bytes(m) - n) {
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
  // Receive every message first (they are already on their way), then
  // place and verify the items.
  std::vector<std::string> messages(push.message_tags_size());
  absl::Status first;
  for (int m = 0; m < push.message_tags_size(); ++m) {
    absl::StatusOr<std::string> msg = transport_->RecvMessage(
        peer, push.message_tags(m), options_.peer_timeout);
    if (!msg.ok()) {
      first.Update(msg.status());
      continue;
    }
    if (msg->size() != push.message_bytes(m)) {
      first.Update(absl::DataLossError(
          absl::StrCat(where, ": message ", m, " has ", msg->size(),
                       " bytes, expected ", push.message_bytes(m))));
    }
    messages[m] = std::move(*msg);
  }
  CAIRN_RETURN_IF_ERROR(first);
  absl::StatusOr<std::shared_ptr<ShmSegment>> seg =
      pool_->Allocate(total, absl::Now() + options_.peer_timeout);
  if (!seg.ok()) {
    return absl::Status(seg.status().code(),
                        absl::StrCat(where, ": ", seg.status().message()));
  }
  set->segment = std::move(*seg);
  for (int i = 0; i < push.items_size(); ++i) {
    const Item& it = set->items[i];
    const uint64_t n = it.item.length();
    if (n == 0) continue;
    const int m = push.item_message(i);  // checked above; sizes match too
    char* dst = set->segment->data() + it.offset;
    std::memcpy(dst, messages[m].data() + push.item_offset(i), n);
    const uint32_t crc = storage::Crc32c(dst, n);
    if (crc != it.crc32c) {
      return absl::DataLossError(absl::StrFormat(
          "%s: item '%s' %s has crc32c 0x%08x, source said 0x%08x", where,
          ItemFqn(it.item), planner::BoxToString(ItemBox(it.item)), crc,
          it.crc32c));
    }
  }
  uint64_t received = 0;
  for (const Item& it : set->items) received += it.item.length();
  m_->replication_received_bytes->Increment(static_cast<double>(received));
  tier_.Keep(std::move(set));
  return absl::OkStatus();
}

}  // namespace cairn::agent
