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
using internal::tls_die_before_commit;
using internal::Where;

namespace internal {
thread_local bool tls_die_before_commit = false;
}  // namespace internal

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

void Agent::PersistStream(std::shared_ptr<Stream> st) {
  const absl::Time t0 = absl::Now();
  absl::StatusOr<v1::CheckpointRecord> r = StreamToStorage(*st);
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
  CAIRN_ASSIGN_OR_RETURN(client::Checkpointer * ckpt, CheckpointerFor(set));
  absl::Mutex* lock;
  {
    absl::MutexLock l(&mu_);
    auto& m = persist_locks_[{set.job, set.rank}];
    if (!m) m = std::make_unique<absl::Mutex>();
    lock = m.get();
  }
  absl::MutexLock pl(lock);
  if (set.incarnation != 0) ckpt->set_incarnation(set.incarnation);
  v1::LocalSavePlan proto;
  proto.set_rank(set.rank);
  for (const Item& it : set.items) *proto.add_items() = it.item;
  CAIRN_ASSIGN_OR_RETURN(planner::LocalSavePlan local,
                         convert::LocalPlanFromProto(proto));
  CAIRN_ASSIGN_OR_RETURN(v1::BeginSaveResponse plan,
                         ckpt->BeginPlannedSave(set.step, local));
  bool committing = false;
  absl::StatusOr<v1::CheckpointRecord> result =
      [&]() -> absl::StatusOr<v1::CheckpointRecord> {
    // Storage order of cairnd's writes for this rank, each matched to the
    // staged item it names, cut into pieces of at most one bucket.
    const auto& writes = plan.rank_plan().writes();
    std::map<std::pair<std::string, planner::ChunkBox>, int> by_key;
    for (size_t i = 0; i < set.items.size(); ++i) {
      by_key[{PlanName(set.items[i].item), ItemBox(set.items[i].item)}] =
          static_cast<int>(i);
    }
    std::vector<int> write_item(writes.size());
    std::vector<int> order(writes.size());
    for (int i = 0; i < writes.size(); ++i) {
      const v1::WriteItem& w = writes[i].item();
      auto it = by_key.find({PlanName(w), ItemBox(w)});
      if (it == by_key.end() || set.items[it->second].item.length() !=
                                    writes[i].location().length()) {
        return absl::FailedPreconditionError(absl::StrCat(
            st.where, ": cairnd planned '", ItemFqn(w), "' ",
            planner::BoxToString(ItemBox(w)),
            " for this rank, which did not stage it with that length"));
      }
      write_item[i] = it->second;
      order[i] = i;
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      const auto& la = writes[a].location();
      const auto& lb = writes[b].location();
      if (la.object_key() != lb.object_key()) {
        return la.object_key() < lb.object_key();
      }
      return la.offset() < lb.offset();
    });
    std::vector<Stream::Piece> pieces;
    for (int i : order) {
      const uint64_t len = writes[i].location().length();
      for (uint64_t off = 0; off < len; off += st.bucket_bytes) {
        pieces.push_back({i, off, std::min(st.bucket_bytes, len - off)});
      }
    }
    {
      absl::MutexLock l(&st.mu);
      st.pieces = pieces;
      st.write_item = std::move(write_item);
      st.plan_ready = true;
    }
    CAIRN_ASSIGN_OR_RETURN(storage::ShardStore * store,
                           ckpt->StoreFor(plan.storage_uri()));
    v1::CommitSaveRequest commit = ckpt->MakeCommitRequest(set.step, plan);
    static const std::string* zeros = new std::string(1 << 16, '\0');
    std::optional<Stream::Bucket> cur;
    size_t pi = 0;
    std::string object;
    std::unique_ptr<storage::ObjectWriter> writer;
    uint64_t cursor = 0;
    std::map<std::string, uint64_t> object_bytes;
    for (const v1::PlannedWrite& w : writes) {
      uint64_t& end = object_bytes[w.location().object_key()];
      end = std::max<uint64_t>(end,
                               w.location().offset() + w.location().length());
    }
    for (int i : order) {
      const v1::StorageLocation& loc = writes[i].location();
      if (writer == nullptr || loc.object_key() != object) {
        if (writer != nullptr) CAIRN_RETURN_IF_ERROR(writer->Close());
        object = loc.object_key();
        // The object's planned size: the store reserves exactly that.
        storage::WriterOptions wo;
        wo.expected_bytes = object_bytes[object];
        CAIRN_ASSIGN_OR_RETURN(
            writer,
            store->NewWriter(absl::StrCat(plan.step_prefix(), object), wo));
        cursor = 0;
      }
      if (loc.offset() < cursor) {
        return absl::InvalidArgumentError(
            absl::StrCat(st.where,
                         ": cairnd planned overlapping writes in "
                         "object ",
                         plan.step_prefix(), object));
      }
      while (cursor < loc.offset()) {
        const uint64_t n =
            std::min<uint64_t>(loc.offset() - cursor, zeros->size());
        CAIRN_RETURN_IF_ERROR(writer->Append(
            absl::MakeConstSpan(zeros->data(), static_cast<size_t>(n))));
        cursor += n;
      }
      uint32_t crc = 0;
      for (uint64_t done = 0; done < loc.length();) {
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
                absl::StrCat(st.where, ": bucket ", cur->seq, " out of order"));
          }
        }
        const Stream::Piece& p = pieces[pi];
        const char* data = cur->segment->data() + cur->offsets[pi - cur->begin];
        crc = storage::Crc32cExtend(crc, data, p.length);
        CAIRN_RETURN_IF_ERROR(writer->Append(
            absl::MakeConstSpan(data, static_cast<size_t>(p.length))));
        CAIRN_CRASH_POINT("agent.stream.mid_write");
        done += p.length;
        cursor += p.length;
        ++pi;
      }
      commit.mutable_results(i)->set_crc32c(crc);
    }
    cur.reset();
    // Every byte durable before the commit.
    if (writer != nullptr) CAIRN_RETURN_IF_ERROR(writer->Close());
    bool die = false;
    {
      absl::MutexLock l(&st.mu);
      CAIRN_RETURN_IF_ERROR(st.AwaitRank(
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) { return st.finished; },
          options_.stream_idle_timeout, stopping_flag_));
      die = st.die_before_commit;
    }
    tls_die_before_commit = die;
    committing = true;
    return ckpt->CommitPlannedSave(commit);
  }();
  if (!result.ok()) {
    // A refused CommitSave too: the save must not linger until cairnd's
    // commit deadline (cairnd's answer then names the cause).
    absl::Status reported = ckpt->AbortPlannedSave(set.step, result.status());
    return committing ? result.status() : reported;
  }
  return result;
}

absl::StatusOr<client::Checkpointer*> Agent::CheckpointerFor(const Set& set) {
  absl::MutexLock l(&mu_);
  std::unique_ptr<client::Checkpointer>& c =
      checkpointers_[{set.job, set.rank}];
  if (c == nullptr || c->options().world_size != set.world_size) {
    client::CheckpointerOptions o;
    o.coordinator = options_.coordinator;
    o.job = set.job;
    o.rank = set.rank;
    o.world_size = set.world_size;
    o.io_threads = options_.io_threads;
    o.store = options_.store;
    o.before_commit_for_test = [] {
      if (tls_die_before_commit) _exit(137);
    };
    CAIRN_ASSIGN_OR_RETURN(c, client::Checkpointer::Connect(o));
  }
  return c.get();
}

void Agent::Persist(std::shared_ptr<Set> set, bool die_before_commit) {
  tls_die_before_commit = die_before_commit;
  CAIRN_CRASH_POINT("agent.persist.begin");
  const std::string where = Where(set->job, set->step, set->rank);
  const absl::Time t0 = absl::Now();
  // A StateDict over the staged bytes; chunks of one tensor are grouped.
  client::StateDict state;
  std::vector<std::unique_ptr<std::string>> blobs;
  std::map<std::string, std::vector<const Item*>> by_fqn;
  std::vector<std::string> order;
  for (Item& it : set->items) {
    it.crc32c =
        storage::Crc32c(set->segment->data() + it.offset, it.item.length());
    if (IsBytes(it.item)) continue;
    auto& v = by_fqn[it.item.tensor().fqn()];
    if (v.empty()) order.push_back(it.item.tensor().fqn());
    v.push_back(&it);
  }
  absl::Status s;
  for (const std::string& fqn : order) {
    const v1::TensorEntry& t = by_fqn[fqn][0]->item.tensor();
    std::vector<client::TensorChunk> chunks;
    for (const Item* it : by_fqn[fqn]) {
      chunks.push_back(
          {ItemBox(it->item), absl::MakeSpan(set->segment->data() + it->offset,
                                             it->item.length())});
    }
    s.Update(state.AddChunks(
        fqn, DTypeOf(t.dtype()),
        planner::Shape(t.global_shape().begin(), t.global_shape().end()),
        std::move(chunks)));
  }
  for (const Item& it : set->items) {
    if (!IsBytes(it.item)) continue;
    blobs.push_back(std::make_unique<std::string>(
        set->segment->data() + it.offset, it.item.length()));
    s.Update(state.AddBytes(it.item.bytes_fqn(), blobs.back().get()));
  }
  absl::StatusOr<v1::CheckpointRecord> record =
      s.ok() ? absl::UnknownError("not persisted") : s;
  if (s.ok()) {
    absl::StatusOr<client::Checkpointer*> ckpt = CheckpointerFor(*set);
    if (!ckpt.ok()) {
      record = ckpt.status();
    } else {
      absl::Mutex* lock;
      {
        absl::MutexLock l(&mu_);
        auto& m = persist_locks_[{set->job, set->rank}];
        if (!m) m = std::make_unique<absl::Mutex>();
        lock = m.get();
      }
      absl::MutexLock pl(lock);
      if (set->incarnation != 0) (*ckpt)->set_incarnation(set->incarnation);
      record = (*ckpt)->Save(set->step, state);
    }
  }
  std::vector<int> peers;
  {
    absl::MutexLock l(&mu_);
    SaveResult& r = results_[Key{set->job, set->step, set->rank}];
    // A committed save is done once its replicas are pushed (below).
    r.done = !record.ok();
    if (record.ok()) {
      r.record = *record;
      ++commits_;
      std::shared_ptr<Set>& slot = tier0_[{set->job, set->rank}];
      if (slot == nullptr || slot->step <= set->step) slot = set;
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
  for (int peer : peers) {
    absl::Status rs = Replicate(set, peer);
    if (!rs.ok()) {
      CAIRN_LOG(warn, "node {}: replicating {} to node {} failed: {}",
                options_.node_id, where, peer, rs.ToString());
    } else {
      absl::MutexLock l(&mu_);
      ++replicas_pushed_;
    }
  }
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
