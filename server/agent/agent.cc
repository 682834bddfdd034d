#include "server/agent/agent.h"

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
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"

namespace cairn::agent {

using copier::CopySource;
using shm::RemoveStaleSegments;
using shm::ShmSegment;

namespace {

constexpr uint64_t kAlign = 64;
constexpr uint64_t kSegmentGranule = 4096;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

planner::DType DTypeOf(v1::DType d) {
  absl::StatusOr<planner::DType> r = convert::DTypeFromProto(d, "");
  return r.ok() ? *r : planner::DType::kUnspecified;
}

bool IsBytes(const v1::WriteItem& item) {
  return item.kind() == v1::WriteItem::KIND_BYTES;
}

const std::string& ItemFqn(const v1::WriteItem& item) {
  return IsBytes(item) ? item.bytes_fqn() : item.tensor().fqn();
}

// The box of an item: its chunk, or [0, length) for a bytes entry (which the
// transfer planner sees as a 1-D uint8 tensor).
planner::ChunkBox ItemBox(const v1::WriteItem& item) {
  planner::ChunkBox box;
  if (IsBytes(item)) {
    box.offsets = {0};
    box.sizes = {static_cast<int64_t>(item.length())};
    return box;
  }
  box.offsets.assign(item.chunk().offsets().begin(),
                     item.chunk().offsets().end());
  box.sizes.assign(item.chunk().sizes().begin(), item.chunk().sizes().end());
  return box;
}

size_t ItemElemSize(const v1::WriteItem& item) {
  if (IsBytes(item)) return 1;
  return planner::DTypeSize(DTypeOf(item.tensor().dtype()));
}

// Transfer-planner name of an item: bytes entries get their own namespace.
std::string PlanName(const v1::WriteItem& item) {
  return IsBytes(item) ? absl::StrCat("\x01bytes:", item.bytes_fqn())
                       : item.tensor().fqn();
}

bool SameItem(const v1::WriteItem& a, const v1::WriteItem& b) {
  return a.kind() == b.kind() && ItemFqn(a) == ItemFqn(b) &&
         ItemBox(a) == ItemBox(b);
}

std::string Where(absl::string_view job, int64_t step, int rank) {
  return absl::StrCat("job '", job, "' step ", step, " rank ", rank);
}

absl::Status ToStatus(const v1::PeerResponse& r) {
  if (r.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
}

// The agent that is exiting on purpose for a fault test (per persist thread).
thread_local bool tls_die_before_commit = false;

}  // namespace

// Staging memory: shm segments counted against the budget. Released segments
// are kept (still counted) for reuse by a save of the same size — the rank
// keeps its mapping of them, so a steady-state save copies into memory that
// is already mapped and faulted — and destroyed when space is needed.
struct Agent::Pool {
  std::string prefix;
  uint64_t budget = 0;
  absl::Mutex mu;
  uint64_t used ABSL_GUARDED_BY(mu) = 0;
  uint64_t seq ABSL_GUARDED_BY(mu) = 0;
  uint64_t peak ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::unique_ptr<ShmSegment>> free ABSL_GUARDED_BY(mu);
  int64_t releases ABSL_GUARDED_BY(mu) = 0;
  // Segments destroyed instead of reused when released: buckets of a failed
  // stream, which a still-running rank might write into.
  std::set<const ShmSegment*> discard ABSL_GUARDED_BY(mu);
  std::atomic<int64_t> streamed_buckets{0};

  void Release(ShmSegment* s) {
    absl::MutexLock l(&mu);
    if (discard.erase(s) > 0) {
      used -= s->size();
      delete s;  // unlinks it; a rank's mapping stays valid but private
    } else {
      free.emplace_back(s);
    }
    ++releases;
  }
  void Discard(const ShmSegment* s) {
    absl::MutexLock l(&mu);
    discard.insert(s);
  }
};

// One streaming save (see agent.h). The persist thread produces `pieces`
// once (plan_ready); StageBucket hands out consecutive runs of them as
// buckets; the persist thread takes filled buckets in order.
struct Agent::Stream {
  struct Piece {
    int write = 0;  // index in cairnd's plan for this rank
    uint64_t item_offset = 0;
    uint64_t length = 0;
  };
  struct Bucket {
    uint64_t seq = 0;
    std::shared_ptr<ShmSegment> segment;
    size_t begin = 0, end = 0;      // pieces [begin, end)
    std::vector<uint64_t> offsets;  // per piece, in the segment
  };

  std::shared_ptr<Set> set;  // items only, no segment
  uint64_t save_id = 0;
  uint64_t bucket_bytes = 0;
  absl::Duration wait_for_space;
  std::string where;

  absl::Mutex mu;
  absl::Status failed ABSL_GUARDED_BY(mu);
  bool plan_ready ABSL_GUARDED_BY(mu) = false;
  std::vector<Piece> pieces ABSL_GUARDED_BY(mu);
  std::vector<int> write_item ABSL_GUARDED_BY(mu);  // plan write -> item
  size_t next_piece ABSL_GUARDED_BY(mu) = 0;
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  std::optional<Bucket> handed ABSL_GUARDED_BY(mu);  // with the rank
  std::deque<Bucket> filled ABSL_GUARDED_BY(mu);     // for the persist thread
  bool finished ABSL_GUARDED_BY(mu) = false;         // FinishStage arrived
  bool die_before_commit ABSL_GUARDED_BY(mu) = false;
  bool rank_in_call ABSL_GUARDED_BY(mu) = false;
  absl::Time last_call ABSL_GUARDED_BY(mu);

  // Waits (mu held) until `ready`, failing when the stream failed, the agent
  // stops, or the rank has made no call for `idle` (it died mid-stream).
  absl::Status AwaitRank(const std::function<bool()>& ready,
                         absl::Duration idle, const std::atomic<bool>& stopping)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto cond = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return ready() || !failed.ok();
    };
    while (true) {
      if (!failed.ok()) return failed;
      if (ready()) return absl::OkStatus();
      if (stopping.load()) {
        return absl::UnavailableError(
            absl::StrCat(where, ": cairn-agent is stopping"));
      }
      if (!rank_in_call && absl::Now() - last_call > idle) {
        return absl::AbortedError(
            absl::StrCat(where, ": the rank made no streaming call for ",
                         absl::FormatDuration(idle),
                         " (killed mid-stream?); the save is aborted"));
      }
      mu.AwaitWithTimeout(absl::Condition(&cond), absl::Milliseconds(50));
    }
  }
};

Agent::Agent(AgentOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Agent>> Agent::Start(AgentOptions options) {
  if (options.node_id < 0 || options.num_nodes < 1 ||
      options.node_id >= options.num_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent node id ", options.node_id, " is out of range for ",
                     options.num_nodes, " nodes"));
  }
  if (options.replicas < 0 || options.replicas >= options.num_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "agent node ", options.node_id, ": --replicas ", options.replicas,
        " must be < the number of nodes (", options.num_nodes,
        "): replicas never live on the same node"));
  }
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("agent needs cairnd's address");
  }
  if (!options.resolve_peer) {
    options.resolve_peer = [](int node) -> absl::StatusOr<std::string> {
      return absl::NotFoundError(absl::StrCat("no address for node ", node));
    };
  }
  std::unique_ptr<Agent> a(new Agent(std::move(options)));
  a->pool_ = std::make_shared<Pool>();
  a->pool_->prefix =
      absl::StrCat("cairn-agent-", a->options_.node_id, "-", getpid(), "-");
  a->pool_->budget = a->options_.staging_budget_bytes;
  RemoveStaleSegments(absl::StrCat("cairn-agent-", a->options_.node_id, "-"));

  TcpTransportOptions t;
  t.node_id = a->options_.node_id;
  t.listen_address = a->options_.peer_listen;
  t.resolve_peer = a->options_.resolve_peer;
  t.control_handler = [p = a.get()](int peer, uint64_t tag, std::string m) {
    p->HandleControl(peer, tag, std::move(m));
  };
  t.control_threads = 8;
  t.connect_timeout = a->options_.peer_connect_timeout;
  t.num_nodes = a->options_.num_nodes;
  t.peer_token = a->options_.peer_token;
  // Frames carry at most one transfer bucket (larger messages are split).
  t.max_frame_bytes = std::clamp<uint64_t>(a->options_.bucket_cap_bytes,
                                           kMinFrameBytes, uint64_t{1} << 30);
  CAIRN_ASSIGN_OR_RETURN(a->transport_, TcpTransport::Start(std::move(t)));

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  a->channel_ = grpc::CreateCustomChannel(
      a->options_.coordinator, grpc::InsecureChannelCredentials(), args);
  a->coordinator_ = v1::Coordinator::NewStub(a->channel_);
  return a;
}

Agent::~Agent() {
  std::list<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> threads;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    stopping_flag_ = true;
    threads.swap(persist_threads_);
  }
  for (auto& t : threads) t.first.join();
  transport_.reset();
  absl::MutexLock l(&mu_);
  staging_.clear();
  tier0_.clear();
  replicas_.clear();
  loads_.clear();
}

uint64_t Agent::NewTag() {
  return (static_cast<uint64_t>(options_.node_id) << 40) |
         (next_tag_.fetch_add(1) & ((uint64_t{1} << 40) - 1));
}

// ---------------------------------------------------------------------------
// Staging memory.

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
    uint64_t bytes, absl::Time deadline) {
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
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration() ||
        !p.mu.AwaitWithTimeout(absl::Condition(&released), left)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "node ", options_.node_id, ": no staging space for ", size,
          " bytes within the wait (budget ", p.budget, " bytes, ", p.used,
          " in use by in-flight saves and loads)"));
    }
  }
}

// ---------------------------------------------------------------------------
// Save path.

absl::StatusOr<v1::BeginStageResponse> Agent::BeginStage(
    const v1::BeginStageRequest& request) {
  const std::string where =
      Where(request.job(), request.step(), request.rank());
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  CAIRN_RETURN_IF_ERROR(storage::ValidateStep(request.step()));
  if (request.world_size() < 1 || request.rank() < 0 ||
      request.rank() >= request.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": rank out of range for world size ", request.world_size()));
  }
  auto set = std::make_shared<Set>();
  set->job = request.job();
  set->step = request.step();
  set->rank = request.rank();
  set->world_size = request.world_size();
  set->incarnation = request.incarnation();
  v1::BeginStageResponse response;
  uint64_t total = 0;
  for (const v1::StageItem& si : request.items()) {
    const v1::WriteItem& w = si.item();
    if (!IsBytes(w)) {
      const size_t elem = ItemElemSize(w);
      const planner::ChunkBox box = ItemBox(w);
      if (elem == 0 || box.offsets.size() != box.sizes.size() ||
          static_cast<uint64_t>(planner::Volume(box)) * elem != w.length()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": item '", w.tensor().fqn(), "' ",
                         planner::BoxToString(box), " has length ", w.length(),
                         " that does not match its box and dtype"));
      }
    }
    Item item;
    item.item = w;
    item.offset = total;
    total = AlignUp(total + w.length(), kAlign);
    v1::StageItem* out = response.add_items();
    *out = si;
    out->set_staging_offset(item.offset);
    set->items.push_back(std::move(item));
  }
  const absl::Duration wait =
      request.wait_for_space_ms() > 0
          ? absl::Milliseconds(request.wait_for_space_ms())
          : options_.wait_for_space;
  if (request.allow_streaming() &&
      AlignUp(std::max<uint64_t>(total, 1), kSegmentGranule) > pool_->budget) {
    // Larger than the whole budget: stream it through buckets.
    auto st = std::make_shared<Stream>();
    st->set = std::move(set);
    st->save_id = next_id_.fetch_add(1);
    st->bucket_bytes =
        std::max(kSegmentGranule,
                 std::min(options_.stream_bucket_bytes, pool_->budget / 2) /
                     kSegmentGranule * kSegmentGranule);
    st->wait_for_space = wait;
    st->where = where;
    {
      absl::MutexLock sl(&st->mu);
      st->last_call = absl::Now();
    }
    for (v1::StageItem& si : *response.mutable_items()) {
      si.clear_staging_offset();
    }
    response.set_save_id(st->save_id);
    response.set_streaming(true);
    response.set_bucket_bytes(st->bucket_bytes);
    {
      absl::MutexLock l(&mu_);
      results_[Key{st->set->job, st->set->step, st->set->rank}] = SaveResult();
      streams_[st->save_id] = st;
    }
    CAIRN_RETURN_IF_ERROR(
        StartPersistThread([this, st] { PersistStream(st); }));
    CAIRN_LOG(info, "node {}: {} streams {} bytes in buckets of {}",
              options_.node_id, where, total, st->bucket_bytes);
    return response;
  }
  absl::StatusOr<std::shared_ptr<ShmSegment>> seg =
      Allocate(total, absl::Now() + wait);
  if (!seg.ok()) {
    return absl::Status(seg.status().code(),
                        absl::StrCat(where, ": ", seg.status().message()));
  }
  set->segment = std::move(*seg);
  const uint64_t id = next_id_.fetch_add(1);
  response.set_save_id(id);
  response.set_shm_name(set->segment->name());
  response.set_shm_size(set->segment->size());
  absl::MutexLock l(&mu_);
  results_[Key{set->job, set->step, set->rank}] = SaveResult();
  staging_[id] = std::move(set);
  return response;
}

absl::Status Agent::FinishStage(const v1::FinishStageRequest& request) {
  std::shared_ptr<Set> set;
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock l(&mu_);
    auto s = streams_.find(request.save_id());
    if (s != streams_.end()) stream = s->second;
  }
  if (stream != nullptr) {
    absl::MutexLock l(&stream->mu);
    if (!stream->failed.ok()) return stream->failed;
    if (request.device_items_size() > 0) {
      stream->failed = absl::UnimplementedError(
          absl::StrCat(stream->where,
                       ": GPU items cannot be streamed (the save exceeds "
                       "the staging budget)"));
      return stream->failed;
    }
    if (!stream->plan_ready || stream->next_piece < stream->pieces.size() ||
        stream->handed.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat(stream->where,
                       ": streaming save is not fully staged; call "
                       "StageBucket until end_of_stream first"));
    }
    stream->finished = true;
    stream->die_before_commit = request.die_before_commit_for_test();
    stream->last_call = absl::Now();
    return absl::OkStatus();
  }
  {
    absl::MutexLock l(&mu_);
    auto it = staging_.find(request.save_id());
    if (it == staging_.end()) {
      return absl::NotFoundError(absl::StrCat("node ", options_.node_id,
                                              ": no staged save with id ",
                                              request.save_id()));
    }
    set = it->second;
    staging_.erase(it);
  }
  const std::string where = Where(set->job, set->step, set->rank);
  if (request.device_items_size() > 0) {
    if (options_.device_copier == nullptr) {
      absl::MutexLock l(&mu_);
      SaveResult& r = results_[Key{set->job, set->step, set->rank}];
      r.done = true;
      r.status = absl::FailedPreconditionError(
          absl::StrCat(where,
                       ": GPU items need the cuda copier, which this "
                       "agent does not have (no CUDA device or build)"));
      return r.status;
    }
    // One copier serves the whole agent; GPU snapshots are serialized.
    static absl::Mutex copier_mu;
    absl::MutexLock cl(&copier_mu);
    for (const v1::StageItem& di : request.device_items()) {
      CopySource src;
      src.kind = CopySource::Kind::kCudaIpc;
      src.cuda_ipc_handle = di.cuda().handle();
      src.offset = di.cuda().offset();
      src.device = di.cuda().device();
      if (di.staging_offset() + di.item().length() > set->segment->size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": GPU item '", ItemFqn(di.item()),
                         "' lies outside the staging segment"));
      }
      CAIRN_RETURN_IF_ERROR(options_.device_copier->Copy(
          src, absl::MakeSpan(set->segment->data() + di.staging_offset(),
                              di.item().length())));
    }
    CAIRN_RETURN_IF_ERROR(options_.device_copier->Flush());
  }
  return StartPersistThread(
      [this, set, die = request.die_before_commit_for_test()] {
        Persist(set, die);
      });
}

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

// ---------------------------------------------------------------------------
// Streaming save.

absl::StatusOr<v1::StageBucketResponse> Agent::StageBucket(
    const v1::StageBucketRequest& request) {
  std::shared_ptr<Stream> st;
  {
    absl::MutexLock l(&mu_);
    auto it = streams_.find(request.save_id());
    if (it == streams_.end()) {
      return absl::NotFoundError(absl::StrCat("node ", options_.node_id,
                                              ": no streaming save with id ",
                                              request.save_id()));
    }
    st = it->second;
  }
  const absl::Time deadline =
      absl::Now() + (request.wait_for_space_ms() > 0
                         ? absl::Milliseconds(request.wait_for_space_ms())
                         : st->wait_for_space);
  bool entered = false;
  auto next = [&]() -> absl::StatusOr<v1::StageBucketResponse> {
    v1::StageBucketResponse response;
    {
      absl::MutexLock l(&st->mu);
      if (!st->failed.ok()) return st->failed;
      if (st->rank_in_call) {
        return absl::FailedPreconditionError(
            absl::StrCat(st->where, ": concurrent StageBucket calls"));
      }
      if (request.filled_bucket() != 0) {
        if (!st->handed.has_value() ||
            st->handed->seq != request.filled_bucket()) {
          return absl::FailedPreconditionError(
              absl::StrCat(st->where, ": bucket ", request.filled_bucket(),
                           " is not the one handed out"));
        }
        st->filled.push_back(std::move(*st->handed));
        st->handed.reset();
      } else if (st->handed.has_value()) {
        return absl::FailedPreconditionError(
            absl::StrCat(st->where, ": bucket ", st->handed->seq,
                         " was handed out and not returned filled"));
      }
      st->rank_in_call = true;
      entered = true;
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) {
        return st->plan_ready || !st->failed.ok();
      };
      if (!st->mu.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
        return absl::DeadlineExceededError(
            absl::StrCat(st->where, ": cairnd's plan did not arrive in time"));
      }
      if (!st->failed.ok()) return st->failed;
      if (st->next_piece == st->pieces.size()) {
        response.set_end_of_stream(true);
        return response;
      }
    }
    // The only wait of a streaming rank: space for the next bucket (the
    // persist thread frees the previous ones as it writes them).
    absl::StatusOr<std::shared_ptr<ShmSegment>> seg =
        Allocate(st->bucket_bytes, deadline);
    if (!seg.ok()) {
      return absl::Status(
          seg.status().code(),
          absl::StrCat(st->where, ": ", seg.status().message()));
    }
    absl::MutexLock l(&st->mu);
    if (!st->failed.ok()) return st->failed;
    Stream::Bucket b;
    b.seq = st->next_seq++;
    b.segment = std::move(*seg);
    b.begin = st->next_piece;
    uint64_t cursor = 0;
    while (st->next_piece < st->pieces.size() &&
           cursor + st->pieces[st->next_piece].length <= st->bucket_bytes) {
      const Stream::Piece& p = st->pieces[st->next_piece];
      v1::StagePiece* out = response.add_pieces();
      out->set_item(st->write_item[p.write]);
      out->set_item_offset(p.item_offset);
      out->set_length(p.length);
      out->set_staging_offset(cursor);
      b.offsets.push_back(cursor);
      cursor = AlignUp(cursor + p.length, kAlign);
      ++st->next_piece;
    }
    b.end = st->next_piece;
    response.set_bucket(b.seq);
    response.set_shm_name(b.segment->name());
    response.set_shm_size(b.segment->size());
    st->handed = std::move(b);
    ++pool_->streamed_buckets;
    return response;
  };
  absl::StatusOr<v1::StageBucketResponse> r = next();
  if (entered) {
    absl::MutexLock l(&st->mu);
    st->rank_in_call = false;
    st->last_call = absl::Now();
  }
  return r;
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

// ---------------------------------------------------------------------------
// Replication.

absl::Status Agent::Replicate(const std::shared_ptr<const Set>& set, int peer) {
  // The transfer schedule from this node to `peer` of every item (same
  // boxes): the planner buckets small items into messages by dtype.
  std::vector<planner::TransferTensor> tensors;
  std::map<std::string, int> tensor_index;
  std::vector<std::vector<int>> dest_item;  // tensor -> dest index -> item
  for (size_t i = 0; i < set->items.size(); ++i) {
    const v1::WriteItem& w = set->items[i].item;
    if (w.length() == 0) continue;
    const std::string name = PlanName(w);
    auto [it, inserted] =
        tensor_index.emplace(name, static_cast<int>(tensors.size()));
    if (inserted) {
      planner::TransferTensor t;
      t.fqn = name;
      if (IsBytes(w)) {
        t.dtype = planner::DType::kUInt8;
        t.global_shape = {static_cast<int64_t>(w.length())};
      } else {
        t.dtype = DTypeOf(w.tensor().dtype());
        t.global_shape.assign(w.tensor().global_shape().begin(),
                              w.tensor().global_shape().end());
      }
      tensors.push_back(std::move(t));
      dest_item.emplace_back();
    }
    planner::TransferTensor& t = tensors[it->second];
    t.sources.push_back({options_.node_id, ItemBox(w)});
    t.destinations.push_back({peer, ItemBox(w)});
    dest_item[it->second].push_back(static_cast<int>(i));
  }
  planner::TransferPlanOptions po;
  po.bucket_cap_bytes = options_.bucket_cap_bytes;
  CAIRN_ASSIGN_OR_RETURN(planner::TransferPlan plan,
                         planner::BuildTransferPlan(tensors, po));

  v1::PeerRequest request;
  v1::PushReplica* push = request.mutable_push();
  push->set_job(set->job);
  push->set_step(set->step);
  push->set_source_rank(set->rank);
  push->set_source_node(options_.node_id);
  std::vector<int> item_message(set->items.size(), -1);
  std::vector<uint64_t> item_offset(set->items.size(), 0);
  std::vector<std::string> payloads;
  for (size_t m = 0; m < plan.messages.size(); ++m) {
    const planner::TransferMessage& msg = plan.messages[m];
    std::string payload(msg.bytes, '\0');
    for (const auto& part : msg.parts) {
      const planner::TransferSend& send = plan.sends[part.send];
      const int item = dest_item[send.tensor][send.dest_index];
      const Item& it = set->items[item];
      item_message[item] = static_cast<int>(m);
      item_offset[item] = part.payload_offset;
      std::memcpy(payload.data() + part.payload_offset,
                  set->segment->data() + it.offset, it.item.length());
    }
    push->add_message_tags(NewTag());
    push->add_message_bytes(msg.bytes);
    payloads.push_back(std::move(payload));
  }
  for (size_t i = 0; i < set->items.size(); ++i) {
    v1::HeldItem* h = push->add_items();
    *h->mutable_item() = set->items[i].item;
    h->set_crc32c(set->items[i].crc32c);
    push->add_item_message(item_message[i]);
    push->add_item_offset(item_offset[i]);
  }
  CAIRN_ASSIGN_OR_RETURN(
      v1::PeerResponse response,
      CallPeer(peer, std::move(request), [&]() -> absl::Status {
        for (size_t m = 0; m < payloads.size(); ++m) {
          CAIRN_RETURN_IF_ERROR(transport_->Send(
              peer, push->message_tags(static_cast<int>(m)), payloads[m]));
        }
        return absl::OkStatus();
      }));
  return ToStatus(response);
}

absl::StatusOr<v1::PeerResponse> Agent::CallPeer(
    int peer, v1::PeerRequest request,
    const std::function<absl::Status()>& after_send) {
  const uint64_t reply_tag = NewTag();
  request.set_reply_tag(reply_tag);
  request.set_from_node(options_.node_id);
  CAIRN_RETURN_IF_ERROR(transport_->Send(peer, kControlTagBit | NewTag(),
                                         request.SerializeAsString()));
  if (after_send) CAIRN_RETURN_IF_ERROR(after_send());
  CAIRN_ASSIGN_OR_RETURN(
      std::string reply,
      transport_->RecvMessage(peer, reply_tag, options_.peer_timeout));
  v1::PeerResponse response;
  if (!response.ParseFromString(reply)) {
    return absl::DataLossError(
        absl::StrCat("unparsable reply from peer node ", peer));
  }
  return response;
}

void Agent::HandleControl(int peer, uint64_t tag, std::string payload) {
  (void)tag;
  v1::PeerRequest request;
  v1::PeerResponse response;
  if (!request.ParseFromString(payload)) {
    CAIRN_LOG(warn, "node {}: unparsable control message from node {}",
              options_.node_id, peer);
    return;
  }
  absl::Status s;
  switch (request.kind_case()) {
    case v1::PeerRequest::kPush:
      s = HandlePush(peer, request.push());
      break;
    case v1::PeerRequest::kInventory:
      *response.mutable_inventory() = HandleInventory(request.inventory());
      break;
    case v1::PeerRequest::kFetch: {
      absl::StatusOr<uint64_t> n = HandleFetch(peer, request.fetch());
      if (n.ok()) {
        response.set_fetch_bytes(*n);
      } else {
        s = n.status();
      }
      break;
    }
    default:
      s = absl::InvalidArgumentError("unknown peer request");
  }
  response.set_code(static_cast<int>(s.code()));
  response.set_message(std::string(s.message()));
  absl::Status sent =
      transport_->Send(peer, request.reply_tag(), response.SerializeAsString());
  if (!sent.ok()) {
    CAIRN_LOG(warn, "node {}: reply to node {} failed: {}", options_.node_id,
              peer, sent.ToString());
  }
}

absl::Status Agent::HandlePush(int peer, const v1::PushReplica& push) {
  const std::string where = absl::StrCat(
      "replica of ", Where(push.job(), push.step(), push.source_rank()),
      " from node ", peer);
  auto set = std::make_shared<Set>();
  set->job = push.job();
  set->step = push.step();
  set->rank = push.source_rank();
  set->replica = true;
  // Everything below indexes and sizes by what the peer sent: check it all
  // before anything is allocated or copied. A refused push's data messages
  // are abandoned (dropped as they arrive).
  auto refuse = [&](absl::Status s) {
    for (uint64_t tag : push.message_tags()) transport_->Abandon(peer, tag);
    return s;
  };
  if (push.item_message_size() != push.items_size() ||
      push.item_offset_size() != push.items_size() ||
      push.message_bytes_size() != push.message_tags_size()) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        where, ": malformed push (", push.items_size(), " items, ",
        push.item_message_size(), " item messages, ", push.item_offset_size(),
        " item offsets, ", push.message_tags_size(), " message tags, ",
        push.message_bytes_size(), " message sizes)")));
  }
  const uint64_t budget = pool_->budget;
  uint64_t total = 0;
  for (int i = 0; i < push.items_size(); ++i) {
    const v1::HeldItem& h = push.items(i);
    const uint64_t n = h.item().length();
    const int m = push.item_message(i);
    if (m < 0 || m >= push.message_tags_size() || n > push.message_bytes(m) ||
        push.item_offset(i) > push.message_bytes(m) - n) {
      return refuse(absl::InvalidArgumentError(
          absl::StrCat(where, ": item '", ItemFqn(h.item()), "' (", n,
                       " bytes) lies outside its message")));
    }
    if (n > budget || total > budget - n) {
      return refuse(absl::ResourceExhaustedError(absl::StrCat(
          where, ": more than the staging budget of ", budget, " bytes")));
    }
    Item it;
    it.item = h.item();
    it.crc32c = h.crc32c();
    it.offset = total;
    total = AlignUp(total + n, kAlign);
    set->items.push_back(std::move(it));
  }
  // Receive every message first (they are already on their way), then
  // place and verify the items.
  std::vector<std::string> messages(push.message_tags_size());
  absl::Status first;
  for (int m = 0; m < push.message_tags_size(); ++m) {
    absl::StatusOr<std::string> msg = transport_->RecvMessage(
        peer, push.message_tags(m), options_.peer_timeout);
    if (!msg.ok()) {
      first.Update(msg.status());
      continue;
    }
    if (msg->size() != push.message_bytes(m)) {
      first.Update(absl::DataLossError(
          absl::StrCat(where, ": message ", m, " has ", msg->size(),
                       " bytes, expected ", push.message_bytes(m))));
    }
    messages[m] = std::move(*msg);
  }
  CAIRN_RETURN_IF_ERROR(first);
  absl::StatusOr<std::shared_ptr<ShmSegment>> seg =
      Allocate(total, absl::Now() + options_.peer_timeout);
  if (!seg.ok()) {
    return absl::Status(seg.status().code(),
                        absl::StrCat(where, ": ", seg.status().message()));
  }
  set->segment = std::move(*seg);
  for (int i = 0; i < push.items_size(); ++i) {
    const Item& it = set->items[i];
    const uint64_t n = it.item.length();
    if (n == 0) continue;
    const int m = push.item_message(i);  // checked above; sizes match too
    char* dst = set->segment->data() + it.offset;
    std::memcpy(dst, messages[m].data() + push.item_offset(i), n);
    const uint32_t crc = storage::Crc32c(dst, n);
    if (crc != it.crc32c) {
      return absl::DataLossError(absl::StrFormat(
          "%s: item '%s' %s has crc32c 0x%08x, source said 0x%08x", where,
          ItemFqn(it.item), planner::BoxToString(ItemBox(it.item)), crc,
          it.crc32c));
    }
  }
  absl::MutexLock l(&mu_);
  std::shared_ptr<Set>& slot = replicas_[{set->job, set->rank}];
  if (slot == nullptr || slot->step <= set->step) slot = set;
  return absl::OkStatus();
}

v1::InventoryResponse Agent::HandleInventory(
    const v1::InventoryRequest& request) {
  v1::InventoryResponse response;
  absl::MutexLock l(&mu_);
  for (auto* m : {&tier0_, &replicas_}) {
    for (const auto& [key, set] : *m) {
      if (set->job != request.job() || set->step != request.step()) continue;
      v1::HeldSet* h = response.add_sets();
      h->set_source_rank(set->rank);
      for (const Item& it : set->items) {
        v1::HeldItem* hi = h->add_items();
        *hi->mutable_item() = it.item;
        hi->set_crc32c(it.crc32c);
      }
    }
  }
  return response;
}

absl::StatusOr<std::pair<std::shared_ptr<const Agent::Set>, const Agent::Item*>>
Agent::FindHeld(const std::string& job, int64_t step, const v1::WriteItem& item,
                uint32_t crc) {
  std::vector<std::shared_ptr<const Set>> candidates;
  {
    absl::MutexLock l(&mu_);
    for (auto* m : {&tier0_, &replicas_}) {
      for (const auto& [key, set] : *m) {
        if (set->job == job && set->step == step) candidates.push_back(set);
      }
    }
  }
  absl::Status last = absl::NotFoundError(absl::StrCat(
      "node ", options_.node_id, " holds no '", ItemFqn(item), "' ",
      planner::BoxToString(ItemBox(item)), " of job '", job, "' step ", step));
  for (const auto& set : candidates) {
    for (const Item& it : set->items) {
      if (!SameItem(it.item, item)) continue;
      const uint32_t got =
          storage::Crc32c(set->segment->data() + it.offset, it.item.length());
      if (got != crc) {
        last = absl::DataLossError(absl::StrFormat(
            "node %d: in-memory '%s' %s of job '%s' step %d has crc32c 0x%08x, "
            "manifest says 0x%08x",
            options_.node_id, ItemFqn(item),
            planner::BoxToString(ItemBox(item)), job, step, got, crc));
        continue;
      }
      return std::make_pair(set, &it);
    }
  }
  return last;
}

absl::StatusOr<uint64_t> Agent::HandleFetch(int peer,
                                            const v1::FetchRequest& req) {
  // Every piece is checked (held here, region inside the held chunk) before
  // the reply is allocated: its size comes from the network.
  struct Piece {
    std::shared_ptr<const Set> set;
    const Item* item;
    planner::ChunkBox region;
    size_t elem;
  };
  std::vector<Piece> pieces;
  uint64_t total = 0;
  for (const v1::FetchPiece& p : req.pieces()) {
    CAIRN_ASSIGN_OR_RETURN(auto held, FindHeld(req.job(), req.step(), p.item(),
                                               p.expected_crc32c()));
    planner::ChunkBox region;
    CAIRN_ASSIGN_OR_RETURN(
        region, convert::BoxFromProto(p.region(), ItemFqn(p.item())));
    const size_t elem = ItemElemSize(p.item());
    const planner::ChunkBox src_box = ItemBox(held.second->item);
    if (!planner::Contains(src_box, region) ||
        elem != ItemElemSize(held.second->item)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fetch of '", ItemFqn(p.item()), "' region ",
                       planner::BoxToString(region), " outside held chunk ",
                       planner::BoxToString(src_box)));
    }
    const uint64_t bytes =
        static_cast<uint64_t>(planner::Volume(region)) * elem;
    if (total + bytes > pool_->budget) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "fetch from node ", peer, " of more than the staging budget of ",
          pool_->budget, " bytes"));
    }
    total += bytes;
    pieces.push_back({std::move(held.first), held.second, region, elem});
  }
  std::string payload(total, '\0');
  uint64_t cursor = 0;
  std::vector<planner::CopySegment> segs;
  for (const Piece& piece : pieces) {
    const planner::ChunkBox& region = piece.region;
    const size_t elem = piece.elem;
    const planner::ChunkBox src_box = ItemBox(piece.item->item);
    segs.clear();
    planner::AppendCopySegments(src_box, region, region, elem, &segs);
    const char* src = piece.set->segment->data() + piece.item->offset;
    for (const auto& s : segs) {
      std::memcpy(payload.data() + cursor + s.dst_offset, src + s.src_offset,
                  s.length);
    }
    cursor += static_cast<uint64_t>(planner::Volume(region)) * elem;
  }
  CAIRN_RETURN_IF_ERROR(transport_->Send(peer, req.data_tag(), payload));
  return total;
}

// ---------------------------------------------------------------------------
// Load path.

absl::StatusOr<v1::AgentLoadResponse> Agent::Load(
    const v1::AgentLoadRequest& request) {
  const absl::Duration rpc_timeout = absl::Seconds(60);
  int64_t step = request.step();
  if (request.ref_case() == v1::AgentLoadRequest::kLatest) {
    v1::ListCheckpointsRequest lr;
    lr.set_job(request.job());
    v1::ListCheckpointsResponse list;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout));
    CAIRN_RETURN_IF_ERROR(
        FromGrpcStatus(coordinator_->ListCheckpoints(&ctx, lr, &list)));
    step = -1;
    for (const v1::CheckpointRecord& r : list.checkpoints()) {
      if (r.job() == request.job() &&
          r.state() == v1::CHECKPOINT_STATE_COMMITTED) {
        step = std::max(step, r.step());
      }
    }
    if (step < 0) {
      return absl::NotFoundError(absl::StrCat("job '", request.job(),
                                              "' has no committed checkpoint"));
    }
  }
  const std::string where = Where(request.job(), step, request.rank());
  v1::GetCheckpointRequest gr;
  gr.set_job(request.job());
  gr.set_step(step);
  v1::GetCheckpointResponse got;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout));
    CAIRN_RETURN_IF_ERROR(
        FromGrpcStatus(coordinator_->GetCheckpoint(&ctx, gr, &got)));
  }
  if (got.checkpoint().state() != v1::CHECKPOINT_STATE_COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": checkpoint is not committed"));
  }
  const v1::Manifest& manifest = got.manifest();

  // Who holds what, in memory: every reachable agent (this one directly).
  struct Holding {
    int node;
    v1::HeldItem held;
  };
  std::vector<std::vector<v1::HeldSet>> held_by(options_.num_nodes);
  {
    v1::InventoryRequest inv;
    inv.set_job(request.job());
    inv.set_step(step);
    v1::InventoryResponse mine = HandleInventory(inv);
    held_by[options_.node_id].assign(mine.sets().begin(), mine.sets().end());
    for (int n = 0; n < options_.num_nodes; ++n) {
      if (n == options_.node_id) continue;
      v1::PeerRequest pr;
      *pr.mutable_inventory() = inv;
      absl::StatusOr<v1::PeerResponse> r = CallPeer(n, std::move(pr), nullptr);
      if (!r.ok() || !ToStatus(*r).ok()) {
        CAIRN_LOG(info, "node {}: peer node {} unavailable for {}: {}",
                  options_.node_id, n, where,
                  r.ok() ? ToStatus(*r).ToString() : r.status().ToString());
        continue;
      }
      held_by[n].assign(r->inventory().sets().begin(),
                        r->inventory().sets().end());
    }
  }
  // (plan name, box) -> holder nodes whose copy claims the manifest's crc.
  std::map<std::pair<std::string, planner::ChunkBox>, std::vector<int>> holders;
  std::map<std::pair<std::string, planner::ChunkBox>, v1::WriteItem> items;
  for (int n = 0; n < options_.num_nodes; ++n) {
    for (const v1::HeldSet& s : held_by[n]) {
      for (const v1::HeldItem& h : s.items()) {
        auto key = std::make_pair(PlanName(h.item()), ItemBox(h.item()));
        std::vector<int>& v = holders[key];
        if (std::find(v.begin(), v.end(), n) == v.end()) v.push_back(n);
        items[key] = h.item();
      }
    }
  }
  absl::flat_hash_map<std::string, const v1::ManifestTensor*> mtensors;
  for (const v1::ManifestTensor& t : manifest.tensors()) {
    mtensors[t.entry().fqn()] = &t;
  }
  absl::flat_hash_map<std::string, const v1::ManifestBytes*> mbytes;
  for (const v1::ManifestBytes& b : manifest.bytes_entries()) {
    mbytes[b.fqn()] = &b;
  }
  // Expected crc per (plan name, box), from the manifest.
  std::map<std::pair<std::string, planner::ChunkBox>, uint32_t> expected;

  // The transfer plan: sources = holders of the manifest's chunks,
  // destinations = this rank's wanted boxes (all on this node).
  std::vector<planner::TransferTensor> tensors;
  std::map<std::string, int> tindex;
  struct Dest {
    uint64_t offset;  // in the load segment
    planner::ChunkBox box;
  };
  std::vector<std::vector<Dest>> dests;
  uint64_t total = 0;
  v1::AgentLoadResponse response;
  auto tensor_for = [&](const std::string& name, planner::DType dtype,
                        planner::Shape shape) -> int {
    auto [it, inserted] =
        tindex.emplace(name, static_cast<int>(tensors.size()));
    if (inserted) {
      planner::TransferTensor t;
      t.fqn = name;
      t.dtype = dtype;
      t.global_shape = std::move(shape);
      tensors.push_back(std::move(t));
      dests.emplace_back();
    }
    return it->second;
  };
  auto add_sources = [&](int ti, const v1::WriteItem& proto_item,
                         const planner::ChunkBox& box, uint32_t crc) {
    const std::string& name = tensors[ti].fqn;
    expected[{name, box}] = crc;
    auto h = holders.find({name, box});
    if (h == holders.end()) return;
    (void)proto_item;
    for (int n : h->second) tensors[ti].sources.push_back({n, box});
  };
  for (const v1::WantedChunk& w : request.wanted()) {
    const std::string& fqn = w.tensor().fqn();
    auto mt = mtensors.find(fqn);
    if (mt == mtensors.end()) {
      return absl::NotFoundError(
          absl::StrCat(where, ": checkpoint has no tensor '", fqn, "'"));
    }
    const v1::TensorEntry& e = mt->second->entry();
    if (e.dtype() != w.tensor().dtype() ||
        !std::equal(e.global_shape().begin(), e.global_shape().end(),
                    w.tensor().global_shape().begin(),
                    w.tensor().global_shape().end())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", fqn,
                       "' dtype or shape differs from the saved "
                       "one"));
    }
    CAIRN_ASSIGN_OR_RETURN(planner::ChunkBox box,
                           convert::BoxFromProto(w.box(), fqn));
    const planner::DType dtype = DTypeOf(e.dtype());
    const bool first = tindex.count(fqn) == 0;
    const int ti = tensor_for(
        fqn, dtype,
        planner::Shape(e.global_shape().begin(), e.global_shape().end()));
    if (first) {
      for (const v1::StoredChunk& c : mt->second->chunks()) {
        CAIRN_ASSIGN_OR_RETURN(planner::ChunkBox cb,
                               convert::BoxFromProto(c.box(), fqn));
        add_sources(ti, v1::WriteItem(), cb, c.crc32c());
      }
    }
    dests[ti].push_back({total, box});
    tensors[ti].destinations.push_back({options_.node_id, box});
    response.add_wanted_offsets(total);
    total = AlignUp(total + static_cast<uint64_t>(planner::Volume(box)) *
                                planner::DTypeSize(dtype),
                    kAlign);
  }
  for (const std::string& fqn : request.wanted_bytes()) {
    auto mb = mbytes.find(fqn);
    if (mb == mbytes.end()) {
      return absl::NotFoundError(
          absl::StrCat(where, ": checkpoint has no bytes entry '", fqn, "'"));
    }
    const uint64_t len = mb->second->location().length();
    response.add_wanted_bytes_offsets(total);
    response.add_wanted_bytes_lengths(len);
    if (len > 0) {
      const std::string name = absl::StrCat("\x01bytes:", fqn);
      planner::ChunkBox box{{0}, {static_cast<int64_t>(len)}};
      const bool first = tindex.count(name) == 0;
      const int ti =
          tensor_for(name, planner::DType::kUInt8, {static_cast<int64_t>(len)});
      if (first) add_sources(ti, v1::WriteItem(), box, mb->second->crc32c());
      dests[ti].push_back({total, box});
      tensors[ti].destinations.push_back({options_.node_id, box});
    }
    total = AlignUp(total + len, kAlign);
  }
  planner::TransferPlanOptions po;
  po.bucket_cap_bytes = options_.bucket_cap_bytes;
  absl::StatusOr<planner::TransferPlan> plan =
      planner::BuildTransferPlan(tensors, po);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat(where, ": memory tiers cannot serve it: ",
                                     plan.status().message()));
  }
  CAIRN_ASSIGN_OR_RETURN(std::shared_ptr<ShmSegment> seg,
                         Allocate(total, absl::Now() + options_.peer_timeout));

  auto held_item = [&](const planner::TransferSend& send) {
    const planner::ChunkBox& src_box =
        tensors[send.tensor].sources[send.source_index].box;
    const std::string& name = tensors[send.tensor].fqn;
    return std::make_tuple(items[{name, src_box}], src_box,
                           expected[{name, src_box}]);
  };
  std::vector<planner::CopySegment> segs;
  // Local pieces: from this agent's own memory.
  for (const planner::TransferSend& send : plan->sends) {
    if (!send.local) continue;
    auto [item, src_box, crc] = held_item(send);
    CAIRN_ASSIGN_OR_RETURN(auto held, FindHeld(request.job(), step, item, crc));
    const Dest& d = dests[send.tensor][send.dest_index];
    segs.clear();
    const size_t elem = planner::DTypeSize(send.dtype);
    planner::AppendCopySegments(src_box, d.box, send.box, elem, &segs);
    const char* src = held.first->segment->data() + held.second->offset;
    for (const auto& s : segs) {
      std::memcpy(seg->data() + d.offset + s.dst_offset, src + s.src_offset,
                  s.length);
    }
    response.set_bytes_local(response.bytes_local() + send.bytes);
  }
  // Remote pieces: one Fetch per planned message, peers in parallel.
  std::vector<absl::Status> results(plan->messages.size());
  std::vector<std::thread> fetchers;
  for (size_t m = 0; m < plan->messages.size(); ++m) {
    fetchers.emplace_back([&, m] {
      const planner::TransferMessage& msg = plan->messages[m];
      v1::PeerRequest pr;
      v1::FetchRequest* f = pr.mutable_fetch();
      f->set_job(request.job());
      f->set_step(step);
      f->set_data_tag(NewTag());
      for (const auto& part : msg.parts) {
        const planner::TransferSend& send = plan->sends[part.send];
        auto [item, src_box, crc] = held_item(send);
        v1::FetchPiece* p = f->add_pieces();
        *p->mutable_item() = item;
        p->set_expected_crc32c(crc);
        convert::BoxToProto(send.box, p->mutable_region());
      }
      absl::StatusOr<v1::PeerResponse> r =
          CallPeer(msg.src_rank, std::move(pr), nullptr);
      if (!r.ok()) {
        results[m] = r.status();
        return;
      }
      if (!ToStatus(*r).ok()) {
        results[m] = ToStatus(*r);
        return;
      }
      absl::StatusOr<std::string> payload = transport_->RecvMessage(
          msg.src_rank, f->data_tag(), options_.peer_timeout);
      if (!payload.ok() || payload->size() != msg.bytes) {
        results[m] = payload.ok()
                         ? absl::DataLossError(absl::StrCat(
                               "fetch from node ", msg.src_rank, " returned ",
                               payload->size(), " bytes, planned ", msg.bytes))
                         : payload.status();
        return;
      }
      std::vector<planner::CopySegment> local_segs;
      for (const auto& part : msg.parts) {
        const planner::TransferSend& send = plan->sends[part.send];
        const Dest& d = dests[send.tensor][send.dest_index];
        local_segs.clear();
        planner::AppendCopySegments(send.box, d.box, send.box,
                                    planner::DTypeSize(send.dtype),
                                    &local_segs);
        for (const auto& s : local_segs) {
          std::memcpy(seg->data() + d.offset + s.dst_offset,
                      payload->data() + part.payload_offset + s.src_offset,
                      s.length);
        }
      }
    });
  }
  for (std::thread& t : fetchers) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
    }
  }
  response.set_bytes_peers(plan->network_bytes);
  response.set_step(step);
  response.set_shm_name(seg->name());
  response.set_shm_size(seg->size());
  const uint64_t id = next_id_.fetch_add(1);
  response.set_load_id(id);
  absl::MutexLock l(&mu_);
  loads_[id] = std::move(seg);
  return response;
}

absl::Status Agent::ReleaseLoad(uint64_t load_id) {
  absl::MutexLock l(&mu_);
  if (loads_.erase(load_id) == 0) {
    return absl::NotFoundError(absl::StrCat("no load with id ", load_id));
  }
  return absl::OkStatus();
}

v1::AgentStatusResponse Agent::Status() {
  v1::AgentStatusResponse r;
  r.set_node_id(options_.node_id);
  r.set_budget_bytes(pool_->budget);
  {
    absl::MutexLock l(&pool_->mu);
    r.set_used_bytes(pool_->used);
    r.set_peak_used_bytes(pool_->peak);
  }
  r.set_streamed_buckets(pool_->streamed_buckets.load());
  absl::MutexLock l(&mu_);
  r.set_tier0_sets(static_cast<int>(tier0_.size()));
  r.set_replica_sets(static_cast<int>(replicas_.size()));
  r.set_commits(commits_);
  r.set_replicas_pushed(replicas_pushed_);
  r.set_streamed_saves(streamed_saves_);
  return r;
}

}  // namespace cairn::agent
