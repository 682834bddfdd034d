// fuzz_seed_corpus OUT_DIR: writes the seed corpus of the three fuzzers,
// OUT_DIR/<fuzzer>/seed-*, from a few save
// scenarios planned by the real planner (so every seed is valid and reaches
// the deepest checks). scripts/fuzz.sh --regen-corpus runs it into
// fuzz/corpus/; the files are checked in, next to the regression inputs of
// fixed findings (crash-*, named after the defect).
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "fuzz/fuzz_input.pb.h"
#include "planner/layout.h"
#include "planner/save_plan.h"
#include "proto/convert/load_answer.h"
#include "proto/convert/plan_convert.h"
#include "storage/catalog/catalog.h"
#include "storage/checkpoint_record.h"
#include "storage/manifest.h"

namespace {

using namespace cairn;  // NOLINT

struct TensorSpec {
  std::string fqn;
  planner::DType dtype;
  planner::Shape shape;
  planner::DTensorLayout layout;
};

planner::DTensorLayout Layout(std::vector<int64_t> mesh,
                              std::vector<planner::Placement> placements) {
  planner::DTensorLayout l;
  int64_t n = 1;
  for (int64_t d : mesh) n *= d;
  l.mesh.shape.assign(mesh.begin(), mesh.end());
  for (int r = 0; r < n; ++r) l.mesh.ranks.push_back(r);
  l.placements = std::move(placements);
  return l;
}

struct Scenario {
  int world;
  std::vector<TensorSpec> tensors;
  std::vector<std::string> blobs;  // bytes entries, every rank holds each
  std::vector<TensorSpec> wanted;  // the load: layouts of the same tensors
};

std::vector<planner::LocalSavePlan> LocalPlans(const Scenario& s) {
  std::vector<planner::LocalSavePlan> plans(s.world);
  for (int r = 0; r < s.world; ++r) plans[r].rank = r;
  for (const TensorSpec& t : s.tensors) {
    const std::vector<planner::RankChunk> chunks =
        planner::AllChunks(t.layout, t.shape).value();
    for (const planner::RankChunk& rc : chunks) {
      planner::WriteItem w;
      w.fqn = t.fqn;
      w.dtype = t.dtype;
      w.global_shape = t.shape;
      w.box = rc.box;
      w.length =
          uint64_t(planner::Volume(rc.box)) * planner::DTypeSize(t.dtype);
      plans[rc.rank].items.push_back(std::move(w));
    }
  }
  for (const std::string& b : s.blobs) {
    for (int r = 0; r < s.world; ++r) {
      planner::WriteItem w;
      w.kind = planner::WriteItem::Kind::kBytes;
      w.fqn = b;
      w.length = 24 + b.size();
      plans[r].items.push_back(std::move(w));
    }
  }
  return plans;
}

// The manifest cairnd would commit for `plan` (as Coordinator::BuildManifest).
v1::Manifest ManifestOf(const planner::GlobalSavePlan& plan, int64_t step) {
  v1::Manifest m;
  m.set_format_version(storage::kManifestFormatVersion);
  m.set_job("fuzz-job");
  m.set_step(step);
  m.set_world_size(plan.world_size);
  m.set_created_unix_micros(1700000000000000 + step);
  std::map<std::string, v1::ManifestTensor> tensors;
  std::map<std::string, v1::ManifestBytes> bytes;
  for (const planner::PlannedEntry& e : plan.entries) {
    if (e.kind != planner::WriteItem::Kind::kTensorChunk) continue;
    v1::TensorEntry* te = tensors[e.fqn].mutable_entry();
    te->set_fqn(e.fqn);
    te->set_dtype(convert::DTypeToProto(e.dtype));
    te->mutable_global_shape()->Assign(e.global_shape.begin(),
                                       e.global_shape.end());
  }
  std::set<std::string> objects;
  uint64_t crc = 0x1234567;
  for (const planner::RankSavePlan& rp : plan.ranks) {
    for (const planner::PlannedWrite& w : rp.writes) {
      const planner::PlannedEntry& e = plan.EntryOf(w);
      objects.insert(rp.object_key);
      crc = crc * 6364136223846793005ULL + 1442695040888963407ULL;
      if (e.kind == planner::WriteItem::Kind::kBytes) {
        v1::ManifestBytes& b = bytes[e.fqn];
        b.set_fqn(e.fqn);
        convert::LocationToProto(rp.LocationOf(w), b.mutable_location());
        b.set_crc32c(static_cast<uint32_t>(crc >> 32));
        b.set_writer_rank(rp.rank);
        continue;
      }
      v1::StoredChunk* c = tensors[e.fqn].add_chunks();
      convert::BoxToProto(plan.BoxOf(rp.rank, w), c->mutable_box());
      convert::LocationToProto(rp.LocationOf(w), c->mutable_location());
      c->set_crc32c(static_cast<uint32_t>(crc >> 32));
      c->set_writer_rank(rp.rank);
    }
  }
  for (auto& [fqn, t] : tensors) *m.add_tensors() = std::move(t);
  for (auto& [fqn, b] : bytes) *m.add_bytes_entries() = std::move(b);
  for (const std::string& o : objects) m.add_objects(o);
  m.set_total_bytes(plan.total_bytes);
  return m;
}

bool Write(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) std::fprintf(stderr, "cannot write %s\n", path.c_str());
  return static_cast<bool>(f);
}

std::vector<Scenario> Scenarios() {
  using planner::DType;
  using P = planner::Placement;
  std::vector<Scenario> out;
  // FSDP rows over 2 ranks, loaded by columns; a bytes entry on both.
  out.push_back(Scenario{
      2,
      {{"model.embed", DType::kFloat32, {8, 6}, Layout({2}, {P::Shard(0)})},
       {"model.wq", DType::kBFloat16, {5, 4, 3}, Layout({2}, {P::Shard(1)})}},
      {"rng"},
      {{"model.embed", DType::kFloat32, {8, 6}, Layout({2}, {P::Shard(1)})},
       {"model.wq", DType::kBFloat16, {5, 4, 3}, Layout({2}, {P::Shard(0)})}}});
  // HSDP: 2 replicas x 2 shards (dedupe), uneven chunks; loaded whole.
  out.push_back(Scenario{
      4,
      {{"layers.0.w",
        DType::kFloat16,
        {7, 5},
        Layout({2, 2}, {P::Replicate(), P::Shard(0)})},
       {"layers.0.b",
        DType::kInt64,
        {3},
        Layout({2, 2}, {P::Replicate(), P::Replicate()})}},
      {"optim.state", "step"},
      {{"layers.0.w", DType::kFloat16, {7, 5}, Layout({1}, {P::Replicate()})},
       {"layers.0.b", DType::kInt64, {3}, Layout({1}, {P::Replicate()})}}});
  // A replicated scalar, an empty tensor, a 2-D grid over a 2x2 mesh.
  out.push_back(Scenario{
      4,
      {{"scalar", DType::kFloat64, {}, Layout({4}, {P::Replicate()})},
       {"empty", DType::kInt8, {0, 5}, Layout({4}, {P::Shard(0)})},
       {"grid",
        DType::kUInt8,
        {9, 10},
        Layout({2, 2}, {P::Shard(0), P::Shard(1)})}},
      {},
      {{"grid", DType::kUInt8, {9, 10}, Layout({3}, {P::Shard(1)})},
       {"scalar", DType::kFloat64, {}, Layout({1}, {P::Replicate()})}}});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  for (const char* sub : {"", "/manifest_fuzzer", "/plan_convert_fuzzer",
                          "/catalog_record_fuzzer"}) {
    ::mkdir((root + sub).c_str(), 0755);
  }
  int files = 0;
  bool ok = true;
  const std::vector<Scenario> scenarios = Scenarios();
  for (size_t i = 0; i < scenarios.size(); ++i) {
    const Scenario& s = scenarios[i];
    const std::vector<planner::LocalSavePlan> plans = LocalPlans(s);
    planner::SavePlanOptions options;
    options.alignment = i == 0 ? 4096 : 8;
    absl::StatusOr<planner::GlobalSavePlan> plan =
        planner::BuildGlobalSavePlan("fuzz-job", 10 + i, plans, options);
    if (!plan.ok()) {
      std::fprintf(stderr, "scenario %zu: %s\n", i,
                   plan.status().ToString().c_str());
      return 1;
    }
    // manifest: framed (selector 0) and bare body (selector 1).
    const v1::Manifest manifest = ManifestOf(*plan, 10 + i);
    if (absl::Status v = storage::ValidateManifest(manifest); !v.ok()) {
      std::fprintf(stderr, "scenario %zu: %s\n", i, v.ToString().c_str());
      return 1;
    }
    ok &= Write(absl::StrFormat("%s/manifest_fuzzer/seed-%zu-framed", root, i),
                std::string(1, '\0') + storage::EncodeManifest(manifest));
    ok &= Write(absl::StrFormat("%s/manifest_fuzzer/seed-%zu-body", root, i),
                std::string(1, '\1') + manifest.SerializeAsString());
    files += 2;

    // plan_convert: the ranks' plans, the load's wanted chunks (of every
    // rank of the load layout), cairnd's answers to rank 0.
    fuzz::PlanConvertInput in;
    for (const planner::LocalSavePlan& p : plans) {
      convert::LocalPlanToProto(p, in.add_local_plans());
    }
    in.set_alignment_log2(i == 0 ? 12 : 3);
    std::vector<planner::WantedChunk> wanted;
    for (const TensorSpec& t : s.wanted) {
      const std::vector<planner::RankChunk> chunks =
          planner::AllChunks(t.layout, t.shape).value();
      for (const planner::RankChunk& rc : chunks) {
        wanted.push_back({t.fqn, t.dtype, t.shape, rc.box});
        convert::WantedToProto(wanted.back(), in.add_wanted());
      }
    }
    convert::RankPlanToProto(*plan, 0, in.mutable_rank_plan());
    // cairnd's answer in read columns to the load's wanted chunks.
    std::unique_ptr<planner::LoadPlanner> loader =
        planner::LoadPlanner::Create(
            convert::StoredTensorsFromManifest(manifest).value())
            .value();
    convert::PlanLoadAnswerWriter answer(manifest.step(), "mem://fuzz",
                                         convert::AnswerForm::kReadColumns);
    if (!loader
             ->PlanEach(
                 wanted,
                 [&](const planner::LoadPlanner::ReadView& r) {
                   answer.AddRead(r);
                 },
                 /*segments=*/false)
             .ok()) {
      return 1;
    }
    v1::PlanLoadResponse planned;
    if (!planned.ParseFromString(std::move(answer).Finish(""))) return 1;
    *in.mutable_objects() = planned.objects();
    *in.mutable_boxes() = planned.boxes();
    *in.mutable_read_columns() = planned.read_columns();
    ok &= Write(absl::StrFormat("%s/plan_convert_fuzzer/seed-%zu", root, i),
                in.SerializeAsString());
    ++files;

    // catalog_record: the record of this checkpoint in each state.
    v1::CheckpointRecord rec =
        storage::RecordFromManifest(manifest, "file:///var/lib/cairn");
    const std::string key = storage::CheckpointRecordKey(rec.job(), rec.step());
    for (v1::CheckpointState state :
         {v1::CHECKPOINT_STATE_COMMITTED, v1::CHECKPOINT_STATE_ABORTED,
          v1::CHECKPOINT_STATE_WRITING}) {
      rec.set_state(state);
      rec.set_abort_reason(state == v1::CHECKPOINT_STATE_ABORTED
                               ? "rank 1 of job 'fuzz-job' step 10 died"
                               : "");
      ok &= Write(absl::StrFormat("%s/catalog_record_fuzzer/seed-%zu-%d", root,
                                  i, static_cast<int>(state)),
                  std::string(1, static_cast<char>(key.size())) + key +
                      rec.SerializeAsString());
      ++files;
    }
  }
  std::printf("fuzz_seed_corpus: wrote %d seeds under %s\n", files,
              root.c_str());
  return ok ? 0 : 1;
}
