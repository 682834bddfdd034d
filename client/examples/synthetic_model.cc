#include "client/examples/synthetic_model.h"

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace cairn::examples {
namespace {

using planner::DType;

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Calls fn(global_index, local_index) for every element of `box`, row-major.
template <typename Fn>
void ForEachElement(const planner::Shape& shape, const planner::ChunkBox& box,
                    Fn fn) {
  const size_t nd = shape.size();
  if (planner::Volume(box) == 0) return;
  if (nd == 0) {
    fn(0, 0);
    return;
  }
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  std::vector<int64_t> idx(nd, 0);
  uint64_t local = 0;
  const int64_t inner = box.sizes[nd - 1];
  while (true) {
    int64_t base = 0;
    for (size_t d = 0; d < nd; ++d)
      base += (box.offsets[d] + idx[d]) * stride[d];
    for (int64_t i = 0; i < inner; ++i)
      fn(static_cast<uint64_t>(base + i), local++);
    // Advance the outer dims.
    size_t d = nd - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < box.sizes[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (nd == 1) return;
  }
}

}  // namespace

uint64_t FqnHash(const std::string& fqn) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : fqn) h = (h ^ c) * 1099511628211ULL;
  return h;
}

void ElementBytes(uint64_t fqn_hash, uint64_t index, size_t elem_size,
                  char* out) {
  const uint64_t v = Mix(fqn_hash ^ (index * 0x100000001b3ULL));
  std::memcpy(out, &v, elem_size <= 8 ? elem_size : 8);
}

absl::StatusOr<std::vector<TensorSpec>> ModelSpec(const std::string& name) {
  if (name == "small") {
    return std::vector<TensorSpec>{
        {"model.embed.weight", DType::kFloat32, {1000, 64}},
        {"model.layers.0.attn.wq.weight", DType::kBFloat16, {257, 130}},
        {"model.layers.0.mlp.w1.weight", DType::kFloat32, {130, 515}},
        {"model.layers.0.mlp.w2.weight", DType::kBFloat16, {515, 130}},
        {"model.layers.0.norm.weight", DType::kFloat32, {130}, true},
        {"optim.step_counts", DType::kInt64, {37, 3}},
        {"model.lm_head.bias", DType::kFloat64, {1001}},
        {"model.layers.0.attn.rope", DType::kFloat32, {3, 5, 7}},
    };
  }
  auto parse_bytes = [&](absl::string_view prefix) -> absl::StatusOr<double> {
    double bytes;
    if (!absl::SimpleAtod(name.substr(prefix.size()), &bytes) || bytes < 1e4) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", name, "': expected ", prefix, "<bytes>"));
    }
    return bytes;
  };
  if (absl::StartsWith(name, "bench:")) {
    CAIRN_ASSIGN_OR_RETURN(double bytes, parse_bytes("bench:"));
    // 8 fp32 matrices with 4096 columns.
    const int64_t rows = static_cast<int64_t>(bytes / 8 / 4096 / 4);
    std::vector<TensorSpec> out;
    for (int i = 0; i < 8; ++i) {
      out.push_back({absl::StrCat("model.layers.", i, ".weight"),
                     DType::kFloat32,
                     {std::max<int64_t>(rows, 4), 4096}});
    }
    return out;
  }
  if (absl::StartsWith(name, "llm:")) {
    CAIRN_ASSIGN_OR_RETURN(double bytes, parse_bytes("llm:"));
    // Per layer: wq,wk,wv,wo (h x h, bf16), w1,w2 (h x 4h, fp32 master),
    // norm (h, fp32, replicated). 8 layers + embedding.
    // 8 layers of 4*h*h*2 + 2*(4h+3)*h*4 bytes: about 320*h^2 in all.
    int64_t h = 64;
    while (320.0 * static_cast<double>(h + 64) * static_cast<double>(h + 64) <
           bytes) {
      h += 64;
    }
    std::vector<TensorSpec> out;
    out.push_back({"model.embed.weight", DType::kFloat32, {1003, h}});
    for (int l = 0; l < 8; ++l) {
      const std::string p = absl::StrCat("model.layers.", l, ".");
      for (const char* w : {"attn.wq", "attn.wk", "attn.wv", "attn.wo"}) {
        out.push_back(
            {absl::StrCat(p, w, ".weight"), DType::kBFloat16, {h, h}});
      }
      out.push_back({p + "mlp.w1.weight", DType::kFloat32, {4 * h + 3, h}});
      out.push_back({p + "mlp.w2.weight", DType::kFloat32, {h, 4 * h + 3}});
      out.push_back({p + "norm.weight", DType::kFloat32, {h}, true});
    }
    out.push_back({"optim.step", DType::kInt64, {17}, true});
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model '", name, "' (small, bench:<bytes>, llm:<bytes>)"));
}

absl::StatusOr<planner::DTensorLayout> ParseLayout(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout '", spec, "': expected MESH:PLACEMENTS, e.g. 2x4:S0,S1"));
  }
  planner::DTensorLayout layout;
  int64_t n = 1;
  for (absl::string_view d : absl::StrSplit(parts[0], 'x')) {
    int64_t v;
    if (!absl::SimpleAtoi(d, &v) || v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout '", spec, "': bad mesh dim '", d, "'"));
    }
    layout.mesh.shape.push_back(v);
    n *= v;
  }
  for (int r = 0; r < n; ++r) layout.mesh.ranks.push_back(r);
  for (absl::string_view p : absl::StrSplit(parts[1], ',')) {
    int d;
    if (p == "R") {
      layout.placements.push_back(planner::Placement::Replicate());
    } else if (p.size() > 1 && p[0] == 'S' &&
               absl::SimpleAtoi(p.substr(1), &d)) {
      layout.placements.push_back(planner::Placement::Shard(d));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("layout '", spec, "': bad placement '", p, "'"));
    }
  }
  if (layout.placements.size() != layout.mesh.shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout '", spec, "': one placement per mesh dim is required"));
  }
  return layout;
}

planner::DTensorLayout LayoutFor(const planner::DTensorLayout& layout,
                                 const TensorSpec& tensor) {
  planner::DTensorLayout out = layout;
  for (planner::Placement& p : out.placements) {
    if (tensor.replicated || (p.kind == planner::Placement::Kind::kShard &&
                              p.dim >= static_cast<int>(tensor.shape.size()))) {
      p = planner::Placement::Replicate();
    }
  }
  return out;
}

std::string ShardedModel::RngState(int64_t step) {
  return absl::StrCat("rng-state-for-step-", step, std::string(100, 'r'));
}

std::string ShardedModel::SchedulerState(int64_t step) {
  return absl::StrCat("{\"lr\": 0.0003, \"step\": ", step, "}");
}

absl::StatusOr<std::unique_ptr<ShardedModel>> ShardedModel::Create(
    const std::vector<TensorSpec>& specs, const planner::DTensorLayout& layout,
    int rank, bool fill, int64_t step) {
  std::unique_ptr<ShardedModel> m(new ShardedModel());
  for (const TensorSpec& t : specs) {
    const planner::DTensorLayout l = LayoutFor(layout, t);
    CAIRN_ASSIGN_OR_RETURN(std::vector<planner::ChunkBox> boxes,
                           planner::LocalChunks(l, t.shape, rank));
    const size_t elem = planner::DTypeSize(t.dtype);
    std::vector<client::TensorChunk> chunks;
    for (planner::ChunkBox& box : boxes) {
      const size_t n = static_cast<size_t>(planner::Volume(box)) * elem;
      m->buffers_.push_back(std::make_unique<char[]>(std::max<size_t>(n, 1)));
      char* buf = m->buffers_.back().get();
      if (fill) {
        const uint64_t h = FqnHash(t.fqn);
        ForEachElement(t.shape, box, [&](uint64_t g, uint64_t local) {
          ElementBytes(h, g, elem, buf + local * elem);
        });
      } else {
        std::memset(buf, 0xEE, n);
      }
      m->local_bytes_ += n;
      chunks.push_back(
          client::TensorChunk{std::move(box), absl::MakeSpan(buf, n)});
    }
    CAIRN_RETURN_IF_ERROR(
        m->state_.AddChunks(t.fqn, t.dtype, t.shape, std::move(chunks)));
  }
  m->rng_state_ = fill ? RngState(step) : "";
  m->scheduler_state_ = fill ? SchedulerState(step) : "";
  CAIRN_RETURN_IF_ERROR(m->state_.AddBytes("rng_state", &m->rng_state_));
  if (rank == 0 || !fill) {
    CAIRN_RETURN_IF_ERROR(
        m->state_.AddBytes("scheduler", &m->scheduler_state_));
  }
  return m;
}

absl::Status ShardedModel::Verify(int64_t step) const {
  for (const client::TensorShard& t : state_.tensors()) {
    const size_t elem = planner::DTypeSize(t.dtype);
    const uint64_t h = FqnHash(t.fqn);
    for (const client::TensorChunk& c : t.chunks) {
      const char* buf = c.data.data();
      absl::Status status;
      char want[8];
      ForEachElement(t.global_shape, c.box, [&](uint64_t g, uint64_t local) {
        if (!status.ok()) return;
        ElementBytes(h, g, elem, want);
        if (std::memcmp(want, buf + local * elem, elem) != 0) {
          status = absl::DataLossError(
              absl::StrCat("'", t.fqn, "' chunk ", planner::BoxToString(c.box),
                           ": element ", g, " differs from what was saved"));
        }
      });
      CAIRN_RETURN_IF_ERROR(status);
    }
  }
  if (rng_state_ != RngState(step)) {
    return absl::DataLossError("bytes entry 'rng_state' differs");
  }
  if (scheduler_state_ != SchedulerState(step)) {
    return absl::DataLossError("bytes entry 'scheduler' differs");
  }
  return absl::OkStatus();
}

}  // namespace cairn::examples
