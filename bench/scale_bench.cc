// scale_bench: the coordinator's cost as the number of ranks grows (issue 17).
//
// Starts a real cairnd (its own process, file:// storage in a scratch
// directory) and plays N ranks against it from this one process: every
// rank's request is built exactly as a real rank builds it (the planner's
// layout helpers give its chunks, planner::FingerprintLocalPlan its
// fingerprint, proto/convert its wire form) and sent over a few shared gRPC
// channels with the callback API, all N collective calls outstanding at
// once. Rounds, per N:
//
//   rpc_floor_cold one small RPC per rank (ListAgents), the first round of
//                N calls: both sides also grow their gRPC thread pools and
//                heaps to N calls at once
//   rpc_floor    the same again: what N calls cost on this machine, the
//                floor under every round of N that follows
//   begin        BeginSave of step 1 with every rank's whole local plan
//                (cairnd builds the global plan: uncached)
//   commit       CommitSave of step 1 (the manifest is published), each
//                rank's checksums in the short form SaveProtocol sends
//   begin_cached BeginSave of step 2 with the plan fingerprint only (cairnd
//                takes the global plan from its cache). Ranks whose plan
//                cairnd no longer holds (its known-plan cache is bounded)
//                are answered resend_plan and send the whole plan, as
//                SaveProtocol does; the round reports how many.
//   commit_cached CommitSave of step 2
//   prepare      no RPC: cairnd indexes each committed checkpoint for
//                PlanLoad right after its commit (--prepare-loads); the
//                bench waits, polling cairnd's /metrics, until step 1's
//                index is built (--no-prepare: skipped, and both load
//                rounds build theirs). prepare_cached: step 2's, after
//                commit_cached.
//   plan_load_cold PlanLoad of step 1 (its index was dropped when step 2's
//                was prepared, so the round waits for the build, as after a
//                cairnd restart) into 3N/4 ranks, outside a load round
//   plan_load    PlanLoad of step 2 into a different world (3N/4 ranks, a
//                load round with collective verification), answered in read
//                columns (expanded by the bench as libcairn does) unless
//                --full-answers; the short form of the request (the tensors'
//                digest and the rank's boxes) unless --full-requests
//   verify_load  VerifyLoad: every loading rank's crc32c terms of the stored
//                chunks it reads only in part
//
// The state is a Llama-like model (default: 70B, 80 layers, hidden 8192, FFN
// 28672, 64 heads / 8 kv heads, vocab 32000) with Adam's exp_avg and
// exp_avg_sq, all float32, laid out FSDP x TP over the mesh [N/8, 8]:
// column-parallel weights (wq, wk, wv, w1, w3, output, embedding) are
// [Shard(0), Shard(0)], row-parallel ones (wo, w2) [Shard(0), Shard(1)],
// norms [Shard(0), Replicate()]; each rank also holds one replicated bytes
// entry. No tensor bytes exist: each planned object is a sparse file of the
// planned size, and every item's crc32c is that of zero bytes (so a loading
// rank's crc32c term of what it reads, a linear term, is 0). cairnd checks
// object sizes at commit and combines the terms at VerifyLoad exactly as
// with real bytes.
//
// Per round it reports wall time (first call sent to last answer), cairnd's
// CPU time (utime + stime from /proc/<pid>/stat) and this process's (the
// simulated ranks' gRPC work: the two share this machine's cores), cairnd's
// minor page faults, its peak RSS during the
// round (VmHWM after resetting it through /proc/<pid>/clear_refs) and RSS
// after, and the serialized request/response bytes per rank; then the
// growth of each from N to 4N. "floor" is this process's single-core time
// to encode the round's requests and decode its answers: cairnd must at
// least decode as many bytes and encode as many, so wall / floor says how
// close a round is to being bound by the protobuf bytes on the wire.
// Requests are built and encoded before a round (not timed) and answers
// decoded after it, so the bench takes as little CPU as possible from
// cairnd during the round.
//
// Every run checks its results and fails (exit 1) when one is wrong: every
// rank got its plan (from the cache in the second save), the planned bytes
// add up to the model's, both steps are listed as committed, every loading
// rank's plan covers every byte it wants, and VerifyLoad verified the partly
// read chunks with none left to verify locally.
//
//   scale_bench --smoke                     # 64 -> 48 ranks, tiny model
//   scale_bench --ranks 1024,4096           # 70B model
//   scale_bench --ranks 16384 --layers 20   # a quarter of the layers
//   scale_bench --perf-dir DIR              # perf record cairnd per round
//   scale_bench --full-answers              # PlanLoad's full answer form
//   scale_bench --full-requests             # PlanLoad's full request form
//   scale_bench --no-prepare                # cairnd --prepare-loads=false
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "cairn/v1/cairn.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "httplib.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "planner/layout.h"
#include "planner/plan_cache.h"
#include "planner/save_plan.h"
#include "proto/convert/load_answer.h"
#include "proto/convert/load_request.h"
#include "proto/convert/plan_convert.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"
#include "tests/testing/cairnd_process.h"
#include "tests/testing/subprocess.h"

#ifndef CAIRN_CAIRND_PATH
#define CAIRN_CAIRND_PATH ""
#endif

namespace cairn::bench {
namespace {

using planner::ChunkBox;
using planner::DTensorLayout;
using planner::Placement;
using planner::Shape;

constexpr int kTp = 8;  // tensor-parallel ranks per node
constexpr char kJob[] = "llama-scale";
constexpr uint64_t kTrainStateBytes = 1024;  // the replicated bytes entry

// The cairnd of the world size being run, killed when the run fails.
std::atomic<pid_t> g_cairnd_pid{0};
// --perf-round: the rounds --perf-dir records (empty: all); set before any.
absl::flat_hash_set<std::string> g_perf_rounds;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "scale_bench: FAILED: %s\n", what.c_str());
  std::fflush(stderr);
  if (const pid_t pid = g_cairnd_pid.load(); pid > 0) kill(pid, SIGKILL);
  std::_Exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Fail(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}

// ---------------------------------------------------------------------------
// The model and its layout.

struct ModelSpec {
  int layers = 80;
  int64_t hidden = 8192;
  int64_t ffn = 28672;
  int64_t heads = 64;
  int64_t kv_heads = 8;
  int64_t vocab = 32000;
};

// How a tensor is split over [FSDP, TP].
enum class Parallel { kColumn, kRow, kNorm };

struct TensorSpec {
  std::string fqn;
  Shape shape;
  int kind;  // index into Model::kinds
};

// Tensors of the same shape and placement share their chunks per rank.
struct TensorKind {
  Shape shape;
  Parallel parallel;
};

struct Model {
  std::vector<TensorKind> kinds;
  std::vector<TensorSpec> tensors;
  uint64_t params = 0;
  uint64_t tensor_bytes = 0;  // float32 params + exp_avg + exp_avg_sq
};

Model BuildModel(const ModelSpec& m) {
  Model model;
  std::map<std::pair<Shape, Parallel>, int> kind_of;
  const int64_t head_dim = m.hidden / m.heads;
  auto add = [&](const std::string& name, Shape shape, Parallel p) {
    auto [it, fresh] = kind_of.emplace(std::make_pair(shape, p),
                                       static_cast<int>(model.kinds.size()));
    if (fresh) model.kinds.push_back({shape, p});
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    model.params += static_cast<uint64_t>(n);
    for (const char* prefix :
         {"model.", "optim.exp_avg.", "optim.exp_avg_sq."}) {
      model.tensors.push_back({absl::StrCat(prefix, name), shape, it->second});
      model.tensor_bytes += static_cast<uint64_t>(n) * 4;
    }
  };
  add("tok_embeddings.weight", {m.vocab, m.hidden}, Parallel::kColumn);
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    add(p + "attention.wq.weight", {m.hidden, m.hidden}, Parallel::kColumn);
    add(p + "attention.wk.weight", {m.kv_heads * head_dim, m.hidden},
        Parallel::kColumn);
    add(p + "attention.wv.weight", {m.kv_heads * head_dim, m.hidden},
        Parallel::kColumn);
    add(p + "attention.wo.weight", {m.hidden, m.hidden}, Parallel::kRow);
    add(p + "feed_forward.w1.weight", {m.ffn, m.hidden}, Parallel::kColumn);
    add(p + "feed_forward.w2.weight", {m.hidden, m.ffn}, Parallel::kRow);
    add(p + "feed_forward.w3.weight", {m.ffn, m.hidden}, Parallel::kColumn);
    add(p + "attention_norm.weight", {m.hidden}, Parallel::kNorm);
    add(p + "ffn_norm.weight", {m.hidden}, Parallel::kNorm);
  }
  add("norm.weight", {m.hidden}, Parallel::kNorm);
  add("output.weight", {m.vocab, m.hidden}, Parallel::kColumn);
  return model;
}

DTensorLayout FsdpTpLayout(int world, Parallel p) {
  DTensorLayout layout;
  layout.mesh.shape = {world / kTp, kTp};
  layout.mesh.ranks.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) layout.mesh.ranks[r] = r;
  switch (p) {
    case Parallel::kColumn:
      layout.placements = {Placement::Shard(0), Placement::Shard(0)};
      break;
    case Parallel::kRow:
      layout.placements = {Placement::Shard(0), Placement::Shard(1)};
      break;
    case Parallel::kNorm:
      layout.placements = {Placement::Shard(0), Placement::Replicate()};
      break;
  }
  return layout;
}

// Every rank's chunk of every tensor kind for one world size: what each
// rank's DTensors report as their local shards.
class RankChunks {
 public:
  RankChunks(const Model& model, int world) {
    for (const TensorKind& k : model.kinds) {
      std::vector<planner::RankChunk> all =
          Check(planner::AllChunks(FsdpTpLayout(world, k.parallel), k.shape),
                "layout");
      std::vector<ChunkBox> by_rank(static_cast<size_t>(world));
      for (planner::RankChunk& c : all) by_rank[c.rank] = std::move(c.box);
      boxes_.push_back(std::move(by_rank));
    }
  }
  const ChunkBox& Of(int kind, int rank) const { return boxes_[kind][rank]; }

 private:
  std::vector<std::vector<ChunkBox>> boxes_;  // [kind][rank]
};

// Rank `rank`'s local save plan, as its Checkpointer builds it: every
// non-empty chunk it holds, plus the replicated bytes entry.
planner::LocalSavePlan LocalPlanOf(const Model& model, const RankChunks& chunks,
                                   int rank) {
  planner::LocalSavePlan plan;
  plan.rank = rank;
  plan.items.reserve(model.tensors.size() + 1);
  for (const TensorSpec& t : model.tensors) {
    const ChunkBox& box = chunks.Of(t.kind, rank);
    if (planner::IsEmpty(box)) continue;
    planner::WriteItem item;
    item.fqn = t.fqn;
    item.dtype = planner::DType::kFloat32;
    item.global_shape = t.shape;
    item.box = box;
    item.length = static_cast<uint64_t>(planner::Volume(box)) * 4;
    plan.items.push_back(std::move(item));
  }
  planner::WriteItem state;
  state.kind = planner::WriteItem::Kind::kBytes;
  state.fqn = "train_state";
  state.dtype = planner::DType::kUInt8;  // as client/state_dict.cc sends it
  state.length = kTrainStateBytes;
  plan.items.push_back(std::move(state));
  return plan;
}

// ---------------------------------------------------------------------------
// cairnd's resources, from /proc.

struct ProcSample {
  double cpu_s = 0;         // utime + stime
  double hwm_mib = 0;       // VmHWM
  double rss_mib = 0;       // VmRSS
  double minor_faults = 0;  // minflt: first touches of fresh pages
};

ProcSample SampleProc(pid_t pid) {
  ProcSample s;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  // Fields after the command name (which may hold spaces), from field 3.
  const size_t close = line.rfind(')');
  if (close != std::string::npos) {
    std::vector<std::string> f =
        absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
    if (f.size() > 13) {
      const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
      s.cpu_s = (std::stod(f[11]) + std::stod(f[12])) / tick;  // 14, 15
      s.minor_faults = std::stod(f[7]);                        // field 10
    }
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  while (std::getline(status, line)) {
    auto kib = [&](const char* key) {
      return std::stod(line.substr(std::strlen(key))) / 1024.0;
    };
    if (absl::StartsWith(line, "VmHWM:")) s.hwm_mib = kib("VmHWM:");
    if (absl::StartsWith(line, "VmRSS:")) s.rss_mib = kib("VmRSS:");
  }
  return s;
}

// Resets VmHWM to the current RSS, so the next sample's VmHWM is the
// round's peak.
void ResetPeak(pid_t pid) {
  std::ofstream(absl::StrCat("/proc/", pid, "/clear_refs")) << "5";
}

// ---------------------------------------------------------------------------
// Many ranks over a few channels.

// One collective round: N calls of one method, all outstanding at once.
class Round {
 public:
  Round(std::vector<std::unique_ptr<grpc::GenericStub>>* stubs,
        std::string method)
      : stubs_(stubs), method_(std::move(method)) {}

  // Encodes `request` now (its bytes count towards the round's floor).
  template <typename Msg>
  void Add(const Msg& request) {
    const absl::Time t0 = absl::Now();
    auto call = std::make_unique<Call>();
    bool own = false;
    grpc::Status s = grpc::SerializationTraits<Msg>::Serialize(
        request, &call->request, &own);
    if (!s.ok()) Fail(absl::StrCat("encoding a request: ", s.error_message()));
    request_bytes_ += call->request.Length();
    encode_ += absl::Now() - t0;
    calls_.push_back(std::move(call));
  }

  // When set, called (on a gRPC thread) with each OK answer: true and a
  // request in `*again` sends call i again (BeginSave's resend_plan).
  using Resend = std::function<bool(size_t i, grpc::ByteBuffer& answer,
                                    grpc::ByteBuffer* again)>;
  void set_resend(Resend resend) { resend_ = std::move(resend); }

  // Sends every call and waits for every answer; returns the wall time.
  absl::Duration Run() {
    const absl::Time start = absl::Now();
    pending_ = calls_.size();
    for (size_t i = 0; i < calls_.size(); ++i) Start(i);
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](size_t* n) { return *n == 0; }, &pending_));
    return done_at_ - start;
  }

  size_t size() const { return calls_.size(); }
  uint64_t resends() const { return resends_; }
  uint64_t request_bytes() const { return request_bytes_; }
  uint64_t response_bytes() const { return response_bytes_; }
  absl::Duration codec_time() const { return encode_ + decode_; }

  // Decodes call i's answer (then frees it); fails the run on an error.
  template <typename Msg>
  Msg Answer(size_t i, const std::string& who) {
    Call& c = *calls_[i];
    if (!c.status.ok()) {
      Fail(absl::StrCat(who, ": ", method_,
                        " failed: ", static_cast<int>(c.status.error_code()),
                        " ", c.status.error_message()));
    }
    const absl::Time t0 = absl::Now();
    response_bytes_ += c.response.Length();
    Msg out;
    grpc::Status s =
        grpc::SerializationTraits<Msg>::Deserialize(&c.response, &out);
    if (!s.ok()) Fail(absl::StrCat(who, ": bad answer: ", s.error_message()));
    decode_ += absl::Now() - t0;
    calls_[i].reset();
    return out;
  }

 private:
  struct Call {
    std::unique_ptr<grpc::ClientContext> context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
    grpc::Status status;
  };

  void Start(size_t i) {
    Call& c = *calls_[i];
    c.context = std::make_unique<grpc::ClientContext>();
    c.context->set_deadline(std::chrono::system_clock::now() +
                            std::chrono::hours(1));
    (*stubs_)[i % stubs_->size()]->UnaryCall(
        c.context.get(), method_, grpc::StubOptions(), &c.request, &c.response,
        [this, i, &c](grpc::Status s) {
          c.request.Clear();
          if (s.ok() && resend_ && resend_(i, c.response, &c.request)) {
            request_bytes_ += c.request.Length();
            ++resends_;
            Start(i);
            return;
          }
          c.status = std::move(s);
          absl::MutexLock lock(&mu_);
          if (--pending_ == 0) done_at_ = absl::Now();
        });
  }

  std::vector<std::unique_ptr<grpc::GenericStub>>* const stubs_;
  const std::string method_;
  std::vector<std::unique_ptr<Call>> calls_;
  Resend resend_;
  std::atomic<uint64_t> resends_{0};
  std::atomic<uint64_t> request_bytes_{0};
  uint64_t response_bytes_ = 0;
  absl::Duration encode_, decode_;

  absl::Mutex mu_;
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time done_at_ ABSL_GUARDED_BY(mu_);
};

std::string Method(const char* name) {
  return absl::StrCat("/cairn.v1.Coordinator/", name);
}

// ---------------------------------------------------------------------------
// The rounds of one world size.

struct RoundResult {
  std::string round;
  int ranks = 0;
  double wall_s = 0;
  double cpu_s = 0;
  double client_cpu_s = 0;  // this process's (the ranks') CPU in the round
  double minor_faults = 0;  // cairnd's in the round
  double peak_mib = 0;
  double rss_mib = 0;
  double request_bytes_per_rank = 0;
  double response_bytes_per_rank = 0;
  double floor_s = 0;   // this process's encode + decode time for the round
  int64_t resends = 0;  // BeginSave answered resend_plan, sent again
  int from_cache = -1;  // BeginSave: ranks told the plan came from the cache
  int unchanged = -1;   // BeginSave: ranks told their plan is the one held
};

class ScaleRun {
 public:
  ScaleRun(const Model& model, testing::CairndProcess* cairnd,
           std::string storage_root, int channels, std::string perf_dir,
           convert::AnswerForm answer_form, bool short_requests,
           std::string metrics_port_file)
      : answer_form_(answer_form),
        short_requests_(short_requests),
        metrics_port_file_(std::move(metrics_port_file)),
        model_(model),
        cairnd_(cairnd),
        storage_root_(std::move(storage_root)),
        perf_dir_(std::move(perf_dir)) {
    for (int i = 0; i < channels; ++i) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);
      args.SetInt("cairn.scale_bench.channel", i);  // a connection each
      channels_.push_back(grpc::CreateCustomChannel(
          cairnd->address(), grpc::InsecureChannelCredentials(), args));
      stubs_.push_back(std::make_unique<grpc::GenericStub>(channels_.back()));
    }
    control_ = v1::Coordinator::NewStub(channels_[0]);
  }

  // Runs every round for `world` saving ranks and `load_world` loading ones.
  std::vector<RoundResult> Run(int world, int load_world, int64_t first_step) {
    std::vector<RoundResult> out;
    const RankChunks chunks(model_, world);
    const int64_t step1 = first_step, step2 = first_step + 1;

    // rpc_floor: the smallest RPC once per rank (ListAgents, an empty
    // answer from memory): what N calls cost here, under any round of N.
    // Twice: the first round of N calls (rpc_floor_cold) also grows both
    // sides' gRPC thread pools, call arenas and heaps to N calls; the second
    // is the floor under the rounds that follow.
    for (const char* name : {"rpc_floor_cold", "rpc_floor"}) {
      Round round(&stubs_, Method("ListAgents"));
      for (int r = 0; r < world; ++r) round.Add(v1::ListAgentsRequest());
      out.push_back(Measure(name, world, round, [&] {
        for (int r = 0; r < world; ++r) {
          round.Answer<v1::ListAgentsResponse>(static_cast<size_t>(r),
                                               absl::StrCat("rank ", r));
        }
      }));
    }
    std::vector<std::string> fingerprints(static_cast<size_t>(world));
    {  // begin: whole local plans.
      Round round(&stubs_, Method("BeginSave"));
      for (int r = 0; r < world; ++r) {
        planner::LocalSavePlan local = LocalPlanOf(model_, chunks, r);
        fingerprints[r] = planner::FingerprintLocalPlan(local);
        v1::BeginSaveRequest req = BeginRequest(step1, r, world);
        convert::LocalPlanToProto(local, req.mutable_local_plan());
        round.Add(req);
      }
      round.set_resend(ResendPlan(chunks, step1, world));
      Round commit(&stubs_, Method("CommitSave"));
      out.push_back(Measure("begin", world, round, [&] {
        if (TakePlans(round, world, step1, fingerprints, &commit) != 0) {
          Fail("the first save's plan came from the cache");
        }
      }));
      out.push_back(Measure("commit", world, commit,
                            [&] { TakeCommits(commit, world, step1); }));
    }
    // Step 1's load index, built after its commit, before the next save
    // (saves are minutes apart).
    if (!metrics_port_file_.empty()) {
      out.push_back(MeasurePrepare("prepare", world, 1));
    }
    {  // begin_cached: fingerprints only.
      Round round(&stubs_, Method("BeginSave"));
      for (int r = 0; r < world; ++r) {
        v1::BeginSaveRequest req = BeginRequest(step2, r, world);
        req.set_plan_fingerprint(fingerprints[r]);
        round.Add(req);
      }
      // As SaveProtocol::Begin: the whole plan again when cairnd no longer
      // holds the rank's plan of that fingerprint.
      round.set_resend(ResendPlan(chunks, step2, world));
      Round commit(&stubs_, Method("CommitSave"));
      out.push_back(Measure("begin_cached", world, round, [&] {
        TakePlans(round, world, step2, fingerprints, &commit);
      }));
      out.push_back(Measure("commit_cached", world, commit,
                            [&] { TakeCommits(commit, world, step2); }));
    }
    CheckListed({step1, step2});
    // Step 2's load index (which drops step 1's).
    if (!metrics_port_file_.empty()) {
      out.push_back(MeasurePrepare("prepare_cached", world, 2));
    }

    {  // plan_load_cold and plan_load into load_world ranks, verify_load.
      const RankChunks wanted_chunks(model_, load_world);
      std::vector<std::vector<uint64_t>> wanted_bytes(
          static_cast<size_t>(load_world));
      // Tensors in fqn order: the short form's.
      std::vector<const TensorSpec*> by_fqn;
      for (const TensorSpec& t : model_.tensors) by_fqn.push_back(&t);
      std::sort(by_fqn.begin(), by_fqn.end(),
                [](const TensorSpec* a, const TensorSpec* b) {
                  return a->fqn < b->fqn;
                });
      // Built again to expand its answer (holding every request would
      // take GBs at 16k ranks). In the full form, as libcairn sends it
      // when cairnd asks (every tensor in fqn order, empty boxes included).
      // Step 2's in a load round (verified collectively), or step 1's
      // alone.
      auto load_request_of = [&](int64_t step, int r) {
        const bool in_round = step == step2;
        v1::PlanLoadRequest req;
        req.set_job(kJob);
        req.set_step(step);
        req.set_rank(r);
        req.set_world_size(in_round ? load_world : 0);
        req.set_verify_in_round(in_round);
        req.set_read_columns(answer_form_ == convert::AnswerForm::kReadColumns);
        for (const TensorSpec* t : by_fqn) {
          planner::WantedChunk w;
          w.fqn = t->fqn;
          w.dtype = planner::DType::kFloat32;
          w.global_shape = t->shape;
          w.box = wanted_chunks.Of(t->kind, r);
          if (planner::IsEmpty(w.box)) {
            w.box.offsets.assign(t->shape.size(), 0);
            w.box.sizes.assign(t->shape.size(), 0);
          }
          convert::WantedToProto(w, req.add_wanted());
        }
        req.add_wanted_bytes("train_state");
        return req;
      };
      for (int r = 0; r < load_world; ++r) {
        const v1::PlanLoadRequest req = load_request_of(step2, r);
        for (const v1::WantedChunk& w : req.wanted()) {
          wanted_bytes[r].push_back(
              static_cast<uint64_t>(
                  planner::Volume(convert::BoxFromProto(w.box(), "").value())) *
              4);
        }
      }
      auto add_requests = [&](int64_t step, Round* round) {
        for (int r = 0; r < load_world; ++r) {
          const v1::PlanLoadRequest req = load_request_of(step, r);
          if (!short_requests_) {
            round->Add(req);
            continue;
          }
          v1::PlanLoadRequest wire;
          if (!convert::CompactWanted(req, &wire)) {
            Fail(absl::StrCat("loading rank ", r, ": no short form"));
          }
          round->Add(wire);
        }
      };
      {
        Round cold(&stubs_, Method("PlanLoad"));
        add_requests(step1, &cold);
        out.push_back(Measure("plan_load_cold", load_world, cold, [&] {
          TakeLoadPlans(
              cold, load_world, step1,
              [&](int r) { return load_request_of(step1, r); }, wanted_bytes,
              nullptr);
        }));
      }
      auto load_request = [&](int r) { return load_request_of(step2, r); };
      Round round(&stubs_, Method("PlanLoad"));
      add_requests(step2, &round);
      Round verify(&stubs_, Method("VerifyLoad"));
      out.push_back(Measure("plan_load", load_world, round, [&] {
        TakeLoadPlans(round, load_world, step2, load_request, wanted_bytes,
                      &verify);
      }));
      out.push_back(Measure("verify_load", load_world, verify,
                            [&] { TakeVerdicts(verify, load_world); }));
    }
    return out;
  }

 private:
  // BeginSave's resend_plan answer (2 bytes on the wire) -> the rank's whole
  // local plan, built then, as a real rank does.
  Round::Resend ResendPlan(const RankChunks& chunks, int64_t step, int world) {
    return [this, &chunks, step, world](size_t i, grpc::ByteBuffer& answer,
                                        grpc::ByteBuffer* again) {
      if (answer.Length() > 64) return false;
      v1::BeginSaveResponse resp;
      if (!grpc::SerializationTraits<v1::BeginSaveResponse>::Deserialize(
               &answer, &resp)
               .ok() ||
          !resp.resend_plan()) {
        return false;
      }
      const int r = static_cast<int>(i);
      v1::BeginSaveRequest req = BeginRequest(step, r, world);
      convert::LocalPlanToProto(LocalPlanOf(model_, chunks, r),
                                req.mutable_local_plan());
      bool own = false;
      return grpc::SerializationTraits<v1::BeginSaveRequest>::Serialize(
                 req, again, &own)
          .ok();
    };
  }

  v1::BeginSaveRequest BeginRequest(int64_t step, int rank, int world) const {
    v1::BeginSaveRequest req;
    req.set_job(kJob);
    req.set_step(step);
    req.set_rank(rank);
    req.set_world_size(world);
    req.set_incarnation(0x5ca1e000000000ULL + static_cast<uint64_t>(rank) + 1);
    if (!held_plan_ids_.empty()) req.set_held_plan_id(held_plan_ids_[rank]);
    return req;
  }

  // Runs `round` against cairnd with /proc samples around it, then `take`
  // (decodes and checks the answers, off the clock).
  template <typename F>
  RoundResult Measure(const std::string& name, int ranks, Round& round,
                      F&& take) {
    const pid_t pid = cairnd_->process().pid();
    ResetPeak(pid);
    std::optional<testing::Subprocess> perf = StartPerf(name, ranks, pid);
    const ProcSample before = SampleProc(pid);
    const ProcSample client_before = SampleProc(getpid());
    const absl::Duration wall = round.Run();
    const ProcSample after = SampleProc(pid);
    const ProcSample client_after = SampleProc(getpid());
    if (perf.has_value()) {
      perf->Signal(SIGINT);
      (void)perf->Wait(absl::Minutes(5));
    }
    from_cache_ = -1;
    unchanged_ = -1;
    take();
    RoundResult r;
    r.resends = static_cast<int64_t>(round.resends());
    r.from_cache = from_cache_;
    r.unchanged = unchanged_;
    r.round = name;
    r.ranks = ranks;
    r.wall_s = absl::ToDoubleSeconds(wall);
    r.cpu_s = after.cpu_s - before.cpu_s;
    r.client_cpu_s = client_after.cpu_s - client_before.cpu_s;
    r.minor_faults = after.minor_faults - before.minor_faults;
    r.peak_mib = after.hwm_mib;
    r.rss_mib = after.rss_mib;
    r.request_bytes_per_rank =
        static_cast<double>(round.request_bytes()) / ranks;
    r.response_bytes_per_rank =
        static_cast<double>(round.response_bytes()) / ranks;
    r.floor_s = absl::ToDoubleSeconds(round.codec_time());
    Report(r);
    return r;
  }

  // The prepare round: waits until cairnd has prepared `n` load indexes in
  // all (cairn_load_indexes_prepared_total on its /metrics), measuring
  // cairnd meanwhile as a round of no RPC.
  RoundResult MeasurePrepare(const std::string& name, int ranks, int n) {
    const pid_t pid = cairnd_->process().pid();
    ResetPeak(pid);
    std::optional<testing::Subprocess> perf = StartPerf(name, ranks, pid);
    const ProcSample before = SampleProc(pid);
    const absl::Time start = absl::Now();
    while (PreparedIndexes() < n) {
      if (absl::Now() - start > absl::Hours(1)) {
        Fail(absl::StrCat("cairnd prepared ", PreparedIndexes(), " of ", n,
                          " load indexes in an hour"));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    RoundResult r;
    r.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
    const ProcSample after = SampleProc(pid);
    if (perf.has_value()) {
      perf->Signal(SIGINT);
      (void)perf->Wait(absl::Minutes(5));
    }
    r.round = name;
    r.ranks = ranks;
    r.cpu_s = after.cpu_s - before.cpu_s;
    r.minor_faults = after.minor_faults - before.minor_faults;
    r.peak_mib = after.hwm_mib;
    r.rss_mib = after.rss_mib;
    Report(r);
    return r;
  }

  // cairn_load_indexes_prepared_total, from cairnd's /metrics.
  int PreparedIndexes() {
    if (metrics_port_ == 0) {
      std::ifstream in(metrics_port_file_);
      if (!(in >> metrics_port_)) Fail("cairnd wrote no metrics port");
    }
    httplib::Client client("127.0.0.1", metrics_port_);
    httplib::Result got = client.Get("/metrics");
    if (!got || got->status != 200) Fail("GET /metrics of cairnd failed");
    constexpr absl::string_view kName = "cairn_load_indexes_prepared_total ";
    for (absl::string_view line : absl::StrSplit(got->body, '\n')) {
      int n = 0;
      if (absl::ConsumePrefix(&line, kName) && absl::SimpleAtoi(line, &n)) {
        return n;
      }
    }
    Fail("cairnd's /metrics has no cairn_load_indexes_prepared_total");
    return 0;
  }

  static void Report(const RoundResult& r) {
    std::printf(
        "{\"bench\":\"scale\",\"round\":\"%s\",\"ranks\":%d,\"wall_s\":%.4f,"
        "\"cairnd_cpu_s\":%.3f,\"client_cpu_s\":%.3f,"
        "\"cairnd_minor_faults\":%.0f,"
        "\"cairnd_peak_rss_mib\":%.1f,"
        "\"cairnd_rss_after_mib\":%.1f,\"request_bytes_per_rank\":%.0f,"
        "\"response_bytes_per_rank\":%.0f,\"codec_floor_s\":%.4f,"
        "\"resends\":%lld,\"plan_from_cache\":%d,\"plan_unchanged\":%d}\n",
        r.round.c_str(), r.ranks, r.wall_s, r.cpu_s, r.client_cpu_s,
        r.minor_faults, r.peak_mib, r.rss_mib, r.request_bytes_per_rank,
        r.response_bytes_per_rank, r.floor_s, static_cast<long long>(r.resends),
        r.from_cache, r.unchanged);
    std::fflush(stdout);
  }

  std::optional<testing::Subprocess> StartPerf(const std::string& name,
                                               int ranks, pid_t pid) {
    if (perf_dir_.empty()) return std::nullopt;
    if (!g_perf_rounds.empty() && !g_perf_rounds.contains(name)) {
      return std::nullopt;
    }
    const std::string base = absl::StrCat(perf_dir_, "/", ranks, "-", name);
    testing::Subprocess p =
        Check(testing::Subprocess::Start(
                  {"/usr/bin/perf", "record", "--call-graph", "dwarf,16384",
                   "-F", "499", "-p", absl::StrCat(pid), "-o", base + ".data"},
                  base + ".log"),
              "starting perf");
    absl::SleepFor(absl::Milliseconds(500));  // perf attaches
    return p;
  }

  // BeginSave's answers: every rank's plan; its objects made (sparse, the
  // planned size) and its CommitSave request added to `commit`.
  // Returns how many ranks were told the global plan came from the cache.
  int TakePlans(Round& round, int world, int64_t step,
                const std::vector<std::string>& fingerprints, Round* commit) {
    uint64_t planned = 0;
    int from_cache = 0, unchanged = 0;
    held_plan_ids_.resize(static_cast<size_t>(world));
    held_plans_.resize(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      const std::string who = absl::StrCat("rank ", r, " step ", step);
      v1::BeginSaveResponse plan =
          round.Answer<v1::BeginSaveResponse>(static_cast<size_t>(r), who);
      if (plan.resend_plan()) {
        Fail(who + ": cairnd asked for the whole plan after it was sent");
      }
      from_cache += plan.plan_from_cache();
      unchanged += plan.rank_plan_unchanged();
      HoldOrUse(r, who, plan);
      if (plan.rank_plan().rank() != r) {
        Fail(absl::StrCat(who, ": got the plan of rank ",
                          plan.rank_plan().rank()));
      }
      if (plan.plan_fingerprint() != fingerprints[r]) {
        Fail(who +
             ": cairnd's fingerprint of the plan differs from the rank's");
      }
      v1::CommitSaveRequest req;
      req.set_job(kJob);
      req.set_step(step);
      req.set_rank(r);
      req.set_incarnation(0x5ca1e000000000ULL + static_cast<uint64_t>(r) + 1);
      // As SaveProtocol: the short form (checksums only) when cairnd named
      // its plan and attempt.
      const bool short_form =
          !plan.plan_id().empty() && !plan.attempt().empty();
      if (short_form) {
        req.set_plan_id(plan.plan_id());
        req.set_attempt(plan.attempt());
      }
      std::map<std::string, uint64_t> object_end;
      for (const v1::PlannedWrite& w : plan.rank_plan().writes()) {
        const v1::StorageLocation& loc = w.location();
        uint64_t& end = object_end[loc.object_key()];
        end = std::max(end, loc.offset() + loc.length());
        planned += loc.length();
        // The item's bytes are zeros: this is their crc32c.
        const uint32_t crc = storage::Crc32cFromPieces(0, loc.length());
        if (short_form) {
          req.add_crc32cs(crc);
          continue;
        }
        v1::WriteResult* res = req.add_results();
        *res->mutable_location() = loc;
        res->set_crc32c(crc);
      }
      for (const auto& [key, end] : object_end) {
        MakeSparseObject(
            absl::StrCat(storage_root_, "/", plan.step_prefix(), key), end);
      }
      commit->Add(req);
    }
    const uint64_t want = model_.tensor_bytes + kTrainStateBytes;
    if (planned != want) {
      Fail(absl::StrCat("step ", step, ": the plans write ", planned,
                        " bytes, the model has ", want));
    }
    from_cache_ = from_cache;
    unchanged_ = unchanged;
    return from_cache;
  }

  // As SaveProtocol: an unchanged rank plan is the held one moved into this
  // attempt's directory; a sent one is held (keys relative to the attempt).
  void HoldOrUse(int r, const std::string& who, v1::BeginSaveResponse& plan) {
    const std::string prefix = plan.attempt() + "/";
    if (plan.rank_plan_unchanged()) {
      if (plan.plan_id().empty() || plan.plan_id() != held_plan_ids_[r]) {
        Fail(absl::StrCat(who, ": told its plan ", plan.plan_id(),
                          " is unchanged, but it holds '", held_plan_ids_[r],
                          "'"));
      }
      if (!plan.mutable_rank_plan()->ParseFromString(held_plans_[r])) {
        Fail(absl::StrCat(who, ": its held plan does not parse"));
      }
      for (v1::PlannedWrite& w : *plan.mutable_rank_plan()->mutable_writes()) {
        w.mutable_location()->set_object_key(prefix +
                                             w.location().object_key());
      }
      return;
    }
    held_plan_ids_[r] = plan.plan_id();
    v1::RankSavePlan held = plan.rank_plan();
    for (v1::PlannedWrite& w : *held.mutable_writes()) {
      absl::string_view key = w.location().object_key();
      if (!absl::ConsumePrefix(&key, prefix)) {
        Fail(absl::StrCat(who, ": object key ", key, " is not under ", prefix));
      }
      w.mutable_location()->set_object_key(std::string(key));
    }
    // Serialized: 16k ranks' parsed plans of the 70B model would take GBs.
    held_plans_[r] = held.SerializeAsString();
  }

  static void MakeSparseObject(const std::string& path, uint64_t size) {
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path());
    std::ofstream(path, std::ios::binary | std::ios::trunc).close();
    std::error_code ec;
    std::filesystem::resize_file(path, size, ec);
    if (ec) Fail(absl::StrCat("sizing ", path, ": ", ec.message()));
  }

  void TakeCommits(Round& round, int world, int64_t step) {
    for (int r = 0; r < world; ++r) {
      const std::string who = absl::StrCat("rank ", r, " step ", step);
      v1::CommitSaveResponse resp =
          round.Answer<v1::CommitSaveResponse>(static_cast<size_t>(r), who);
      if (resp.checkpoint().state() != v1::CHECKPOINT_STATE_COMMITTED ||
          resp.checkpoint().step() != step) {
        Fail(absl::StrCat(who, ": CommitSave answered ",
                          resp.checkpoint().ShortDebugString()));
      }
    }
  }

  void CheckListed(const std::vector<int64_t>& steps) {
    grpc::ClientContext ctx;
    v1::ListCheckpointsRequest req;
    req.set_job(kJob);
    v1::ListCheckpointsResponse resp;
    grpc::Status s = control_->ListCheckpoints(&ctx, req, &resp);
    if (!s.ok()) Fail("ListCheckpoints: " + s.error_message());
    for (int64_t step : steps) {
      bool found = false;
      for (const v1::CheckpointRecord& c : resp.checkpoints()) {
        found |= c.step() == step &&
                 c.state() == v1::CHECKPOINT_STATE_COMMITTED &&
                 c.total_bytes() == model_.tensor_bytes + kTrainStateBytes;
      }
      if (!found) {
        Fail(
            absl::StrCat("step ", step,
                         " is not listed as committed with the model's bytes"));
      }
    }
  }

  // PlanLoad's answers: every wanted byte covered; each rank's VerifyLoad
  // request (the pieces of the stored chunks it reads in part) added to
  // `verify` (nullptr: a load outside a load round).
  void TakeLoadPlans(Round& round, int world, int64_t step,
                     const std::function<v1::PlanLoadRequest(int)>& request_of,
                     const std::vector<std::vector<uint64_t>>& wanted_bytes,
                     Round* verify) {
    uint64_t load_round = 0;
    for (int r = 0; r < world; ++r) {
      const std::string who = absl::StrCat("loading rank ", r);
      v1::PlanLoadResponse plan =
          round.Answer<v1::PlanLoadResponse>(static_cast<size_t>(r), who);
      if (plan.step() != step) {
        Fail(absl::StrCat(who, ": planned step ", plan.step()));
      }
      if (plan.resend_wanted()) {
        Fail(absl::StrCat(who,
                          ": cairnd asked for the wanted chunks in full "
                          "(the tensors are the checkpoint's)"));
      }
      // (Read columns are sent even when empty: a rank of the last FSDP
      // group may want no tensor bytes at all.)
      const convert::AnswerForm form = plan.has_read_columns()
                                           ? convert::AnswerForm::kReadColumns
                                           : convert::AnswerForm::kFull;
      if (form != answer_form_) {
        Fail(absl::StrCat(who, ": asked for answers of form ",
                          static_cast<int>(answer_form_), ", got one of form ",
                          static_cast<int>(form)));
      }
      if (absl::Status s = convert::ExpandReadColumns(request_of(r), &plan);
          !s.ok()) {
        Fail(absl::StrCat(who, ": ", s.ToString()));
      }
      if (r == 0) load_round = plan.load_round();
      if ((verify != nullptr) != (plan.load_round() != 0) ||
          plan.load_round() != load_round) {
        Fail(absl::StrCat(who, ": load round ", plan.load_round(),
                          ", rank 0's is ", load_round));
      }
      std::vector<uint64_t> got(wanted_bytes[r].size());
      v1::VerifyLoadRequest req;
      req.set_job(kJob);
      req.set_step(step);
      req.set_rank(r);
      req.set_world_size(world);
      req.set_load_round(plan.load_round());
      for (const v1::ReadItem& it : plan.reads()) {
        if (it.dest_index() < 0 ||
            static_cast<size_t>(it.dest_index()) >= got.size()) {
          Fail(absl::StrCat(who, ": read item for wanted chunk ",
                            it.dest_index()));
        }
        uint64_t bytes = 0;
        for (const v1::CopySegment& s : it.segments()) bytes += s.length();
        got[it.dest_index()] += bytes;
        if (bytes != it.source().length()) {  // read in part
          v1::ChunkPiece* p = req.add_pieces();
          if (it.has_chunk()) {  // as the client does
            p->set_chunk(it.chunk());
          } else {
            p->set_fqn(it.fqn());
            *p->mutable_source() = it.source();
          }
          *p->mutable_overlap() = it.overlap();
          p->set_crc_term(0);  // the linear term of zero bytes
        }
      }
      if (got != wanted_bytes[r]) {
        for (size_t i = 0; i < got.size(); ++i) {
          if (got[i] != wanted_bytes[r][i]) {
            Fail(absl::StrCat(who, ": wanted chunk ", i, " has ",
                              wanted_bytes[r][i], " bytes, the plan reads ",
                              got[i]));
          }
        }
      }
      if (plan.bytes_entries_size() != 1 ||
          plan.bytes_entries(0).location().length() != kTrainStateBytes) {
        Fail(who + ": the bytes entry 'train_state' is not planned");
      }
      if (verify != nullptr) verify->Add(req);
    }
  }

  void TakeVerdicts(Round& round, int world) {
    int64_t verified = 0;
    for (int r = 0; r < world; ++r) {
      const std::string who = absl::StrCat("loading rank ", r);
      v1::VerifyLoadResponse v =
          round.Answer<v1::VerifyLoadResponse>(static_cast<size_t>(r), who);
      if (v.verify_locally_size() != 0) {
        Fail(absl::StrCat(who, ": ", v.verify_locally_size(),
                          " pieces left to verify locally"));
      }
      verified += v.chunks_verified();
    }
    if (verified == 0) Fail("VerifyLoad verified no stored chunk");
    std::printf("verify_load: %lld stored-chunk verifications over %d ranks\n",
                static_cast<long long>(verified), world);
  }

  const convert::AnswerForm answer_form_;  // PlanLoadRequest.read_columns
  const bool short_requests_;              // PlanLoadRequest.tensors_digest
  // Where cairnd writes its metrics port; empty: cairnd prepares no load
  // index (--no-prepare), no prepare round.
  const std::string metrics_port_file_;
  int metrics_port_ = 0;
  const Model& model_;
  testing::CairndProcess* const cairnd_;
  const std::string storage_root_;
  const std::string perf_dir_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  std::unique_ptr<v1::Coordinator::Stub> control_;
  int from_cache_ = -1;  // of the last BeginSave round taken
  int unchanged_ = -1;   // of the last BeginSave round taken
  // What each simulated rank holds from its last BeginSave answer.
  std::vector<std::string> held_plan_ids_;
  std::vector<std::string> held_plans_;  // serialized v1::RankSavePlan
};

// The checksum facts the zero-byte objects rely on, checked on real bytes.
void CheckZeroCrcs() {
  const std::string zeros(8192, '\0');
  if (storage::Crc32cFromPieces(0, zeros.size()) !=
      storage::Crc32c(zeros.data(), zeros.size())) {
    Fail("Crc32cFromPieces(0, n) is not the crc32c of n zero bytes");
  }
  storage::Crc32cPieces piece;
  piece.Add(100, zeros.data(), 1000);
  piece.Add(5000, zeros.data(), 1000);
  if (piece.Finish(zeros.size()) != 0) {
    Fail("the crc32c term of zero bytes is not 0");
  }
}

std::string Fmt(double v, const char* f) { return absl::StrFormat(f, v); }

void PrintTable(const std::vector<RoundResult>& rows) {
  std::printf(
      "\n| round | ranks | wall s | cairnd CPU s | ranks' CPU s | peak RSS "
      "MiB | RSS after MiB | req B/rank | resp B/rank | codec floor s | "
      "wall/floor | resends | plan from cache | plan unchanged |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const RoundResult& r : rows) {
    std::printf(
        "| %s | %d | %s | %s | %s | %.0f | %.0f | %.0f | %.0f | %s | %s | %s "
        "| %s | %s |\n",
        r.round.c_str(), r.ranks, Fmt(r.wall_s, "%.3f").c_str(),
        Fmt(r.cpu_s, "%.2f").c_str(), Fmt(r.client_cpu_s, "%.2f").c_str(),
        r.peak_mib, r.rss_mib, r.request_bytes_per_rank,
        r.response_bytes_per_rank, Fmt(r.floor_s, "%.3f").c_str(),
        Fmt(r.floor_s > 0 ? r.wall_s / r.floor_s : 0, "%.1f").c_str(),
        r.from_cache < 0 ? "-" : absl::StrCat(r.resends).c_str(),
        r.from_cache < 0 ? "-" : absl::StrCat(r.from_cache).c_str(),
        r.unchanged < 0 ? "-" : absl::StrCat(r.unchanged).c_str());
  }
  // Growth from N to 4N, same round.
  bool header = false;
  for (const RoundResult& big : rows) {
    for (const RoundResult& small : rows) {
      if (small.round != big.round || big.ranks != 4 * small.ranks) continue;
      if (!header) {
        std::printf(
            "\n| round | ranks N -> 4N | wall x | cairnd CPU x | peak RSS x | "
            "req B/rank x | resp B/rank x |\n|---|---|---|---|---|---|---|\n");
        header = true;
      }
      auto x = [](double a, double b) {
        return b > 0 ? absl::StrFormat("%.2f", a / b) : std::string("-");
      };
      std::printf(
          "| %s | %d -> %d | %s | %s | %s | %s | %s |\n", big.round.c_str(),
          small.ranks, big.ranks, x(big.wall_s, small.wall_s).c_str(),
          x(big.cpu_s, small.cpu_s).c_str(),
          x(big.peak_mib, small.peak_mib).c_str(),
          x(big.request_bytes_per_rank, small.request_bytes_per_rank).c_str(),
          x(big.response_bytes_per_rank, small.response_bytes_per_rank)
              .c_str());
      std::printf(
          "{\"bench\":\"scale_growth\",\"round\":\"%s\",\"from\":%d,\"to\":%d,"
          "\"wall_x\":%.3f,\"cpu_x\":%.3f,\"peak_rss_x\":%.3f}\n",
          big.round.c_str(), small.ranks, big.ranks,
          small.wall_s > 0 ? big.wall_s / small.wall_s : 0,
          small.cpu_s > 0 ? big.cpu_s / small.cpu_s : 0,
          small.peak_mib > 0 ? big.peak_mib / small.peak_mib : 0);
    }
  }
}

int Main(int argc, char** argv) {
  CLI::App app{
      "Coordinator at scale: N simulated ranks against a real cairnd "
      "(issue 17)",
      "scale_bench"};
  std::string cairnd_path = CAIRN_CAIRND_PATH;
  std::string ranks_flag = "1024,4096";
  std::string dir = "/dev/shm/cairn-scale-bench";
  std::string perf_dir;
  ModelSpec spec;
  double load_fraction = 0.75;
  int channels = 8;
  int workers = 2;
  bool smoke = false;
  app.add_option("--cairnd", cairnd_path, "The cairnd binary")
      ->capture_default_str();
  app.add_option("--ranks", ranks_flag,
                 "Saving world sizes, comma-separated (multiples of 8)")
      ->capture_default_str();
  app.add_option("--layers", spec.layers, "Transformer layers of the model")
      ->capture_default_str();
  app.add_option("--load-fraction", load_fraction,
                 "Loading world = this fraction of the saving one, rounded "
                 "down to a multiple of 8")
      ->capture_default_str();
  app.add_option("--channels", channels, "gRPC channels (connections)")
      ->capture_default_str();
  app.add_option("--workers", workers, "cairnd --workers")
      ->capture_default_str();
  app.add_option("--dir", dir,
                 "Scratch directory (cairnd's catalog and file:// storage "
                 "of sparse objects); removed first")
      ->capture_default_str();
  std::vector<std::string> cairnd_args;
  app.add_option("--cairnd-arg", cairnd_args,
                 "An extra cairnd flag (repeatable), e.g. "
                 "--cairnd-arg=--plan-cache-mib=4096");
  app.add_option("--perf-dir", perf_dir,
                 "Record cairnd with perf record per round into this dir "
                 "(DWARF call graphs: cairnd has no frame pointers; ~100 MB "
                 "a round at 4096 ranks)");
  std::vector<std::string> perf_rounds;
  app.add_option("--perf-round", perf_rounds,
                 "With --perf-dir: record only this round (repeatable), e.g. "
                 "--perf-round=begin_cached");
  bool full_answers = false;
  bool full_requests = false;
  bool no_prepare = false;
  app.add_flag("--no-prepare", no_prepare,
               "cairnd --prepare-loads=false: no load index is built before "
               "a PlanLoad asks (both load rounds build theirs)");
  app.add_flag("--full-requests", full_requests,
               "PlanLoad requests with every wanted chunk in full (fqn, "
               "dtype, shape, box) instead of the tensors' digest and boxes");
  app.add_flag("--full-answers", full_answers,
               "PlanLoad answers in the full form (ReadItem messages) instead "
               "of the read columns libcairn asks for");
  app.add_flag("--smoke", smoke,
               "64 -> 48 ranks, a 2-layer model of hidden 64: seconds");
  CLI11_PARSE(app, argc, argv);
  if (smoke) {
    ranks_flag = "64";
    spec = ModelSpec{.layers = 2,
                     .hidden = 64,
                     .ffn = 224,
                     .heads = 8,
                     .kv_heads = 2,
                     .vocab = 256};
  }
  if (cairnd_path.empty()) Fail("--cairnd is required");
  std::vector<int> worlds;
  for (absl::string_view s : absl::StrSplit(ranks_flag, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < kTp || n % kTp != 0) {
      Fail(absl::StrCat("--ranks: '", s, "' is not a multiple of ", kTp));
    }
    worlds.push_back(n);
  }
  CheckZeroCrcs();
  const Model model = BuildModel(spec);
  std::printf(
      "scale_bench: model %d layers, %.2fB params, %zu tensors (params + "
      "exp_avg + exp_avg_sq, float32, %.1f GB), FSDP x TP=%d\n",
      spec.layers, static_cast<double>(model.params) / 1e9,
      model.tensors.size(), static_cast<double>(model.tensor_bytes) / 1e9, kTp);
  if (!perf_dir.empty()) std::filesystem::create_directories(perf_dir);
  g_perf_rounds.insert(perf_rounds.begin(), perf_rounds.end());

  std::vector<RoundResult> rows;
  for (size_t i = 0; i < worlds.size(); ++i) {
    const int world = worlds[i];
    int load_world = static_cast<int>(world * load_fraction) / kTp * kTp;
    load_world = std::max(kTp, load_world);
    // A fresh cairnd per world size: its RSS is this N's alone.
    const std::string data_dir = absl::StrCat(dir, "/n", world);
    std::filesystem::remove_all(data_dir);
    const std::string storage = data_dir + "/checkpoints";
    std::filesystem::create_directories(storage);
    std::vector<std::string> args = {"--storage",
                                     "file://" + storage,
                                     "--workers",
                                     absl::StrCat(workers),
                                     "--begin-deadline",
                                     "3600",
                                     "--commit-deadline",
                                     "3600",
                                     "--load-join-grace",
                                     "600",
                                     "--load-verify-deadline",
                                     "600",
                                     "--log-level",
                                     "warn"};
    const std::string metrics_port_file = data_dir + "/metrics-port";
    if (no_prepare) {
      args.push_back("--prepare-loads=false");
    } else {
      args.insert(args.end(), {"--metrics-listen", "127.0.0.1:0",
                               "--metrics-port-file", metrics_port_file});
    }
    args.insert(args.end(), cairnd_args.begin(), cairnd_args.end());
    std::unique_ptr<testing::CairndProcess> cairnd =
        Check(testing::CairndProcess::Start(cairnd_path, data_dir, args),
              "starting cairnd");
    g_cairnd_pid = cairnd->process().pid();
    std::printf("scale_bench: %d ranks save, %d load; cairnd pid %d\n", world,
                load_world, static_cast<int>(cairnd->process().pid()));
    std::fflush(stdout);
    ScaleRun run(model, cairnd.get(), storage, channels, perf_dir,
                 full_answers ? convert::AnswerForm::kFull
                              : convert::AnswerForm::kReadColumns,
                 !full_requests, no_prepare ? "" : metrics_port_file);
    for (RoundResult& r : run.Run(world, load_world, 1)) rows.push_back(r);
    cairnd->process().Signal(SIGTERM);
    (void)cairnd->process().Wait(absl::Minutes(2));
    std::filesystem::remove_all(data_dir);
  }
  PrintTable(rows);
  std::printf("scale_bench: all checks passed\n");
  return 0;
}

}  // namespace
}  // namespace cairn::bench

int main(int argc, char** argv) { return cairn::bench::Main(argc, argv); }
