// Staging pool: shared-memory segments counted against the staging budget
// (Allocate), reused by size, and eviction of tier 0 and replicas to make
// room (EvictOne).
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
using internal::kSegmentGranule;
using internal::Where;
using shm::ShmSegment;

// How often a wait for space checks whether its caller gave up.
constexpr absl::Duration kCallerCheckInterval = absl::Milliseconds(100);

bool Agent::EvictOne() {
  absl::MutexLock l(&mu_);
  // Replicas first (oldest step), then tier 0 (oldest step): both are
  // already durable in storage, so eviction only costs load speed.
  for (auto* m : {&replicas_, &tier0_}) {
    auto victim = m->end();
    for (auto it = m->begin(); it != m->end(); ++it) {
      if (victim == m->end() || it->second->step < victim->second->step) {
        victim = it;
      }
    }
    if (victim != m->end()) {
      CAIRN_LOG(info, "node {}: evicting {} of {} from memory",
                options_.node_id,
                victim->second->replica ? "replica" : "tier 0",
                Where(victim->second->job, victim->second->step,
                      victim->second->rank));
      m->erase(victim);
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::shared_ptr<ShmSegment>> Agent::Allocate(
    uint64_t bytes, absl::Time deadline,
    const std::function<bool()>& caller_gone) {
  const uint64_t size = AlignUp(std::max<uint64_t>(bytes, 1), kSegmentGranule);
  Pool& p = *pool_;
  if (size > p.budget) {
    return absl::ResourceExhaustedError(
        absl::StrCat("node ", options_.node_id, ": ", size,
                     " bytes do not fit the staging budget of ", p.budget,
                     " bytes (--staging-budget-mib)"));
  }
  auto wrap = [pool = pool_](ShmSegment* s) {
    return std::shared_ptr<ShmSegment>(
        s, [pool](ShmSegment* seg) { pool->Release(seg); });
  };
  while (true) {
    int64_t releases_seen;
    {
      absl::MutexLock l(&p.mu);
      for (size_t i = 0; i < p.free.size(); ++i) {
        if (p.free[i]->size() == size) {
          ShmSegment* s = p.free[i].release();
          p.free.erase(p.free.begin() + static_cast<long>(i));
          return wrap(s);
        }
      }
      while (p.used + size > p.budget && !p.free.empty()) {
        p.used -= p.free.back()->size();
        p.free.pop_back();
      }
      if (p.used + size <= p.budget) {
        const std::string name = absl::StrCat("/", p.prefix, ++p.seq);
        absl::StatusOr<std::unique_ptr<ShmSegment>> s = ShmSegment::Create(
            name, size,
            options_.shm_group == static_cast<gid_t>(-1) ? 0600 : 0660,
            options_.shm_group);
        if (!s.ok()) return s.status();
        p.used += size;
        p.peak = std::max(p.peak, p.used);
        return wrap(s->release());
      }
      releases_seen = p.releases;
    }
    if (EvictOne()) continue;
    absl::MutexLock l(&p.mu);
    auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
      return p.releases != releases_seen;
    };
    // Waits in slices when the caller may give up, to notice it.
    while (true) {
      if (caller_gone && caller_gone()) {
        return absl::CancelledError(absl::StrCat("node ", options_.node_id,
                                                 ": the rank gave up "
                                                 "waiting for ",
                                                 size,
                                                 " bytes of staging space"));
      }
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "node ", options_.node_id, ": no staging space for ", size,
            " bytes within the wait (budget ", p.budget, " bytes, ", p.used,
            " in use by in-flight saves and loads)"));
      }
      if (p.mu.AwaitWithTimeout(
              absl::Condition(&released),
              caller_gone ? std::min(left, kCallerCheckInterval) : left)) {
        break;
      }
    }
  }
}

}  // namespace cairn::agent
