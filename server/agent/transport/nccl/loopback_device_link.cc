#include "server/agent/transport/nccl/loopback_device_link.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace cairn::agent {

size_t LoopbackFabric::in_flight(int from, int to) {
  absl::MutexLock l(&mu_);
  auto it = queues_.find({from, to});
  return it == queues_.end() ? 0 : it->second.size();
}

absl::StatusOr<std::string> LoopbackDeviceLink::NewUniqueId() {
  return absl::StrCat("loopback-", fabric_->next_id_.fetch_add(1));
}

absl::Status LoopbackDeviceLink::Init(int num_nodes, int node,
                                      const std::string& up_id,
                                      const std::string& down_id,
                                      absl::Duration timeout) {
  LoopbackFabric& f = *fabric_;
  absl::MutexLock l(&f.mu_);
  const auto key = std::make_pair(up_id, down_id);
  ++f.joined_[key];
  auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(f.mu_) {
    return f.joined_[key] >= num_nodes;
  };
  if (!f.mu_.AwaitWithTimeout(absl::Condition(&all), timeout)) {
    --f.joined_[key];
    return absl::DeadlineExceededError(absl::StrCat(
        "loopback device link: node ", node, ": ", f.joined_[key] + 1, " of ",
        num_nodes, " nodes joined the communicators within ",
        absl::FormatDuration(timeout)));
  }
  node_ = node;
  num_nodes_ = num_nodes;
  return absl::OkStatus();
}

absl::Status LoopbackDeviceLink::Send(int peer, absl::Span<const char> data) {
  if (node_ < 0) {
    return absl::FailedPreconditionError("loopback device link: not joined");
  }
  LoopbackFabric& f = *fabric_;
  LoopbackFabric::Transfer t;
  t.data = data;
  absl::MutexLock l(&f.mu_);
  f.queues_[{node_, peer}].push_back(&t);
  // As ncclSend + stream sync: done when the peer's Recv took the bytes.
  auto done = [&t]() { return t.taken; };
  f.mu_.Await(absl::Condition(&done));
  if (t.failed) {
    return absl::DataLossError(absl::StrCat(
        "loopback device link: node ", peer, " received ", data.size(),
        " bytes from node ", node_, " with a Recv of another size"));
  }
  return absl::OkStatus();
}

absl::Status LoopbackDeviceLink::Recv(int peer, absl::Span<char> out) {
  if (node_ < 0) {
    return absl::FailedPreconditionError("loopback device link: not joined");
  }
  LoopbackFabric& f = *fabric_;
  absl::MutexLock l(&f.mu_);
  auto& q = f.queues_[{peer, node_}];
  auto arrived = [&q]() { return !q.empty(); };
  f.mu_.Await(absl::Condition(&arrived));
  LoopbackFabric::Transfer* t = q.front();
  q.pop_front();
  t->taken = true;
  if (t->data.size() != out.size()) {
    t->failed = true;
    return absl::DataLossError(absl::StrCat(
        "loopback device link: node ", node_, " expected ", out.size(),
        " bytes from node ", peer, ", got ", t->data.size()));
  }
  if (!out.empty()) std::memcpy(out.data(), t->data.data(), out.size());
  return absl::OkStatus();
}

}  // namespace cairn::agent
