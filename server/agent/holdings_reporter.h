// HoldingsReporter: tells cairnd, every `interval`, what this agent holds in
// memory (MemoryTier::Held, with the staging pool's budget and use) — its
// heartbeat, from which cairnd knows which memory checkpoints can be
// restored — and applies the answer: sets of checkpoints that are gone are
// freed, those persisted are unpinned, and cairnd's orders run in the
// background (write a held set to storage: `cairn persist`, or a promotion
// after copies were lost; push one to another node: a replacement node
// getting its copies back), their outcomes sent with the next report. An
// order already running is not started twice. A report cairnd does not
// answer is logged (once per outage) and the next one goes at the next
// interval.
//
// Thread-safe: one thread of its own; Stop() (or the destructor) ends it.
#ifndef CAIRN_SERVER_AGENT_HOLDINGS_REPORTER_H_
#define CAIRN_SERVER_AGENT_HOLDINGS_REPORTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "common/thread_pool.h"
#include "server/agent/memory_tier.h"

namespace cairn::agent {

class HoldingsReporter {
 public:
  struct Options {
    int node_id = 0;
    int num_nodes = 1;
    absl::Duration interval = absl::Seconds(1);
    absl::Duration rpc_timeout = absl::Seconds(5);
    // The staging pool's budget and bytes in use, read for each report.
    std::function<uint64_t()> budget_bytes;
    std::function<uint64_t()> used_bytes;
    // Run cairnd's orders (on the reporter's order threads).
    std::function<absl::Status(const v1::PersistOrder&)> persist;
    std::function<absl::Status(const v1::ReplicateOrder&)> replicate;
    int order_threads = 2;
  };
  // `coordinator` and `tier` must outlive this object. Starts reporting.
  HoldingsReporter(Options options, v1::Coordinator::Stub* coordinator,
                   MemoryTier& tier);
  ~HoldingsReporter();
  HoldingsReporter(const HoldingsReporter&) = delete;
  HoldingsReporter& operator=(const HoldingsReporter&) = delete;

  // One report now, on the caller's thread (tests; the loop does the same).
  absl::Status ReportOnce();
  // Reports answered so far.
  int64_t reports() const;
  void Stop();

 private:
  void Loop();
  // Starts `order` unless one of the same key runs; its outcome goes into
  // results_.
  void Start(const std::string& key, v1::OrderResult result,
             std::function<absl::Status()> run);

  const Options options_;
  v1::Coordinator::Stub* const coordinator_;
  MemoryTier& tier_;
  const uint64_t incarnation_;  // of this agent process

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failing_ ABSL_GUARDED_BY(mu_) = false;  // the last report failed
  int64_t reports_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> running_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::OrderResult> results_ ABSL_GUARDED_BY(mu_);
  // Declared after the state its tasks touch: destroyed (drained) first.
  std::unique_ptr<ThreadPool> orders_;
  std::thread thread_;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_HOLDINGS_REPORTER_H_
