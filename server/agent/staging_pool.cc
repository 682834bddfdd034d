#include "server/agent/staging_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace cairn::agent {

using shm::ShmSegment;

// How often a wait for space checks whether its caller gave up.
constexpr absl::Duration kCallerCheckInterval = absl::Milliseconds(100);

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(
    Options options) {
  auto state = std::make_shared<State>();
  const std::string node_prefix =
      absl::StrCat("cairn-agent-", options.node_id, "-");
  shm::RemoveStaleSegments(node_prefix);
  CAIRN_ASSIGN_OR_RETURN(state->family, shm::SegmentFamily::Claim(node_prefix));
  state->prefix = state->family->name_prefix();
  state->node_id = options.node_id;
  state->budget = options.budget_bytes;
  state->shm_group = options.shm_group;
  return std::unique_ptr<StagingPool>(
      new StagingPool(std::move(state), std::move(options.evict)));
}

uint64_t StagingPool::SegmentSize(uint64_t bytes) {
  const uint64_t b = std::max<uint64_t>(bytes, 1);
  return (b + kSegmentGranule - 1) / kSegmentGranule * kSegmentGranule;
}

void StagingPool::State::Release(ShmSegment* s) {
  absl::MutexLock l(&mu);
  if (discard.erase(s) > 0) {
    used -= s->size();
    delete s;  // unlinks it; a rank's mapping stays valid but private
  } else {
    free.emplace_back(s);
  }
  ++releases;
}

void StagingPool::Discard(const ShmSegment* segment) {
  absl::MutexLock l(&state_->mu);
  state_->discard.insert(segment);
}

StagingPool::Stats StagingPool::stats() const {
  absl::MutexLock l(&state_->mu);
  Stats s;
  s.used_bytes = state_->used;
  s.peak_used_bytes = state_->peak;
  return s;
}

absl::StatusOr<std::shared_ptr<ShmSegment>> StagingPool::Allocate(
    uint64_t bytes, absl::Time deadline,
    const std::function<bool()>& caller_gone) {
  const uint64_t size = SegmentSize(bytes);
  State& p = *state_;
  if (size > p.budget) {
    return absl::ResourceExhaustedError(
        absl::StrCat("node ", p.node_id, ": ", size,
                     " bytes do not fit the staging budget of ", p.budget,
                     " bytes (--staging-budget-mib)"));
  }
  auto wrap = [state = state_](ShmSegment* s) {
    return std::shared_ptr<ShmSegment>(
        s, [state](ShmSegment* seg) { state->Release(seg); });
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
            name, size, p.shm_group == static_cast<gid_t>(-1) ? 0600 : 0660,
            p.shm_group);
        if (!s.ok()) return s.status();
        p.used += size;
        p.peak = std::max(p.peak, p.used);
        return wrap(s->release());
      }
      releases_seen = p.releases;
    }
    if (evict_ && evict_()) continue;
    absl::MutexLock l(&p.mu);
    auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
      return p.releases != releases_seen;
    };
    // Waits in slices when the caller may give up, to notice it.
    while (true) {
      if (caller_gone && caller_gone()) {
        return absl::CancelledError(absl::StrCat("node ", p.node_id,
                                                 ": the rank gave up "
                                                 "waiting for ",
                                                 size,
                                                 " bytes of staging space"));
      }
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "node ", p.node_id, ": no staging space for ", size,
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
