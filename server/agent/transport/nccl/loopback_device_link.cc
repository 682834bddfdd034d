#include "server/agent/transport/nccl/loopback_device_link.h"

#include <algorithm>
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
  absl::MutexLock dl(&mu_);
  aborted_up_ = absl::OkStatus();  // new communicators
  aborted_down_ = absl::OkStatus();
  return absl::OkStatus();
}

absl::Status LoopbackDeviceLink::CheckDirection(int peer) {
  absl::MutexLock l(&mu_);
  const absl::Status& aborted = peer > node_ ? aborted_up_ : aborted_down_;
  if (aborted.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("loopback device link: node ", node_,
                   ": the communicator to ", peer > node_ ? "higher" : "lower",
                   " nodes was aborted: ", aborted.message()));
}

void LoopbackDeviceLink::AbortDirection(int peer, const absl::Status& reason) {
  absl::MutexLock l(&mu_);
  (peer > node_ ? aborted_up_ : aborted_down_) = reason;
}

absl::Status LoopbackDeviceLink::Send(int peer, absl::Span<const char> data,
                                      absl::Duration timeout) {
  if (node_ < 0) {
    return absl::FailedPreconditionError("loopback device link: not joined");
  }
  if (absl::Status s = CheckDirection(peer); !s.ok()) return s;
  LoopbackFabric& f = *fabric_;
  LoopbackFabric::Transfer t;
  t.data = data;
  {
    absl::MutexLock l(&f.mu_);
    std::deque<LoopbackFabric::Transfer*>& q = f.queues_[{node_, peer}];
    q.push_back(&t);
    // As ncclSend + waiting for the stream: done when the peer's Recv took
    // the bytes.
    auto done = [&t]() { return t.taken; };
    if (f.mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
      if (t.failed) {
        return absl::DataLossError(absl::StrCat(
            "loopback device link: node ", peer, " received ", data.size(),
            " bytes from node ", node_, " with a Recv of another size"));
      }
      return absl::OkStatus();
    }
    q.erase(std::find(q.begin(), q.end(), &t));
  }
  const absl::Status failed = absl::DeadlineExceededError(absl::StrCat(
      "loopback device link: node ", node_, " sending ", data.size(),
      " bytes to node ", peer, " did not complete within ",
      absl::FormatDuration(timeout), "; communicator aborted"));
  AbortDirection(peer, failed);
  return failed;
}

absl::Status LoopbackDeviceLink::Recv(int peer, absl::Span<char> out,
                                      absl::Duration timeout) {
  if (node_ < 0) {
    return absl::FailedPreconditionError("loopback device link: not joined");
  }
  if (absl::Status s = CheckDirection(peer); !s.ok()) return s;
  LoopbackFabric& f = *fabric_;
  {
    absl::MutexLock l(&f.mu_);
    auto& q = f.queues_[{peer, node_}];
    auto arrived = [&q]() { return !q.empty(); };
    if (f.mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout)) {
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
  }
  const absl::Status failed = absl::DeadlineExceededError(absl::StrCat(
      "loopback device link: node ", node_, " receiving ", out.size(),
      " bytes from node ", peer, " did not complete within ",
      absl::FormatDuration(timeout), "; communicator aborted"));
  AbortDirection(peer, failed);
  return failed;
}

}  // namespace cairn::agent
