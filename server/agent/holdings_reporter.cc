// HoldingsReporter (holdings_reporter.h).
#include "server/agent/holdings_reporter.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "protocol/save_protocol.h"
#include "server/agent/items.h"

namespace cairn::agent {

HoldingsReporter::HoldingsReporter(Options options,
                                   v1::Coordinator::Stub* coordinator,
                                   MemoryTier& tier)
    : options_(std::move(options)),
      coordinator_(coordinator),
      tier_(tier),
      incarnation_(protocol::NewIncarnation()) {
  thread_ = std::thread([this] { Loop(); });
}

HoldingsReporter::~HoldingsReporter() { Stop(); }

void HoldingsReporter::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t HoldingsReporter::reports() const {
  absl::MutexLock l(&mu_);
  return reports_;
}

absl::Status HoldingsReporter::ReportOnce() {
  v1::ReportHoldingsRequest request;
  request.set_node_id(options_.node_id);
  request.set_num_nodes(options_.num_nodes);
  request.set_incarnation(incarnation_);
  if (options_.budget_bytes) request.set_budget_bytes(options_.budget_bytes());
  if (options_.used_bytes) request.set_used_bytes(options_.used_bytes());
  for (v1::HeldShards& h : tier_.Held()) *request.add_held() = std::move(h);
  v1::ReportHoldingsResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  absl::Status s =
      FromGrpcStatus(coordinator_->ReportHoldings(&ctx, request, &response));
  if (!s.ok()) return s;
  for (const v1::HeldShards& h : response.drop()) {
    if (tier_.Drop(h.job(), h.step(), h.rank()) > 0) {
      CAIRN_LOG(info, "node {}: freed {} (cairnd: the checkpoint is gone)",
                options_.node_id, internal::Where(h.job(), h.step(), h.rank()));
    }
  }
  for (const v1::HeldShards& h : response.unpin()) {
    tier_.Unpin(h.job(), h.step(), h.rank());
  }
  absl::MutexLock l(&mu_);
  ++reports_;
  return absl::OkStatus();
}

void HoldingsReporter::Loop() {
  absl::Time next = absl::Now();
  while (true) {
    {
      absl::MutexLock l(&mu_);
      auto stop = [this]()
                      ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithDeadline(absl::Condition(&stop), next)) return;
    }
    next = absl::Now() + options_.interval;
    absl::Status s = ReportOnce();
    absl::MutexLock l(&mu_);
    if (!s.ok() && !failing_) {
      CAIRN_LOG(warn,
                "node {}: cannot report what it holds to cairnd ({}); its "
                "memory checkpoints count as lost there until it can",
                options_.node_id, s.ToString());
    } else if (s.ok() && failing_) {
      CAIRN_LOG(info, "node {}: reporting to cairnd again", options_.node_id);
    }
    failing_ = !s.ok();
  }
}

}  // namespace cairn::agent
