#include "server/agent/agent_directory.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "grpcpp/client_context.h"
#include "protocol/coordinator_call.h"

namespace cairn::agent {

AgentDirectory::AgentDirectory(AgentDirectoryOptions options)
    : options_(std::move(options)) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      protocol::NewCoordinatorChannel(options_.coordinator, options_.security);
  if (channel.ok()) {
    stub_ = v1::Coordinator::NewStub(*channel);
  } else {
    channel_status_ = channel.status();
  }
}

absl::StatusOr<int> AgentDirectory::Register(const std::string& peer_address) {
  if (!channel_status_.ok()) return channel_status_;
  v1::RegisterAgentRequest request;
  request.set_node_name(options_.node_name);
  request.set_peer_address(peer_address);
  request.set_num_nodes(options_.num_nodes);
  const absl::Time deadline = absl::Now() + options_.register_timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(
        std::min(absl::Now() + options_.rpc_timeout, deadline)));
    // Wait for a cairnd that is still starting instead of failing at once.
    context.set_wait_for_ready(true);
    v1::RegisterAgentResponse response;
    const absl::Status s =
        FromGrpcStatus(stub_->RegisterAgent(&context, request, &response));
    if (s.ok()) {
      // A later registration may have moved the table: see it next time.
      absl::MutexLock lock(&mu_);
      refreshed_at_ = absl::InfinitePast();
      return response.node_id();
    }
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) {
      return s;  // retrying cannot change the answer
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "node '", options_.node_name, "' could not register with cairnd at ",
          options_.coordinator, " within ",
          absl::FormatDuration(options_.register_timeout), " (", attempt,
          " attempts): ", s.message()));
    }
    CAIRN_LOG(info,
              "node '{}': cairnd at {} not reachable yet ({}); registering "
              "again in {}",
              options_.node_name, options_.coordinator, s.ToString(),
              absl::FormatDuration(backoff));
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

absl::Status AgentDirectory::RefreshLocked() {
  if (!channel_status_.ok()) return channel_status_;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  v1::ListAgentsResponse response;
  ++refreshes_;
  const absl::Status s = FromGrpcStatus(
      stub_->ListAgents(&context, v1::ListAgentsRequest(), &response));
  if (!s.ok()) return s;
  table_.clear();
  for (v1::AgentRecord& a : *response.mutable_agents()) {
    const int id = a.node_id();
    table_[id] = std::move(a);
  }
  have_table_ = true;
  refreshed_at_ = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<std::string> AgentDirectory::Resolve(int node) {
  absl::MutexLock lock(&mu_);
  absl::Status refreshed = absl::OkStatus();
  if (absl::Now() - refreshed_at_ >= options_.min_refresh_interval) {
    refreshed = RefreshLocked();
    if (!refreshed.ok()) {
      CAIRN_LOG(debug,
                "node '{}': cannot refresh the agent table from cairnd at "
                "{}: {}",
                options_.node_name, options_.coordinator, refreshed.ToString());
    }
  }
  if (!have_table_) {
    return absl::UnavailableError(absl::StrCat(
        "cannot ask cairnd at ", options_.coordinator,
        " for the address of node ", node, ": ", refreshed.message()));
  }
  auto it = table_.find(node);
  if (it == table_.end()) {
    // A node cairnd does not know: unless cairnd could not be asked, no
    // connect retry can succeed.
    const std::string msg = absl::StrCat(
        "no agent has registered as node ", node, " with cairnd at ",
        options_.coordinator, " (", table_.size(), " registered)");
    if (!refreshed.ok()) {
      return absl::UnavailableError(
          absl::StrCat(msg, "; cairnd unreachable: ", refreshed.message()));
    }
    return absl::FailedPreconditionError(msg);
  }
  if (it->second.peer_address().empty()) {
    return absl::UnavailableError(
        absl::StrCat("node ", node, " ('", it->second.node_name(),
                     "') has registered but is not serving yet"));
  }
  return it->second.peer_address();
}

int64_t AgentDirectory::refreshes() const {
  absl::MutexLock lock(&mu_);
  return refreshes_;
}

}  // namespace cairn::agent
