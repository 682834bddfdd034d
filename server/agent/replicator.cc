// Replicator (replicator.h): a committed set pushed to a peer, bucketed by
// the planner's transfer schedule.
#include "server/agent/replicator.h"

#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "planner/transfer_plan.h"

namespace cairn::agent {

using internal::DTypeOf;
using internal::IsBytes;
using internal::ItemBox;
using internal::PlanName;

absl::Status Replicator::Push(const ItemSet& set, int peer) {
  // The transfer schedule from this node to `peer` of every item (same
  // boxes): the planner buckets small items into messages by dtype.
  std::vector<planner::TransferTensor> tensors;
  std::map<std::string, int> tensor_index;
  std::vector<std::vector<int>> dest_item;  // tensor -> dest index -> item
  for (size_t i = 0; i < set.items.size(); ++i) {
    const v1::WriteItem& w = set.items[i].item;
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
    t.sources.push_back({peers_.node_id(), ItemBox(w)});
    t.destinations.push_back({peer, ItemBox(w)});
    dest_item[it->second].push_back(static_cast<int>(i));
  }
  planner::TransferPlanOptions po;
  po.bucket_cap_bytes = bucket_cap_bytes_;
  CAIRN_ASSIGN_OR_RETURN(planner::TransferPlan plan,
                         planner::BuildTransferPlan(tensors, po));

  v1::PeerRequest request;
  v1::PushReplica* push = request.mutable_push();
  push->set_job(set.job);
  push->set_step(set.step);
  push->set_source_rank(set.rank);
  push->set_memory_tier(set.memory_tier);
  push->set_source_node(peers_.node_id());
  std::vector<int> item_message(set.items.size(), -1);
  std::vector<uint64_t> item_offset(set.items.size(), 0);
  std::vector<std::string> payloads;
  for (size_t m = 0; m < plan.messages.size(); ++m) {
    const planner::TransferMessage& msg = plan.messages[m];
    std::string payload(msg.bytes, '\0');
    for (const auto& part : msg.parts) {
      const planner::TransferSend& send = plan.sends[part.send];
      const int item = dest_item[send.tensor][send.dest_index];
      const StagedItem& it = set.items[item];
      item_message[item] = static_cast<int>(m);
      item_offset[item] = part.payload_offset;
      std::memcpy(payload.data() + part.payload_offset,
                  set.segment->data() + it.offset, it.item.length());
    }
    push->add_message_tags(peers_.NewTag());
    push->add_message_bytes(msg.bytes);
    payloads.push_back(std::move(payload));
  }
  for (size_t i = 0; i < set.items.size(); ++i) {
    v1::HeldItem* h = push->add_items();
    *h->mutable_item() = set.items[i].item;
    h->set_crc32c(set.items[i].crc32c);
    push->add_item_message(item_message[i]);
    push->add_item_offset(item_offset[i]);
  }
  CAIRN_ASSIGN_OR_RETURN(
      v1::PeerResponse response,
      peers_.Call(peer, std::move(request), [&]() -> absl::Status {
        for (size_t m = 0; m < payloads.size(); ++m) {
          CAIRN_RETURN_IF_ERROR(peers_.Send(
              peer, push->message_tags(static_cast<int>(m)), payloads[m]));
        }
        return absl::OkStatus();
      }));
  return PeerClient::StatusOf(response);
}

}  // namespace cairn::agent
