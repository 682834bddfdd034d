// planner_bench: the planner's numbers for bench/README.md (issue 3).
//
//   BM_SavePlanUncached   global save plan for 4096 ranks x 1000 items each
//                         (HSDP layout: mesh [2, 256, 8] = [Replicate,
//                         Shard(0), Shard(1)], 1000 tensors), built from
//                         scratch: validation, exact-cover checks, balanced
//                         dedupe of the 2 replicas of every chunk, layout.
//   BM_SavePlanCached     the same save when no rank's plan changed: the
//                         coordinator assembles the cache key from the 4096
//                         fingerprints the ranks sent and looks the plan up.
//   BM_FingerprintLocalPlan  what each rank pays (in parallel) to fingerprint
//                         its own 1000-item plan.
//   BM_LoadPlanIndex/n    read items for n wanted chunks of one tensor stored
//                         as n chunks under a different layout (stored mesh
//                         [s, s], wanted mesh [2s, s/2], uneven torch.chunk
//                         boundaries that do not line up), via LoadPlanner's
//                         overlap index (built once per manifest, not timed;
//                         BM_LoadPlanIndexBuild/n times the build).
//   BM_LoadAnswerColumns/n  the same read items written as the wire bytes of
//                         cairnd's PlanLoad answer in read columns (libcairn's
//                         form: PlanEach without copy segments into
//                         convert::PlanLoadAnswerWriter, given the previous
//                         answer's size as cairnd does): what cairnd spends
//                         per loading rank besides gRPC. One tensor, so no
//                         stored box is shared here.
//   BM_LoadAnswerFull/n   the same in the full form (ReadItem messages, with
//                         their copy segments).
//   BM_LoadPlanNaive/n    the same read items from PyTorch's
//                         create_read_items_for_chunk_list loop: every wanted
//                         chunk against every stored chunk. Lives here only,
//                         as the baseline; it emits the identical read items
//                         (checked after timing).
//   BM_TransferPlan_4096_to_3072  peer resharding schedule for 64 tensors
//                         from mesh [2, 256, 8] to mesh [2, 192, 8] (both
//                         [Replicate, Shard(0), Shard(1)]), with bucketing.
//
// Run: build-dir/bench/planner_bench  (RelWithDebInfo, -O2; ~2 minutes).
//
// --smoke runs every benchmark once on tiny sizes (16 ranks x 10 tensors,
// 16 and 64 load chunks, 16 -> 12 ranks for the transfer plan) in about a
// second: ctest runs it (label bench-smoke) so a change that breaks the
// benchmark fails CI. Numbers are never checked; the run fails (exit 1) if
// a benchmark reports an error or none ran. Other flags are Google
// Benchmark's (--benchmark_filter=...).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "planner/layout.h"
#include "planner/load_plan.h"
#include "planner/plan_cache.h"
#include "planner/save_plan.h"
#include "planner/transfer_plan.h"
#include "proto/convert/load_answer.h"

namespace cairn::planner {
namespace {

// The sizes each benchmark runs at: bench/README.md's (default) or --smoke's.
struct Sizes {
  int64_t replicas = 2, rows = 256, cols = 8;  // save mesh: 4096 ranks
  int tensors = 1000;
  std::vector<int64_t> load_chunks = {1024, 4096, 16384, 65536};
  int64_t transfer_rows_to = 192;  // transfer: mesh rows 256 -> 192
  int transfer_tensors = 64;
  int64_t transfer_dim0 = 8192, transfer_dim1 = 4096;
  int64_t world() const { return replicas * rows * cols; }
};

Sizes SmokeSizes() {
  Sizes s;
  s.replicas = 2;
  s.rows = 4;
  s.cols = 2;
  s.tensors = 10;
  s.load_chunks = {16, 64};
  s.transfer_rows_to = 3;
  s.transfer_tensors = 4;
  s.transfer_dim0 = 64;
  s.transfer_dim1 = 32;
  return s;
}

Sizes& CurrentSizes() {
  static Sizes sizes;
  return sizes;
}

DTensorLayout Mesh3(int64_t replicas, int64_t rows, int64_t cols,
                    int first_rank = 0) {
  DTensorLayout layout;
  layout.mesh.shape = {replicas, rows, cols};
  layout.mesh.ranks.resize(static_cast<size_t>(replicas * rows * cols));
  for (size_t i = 0; i < layout.mesh.ranks.size(); ++i) {
    layout.mesh.ranks[i] = first_rank + static_cast<int>(i);
  }
  layout.placements = {Placement::Replicate(), Placement::Shard(0),
                       Placement::Shard(1)};
  return layout;
}

// ---- Save planning ----

struct SaveFixture {
  std::vector<LocalSavePlan> plans;
  std::vector<std::string> fingerprints;
  PlanCache cache{size_t{8} << 30};
  PlanCache::Key key;
};

SaveFixture& GetSaveFixture() {
  static SaveFixture* const fixture = [] {
    const Sizes& z = CurrentSizes();
    const int world = static_cast<int>(z.world());
    auto* f = new SaveFixture;
    f->plans.resize(world);
    for (int r = 0; r < world; ++r) {
      f->plans[r].rank = r;
      f->plans[r].items.reserve(z.tensors);
    }
    const DTensorLayout layout = Mesh3(z.replicas, z.rows, z.cols);
    for (int t = 0; t < z.tensors; ++t) {
      // Short fqns stay in std::string's inline buffer, as real code can't
      // count on; shapes vary so chunks are uneven.
      const std::string fqn = absl::StrFormat("l%03d.w", t);
      const Shape shape = {4096 + 3 * (t % 7), 1024 + (t % 5)};
      const DType dtype = t % 3 == 0 ? DType::kFloat32 : DType::kBFloat16;
      auto chunks = AllChunks(layout, shape);
      if (!chunks.ok()) std::abort();
      for (const RankChunk& rc : *chunks) {
        WriteItem item;
        item.fqn = fqn;
        item.dtype = dtype;
        item.global_shape = shape;
        item.box = rc.box;
        item.length = static_cast<uint64_t>(Volume(rc.box)) * DTypeSize(dtype);
        f->plans[rc.rank].items.push_back(std::move(item));
      }
    }
    for (const LocalSavePlan& p : f->plans) {
      f->fingerprints.push_back(FingerprintLocalPlan(p));
    }
    SavePlanOptions options;
    f->key = PlanCache::Key{"llama-70b", world, f->fingerprints,
                            StorageSettingsKey(options)};
    auto plan = BuildGlobalSavePlan("llama-70b", 1000, f->plans, options);
    if (!plan.ok()) std::abort();
    f->cache.Insert(f->key,
                    std::make_shared<const GlobalSavePlan>(std::move(*plan)));
    if (f->cache.size() != 1) std::abort();
    return f;
  }();
  return *fixture;
}

void BM_SavePlanUncached(benchmark::State& state) {
  SaveFixture& f = GetSaveFixture();
  uint64_t writes = 0;
  for (auto _ : state) {
    auto plan = BuildGlobalSavePlan("llama-70b", 1000, f.plans, {});
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      break;
    }
    writes = 0;
    for (const RankSavePlan& r : plan->ranks) writes += r.writes.size();
    benchmark::DoNotOptimize(plan);
  }
  state.counters["ranks"] = static_cast<double>(f.plans.size());
  state.counters["items"] =
      static_cast<double>(f.plans.size()) * CurrentSizes().tensors;
  state.counters["writes"] = static_cast<double>(writes);
}

void BM_SavePlanCached(benchmark::State& state) {
  SaveFixture& f = GetSaveFixture();
  for (auto _ : state) {
    // The key is assembled from the fingerprints the ranks sent.
    PlanCache::Key key{"llama-70b", static_cast<int>(f.plans.size()),
                       f.fingerprints, StorageSettingsKey(SavePlanOptions{})};
    auto plan = f.cache.Lookup(key);
    if (plan == nullptr) {
      state.SkipWithError("cache miss");
      break;
    }
    benchmark::DoNotOptimize(plan);
  }
  state.counters["ranks"] = static_cast<double>(f.plans.size());
}

void BM_FingerprintLocalPlan(benchmark::State& state) {
  SaveFixture& f = GetSaveFixture();
  const LocalSavePlan& plan = f.plans[17 % f.plans.size()];
  for (auto _ : state) {
    benchmark::DoNotOptimize(FingerprintLocalPlan(plan));
  }
  state.counters["items"] = static_cast<double>(plan.items.size());
}

// ---- Load planning ----

struct LoadFixture {
  StoredTensor tensor;
  std::vector<WantedChunk> wanted;
  std::unique_ptr<LoadPlanner> planner;
};

// n = s * s stored chunks (mesh [s, s]) and n wanted chunks (mesh [2s, s/2])
// of a [6s - 1, 1000s + 7] float32 tensor: rows 6 / 3 per chunk, columns
// 1001 / 2001 per chunk, so column boundaries never line up.
LoadFixture& GetLoadFixture(int64_t n) {
  static auto* const fixtures = new std::vector<std::unique_ptr<LoadFixture>>;
  for (auto& f : *fixtures) {
    if (static_cast<int64_t>(f->wanted.size()) == n) return *f;
  }
  int64_t s = 1;
  while (s * s < n) ++s;
  auto f = std::make_unique<LoadFixture>();
  const Shape shape = {6 * s - 1, 1000 * s + 7};
  DTensorLayout stored;
  stored.mesh.shape = {s, s};
  stored.placements = {Placement::Shard(0), Placement::Shard(1)};
  for (int r = 0; r < s * s; ++r) stored.mesh.ranks.push_back(r);
  DTensorLayout wanted = stored;
  wanted.mesh.shape = {2 * s, s / 2};
  auto stored_chunks = AllChunks(stored, shape);
  auto wanted_chunks = AllChunks(wanted, shape);
  if (!stored_chunks.ok() || !wanted_chunks.ok()) std::abort();
  f->tensor = StoredTensor{"model.embed.weight", DType::kFloat32, shape, {}};
  for (const RankChunk& rc : *stored_chunks) {
    if (Volume(rc.box) == 0) std::abort();  // keep n honest: no empty chunks
    const uint64_t len = static_cast<uint64_t>(Volume(rc.box)) * 4;
    f->tensor.chunks.push_back(StoredChunk{
        rc.box,
        StorageLocation{absl::StrFormat("data/rank-%05d.bin", rc.rank), 0, len},
        0});
  }
  for (const RankChunk& rc : *wanted_chunks) {
    if (Volume(rc.box) == 0) std::abort();
    f->wanted.push_back(
        WantedChunk{"model.embed.weight", DType::kFloat32, shape, rc.box});
  }
  auto planner = LoadPlanner::Create({f->tensor});
  if (!planner.ok()) std::abort();
  f->planner = std::move(*planner);
  fixtures->push_back(std::move(f));
  return *fixtures->back();
}

// PyTorch's create_read_items_for_chunk_list: O(wanted x stored).
std::vector<ReadItem> NaivePlan(const StoredTensor& t,
                                const std::vector<WantedChunk>& wanted) {
  std::vector<ReadItem> reads;
  const size_t elem = DTypeSize(t.dtype);
  for (int w = 0; w < static_cast<int>(wanted.size()); ++w) {
    for (int c = 0; c < static_cast<int>(t.chunks.size()); ++c) {
      ChunkBox overlap;
      if (!Intersect(t.chunks[c].box, wanted[w].box, &overlap)) continue;
      ReadItem item;
      item.fqn = wanted[w].fqn;
      item.dest_index = w;
      item.source_chunk = c;
      item.source = t.chunks[c].location;
      item.source_crc32c = t.chunks[c].crc32c;
      AppendCopySegments(t.chunks[c].box, wanted[w].box, overlap, elem,
                         &item.segments);
      item.overlap = std::move(overlap);
      reads.push_back(std::move(item));
    }
  }
  return reads;
}

void SetLoadCounters(benchmark::State& state,
                     const std::vector<ReadItem>& reads, int64_t n) {
  uint64_t segments = 0;
  for (const ReadItem& r : reads) segments += r.segments.size();
  state.counters["read_items"] = static_cast<double>(reads.size());
  state.counters["segments"] = static_cast<double>(segments);
  state.counters["chunks/s"] = benchmark::Counter(
      static_cast<double>(n) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

void BM_LoadPlanIndex(benchmark::State& state) {
  LoadFixture& f = GetLoadFixture(state.range(0));
  std::vector<ReadItem> reads;
  for (auto _ : state) {
    auto r = f.planner->Plan(f.wanted);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      break;
    }
    reads = std::move(*r);
    benchmark::DoNotOptimize(reads);
  }
  SetLoadCounters(state, reads, state.range(0));
}

void LoadAnswer(benchmark::State& state, convert::AnswerForm form) {
  LoadFixture& f = GetLoadFixture(state.range(0));
  size_t expected = 0;
  int items = 0;
  for (auto _ : state) {
    convert::PlanLoadAnswerWriter answer(1, "file:///ckpt", form, expected);
    const absl::Status s = f.planner->PlanEach(
        f.wanted,
        [&answer](const LoadPlanner::ReadView& r) { answer.AddRead(r); },
        /*segments=*/form == convert::AnswerForm::kFull);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    items = answer.reads();
    std::string bytes = std::move(answer).Finish("job/1/");
    expected = bytes.size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["read_items"] = items;
  state.counters["answer_bytes"] = static_cast<double>(expected);
  state.counters["items/s"] = benchmark::Counter(
      static_cast<double>(items) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

void BM_LoadAnswerColumns(benchmark::State& state) {
  LoadAnswer(state, convert::AnswerForm::kReadColumns);
}

void BM_LoadAnswerFull(benchmark::State& state) {
  LoadAnswer(state, convert::AnswerForm::kFull);
}

void BM_LoadPlanIndexBuild(benchmark::State& state) {
  LoadFixture& f = GetLoadFixture(state.range(0));
  for (auto _ : state) {
    auto planner = LoadPlanner::Create({f.tensor});
    benchmark::DoNotOptimize(planner);
  }
}

bool SameReads(const std::vector<ReadItem>& a, const std::vector<ReadItem>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dest_index != b[i].dest_index ||
        a[i].source_chunk != b[i].source_chunk ||
        a[i].overlap != b[i].overlap || a[i].segments != b[i].segments) {
      return false;
    }
  }
  return true;
}

void BM_LoadPlanNaive(benchmark::State& state) {
  LoadFixture& f = GetLoadFixture(state.range(0));
  std::vector<ReadItem> reads;
  for (auto _ : state) {
    reads = NaivePlan(f.tensor, f.wanted);
    benchmark::DoNotOptimize(reads);
  }
  SetLoadCounters(state, reads, state.range(0));
  auto indexed = f.planner->Plan(f.wanted);  // not timed: same answer?
  if (!indexed.ok() || !SameReads(reads, *indexed)) {
    state.SkipWithError("naive and indexed read items differ");
  }
}

// ---- Transfer schedule ----

// BM_TransferPlan_<from>_to_<to>.
void BM_TransferPlan(benchmark::State& state) {
  const Sizes& z = CurrentSizes();
  const DTensorLayout src = Mesh3(z.replicas, z.rows, z.cols);
  const DTensorLayout dst = Mesh3(z.replicas, z.transfer_rows_to, z.cols);
  std::vector<TransferTensor> tensors;
  for (int t = 0; t < z.transfer_tensors; ++t) {
    TransferTensor tensor;
    tensor.fqn = absl::StrFormat("layers.%02d.mlp.w", t);
    tensor.dtype = DType::kBFloat16;
    tensor.global_shape = {z.transfer_dim0 + 5 * t, z.transfer_dim1};
    auto s = AllChunks(src, tensor.global_shape);
    auto d = AllChunks(dst, tensor.global_shape);
    if (!s.ok() || !d.ok()) std::abort();
    tensor.sources = std::move(*s);
    tensor.destinations = std::move(*d);
    tensors.push_back(std::move(tensor));
  }
  TransferPlan plan;
  for (auto _ : state) {
    auto p = BuildTransferPlan(tensors, {});
    if (!p.ok()) {
      state.SkipWithError(std::string(p.status().message()).c_str());
      break;
    }
    plan = std::move(*p);
    benchmark::DoNotOptimize(plan);
  }
  state.counters["sends"] = static_cast<double>(plan.sends.size());
  state.counters["messages"] = static_cast<double>(plan.messages.size());
  state.counters["net_GiB"] =
      static_cast<double>(plan.network_bytes) / (1 << 30);
  state.counters["local_GiB"] =
      static_cast<double>(plan.local_bytes) / (1 << 30);
  state.counters["max_send_MiB"] =
      static_cast<double>(plan.max_rank_send_bytes) / (1 << 20);
  state.counters["max_recv_MiB"] =
      static_cast<double>(plan.max_rank_recv_bytes) / (1 << 20);
}

// Registers every benchmark at `z`; smoke runs each exactly once.
void RegisterAll(const Sizes& z, bool smoke) {
  auto fixed = [smoke](benchmark::internal::Benchmark* b, int iterations) {
    b->Iterations(smoke ? 1 : iterations);
  };
  auto timed = [smoke](benchmark::internal::Benchmark* b) {
    if (smoke) b->Iterations(1);
  };
  fixed(benchmark::RegisterBenchmark("BM_SavePlanUncached", BM_SavePlanUncached)
            ->Unit(benchmark::kMillisecond),
        3);
  timed(benchmark::RegisterBenchmark("BM_SavePlanCached", BM_SavePlanCached)
            ->Unit(benchmark::kMicrosecond));
  timed(benchmark::RegisterBenchmark("BM_FingerprintLocalPlan",
                                     BM_FingerprintLocalPlan)
            ->Unit(benchmark::kMicrosecond));
  for (auto [name, fn] :
       {std::pair{"BM_LoadPlanIndex", BM_LoadPlanIndex},
        std::pair{"BM_LoadAnswerColumns", BM_LoadAnswerColumns},
        std::pair{"BM_LoadAnswerFull", BM_LoadAnswerFull},
        std::pair{"BM_LoadPlanIndexBuild", BM_LoadPlanIndexBuild}}) {
    auto* b =
        benchmark::RegisterBenchmark(name, fn)->Unit(benchmark::kMillisecond);
    for (int64_t n : z.load_chunks) b->Arg(n);
    timed(b);
  }
  auto* naive =
      benchmark::RegisterBenchmark("BM_LoadPlanNaive", BM_LoadPlanNaive)
          ->Unit(benchmark::kMillisecond);
  for (int64_t n : z.load_chunks) naive->Arg(n);
  fixed(naive, 1);
  fixed(benchmark::RegisterBenchmark(
            absl::StrFormat("BM_TransferPlan_%d_to_%d", z.world(),
                            z.replicas * z.transfer_rows_to * z.cols)
                .c_str(),
            BM_TransferPlan)
            ->Unit(benchmark::kMillisecond),
        3);
}

// Console output as usual, and a count of the runs and of those that
// reported an error (SkipWithError), so that a broken benchmark exits 1.
class CountingReporter : public benchmark::ConsoleReporter {
 public:
  // Colors only on a terminal (ctest matches the plain lines).
  CountingReporter()
      : ConsoleReporter(::isatty(STDOUT_FILENO) ? OO_ColorTabular
                                                : OO_Tabular) {}
  void ReportRuns(const std::vector<Run>& reports) override {
    for (const Run& run : reports) {
      ++runs_;
      if (run.error_occurred) ++errors_;
    }
    ConsoleReporter::ReportRuns(reports);
  }
  int runs() const { return runs_; }
  int errors() const { return errors_; }

 private:
  int runs_ = 0;
  int errors_ = 0;
};

}  // namespace
}  // namespace cairn::planner

int main(int argc, char** argv) {
  using namespace cairn::planner;  // NOLINT
  bool smoke = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0) {
      smoke = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  if (smoke) CurrentSizes() = SmokeSizes();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  RegisterAll(CurrentSizes(), smoke);
  CountingReporter reporter;
  const size_t matched = benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  if (matched == 0 || reporter.errors() > 0) {
    std::fprintf(stderr,
                 "planner_bench: %zu benchmarks matched, %d of %d runs "
                 "failed\n",
                 matched, reporter.errors(), reporter.runs());
    return 1;
  }
  if (reporter.runs() > 0) {
    std::printf("planner_bench: %d benchmark runs completed%s\n",
                reporter.runs(), smoke ? " (smoke sizes)" : "");
  }
  return 0;
}
