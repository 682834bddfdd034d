#include "planner/transfer_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/overlap_index.h"

namespace cairn::planner {
namespace {

// The distinct source boxes of one tensor and who holds each.
struct SourceBoxes {
  std::vector<ChunkBox> boxes;            // distinct, sorted
  std::vector<std::vector<int>> holders;  // source indices, ascending rank
};

// One destination-box ∩ source-box intersection, before choosing a holder.
struct Piece {
  int tensor;
  int dest_index;
  int source_box;  // index into SourceBoxes::boxes
  ChunkBox box;
  uint64_t bytes;
  int chosen = -1;  // index into tensors[tensor].sources
  bool local = false;
};

// The caller has checked t.global_shape with ValidateShape.
absl::Status ValidateChunks(const TransferTensor& t, absl::string_view what,
                            const std::vector<RankChunk>& chunks) {
  for (const RankChunk& c : chunks) {
    if (c.rank < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", t.fqn, "': ", what, " rank ", c.rank, " is negative"));
    }
    if (absl::Status s = ValidateBoxInValidShape(c.box, t.global_shape);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", t.fqn, "': ", what, " rank ", c.rank, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

SourceBoxes GroupSources(const TransferTensor& t) {
  std::vector<int> order(t.sources.size());
  std::iota(order.begin(), order.end(), 0);
  order.erase(std::remove_if(order.begin(), order.end(),
                             [&](int i) { return IsEmpty(t.sources[i].box); }),
              order.end());
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const RankChunk& x = t.sources[a];
    const RankChunk& y = t.sources[b];
    if (int c = CompareBoxes(x.box, y.box); c != 0) return c < 0;
    if (x.rank != y.rank) return x.rank < y.rank;
    return a < b;
  });
  SourceBoxes out;
  for (int i : order) {
    const RankChunk& c = t.sources[i];
    if (out.boxes.empty() || out.boxes.back() != c.box) {
      out.boxes.push_back(c.box);
      out.holders.emplace_back();
    }
    auto& h = out.holders.back();
    // A rank listing the same box twice holds it once.
    if (h.empty() || t.sources[h.back()].rank != c.rank) h.push_back(i);
  }
  return out;
}

}  // namespace

absl::StatusOr<TransferPlan> BuildTransferPlan(
    const std::vector<TransferTensor>& tensors,
    const TransferPlanOptions& options) {
  if (options.bucket_cap_bytes == 0) {
    return absl::InvalidArgumentError("bucket_cap_bytes must be >= 1");
  }
  // Canonical tensor order: by fqn.
  std::vector<int> tensor_order(tensors.size());
  std::iota(tensor_order.begin(), tensor_order.end(), 0);
  std::sort(tensor_order.begin(), tensor_order.end(),
            [&](int a, int b) { return tensors[a].fqn < tensors[b].fqn; });
  for (size_t k = 0; k < tensor_order.size(); ++k) {
    const TransferTensor& t = tensors[tensor_order[k]];
    if (t.fqn.empty()) {
      return absl::InvalidArgumentError("a transfer tensor has no fqn");
    }
    if (k > 0 && tensors[tensor_order[k - 1]].fqn == t.fqn) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.fqn, "' is listed twice"));
    }
  }

  // Pieces, in canonical (fqn, destination box, destination rank, source
  // box) order.
  std::vector<Piece> pieces;
  std::vector<SourceBoxes> sources(tensors.size());
  std::vector<int> hits;
  for (int ti : tensor_order) {
    const TransferTensor& t = tensors[ti];
    const size_t elem = DTypeSize(t.dtype);
    if (elem == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", t.fqn, "' has unknown dtype ", DTypeName(t.dtype)));
    }
    if (absl::Status s = ValidateShape(t.global_shape); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", t.fqn, "': ", s.message()));
    }
    if (absl::Status s = ValidateChunks(t, "source", t.sources); !s.ok()) {
      return s;
    }
    if (absl::Status s = ValidateChunks(t, "destination", t.destinations);
        !s.ok()) {
      return s;
    }
    sources[ti] = GroupSources(t);
    const SourceBoxes& src = sources[ti];
    OverlapIndex index(src.boxes);
    for (int b = 0; b < index.size(); ++b) {
      int hit = -1;
      if (index.AnyOverlap(src.boxes[b], b, &hit)) {
        const int lo = std::min(b, hit), hi = std::max(b, hit);
        return absl::InvalidArgumentError(absl::StrCat(
            "'", t.fqn, "': source rank ", t.sources[src.holders[hi][0]].rank,
            " box ", BoxToString(src.boxes[hi]),
            " partially overlaps source rank ",
            t.sources[src.holders[lo][0]].rank, " box ",
            BoxToString(src.boxes[lo]),
            " (source boxes must be identical replicas or disjoint)"));
      }
    }
    std::vector<int> dests(t.destinations.size());
    std::iota(dests.begin(), dests.end(), 0);
    std::sort(dests.begin(), dests.end(), [&](int a, int b) {
      const RankChunk& x = t.destinations[a];
      const RankChunk& y = t.destinations[b];
      if (int c = CompareBoxes(x.box, y.box); c != 0) return c < 0;
      if (x.rank != y.rank) return x.rank < y.rank;
      return a < b;
    });
    for (int d : dests) {
      const RankChunk& dst = t.destinations[d];
      const int64_t need = Volume(dst.box);
      if (need == 0) continue;
      hits.clear();
      index.Query(dst.box, &hits);
      int64_t covered = 0;
      for (int b : hits) {
        Piece p{ti, d, b, {}, 0};
        Intersect(src.boxes[b], dst.box, &p.box);
        const int64_t v = Volume(p.box);
        covered += v;
        p.bytes = static_cast<uint64_t>(v) * elem;
        pieces.push_back(std::move(p));
      }
      if (covered != need) {
        ChunkBox gap;
        std::string example;
        if (FindUncovered(index, dst.box, &gap)) {
          example = absl::StrCat("; e.g. ", BoxToString(gap), " is missing");
        }
        return absl::FailedPreconditionError(absl::StrCat(
            "'", t.fqn, "': the sources hold ", covered, " of the ", need,
            " elements destination rank ", dst.rank, " wants in ",
            BoxToString(dst.box), example));
      }
    }
  }

  // Dense ids for ranks, for the load counters.
  absl::flat_hash_map<int, int> dense;
  auto dense_id = [&](int rank) {
    return dense.try_emplace(rank, static_cast<int>(dense.size()))
        .first->second;
  };
  std::vector<uint64_t> sent;
  auto add_load = [&](int rank, uint64_t bytes) {
    const int id = dense_id(rank);
    if (static_cast<size_t>(id) >= sent.size()) sent.resize(id + 1, 0);
    sent[id] += bytes;
  };

  // Local copies and single-holder pieces are forced.
  std::vector<int> replicated;
  for (int i = 0; i < static_cast<int>(pieces.size()); ++i) {
    Piece& p = pieces[i];
    const TransferTensor& t = tensors[p.tensor];
    const std::vector<int>& holders = sources[p.tensor].holders[p.source_box];
    const int dst_rank = t.destinations[p.dest_index].rank;
    auto self = std::lower_bound(
        holders.begin(), holders.end(), dst_rank,
        [&](int s, int rank) { return t.sources[s].rank < rank; });
    if (self != holders.end() && t.sources[*self].rank == dst_rank) {
      p.chosen = *self;
      p.local = true;
    } else if (holders.size() == 1) {
      p.chosen = holders[0];
      add_load(t.sources[p.chosen].rank, p.bytes);
    } else {
      replicated.push_back(i);
    }
  }
  // LPT: largest first to the least-loaded holder; ties go to the first
  // holder after the destination rank in cyclic rank order.
  std::stable_sort(replicated.begin(), replicated.end(), [&](int a, int b) {
    return pieces[a].bytes > pieces[b].bytes;
  });
  for (int i : replicated) {
    Piece& p = pieces[i];
    const TransferTensor& t = tensors[p.tensor];
    const int dst_rank = t.destinations[p.dest_index].rank;
    uint64_t best_load = UINT64_MAX;
    int64_t best_dist = INT64_MAX;
    for (int s : sources[p.tensor].holders[p.source_box]) {
      const int rank = t.sources[s].rank;
      const int id = dense_id(rank);
      const uint64_t load =
          static_cast<size_t>(id) < sent.size() ? sent[id] : 0;
      int64_t dist = static_cast<int64_t>(rank) - dst_rank;
      if (dist <= 0) dist += int64_t{1} << 32;
      if (load < best_load || (load == best_load && dist < best_dist)) {
        best_load = load;
        best_dist = dist;
        p.chosen = s;
      }
    }
    add_load(t.sources[p.chosen].rank, p.bytes);
  }

  // Sends, sorted by (src, dst, dtype, fqn, box, dest index).
  TransferPlan plan;
  plan.sends.reserve(pieces.size());
  for (Piece& p : pieces) {
    const TransferTensor& t = tensors[p.tensor];
    TransferSend s;
    s.src_rank = t.sources[p.chosen].rank;
    s.dst_rank = t.destinations[p.dest_index].rank;
    s.tensor = p.tensor;
    s.fqn = t.fqn;
    s.dtype = t.dtype;
    s.box = std::move(p.box);
    s.source_index = p.chosen;
    s.dest_index = p.dest_index;
    s.bytes = p.bytes;
    s.local = p.local;
    plan.sends.push_back(std::move(s));
  }
  std::sort(plan.sends.begin(), plan.sends.end(),
            [](const TransferSend& a, const TransferSend& b) {
              if (a.src_rank != b.src_rank) return a.src_rank < b.src_rank;
              if (a.dst_rank != b.dst_rank) return a.dst_rank < b.dst_rank;
              if (a.dtype != b.dtype) return a.dtype < b.dtype;
              if (int c = a.fqn.compare(b.fqn); c != 0) return c < 0;
              if (int c = CompareBoxes(a.box, b.box); c != 0) return c < 0;
              return a.dest_index < b.dest_index;
            });

  // Bucketing and statistics.
  std::vector<uint64_t> recv(dense.size() + 1, 0);
  std::vector<uint64_t> send_total(dense.size() + 1, 0);
  const uint64_t cap = options.bucket_cap_bytes;
  for (int i = 0; i < static_cast<int>(plan.sends.size()); ++i) {
    const TransferSend& s = plan.sends[i];
    if (s.local) {
      plan.local_bytes += s.bytes;
      continue;
    }
    plan.network_bytes += s.bytes;
    const int src_id = dense_id(s.src_rank), dst_id = dense_id(s.dst_rank);
    const size_t need = static_cast<size_t>(std::max(src_id, dst_id)) + 1;
    if (recv.size() < need) {
      recv.resize(need, 0);
      send_total.resize(need, 0);
    }
    send_total[src_id] += s.bytes;
    recv[dst_id] += s.bytes;
    TransferMessage* m =
        plan.messages.empty() ? nullptr : &plan.messages.back();
    if (m == nullptr || m->src_rank != s.src_rank ||
        m->dst_rank != s.dst_rank || m->dtype != s.dtype ||
        m->bytes + s.bytes > cap) {
      plan.messages.push_back(
          TransferMessage{s.src_rank, s.dst_rank, s.dtype, 0, {}});
      m = &plan.messages.back();
    }
    m->parts.push_back(TransferMessage::Part{i, m->bytes});
    m->bytes += s.bytes;
  }
  for (uint64_t v : send_total) {
    plan.max_rank_send_bytes = std::max(plan.max_rank_send_bytes, v);
  }
  for (uint64_t v : recv) {
    plan.max_rank_recv_bytes = std::max(plan.max_rank_recv_bytes, v);
  }
  return plan;
}

}  // namespace cairn::planner
