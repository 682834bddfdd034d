// HoldingsReporter (holdings_reporter.h).
#include "server/agent/holdings_reporter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
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
      incarnation_(protocol::NewIncarnation()),
      orders_(
          std::make_unique<ThreadPool>(std::max(options_.order_threads, 1))) {
  thread_ = std::thread([this] { Loop(); });
}

HoldingsReporter::~HoldingsReporter() { Stop(); }

void HoldingsReporter::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  orders_.reset();  // waits for the orders running
}

void HoldingsReporter::Start(const std::string& key, v1::OrderResult result,
                             std::function<absl::Status()> run) {
  {
    absl::MutexLock l(&mu_);
    if (stopping_ || !running_.insert(key).second) return;
  }
  orders_->Schedule([this, key, result, run = std::move(run)]() mutable {
    const absl::Status s = run();
    result.set_code(static_cast<int32_t>(s.code()));
    result.set_message(std::string(s.message()));
    if (!s.ok()) {
      CAIRN_LOG(warn, "node {}: cairnd's order for {} failed: {}",
                options_.node_id,
                internal::Where(result.job(), result.step(), result.rank()),
                s.ToString());
    }
    absl::MutexLock l(&mu_);
    running_.erase(key);
    results_.push_back(std::move(result));
  });
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
  std::vector<v1::OrderResult> results;
  {
    absl::MutexLock l(&mu_);
    results.swap(results_);
  }
  for (const v1::OrderResult& r : results) *request.add_results() = r;
  v1::ReportHoldingsResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  absl::Status s =
      FromGrpcStatus(coordinator_->ReportHoldings(&ctx, request, &response));
  if (!s.ok()) {
    // Sent again with the next report.
    absl::MutexLock l(&mu_);
    results_.insert(results_.end(), results.begin(), results.end());
    return s;
  }
  for (const v1::HeldShards& h : response.drop()) {
    if (tier_.Drop(h.job(), h.step(), h.rank()) > 0) {
      CAIRN_LOG(info, "node {}: freed {} (cairnd: the checkpoint is gone)",
                options_.node_id, internal::Where(h.job(), h.step(), h.rank()));
    }
  }
  for (const v1::HeldShards& h : response.unpin()) {
    tier_.Unpin(h.job(), h.step(), h.rank());
  }
  for (const v1::PersistOrder& o : response.persist()) {
    if (!options_.persist) continue;
    v1::OrderResult r;
    r.set_job(o.job());
    r.set_step(o.step());
    r.set_rank(o.rank());
    r.set_to_node(-1);
    Start(absl::StrCat("persist/", o.job(), "/", o.step(), "/", o.rank()), r,
          [this, o] { return options_.persist(o); });
  }
  for (const v1::ReplicateOrder& o : response.replicate()) {
    if (!options_.replicate) continue;
    v1::OrderResult r;
    r.set_job(o.job());
    r.set_step(o.step());
    r.set_rank(o.rank());
    r.set_to_node(o.to_node());
    Start(absl::StrCat("replicate/", o.job(), "/", o.step(), "/", o.rank(), "/",
                       o.to_node()),
          r, [this, o] { return options_.replicate(o); });
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
