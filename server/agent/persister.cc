// Persister: writes staged sets (Persist) and streaming saves
// (PersistStream / StreamToStorage) to storage through cairnd's save
// protocol, on persist threads; WaitSave reports the outcome.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
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

using internal::DTypeOf;
using internal::IsBytes;
using internal::ItemBox;
using internal::ItemFqn;
using internal::PlanName;
using internal::Where;

absl::Status Agent::StartPersistThread(std::function<void()> fn) {
  std::list<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>>
      finished;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return absl::UnavailableError("cairn-agent is stopping");
    for (auto it = persist_threads_.begin(); it != persist_threads_.end();) {
      auto next = std::next(it);
      if (it->second->load()) {
        finished.splice(finished.end(), persist_threads_, it);
      }
      it = next;
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    persist_threads_.emplace_back(std::thread([fn = std::move(fn), done] {
                                    fn();
                                    *done = true;
                                  }),
                                  done);
  }
  for (auto& t : finished) t.first.join();
  return absl::OkStatus();
}

void Agent::PersistStream(const std::shared_ptr<Stream>& st) {
  const absl::Time t0 = absl::Now();
  m_->persist_queue->Add(1);
  absl::StatusOr<v1::CheckpointRecord> r = StreamToStorage(*st);
  m_->persist_queue->Sub(1);
  RecordPersist(r.ok(), st->written_bytes, t0);
  {
    absl::MutexLock l(&st->mu);
    if (!r.ok() && st->failed.ok()) st->failed = r.status();
    // Buckets still held after a failure are destroyed, never reused: the
    // rank may still be writing into the one it holds.
    if (st->handed.has_value()) pool_->Discard(st->handed->segment.get());
    st->handed.reset();
    st->filled.clear();
    st->pieces.clear();
  }
  if (r.ok()) {
    absl::MutexLock l(&mu_);
    streams_.erase(st->save_id);
  }
  const Set& set = *st->set;
  absl::MutexLock l(&mu_);
  SaveResult& res = results_[Key{set.job, set.step, set.rank}];
  res.done = true;
  if (r.ok()) {
    res.record = *r;
    ++commits_;
    ++streamed_saves_;
    CAIRN_LOG(info, "node {}: {} committed (streamed, {} items) in {}",
              options_.node_id, st->where, set.items.size(),
              absl::FormatDuration(absl::Now() - t0));
  } else {
    res.status = r.status();
    CAIRN_LOG(warn, "node {}: streaming {} failed: {}", options_.node_id,
              st->where, r.status().ToString());
  }
}

absl::StatusOr<v1::CheckpointRecord> Agent::StreamToStorage(Stream& st) {
  const Set& set = *st.set;
  CAIRN_ASSIGN_OR_RETURN(RankProtocol * rp, ProtocolFor(set));
  absl::Mutex* lock;
  {
    absl::MutexLock l(&mu_);
    auto& m = persist_locks_[{set.job, set.rank}];
    if (!m) m = std::make_unique<absl::Mutex>();
    lock = m.get();
  }
  absl::MutexLock pl(lock);
  CAIRN_RETURN_IF_ERROR(StartPersisting(rp, set));
  absl::Cleanup end_persisting = [this, rp] { EndPersisting(rp); };
  if (set.incarnation != 0) rp->protocol->set_incarnation(set.incarnation);
  v1::LocalSavePlan proto;
  proto.set_rank(set.rank);
  for (const Item& it : set.items) *proto.add_items() = it.item;
  CAIRN_ASSIGN_OR_RETURN(planner::LocalSavePlan local,
                         convert::LocalPlanFromProto(proto));
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<protocol::PlannedSave> save,
                         rp->protocol->Begin(set.step, local));
  const v1::BeginSaveResponse& plan = save->plan();
  for (const v1::PlannedWrite& w : plan.rank_plan().writes()) {
    st.written_bytes += w.location().length();
  }
  bool committing = false;
  absl::StatusOr<v1::CheckpointRecord> result =
      [&]() -> absl::StatusOr<v1::CheckpointRecord> {
    // Storage order of cairnd's writes for this rank (the protocol's object
    // order, writes by offset), each matched to the staged item it names,
    // cut into pieces of at most one bucket.
    const auto& writes = plan.rank_plan().writes();
    std::map<std::pair<std::string, planner::ChunkBox>, int> by_key;
    for (size_t i = 0; i < set.items.size(); ++i) {
      by_key[{PlanName(set.items[i].item), ItemBox(set.items[i].item)}] =
          static_cast<int>(i);
    }
    std::vector<int> write_item(writes.size());
    for (int i = 0; i < writes.size(); ++i) {
      const v1::WriteItem& w = writes[i].item();
      auto it = by_key.find({PlanName(w), ItemBox(w)});
      if (it == by_key.end() || set.items[it->second].item.length() !=
                                    writes[i].location().length()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cairnd planned '", ItemFqn(w), "' ",
            planner::BoxToString(ItemBox(w)),
            " for this rank, which did not stage it with that length"));
      }
      write_item[i] = it->second;
    }
    std::vector<Stream::Piece> pieces;
    for (const protocol::PlannedObject& object : save->objects()) {
      for (int i : object.writes) {
        const uint64_t len = writes[i].location().length();
        for (uint64_t off = 0; off < len; off += st.bucket_bytes) {
          pieces.push_back({i, off, std::min(st.bucket_bytes, len - off)});
        }
      }
    }
    {
      absl::MutexLock l(&st.mu);
      st.pieces = pieces;
      st.write_item = std::move(write_item);
      st.plan_ready = true;
    }
    std::optional<Stream::Bucket> cur;
    size_t pi = 0;
    for (size_t o = 0; o < save->objects().size(); ++o) {
      CAIRN_ASSIGN_OR_RETURN(
          std::unique_ptr<protocol::PlannedObjectWriter> writer,
          save->OpenObject(o));
      for (int i : save->objects()[o].writes) {
        for (uint64_t done = 0; done < writes[i].location().length();) {
          if (!cur.has_value() || pi == cur->end) {
            cur.reset();  // frees the written bucket for the rank's next one
            absl::MutexLock l(&st.mu);
            CAIRN_RETURN_IF_ERROR(st.AwaitRank(
                [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
                  return !st.filled.empty();
                },
                options_.stream_idle_timeout, stopping_flag_));
            cur = std::move(st.filled.front());
            st.filled.pop_front();
            if (cur->begin != pi) {
              return absl::InternalError(
                  absl::StrCat("bucket ", cur->seq, " out of order"));
            }
          }
          const Stream::Piece& p = pieces[pi];
          const char* data =
              cur->segment->data() + cur->offsets[pi - cur->begin];
          CAIRN_RETURN_IF_ERROR(writer->Append(
              absl::MakeConstSpan(data, static_cast<size_t>(p.length))));
          CAIRN_CRASH_POINT("agent.stream.mid_write");
          done += p.length;
          ++pi;
        }
        CAIRN_RETURN_IF_ERROR(writer->FinishItem());
      }
      // Every byte durable before the commit.
      CAIRN_RETURN_IF_ERROR(writer->Close());
    }
    cur.reset();
    {
      absl::MutexLock l(&st.mu);
      CAIRN_RETURN_IF_ERROR(st.AwaitRank(
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) { return st.finished; },
          options_.stream_idle_timeout, stopping_flag_));
      if (st.die_before_commit) {
        save->SetBeforeCommitForTest([] { _exit(137); });
      }
    }
    committing = true;
    return save->Commit();
  }();
  if (!result.ok()) {
    // A refused CommitSave too: the save must not linger until cairnd's
    // commit deadline (cairnd's answer then names the cause).
    absl::Status reported = save->Abort(result.status());
    return committing ? result.status() : reported;
  }
  return result;
}

absl::StatusOr<Agent::RankProtocol*> Agent::ProtocolFor(const Set& set) {
  absl::MutexLock l(&mu_);
  std::unique_ptr<RankProtocol>& rp = protocols_[{set.job, set.rank}];
  if (rp == nullptr || rp->protocol->options().world_size != set.world_size) {
    CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(set.job));
    if (set.world_size < 1 || set.rank < 0 || set.rank >= set.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("job '", set.job, "': rank ", set.rank,
                       " is out of range for world_size ", set.world_size));
    }
    protocol::SaveProtocolOptions o;
    o.job = set.job;
    o.rank = set.rank;
    o.world_size = set.world_size;
    o.store = options_.store;
    o.contact = coordinator_contact_.get();
    auto fresh = std::make_unique<RankProtocol>();
    o.cancellation = &fresh->cancel;
    fresh->protocol =
        std::make_unique<protocol::SaveProtocol>(coordinator_.get(), o);
    fresh->io_pool =
        std::make_unique<ThreadPool>(std::max(1, options_.io_threads));
    rp = std::move(fresh);
  }
  return rp.get();
}

absl::Status Agent::StartPersisting(RankProtocol* rp, const Set& set) {
  absl::MutexLock l(&mu_);
  if (set.cancelled) {
    return absl::CancelledError(absl::StrCat(Where(set.job, set.step, set.rank),
                                             ": ",
                                             rp->cancel.status().message()));
  }
  rp->persisting = &set;
  return absl::OkStatus();
}

void Agent::EndPersisting(RankProtocol* rp) {
  absl::MutexLock l(&mu_);
  rp->persisting = nullptr;
  rp->cancel.Reset();
}

absl::Status Agent::CancelSave(const v1::CancelSaveRequest& request) {
  const Key key{request.job(), request.step(), request.rank()};
  // Another process of the rank (a restarted one) does not cancel this one's
  // save, nor this one a save of the process before it.
  auto ours = [&](const Set& s) {
    return Key{s.job, s.step, s.rank} == key &&
           (request.incarnation() == 0 || s.incarnation == 0 ||
            s.incarnation == request.incarnation());
  };
  const std::string where =
      Where(request.job(), request.step(), request.rank());
  std::shared_ptr<Set> dropped;  // its segment is released off the lock
  std::vector<std::shared_ptr<Stream>> streams;
  {
    absl::MutexLock l(&mu_);
    // Still being staged: nothing was sent to cairnd for it, and the rank
    // copies into it no more.
    for (auto it = staging_.begin(); it != staging_.end(); ++it) {
      if (ours(*it->second)) {
        dropped = std::move(it->second);
        staging_.erase(it);
        SaveResult& r = results_[key];
        r.done = true;
        r.status = absl::CancelledError(
            absl::StrCat(where, ": cancelled (AgentCheckpointer::Cancel)"));
        break;
      }
    }
    for (auto& [id, st] : streams_) {
      if (ours(*st->set)) {
        st->set->cancelled = true;
        streams.push_back(st);
      }
    }
    if (auto p = persisting_.find(key);
        p != persisting_.end() && ours(*p->second)) {
      p->second->cancelled = true;
    }
    auto rp = protocols_.find({request.job(), request.rank()});
    if (rp != protocols_.end() && rp->second->persisting != nullptr &&
        ours(*rp->second->persisting)) {
      // Its calls to cairnd return at once; the save is aborted there.
      rp->second->cancel.Cancel();
    }
  }
  for (const std::shared_ptr<Stream>& st : streams) {
    absl::MutexLock sl(&st->mu);
    if (st->failed.ok()) {
      st->failed = absl::CancelledError(
          absl::StrCat(st->where, ": cancelled (AgentCheckpointer::Cancel)"));
    }
  }
  if (dropped != nullptr || !streams.empty()) {
    CAIRN_LOG(info, "node {}: {} cancelled by the rank", options_.node_id,
              where);
  }
  return absl::OkStatus();
}

void Agent::RecordPersist(bool committed, uint64_t written, absl::Time start) {
  if (!committed) {
    m_->persists_failed->Increment();
    return;
  }
  m_->bytes_persisted->Increment(static_cast<double>(written));
  m_->persist_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  m_->persists_committed->Increment();
}

void Agent::Persist(std::shared_ptr<Set> set, bool die_before_commit) {
  CAIRN_CRASH_POINT("agent.persist.begin");
  const std::string where = Where(set->job, set->step, set->rank);
  const absl::Time t0 = absl::Now();
  m_->persist_queue->Add(1);
  // The items' bytes are in the segment; cairnd plans them as staged.
  protocol::ItemSources sources;
  v1::LocalSavePlan proto;
  proto.set_rank(set->rank);
  for (Item& it : set->items) {
    const char* data = set->segment->data() + it.offset;
    it.crc32c = storage::Crc32c(data, it.item.length());
    const absl::Span<const char> span(data, it.item.length());
    if (IsBytes(it.item)) {
      sources.AddBytes(it.item.bytes_fqn(), span);
    } else {
      sources.AddChunk(it.item.tensor().fqn(), ItemBox(it.item), span);
    }
    *proto.add_items() = it.item;
  }
  uint64_t written = 0;  // bytes cairnd's plan has this rank write
  absl::StatusOr<v1::CheckpointRecord> record =
      [&]() -> absl::StatusOr<v1::CheckpointRecord> {
    CAIRN_ASSIGN_OR_RETURN(planner::LocalSavePlan local,
                           convert::LocalPlanFromProto(proto));
    CAIRN_ASSIGN_OR_RETURN(RankProtocol * rp, ProtocolFor(*set));
    absl::Mutex* lock;
    {
      absl::MutexLock l(&mu_);
      auto& m = persist_locks_[{set->job, set->rank}];
      if (!m) m = std::make_unique<absl::Mutex>();
      lock = m.get();
    }
    absl::MutexLock pl(lock);
    CAIRN_RETURN_IF_ERROR(StartPersisting(rp, *set));
    absl::Cleanup end_persisting = [this, rp] { EndPersisting(rp); };
    if (set->incarnation != 0) rp->protocol->set_incarnation(set->incarnation);
    CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<protocol::PlannedSave> save,
                           rp->protocol->Begin(set->step, local));
    if (die_before_commit) save->SetBeforeCommitForTest([] { _exit(137); });
    for (const v1::PlannedWrite& w : save->plan().rank_plan().writes()) {
      written += w.location().length();
    }
    if (absl::Status s = save->WriteAll(sources, *rp->io_pool); !s.ok()) {
      return save->Abort(s);
    }
    absl::StatusOr<v1::CheckpointRecord> committed = save->Commit();
    // A refused CommitSave: the save must not linger until cairnd's commit
    // deadline (cairnd's answer names the cause).
    if (!committed.ok()) (void)save->Abort(committed.status());
    return committed;
  }();
  m_->persist_queue->Sub(1);
  RecordPersist(record.ok(), written, t0);
  std::vector<int> peers;
  {
    absl::MutexLock l(&mu_);
    if (auto p = persisting_.find(Key{set->job, set->step, set->rank});
        p != persisting_.end() && p->second == set) {
      persisting_.erase(p);
    }
    SaveResult& r = results_[Key{set->job, set->step, set->rank}];
    // A committed save is done once its replicas are pushed (below).
    r.done = !record.ok();
    if (record.ok()) {
      r.record = *record;
      ++commits_;
      tier_.Keep(set);
      for (int i = 1; i <= options_.replicas; ++i) {
        peers.push_back((options_.node_id + i) % options_.num_nodes);
      }
    } else {
      r.status = record.status();
    }
  }
  if (!record.ok()) {
    CAIRN_LOG(warn, "node {}: persisting {} failed: {}", options_.node_id,
              where, record.status().ToString());
    return;
  }
  CAIRN_LOG(info, "node {}: {} committed ({} items) in {}", options_.node_id,
            where, set->items.size(), absl::FormatDuration(absl::Now() - t0));
  uint64_t set_bytes = 0;
  for (const Item& it : set->items) set_bytes += it.item.length();
  const uint64_t replication =
      peers.empty() ? 0 : m_->ReplicationStarted(set_bytes, absl::Now());
  for (int peer : peers) {
    absl::Status rs = replicator_->Push(*set, peer);
    if (!rs.ok()) {
      m_->replication_failures->Increment();
      CAIRN_LOG(warn, "node {}: replicating {} to node {} failed: {}",
                options_.node_id, where, peer, rs.ToString());
    } else {
      m_->replication_sent_bytes->Increment(static_cast<double>(set_bytes));
      absl::MutexLock l(&mu_);
      ++replicas_pushed_;
    }
  }
  if (!peers.empty()) m_->ReplicationDone(replication);
  absl::MutexLock l(&mu_);
  results_[Key{set->job, set->step, set->rank}].done = true;
}

absl::StatusOr<v1::CheckpointRecord> Agent::WaitSave(
    const v1::WaitSaveRequest& request) {
  const Key key{request.job(), request.step(), request.rank()};
  const absl::Duration timeout = request.timeout_ms() > 0
                                     ? absl::Milliseconds(request.timeout_ms())
                                     : absl::Hours(2);
  absl::MutexLock l(&mu_);
  if (results_.count(key) == 0) {
    return absl::NotFoundError(
        absl::StrCat("node ", options_.node_id, ": no save of ",
                     Where(request.job(), request.step(), request.rank())));
  }
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return results_[key].done;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat(Where(request.job(), request.step(), request.rank()),
                     " not persisted within ", absl::FormatDuration(timeout)));
  }
  const SaveResult& r = results_[key];
  if (!r.status.ok()) return r.status;
  return r.record;
}

}  // namespace cairn::agent
