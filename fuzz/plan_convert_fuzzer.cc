// plan_convert_fuzzer: the wire -> planner path of a save and of a load, as
// cairnd runs it on what ranks send (input: a cairn.fuzz.PlanConvertInput,
// fuzz/fuzz_input.proto).
//
//  1. BeginSave: each rank's cairn.v1.LocalSavePlan -> LocalPlanFromProto ->
//     FingerprintLocalPlan (the plan cache key), then BuildGlobalSavePlan over
//     all ranks, and each rank's share back to the wire (RankPlanToProto),
//     which the rank decodes (RankPlanFromProto).
//  2. PlanLoad: a LoadPlanner over the checkpoint that global plan commits,
//     and the wanted chunks of one rank -> WantedFromProto -> Plan ->
//     ReadItemToProto -> ReadItemFromProto (what the rank decodes).
//     The same plan in read columns (PlanLoadAnswerWriter), expanded as the
//     rank does (ExpandReadColumns), must be the same read items.
//     The short form of a request (tensors_digest, wanted_boxes) with hostile
//     boxes: refused, or planned as its full form.
//  3. A client decoding hostile answers: RankPlanFromProto, ReadItemFromProto,
//     ExpandReadColumns (segments it computes stay inside their buffers).
// Invariants checked (a violation aborts): every error is a status (never a
// crash, hang or allocation bomb); conversions round-trip; a global plan has
// one rank plan per rank, writes inside their objects (at most 2^63 - 1
// bytes), aligned and disjoint, and total_bytes is the sum of the write
// lengths (at most 2^63, never wrapped); the committed checkpoint
// always gets a LoadPlanner; read segments stay inside the stored chunk and
// the wanted buffer and cover each wanted box exactly once.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.pb.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "planner/load_plan.h"
#include "planner/plan_cache.h"
#include "planner/save_plan.h"
#include "proto/convert/load_answer.h"
#include "proto/convert/load_request.h"
#include "proto/convert/plan_convert.h"

namespace {

using namespace cairn;  // NOLINT

// cairnd accepts worlds up to 2^20; a fuzz input holds one plan per rank,
// so this bounds only the input's size.
constexpr int kMaxFuzzWorld = 64;

using ull = unsigned long long;

void CheckGlobalPlan(const planner::GlobalSavePlan& plan, int world,
                     uint64_t alignment) {
  FUZZ_CHECK(plan.world_size == world && plan.ranks.size() == size_t(world),
             "global plan for %d ranks has world %d and %zu rank plans", world,
             plan.world_size, plan.ranks.size());
  unsigned __int128 total = 0;  // cannot wrap, unlike the plan's sums
  for (int r = 0; r < world; ++r) {
    const planner::RankSavePlan& rp = plan.ranks[r];
    FUZZ_CHECK(rp.rank == r, "ranks[%d].rank == %d", r, rp.rank);
    FUZZ_CHECK(rp.object_bytes <= INT64_MAX, "rank %d's object of %llu bytes",
               r, ull(rp.object_bytes));
    uint64_t end = 0;  // writes are laid out in order, back to back
    FUZZ_CHECK(rp.writes.empty() == rp.object_key.empty(),
               "rank %d has %zu writes and object key '%s'", r,
               rp.writes.size(), rp.object_key.c_str());
    for (const planner::PlannedWrite& w : rp.writes) {
      FUZZ_CHECK(w.entry < plan.entries.size(), "write names entry %u of %zu",
                 w.entry, plan.entries.size());
      const planner::PlannedEntry& e = plan.EntryOf(w);
      if (e.kind == planner::WriteItem::Kind::kTensorChunk) {
        FUZZ_CHECK(w.box_begin + 2 * e.global_shape.size() <= rp.coords.size(),
                   "box of write at %u past the %zu coords", w.box_begin,
                   rp.coords.size());
      }
      const planner::StorageLocation loc = rp.LocationOf(w);
      FUZZ_CHECK(loc.offset % alignment == 0, "offset %llu not aligned to %llu",
                 ull(loc.offset), ull(alignment));
      FUZZ_CHECK(loc.offset >= end,
                 "write at %llu overlaps the previous one "
                 "(ends at %llu)",
                 ull(loc.offset), ull(end));
      FUZZ_CHECK(loc.length <= rp.object_bytes &&
                     loc.offset <= rp.object_bytes - loc.length,
                 "write [%llu, +%llu) outside object of %llu bytes",
                 ull(loc.offset), ull(loc.length), ull(rp.object_bytes));
      end = loc.offset + loc.length;
      total += loc.length;
    }
    // The rank's share crosses the wire and is decoded by the rank.
    v1::RankSavePlan wire;
    convert::RankPlanToProto(plan, r, &wire);
    absl::StatusOr<convert::DecodedRankPlan> back =
        convert::RankPlanFromProto(wire);
    FUZZ_CHECK(back.ok() && back->items.size() == rp.writes.size(),
               "rank plan does not round-trip: %s",
               back.status().ToString().c_str());
    for (size_t i = 0; i < rp.writes.size(); ++i) {
      const planner::WriteItem item = plan.ItemOf(r, rp.writes[i]);
      FUZZ_CHECK(back->locations[i] == rp.LocationOf(rp.writes[i]) &&
                     back->items[i].fqn == item.fqn &&
                     back->items[i].box == item.box &&
                     back->items[i].length == item.length,
                 "planned write %zu of rank %d does not round-trip", i, r);
    }
  }
  FUZZ_CHECK(total == plan.total_bytes && total <= uint64_t{1} << 63,
             "total_bytes %llu != sum %llu (or beyond 2^63)",
             ull(plan.total_bytes), ull(total));
}

// The checkpoint `plan` commits, as the load planner sees it.
std::vector<planner::StoredTensor> Committed(
    const planner::GlobalSavePlan& plan) {
  std::map<std::string, planner::StoredTensor> by_fqn;
  for (const planner::PlannedEntry& e : plan.entries) {
    if (e.kind != planner::WriteItem::Kind::kTensorChunk) continue;
    by_fqn[e.fqn] = planner::StoredTensor{e.fqn, e.dtype, e.global_shape, {}};
  }
  for (const planner::RankSavePlan& rp : plan.ranks) {
    for (const planner::PlannedWrite& w : rp.writes) {
      const planner::PlannedEntry& e = plan.EntryOf(w);
      if (e.kind != planner::WriteItem::Kind::kTensorChunk) continue;
      auto it = by_fqn.find(e.fqn);
      FUZZ_CHECK(it != by_fqn.end(), "write of '%s' has no entry",
                 e.fqn.c_str());
      it->second.chunks.push_back(
          planner::StoredChunk{plan.BoxOf(rp.rank, w), rp.LocationOf(w), 0});
    }
  }
  std::vector<planner::StoredTensor> out;
  for (auto& [fqn, t] : by_fqn) out.push_back(std::move(t));
  return out;
}

void CheckLoad(const planner::LoadPlanner& loader,
               const google::protobuf::RepeatedPtrField<v1::WantedChunk>& in) {
  std::vector<planner::WantedChunk> wanted;
  for (const v1::WantedChunk& w : in) {
    absl::StatusOr<planner::WantedChunk> c = convert::WantedFromProto(w);
    if (!c.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(c.status()), "%s",
                 c.status().ToString().c_str());
      return;
    }
    v1::WantedChunk wire;
    convert::WantedToProto(*c, &wire);
    absl::StatusOr<planner::WantedChunk> again = convert::WantedFromProto(wire);
    FUZZ_CHECK(again.ok() && again->box == c->box &&
                   again->global_shape == c->global_shape,
               "wanted chunk does not round-trip");
    wanted.push_back(std::move(*c));
  }
  absl::StatusOr<std::vector<planner::ReadItem>> reads = loader.Plan(wanted);
  if (!reads.ok()) return;
  std::vector<uint64_t> covered(wanted.size(), 0);
  for (const planner::ReadItem& r : *reads) {
    FUZZ_CHECK(r.dest_index >= 0 && size_t(r.dest_index) < wanted.size(),
               "dest_index %d of %zu", r.dest_index, wanted.size());
    const planner::WantedChunk& w = wanted[r.dest_index];
    const uint64_t dst_bytes =
        uint64_t(planner::Volume(w.box)) * planner::DTypeSize(w.dtype);
    for (const planner::CopySegment& s : r.segments) {
      FUZZ_CHECK(s.length <= r.source.length &&
                     s.src_offset <= r.source.length - s.length,
                 "segment [%llu, +%llu) outside stored chunk of %llu bytes",
                 ull(s.src_offset), ull(s.length), ull(r.source.length));
      FUZZ_CHECK(s.length <= dst_bytes && s.dst_offset <= dst_bytes - s.length,
                 "segment [%llu, +%llu) outside wanted buffer of %llu bytes",
                 ull(s.dst_offset), ull(s.length), ull(dst_bytes));
      covered[r.dest_index] += s.length;
    }
    v1::ReadItem wire;
    convert::ReadItemToProto(r, &wire);
    absl::StatusOr<planner::ReadItem> back = convert::ReadItemFromProto(wire);
    FUZZ_CHECK(back.ok() && back->segments == r.segments &&
                   back->overlap == r.overlap && back->source == r.source,
               "read item does not round-trip");
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    const uint64_t need = uint64_t(planner::Volume(wanted[i].box)) *
                          planner::DTypeSize(wanted[i].dtype);
    FUZZ_CHECK(covered[i] == need, "wanted chunk %zu: %llu of %llu bytes", i,
               ull(covered[i]), ull(need));
  }

  // The same answer in read columns, expanded by the rank; given some room
  // up front (none, too little or too much, by the input) as cairnd gives it
  // the size of the last answer.
  v1::PlanLoadRequest request;
  for (const planner::WantedChunk& w : wanted) {
    convert::WantedToProto(w, request.add_wanted());
  }
  convert::PlanLoadAnswerWriter writer(
      1, "mem://fuzz", convert::AnswerForm::kReadColumns,
      (wanted.size() % 3) * reads->size() * 16);
  FUZZ_CHECK(loader
                 .PlanEach(
                     wanted,
                     [&](const planner::LoadPlanner::ReadView& r) {
                       writer.AddRead(r);
                     },
                     /*segments=*/false)
                 .ok(),
             "PlanEach fails where Plan succeeded");
  v1::PlanLoadResponse columns;
  FUZZ_CHECK(columns.ParseFromString(std::move(writer).Finish("p/")),
             "a read-columns answer does not parse");
  const absl::Status expanded = convert::ExpandReadColumns(request, &columns);
  FUZZ_CHECK(expanded.ok(), "a read-columns answer does not expand: %s",
             expanded.ToString().c_str());
  FUZZ_CHECK(size_t(columns.reads_size()) == reads->size(),
             "%d read items from columns, %zu planned", columns.reads_size(),
             reads->size());
  for (size_t i = 0; i < reads->size(); ++i) {
    absl::StatusOr<planner::ReadItem> got =
        convert::ReadItemFromProto(columns.reads(int(i)));
    const planner::ReadItem& want = (*reads)[i];
    FUZZ_CHECK(got.ok() && got->fqn == want.fqn &&
                   got->dest_index == want.dest_index &&
                   got->overlap == want.overlap && got->source == want.source &&
                   got->segments == want.segments,
               "read item %zu from columns expands to another item", i);
  }
}

// A client expanding hostile read columns: whatever it accepts reads inside
// the stored chunk and inside the wanted buffer.
void CheckHostileReadColumns(const fuzz::PlanConvertInput& in) {
  if (!in.has_read_columns()) return;
  v1::PlanLoadRequest request;
  *request.mutable_wanted() = in.wanted();
  v1::PlanLoadResponse answer;
  *answer.mutable_objects() = in.objects();
  *answer.mutable_boxes() = in.boxes();
  *answer.mutable_read_columns() = in.read_columns();
  if (!convert::ExpandReadColumns(request, &answer).ok()) return;
  for (int i = 0; i < answer.reads_size(); ++i) {
    const v1::ReadItem& it = answer.reads(i);
    absl::StatusOr<planner::WantedChunk> w =
        convert::WantedFromProto(request.wanted(it.dest_index()));
    FUZZ_CHECK(w.ok(), "expanded against a malformed wanted chunk");
    const uint64_t dst_bytes =
        uint64_t(planner::Volume(w->box)) * planner::DTypeSize(w->dtype);
    for (const v1::CopySegment& s : it.segments()) {
      FUZZ_CHECK(s.length() <= it.source().length() &&
                     s.src_offset() <= it.source().length() - s.length(),
                 "expanded segment outside its stored chunk");
      FUZZ_CHECK(
          s.length() <= dst_bytes && s.dst_offset() <= dst_bytes - s.length(),
          "expanded segment outside the wanted buffer");
    }
  }
}

// The short form of a load request against that checkpoint, with the
// input's wanted boxes' values as a hostile rank's wanted_boxes: refused as
// INVALID_ARGUMENT, or expanded into chunks whose full form shortens back to
// the same request and plans as CheckLoad demands.
void CheckShortFormLoad(const planner::LoadPlanner& loader,
                        const fuzz::PlanConvertInput& in) {
  std::vector<int> order;
  const std::string digest = convert::TensorsDigestOf(loader, &order);
  v1::PlanLoadRequest request;
  request.set_tensors_digest(digest);
  for (const v1::WantedChunk& w : in.wanted()) {
    request.mutable_wanted_boxes()->Add(w.box().offsets().begin(),
                                        w.box().offsets().end());
    request.mutable_wanted_boxes()->Add(w.box().sizes().begin(),
                                        w.box().sizes().end());
  }
  absl::StatusOr<std::vector<planner::WantedBox>> wanted =
      convert::WantedFromCompact(request, loader, order);
  // What cairnd plans instead: the run of values as sent.
  const absl::StatusOr<std::vector<planner::ReadItem>> run =
      loader.Plan(planner::WantedBoxRun{
          order, absl::MakeConstSpan(request.wanted_boxes().data(),
                                     request.wanted_boxes_size())});
  if (!wanted.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(wanted.status()), "%s",
               wanted.status().ToString().c_str());
    FUZZ_CHECK(absl::IsInvalidArgument(run.status()),
               "a run of values the boxes refuse planned: %s",
               run.status().ToString().c_str());
    return;
  }
  const absl::StatusOr<std::vector<planner::ReadItem>> boxes =
      loader.Plan(*wanted);
  FUZZ_CHECK(run.status().code() == boxes.status().code(),
             "a run of values planned as %s, its boxes as %s",
             run.status().ToString().c_str(),
             boxes.status().ToString().c_str());
  if (run.ok()) {
    FUZZ_CHECK(run->size() == boxes->size(), "%zu items from a run, %zu",
               run->size(), boxes->size());
    for (size_t i = 0; i < run->size(); ++i) {
      const planner::ReadItem& a = (*run)[i];
      const planner::ReadItem& b = (*boxes)[i];
      FUZZ_CHECK(a.dest_index == b.dest_index && a.fqn == b.fqn &&
                     a.overlap == b.overlap && a.source == b.source &&
                     a.source_crc32c == b.source_crc32c &&
                     a.segments == b.segments,
                 "item %zu of a run differs from its boxes'", i);
    }
  }
  v1::PlanLoadRequest full;
  for (const planner::WantedBox& w : *wanted) {
    convert::WantedToProto(loader.Named(w), full.add_wanted());
  }
  v1::PlanLoadRequest again;
  FUZZ_CHECK(convert::CompactWanted(full, &again), "no short form");
  FUZZ_CHECK(
      again.tensors_digest() == digest &&
          std::equal(again.wanted_boxes().begin(), again.wanted_boxes().end(),
                     request.wanted_boxes().begin(),
                     request.wanted_boxes().end()),
      "a short form does not round-trip");
  CheckLoad(loader, full.wanted());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::PlanConvertInput in;
  if (!in.ParseFromArray(data, static_cast<int>(size))) return 0;

  // 3. A client decoding cairnd's answers.
  (void)convert::RankPlanFromProto(in.rank_plan());
  for (const v1::ReadItem& r : in.reads()) (void)convert::ReadItemFromProto(r);
  CheckHostileReadColumns(in);

  // 1. BeginSave from every rank.
  const int world = in.local_plans_size();
  if (world == 0 || world > kMaxFuzzWorld) return 0;
  std::vector<planner::LocalSavePlan> plans;
  for (int r = 0; r < world; ++r) {
    // cairnd refuses a plan whose rank is not the caller's.
    if (in.local_plans(r).rank() != r) return 0;
    absl::StatusOr<planner::LocalSavePlan> p =
        convert::LocalPlanFromProto(in.local_plans(r));
    if (!p.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(p.status()), "%s",
                 p.status().ToString().c_str());
      return 0;
    }
    const std::string fingerprint = planner::FingerprintLocalPlan(*p);
    v1::LocalSavePlan wire;
    convert::LocalPlanToProto(*p, &wire);
    absl::StatusOr<planner::LocalSavePlan> again =
        convert::LocalPlanFromProto(wire);
    FUZZ_CHECK(
        again.ok() && planner::FingerprintLocalPlan(*again) == fingerprint,
        "local plan of rank %d does not round-trip", r);
    plans.push_back(std::move(*p));
  }
  planner::SavePlanOptions options;
  options.alignment = uint64_t{1} << (in.alignment_log2() % 13);
  absl::StatusOr<planner::GlobalSavePlan> plan =
      planner::BuildGlobalSavePlan("fuzz", 1, plans, options);
  if (!plan.ok()) return 0;
  CheckGlobalPlan(*plan, world, options.alignment);

  // 2. PlanLoad against the checkpoint this plan commits.
  absl::StatusOr<std::unique_ptr<planner::LoadPlanner>> loader =
      planner::LoadPlanner::Create(Committed(*plan));
  FUZZ_CHECK(loader.ok(), "the committed plan gets no LoadPlanner: %s",
             loader.status().ToString().c_str());
  CheckLoad(**loader, in.wanted());
  CheckShortFormLoad(**loader, in);
  return 0;
}
