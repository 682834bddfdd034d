#include "server/agent/persister.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/crash_point.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "proto/convert/plan_convert.h"
#include "storage/checkpoint_keys.h"
#include "storage/checksum.h"

namespace cairn::agent {

using internal::IsBytes;
using internal::ItemBox;
using internal::Where;

bool CancelNames(const v1::CancelSaveRequest& request, const ItemSet& set) {
  // Another process of the rank (a restarted one) does not cancel this one's
  // save, nor this one a save of the process before it.
  return set.job == request.job() && set.step == request.step() &&
         set.rank == request.rank() &&
         (request.incarnation() == 0 || set.incarnation == 0 ||
          set.incarnation == request.incarnation());
}

Persister::Metrics Persister::Metrics::Register(metrics::Registry& r) {
  Metrics m;
  m.bytes_persisted = r.AddCounter(
      "cairn_agent_bytes_persisted_total",
      "Bytes this agent wrote to storage for ranks' saves that committed "
      "(staged and streamed; what cairnd's plan had each rank write, so a "
      "replicated item deduplicated to another rank is not counted).");
  m.persist_seconds = r.AddHistogram(
      "cairn_agent_persist_duration_seconds",
      "Committed persists of one rank's save: from the hand-over (FinishStage, "
      "or a streaming save's start) to cairnd's commit.",
      metrics::Histogram::LatencyBuckets());
  metrics::Family<metrics::Counter>* persists = r.AddCounterFamily(
      "cairn_agent_persists_total",
      "Persists of one rank's save finished, by result (committed, failed).",
      {"result"});
  m.persists_committed = persists->Get({"committed"});
  m.persists_failed = persists->Get({"failed"});
  m.persist_queue = r.AddGauge(
      "cairn_agent_persist_queue_depth",
      "Ranks' saves handed to this agent and not yet committed or failed "
      "(writing, or waiting for an earlier save of the same rank).");
  metrics::Family<metrics::Counter>* replication = r.AddCounterFamily(
      "cairn_agent_replication_bytes_total",
      "Replica bytes pushed to peer agents (direction=\"sent\") and "
      "received from them (direction=\"received\").",
      {"direction"});
  m.replication_sent_bytes = replication->Get({"sent"});
  m.replication_received_bytes = replication->Get({"received"});
  m.replication_failures =
      r.AddCounter("cairn_agent_replication_failures_total",
                   "Replica pushes to a peer agent that failed.");
  return m;
}

Persister::Persister(const Options& options, v1::Coordinator::Stub* coordinator,
                     protocol::CoordinatorContact* contact, MemoryTier& tier,
                     Push push)
    : options_(options),
      coordinator_(coordinator),
      contact_(contact),
      tier_(tier),
      push_(std::move(push)) {}

Persister::~Persister() { Stop(); }

void Persister::Stop() {
  std::list<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> threads;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    stopping_flag_ = true;
    threads.swap(threads_);
  }
  for (auto& t : threads) t.first.join();
}

void Persister::Expect(const ItemSet& set) {
  absl::MutexLock l(&mu_);
  results_[KeyOf(set)] = SaveResult();
}

void Persister::SetOutcome(const Key& key, const absl::Status& status) {
  SaveResult& r = results_[key];
  r.done = true;
  r.status = status;
}

void Persister::Fail(const ItemSet& set, const absl::Status& status) {
  absl::MutexLock l(&mu_);
  SetOutcome(KeyOf(set), status);
}

absl::Status Persister::StartThread(std::function<void()> fn) {
  std::list<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>>
      finished;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return absl::UnavailableError("cairn-agent is stopping");
    for (auto it = threads_.begin(); it != threads_.end();) {
      auto next = std::next(it);
      if (it->second->load()) finished.splice(finished.end(), threads_, it);
      it = next;
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    threads_.emplace_back(std::thread([fn = std::move(fn), done] {
                            fn();
                            *done = true;
                          }),
                          done);
  }
  for (auto& t : finished) t.first.join();
  return absl::OkStatus();
}

absl::Status Persister::Persist(const std::shared_ptr<ItemSet>& set,
                                bool die_before_commit,
                                const std::function<absl::Status()>& prepare) {
  const Key key = KeyOf(*set);
  {
    absl::MutexLock l(&mu_);
    // Cancellable (Cancel) from here until its persist ends.
    persisting_[key] = set;
  }
  absl::Status started = prepare ? prepare() : absl::OkStatus();
  if (started.ok()) {
    started = StartThread(
        [this, set, die_before_commit] { RunPersist(set, die_before_commit); });
  }
  if (!started.ok()) {
    absl::MutexLock l(&mu_);
    if (auto p = persisting_.find(key);
        p != persisting_.end() && p->second == set) {
      persisting_.erase(p);
    }
    SetOutcome(key, started);
  }
  return started;
}

absl::Status Persister::Stream(const std::shared_ptr<StreamingSave>& stream) {
  {
    absl::MutexLock l(&mu_);
    results_[KeyOf(*stream->set())] = SaveResult();
    streams_[stream->save_id()] = stream;
  }
  absl::Status started = StartThread([this, stream] { RunStream(stream); });
  if (!started.ok()) {
    stream->End(started);
    absl::MutexLock l(&mu_);
    streams_.erase(stream->save_id());
    SetOutcome(KeyOf(*stream->set()), started);
  }
  return started;
}

std::shared_ptr<StreamingSave> Persister::FindStream(uint64_t save_id) {
  absl::MutexLock l(&mu_);
  auto it = streams_.find(save_id);
  return it == streams_.end() ? nullptr : it->second;
}

bool Persister::Cancel(const v1::CancelSaveRequest& request) {
  std::vector<std::shared_ptr<StreamingSave>> streams;
  bool stopped = false;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, st] : streams_) {
      if (CancelNames(request, *st->set())) {
        st->set()->cancelled = true;
        streams.push_back(st);
      }
    }
    if (auto p = persisting_.find(
            Key{request.job(), request.step(), request.rank()});
        p != persisting_.end() && CancelNames(request, *p->second)) {
      p->second->cancelled = true;
      stopped = true;
    }
    auto rp = protocols_.find({request.job(), request.rank()});
    if (rp != protocols_.end() && rp->second->persisting != nullptr &&
        CancelNames(request, *rp->second->persisting)) {
      // Its calls to cairnd return at once; the save is aborted there.
      rp->second->cancel.Cancel();
      stopped = true;
    }
  }
  for (const std::shared_ptr<StreamingSave>& st : streams) {
    st->Fail(absl::CancelledError(
        absl::StrCat(st->where(), ": cancelled (AgentCheckpointer::Cancel)")));
  }
  return stopped || !streams.empty();
}

absl::Mutex* Persister::PersistLock(const ItemSet& set) {
  absl::MutexLock l(&mu_);
  std::unique_ptr<absl::Mutex>& m = persist_locks_[{set.job, set.rank}];
  if (m == nullptr) m = std::make_unique<absl::Mutex>();
  return m.get();
}

absl::StatusOr<Persister::RankProtocol*> Persister::ProtocolFor(
    const ItemSet& set) {
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
    o.contact = contact_;
    auto fresh = std::make_unique<RankProtocol>();
    o.cancellation = &fresh->cancel;
    fresh->protocol = std::make_unique<protocol::SaveProtocol>(coordinator_, o);
    fresh->io_pool =
        std::make_unique<ThreadPool>(std::max(1, options_.io_threads));
    rp = std::move(fresh);
  }
  return rp.get();
}

absl::Status Persister::StartPersisting(RankProtocol* rp, const ItemSet& set) {
  absl::MutexLock l(&mu_);
  if (set.cancelled) {
    return absl::CancelledError(absl::StrCat(Where(set.job, set.step, set.rank),
                                             ": ",
                                             rp->cancel.status().message()));
  }
  rp->persisting = &set;
  return absl::OkStatus();
}

void Persister::EndPersisting(RankProtocol* rp) {
  absl::MutexLock l(&mu_);
  rp->persisting = nullptr;
  rp->cancel.Reset();
}

void Persister::RecordPersist(bool committed, uint64_t written,
                              absl::Time start) {
  const Metrics& m = options_.metrics;
  if (!committed) {
    m.persists_failed->Increment();
    return;
  }
  m.bytes_persisted->Increment(static_cast<double>(written));
  m.persist_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  m.persists_committed->Increment();
}

void Persister::RunPersist(const std::shared_ptr<ItemSet>& set,
                           bool die_before_commit) {
  CAIRN_CRASH_POINT("agent.persist.begin");
  const Key key = KeyOf(*set);
  const std::string where = Where(set->job, set->step, set->rank);
  const absl::Time t0 = absl::Now();
  options_.metrics.persist_queue->Add(1);
  // The items' bytes are in the segment; cairnd plans them as staged.
  protocol::ItemSources sources;
  v1::LocalSavePlan proto;
  proto.set_rank(set->rank);
  for (StagedItem& it : set->items) {
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
  uint64_t written = 0;    // bytes cairnd's plan has this rank write
  bool in_memory = false;  // a memory save: held here and on peers
  absl::StatusOr<v1::CheckpointRecord> record =
      [&]() -> absl::StatusOr<v1::CheckpointRecord> {
    CAIRN_ASSIGN_OR_RETURN(planner::LocalSavePlan local,
                           convert::LocalPlanFromProto(proto));
    absl::MutexLock pl(PersistLock(*set));
    CAIRN_ASSIGN_OR_RETURN(RankProtocol * rp, ProtocolFor(*set));
    CAIRN_RETURN_IF_ERROR(StartPersisting(rp, *set));
    absl::Cleanup end_persisting = [this, rp] { EndPersisting(rp); };
    if (set->incarnation != 0) rp->protocol->set_incarnation(set->incarnation);
    rp->protocol->set_tier(
        {set->tier_asked, /*agent_holds=*/true, options_.replicas});
    CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<protocol::PlannedSave> save,
                           rp->protocol->Begin(set->step, local));
    if (die_before_commit) save->SetBeforeCommitForTest([] { _exit(137); });
    if (save->plan().tier() == v1::TIER_MEMORY) {
      // Nothing goes to storage: the set stays here, pinned, and in the
      // memory of `replicas` peers before the rank commits with them.
      in_memory = true;
      absl::StatusOr<std::vector<int>> holders =
          HoldInMemory(set, save->plan().replicas());
      absl::Status s = holders.status();
      if (s.ok()) s = save->RecordHeld(sources, *holders);
      if (!s.ok()) return save->Abort(s);
      absl::StatusOr<v1::CheckpointRecord> committed = save->Commit();
      if (!committed.ok()) (void)save->Abort(committed.status());
      return committed;
    }
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
  options_.metrics.persist_queue->Sub(1);
  RecordPersist(record.ok(), written, t0);
  std::vector<int> peers;
  uint64_t set_bytes = 0;
  for (const StagedItem& it : set->items) set_bytes += it.item.length();
  uint64_t replication = 0;
  {
    absl::MutexLock l(&mu_);
    if (auto p = persisting_.find(key);
        p != persisting_.end() && p->second == set) {
      persisting_.erase(p);
    }
    SaveResult& r = results_[key];
    // A committed save is done once its replicas are pushed (below).
    r.done = !record.ok();
    if (record.ok() && in_memory) {
      r.record = *record;
      r.done = true;  // its copies were made before the commit
      ++counts_.commits;
    } else if (record.ok()) {
      r.record = *record;
      ++counts_.commits;
      tier_.Keep(set);
      for (int i = 1; i <= options_.replicas; ++i) {
        peers.push_back((options_.node_id + i) % options_.num_nodes);
      }
      if (!peers.empty()) {
        replication = ++next_replication_;
        replicating_[replication] = {set_bytes, absl::Now()};
      }
    } else {
      r.status = record.status();
    }
  }
  if (!record.ok()) {
    // A memory save's copies here go now; its peers drop theirs when cairnd
    // answers their next report (the save is aborted there).
    if (in_memory) tier_.Drop(set->job, set->step, set->rank);
    CAIRN_LOG(warn, "node {}: persisting {} failed: {}", options_.node_id,
              where, record.status().ToString());
    return;
  }
  if (in_memory) {
    CAIRN_LOG(info, "node {}: {} committed in memory ({} items) in {}",
              options_.node_id, where, set->items.size(),
              absl::FormatDuration(absl::Now() - t0));
    return;
  }
  CAIRN_LOG(info, "node {}: {} committed ({} items) in {}", options_.node_id,
            where, set->items.size(), absl::FormatDuration(absl::Now() - t0));
  for (int peer : peers) {
    absl::Status rs = push_(*set, peer);
    if (!rs.ok()) {
      options_.metrics.replication_failures->Increment();
      CAIRN_LOG(warn, "node {}: replicating {} to node {} failed: {}",
                options_.node_id, where, peer, rs.ToString());
    } else {
      options_.metrics.replication_sent_bytes->Increment(
          static_cast<double>(set_bytes));
      absl::MutexLock l(&mu_);
      ++counts_.replicas_pushed;
    }
  }
  absl::MutexLock l(&mu_);
  replicating_.erase(replication);
  results_[key].done = true;
}

absl::StatusOr<std::vector<int>> Persister::HoldInMemory(
    const std::shared_ptr<ItemSet>& set, int replicas) {
  set->memory_tier = true;
  tier_.Keep(set);
  std::vector<int> holders = {options_.node_id};
  uint64_t set_bytes = 0;
  for (const StagedItem& it : set->items) set_bytes += it.item.length();
  // The next nodes in turn, skipping those that cannot take it, until k
  // peers hold it.
  std::vector<std::string> refused;
  for (int i = 1; i < options_.num_nodes &&
                  static_cast<int>(holders.size()) < replicas + 1;
       ++i) {
    const int peer = (options_.node_id + i) % options_.num_nodes;
    const absl::Time t0 = absl::Now();
    absl::Status s = push_(*set, peer);
    if (!s.ok()) {
      options_.metrics.replication_failures->Increment();
      refused.push_back(absl::StrCat("node ", peer, ": ", s.message()));
      continue;
    }
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    CAIRN_LOG(info, "node {}: pushed {} bytes of {} to node {} in {:.3f} s",
              options_.node_id, set_bytes,
              Where(set->job, set->step, set->rank), peer, secs);
    options_.metrics.replication_sent_bytes->Increment(
        static_cast<double>(set_bytes));
    absl::MutexLock l(&mu_);
    ++counts_.replicas_pushed;
    holders.push_back(peer);
  }
  if (static_cast<int>(holders.size()) < replicas + 1) {
    tier_.Drop(set->job, set->step, set->rank);
    return absl::UnavailableError(absl::StrCat(
        "a memory save needs ", replicas + 1, " copies on distinct nodes; ",
        holders.size(), " could be made (",
        refused.empty() ? std::string("too few nodes")
                        : absl::StrJoin(refused, "; "),
        ")"));
  }
  return holders;
}

absl::Status Persister::WriteHeld(const std::string& job, int64_t step,
                                  int rank) {
  const std::string where = Where(job, step, rank);
  std::shared_ptr<const ItemSet> set = tier_.FindSet(job, step, rank);
  if (set == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("node ", options_.node_id, " holds no shards of ", where));
  }
  v1::GetCheckpointRequest get;
  get.set_job(job);
  get.set_step(step);
  v1::GetCheckpointResponse got;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
    CAIRN_RETURN_IF_ERROR(
        FromGrpcStatus(coordinator_->GetCheckpoint(&ctx, get, &got)));
  }
  // The held items by what names them in the manifest.
  auto key_of = [](absl::string_view fqn, const v1::ChunkBox* box) {
    std::string key(fqn);
    if (box != nullptr) {
      absl::StrAppend(&key, "\n", absl::StrJoin(box->offsets(), ","), "/",
                      absl::StrJoin(box->sizes(), ","));
    }
    return key;
  };
  std::map<std::string, const StagedItem*> held;
  for (const StagedItem& it : set->items) {
    held[IsBytes(it.item) ? key_of(it.item.bytes_fqn(), nullptr)
                          : key_of(it.item.tensor().fqn(), &it.item.chunk())] =
        &it;
  }
  struct Piece {
    uint64_t offset = 0;
    absl::Span<const char> bytes;
  };
  std::map<std::string, std::vector<Piece>> objects;
  auto take = [&](const std::string& key, absl::string_view fqn,
                  const v1::StorageLocation& at, uint32_t crc) -> absl::Status {
    auto it = held.find(key);
    if (it == held.end() || it->second->item.length() != at.length()) {
      return absl::NotFoundError(absl::StrCat(
          where, ": node ", options_.node_id, " holds no '", fqn,
          "' of the length the manifest names (", at.length(), " bytes)"));
    }
    const char* data = set->segment->data() + it->second->offset;
    if (const uint32_t got_crc = storage::Crc32c(data, at.length());
        got_crc != crc) {
      return absl::DataLossError(absl::StrCat(where, ": in-memory '", fqn,
                                              "' has crc32c ", got_crc,
                                              ", the manifest says ", crc));
    }
    objects[at.object_key()].push_back(
        Piece{at.offset(), absl::MakeConstSpan(data, at.length())});
    return absl::OkStatus();
  };
  for (const v1::ManifestTensor& t : got.manifest().tensors()) {
    for (const v1::StoredChunk& c : t.chunks()) {
      if (c.writer_rank() != rank) continue;
      CAIRN_RETURN_IF_ERROR(take(key_of(t.entry().fqn(), &c.box()),
                                 t.entry().fqn(), c.location(), c.crc32c()));
    }
  }
  for (const v1::ManifestBytes& b : got.manifest().bytes_entries()) {
    if (b.writer_rank() != rank) continue;
    CAIRN_RETURN_IF_ERROR(
        take(key_of(b.fqn(), nullptr), b.fqn(), b.location(), b.crc32c()));
  }
  CAIRN_ASSIGN_OR_RETURN(
      std::unique_ptr<storage::ShardStore> store,
      storage::OpenShardStore(got.checkpoint().storage_uri(), options_.store));
  const std::string zeros(64 << 10, '\0');
  uint64_t written = 0;
  for (auto& [key, pieces] : objects) {
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
      return a.offset < b.offset;
    });
    CAIRN_ASSIGN_OR_RETURN(
        std::unique_ptr<storage::ObjectWriter> w,
        store->NewWriter(storage::ObjectKey(job, step, key)));
    uint64_t at = 0;
    for (const Piece& p : pieces) {
      while (at < p.offset) {
        const uint64_t n = std::min<uint64_t>(p.offset - at, zeros.size());
        CAIRN_RETURN_IF_ERROR(w->Append(absl::MakeConstSpan(zeros.data(), n)));
        at += n;
      }
      CAIRN_RETURN_IF_ERROR(w->Append(p.bytes));
      at += p.bytes.size();
      written += p.bytes.size();
    }
    CAIRN_RETURN_IF_ERROR(w->Close());
  }
  options_.metrics.bytes_persisted->Increment(static_cast<double>(written));
  CAIRN_LOG(info,
            "node {}: wrote its copy of {} to storage ({} objects, {} "
            "bytes)",
            options_.node_id, where, objects.size(), written);
  return absl::OkStatus();
}

void Persister::RunStream(const std::shared_ptr<StreamingSave>& st) {
  const absl::Time t0 = absl::Now();
  options_.metrics.persist_queue->Add(1);
  uint64_t written = 0;
  absl::StatusOr<v1::CheckpointRecord> r = StreamToStorage(*st, written);
  options_.metrics.persist_queue->Sub(1);
  RecordPersist(r.ok(), written, t0);
  st->End(r.status());
  const ItemSet& set = *st->set();
  absl::MutexLock l(&mu_);
  if (r.ok()) streams_.erase(st->save_id());
  SaveResult& res = results_[KeyOf(set)];
  res.done = true;
  if (r.ok()) {
    res.record = *r;
    ++counts_.commits;
    ++counts_.streamed_saves;
    CAIRN_LOG(info, "node {}: {} committed (streamed, {} items) in {}",
              options_.node_id, st->where(), set.items.size(),
              absl::FormatDuration(absl::Now() - t0));
  } else {
    res.status = r.status();
    CAIRN_LOG(warn, "node {}: streaming {} failed: {}", options_.node_id,
              st->where(), r.status().ToString());
  }
}

absl::StatusOr<v1::CheckpointRecord> Persister::StreamToStorage(
    StreamingSave& st, uint64_t& written) {
  const ItemSet& set = *st.set();
  absl::MutexLock pl(PersistLock(set));
  CAIRN_ASSIGN_OR_RETURN(RankProtocol * rp, ProtocolFor(set));
  CAIRN_RETURN_IF_ERROR(StartPersisting(rp, set));
  absl::Cleanup end_persisting = [this, rp] { EndPersisting(rp); };
  if (set.incarnation != 0) rp->protocol->set_incarnation(set.incarnation);
  // A save larger than the budget cannot be held: persisted, whatever the
  // job's policy would say.
  rp->protocol->set_tier({v1::TIER_PERSISTENT, /*agent_holds=*/false, 0});
  v1::LocalSavePlan proto;
  proto.set_rank(set.rank);
  for (const StagedItem& it : set.items) *proto.add_items() = it.item;
  CAIRN_ASSIGN_OR_RETURN(planner::LocalSavePlan local,
                         convert::LocalPlanFromProto(proto));
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<protocol::PlannedSave> save,
                         rp->protocol->Begin(set.step, local));
  const v1::BeginSaveResponse& plan = save->plan();
  for (const v1::PlannedWrite& w : plan.rank_plan().writes()) {
    written += w.location().length();
  }
  bool committing = false;
  absl::StatusOr<v1::CheckpointRecord> result =
      [&]() -> absl::StatusOr<v1::CheckpointRecord> {
    CAIRN_ASSIGN_OR_RETURN(std::vector<StreamingSave::Piece> pieces,
                           st.SetPlan(plan.rank_plan(), save->objects()));
    const auto& writes = plan.rank_plan().writes();
    std::optional<StreamingSave::Bucket> cur;
    size_t pi = 0;
    for (size_t o = 0; o < save->objects().size(); ++o) {
      CAIRN_ASSIGN_OR_RETURN(
          std::unique_ptr<protocol::PlannedObjectWriter> writer,
          save->OpenObject(o));
      for (int i : save->objects()[o].writes) {
        for (uint64_t done = 0; done < writes[i].location().length();) {
          if (!cur.has_value() || pi == cur->end) {
            cur.reset();  // frees the written bucket for the rank's next one
            CAIRN_ASSIGN_OR_RETURN(cur, st.TakeFilled(stopping_flag_));
            if (cur->begin != pi) {
              return absl::InternalError(
                  absl::StrCat("bucket ", cur->seq, " out of order"));
            }
          }
          const StreamingSave::Piece& p = pieces[pi];
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
    CAIRN_ASSIGN_OR_RETURN(bool die, st.AwaitFinished(stopping_flag_));
    if (die) save->SetBeforeCommitForTest([] { _exit(137); });
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

absl::StatusOr<v1::CheckpointRecord> Persister::Wait(
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

Persister::Counts Persister::counts() {
  absl::MutexLock l(&mu_);
  return counts_;
}

Persister::ReplicationLag Persister::replication_lag() {
  absl::MutexLock l(&mu_);
  ReplicationLag lag;
  for (const auto& [id, rep] : replicating_) {
    lag.bytes += rep.first;
    lag.oldest_commit = std::min(lag.oldest_commit, rep.second);
  }
  return lag;
}

}  // namespace cairn::agent
