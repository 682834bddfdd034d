// StateDict: what one training rank saves and loads — its chunks of sharded
// tensors (caller-owned buffers) and opaque bytes entries.
//
// Buffers are borrowed: they must stay valid and unchanged (for a save) or
// writable (for a load) for the duration of the Save/Load call. Each chunk's
// buffer is row-major, little-endian and contiguous, and is registered with
// its length: exactly Volume(box) * dtype size bytes, so a buffer of the wrong
// size is INVALID_ARGUMENT naming the tensor when it is added, never a read or
// write past its end. Each tensor keeps its layout (the DTensor layout, or the
// explicit chunk list), so a layout that cannot be saved or loaded (a
// Partial() placement: a pending reduction) is INVALID_ARGUMENT naming the
// tensor, not data silently saved as if it were replicated.
//
// Example (FSDP x TP on a 2x4 mesh):
//   StateDict state;
//   planner::DTensorLayout layout{{{2, 4}, {0, 1, 2, 3, 4, 5, 6, 7}},
//                                 {Placement::Shard(0), Placement::Shard(1)}};
//   CAIRN_RETURN_IF_ERROR(state.AddDTensor("model.wq", DType::kBFloat16,
//                                          {4096, 1000}, layout, rank,
//                                          absl::MakeSpan(ptr, bytes)));
//   CAIRN_RETURN_IF_ERROR(state.AddBytes("rng", &rng_state));
#ifndef CAIRN_CLIENT_STATE_DICT_H_
#define CAIRN_CLIENT_STATE_DICT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "planner/layout.h"
#include "planner/save_plan.h"

namespace cairn::client {

struct TensorChunk {
  planner::ChunkBox box;  // in global coordinates
  absl::Span<char> data;  // exactly Volume(box) * DTypeSize(dtype) bytes
};

struct TensorShard {
  std::string fqn;
  planner::DType dtype = planner::DType::kUnspecified;
  planner::Shape global_shape;
  // The DTensor layout the chunks come from (AddDTensor); unset for an
  // explicit chunk list (AddChunks).
  std::optional<planner::DTensorLayout> layout;
  std::vector<TensorChunk> chunks;  // what this rank holds (may be empty)
};

struct BytesEntry {
  std::string fqn;
  std::string* blob = nullptr;  // saved from; replaced on load
};

class StateDict {
 public:
  // A tensor laid out over a device mesh; `data` holds this rank's chunk
  // (LocalChunks(layout, global_shape, rank)) and must be exactly its size
  // (INVALID_ARGUMENT naming the tensor otherwise). A rank outside the mesh,
  // or holding an empty trailing shard, holds nothing and may pass an empty
  // span. A Partial() placement is accepted here and refused by ToLocalPlan
  // and CheckLoadable (a pending reduction is neither saved nor loaded).
  absl::Status AddDTensor(std::string fqn, planner::DType dtype,
                          planner::Shape global_shape,
                          const planner::DTensorLayout& layout, int rank,
                          absl::Span<char> data);

  // A tensor with explicitly listed chunks (irregular, ShardedTensor-style).
  // Every chunk's `data` must be exactly Volume(box) * DTypeSize(dtype) bytes.
  absl::Status AddChunks(std::string fqn, planner::DType dtype,
                         planner::Shape global_shape,
                         std::vector<TensorChunk> chunks);

  // An opaque blob saved by whichever rank holds it (replicas are saved once).
  absl::Status AddBytes(std::string fqn, std::string* blob);

  const std::vector<TensorShard>& tensors() const { return tensors_; }
  const std::vector<BytesEntry>& bytes() const { return bytes_; }

  // This rank's local save plan: one write item per chunk (empty ones too, so
  // the checkpoint records every tensor) and per bytes entry, in insertion
  // order. INVALID_ARGUMENT naming the tensor if one cannot be saved (a
  // Partial() placement).
  absl::StatusOr<planner::LocalSavePlan> ToLocalPlan(int rank) const;

  // OK if every tensor can be loaded into; INVALID_ARGUMENT naming the tensor
  // otherwise (a Partial() placement: which rank would get the values?).
  absl::Status CheckLoadable() const;

 private:
  absl::Status AddTensor(std::string fqn, planner::DType dtype,
                         planner::Shape global_shape,
                         std::optional<planner::DTensorLayout> layout,
                         std::vector<TensorChunk> chunks);
  absl::Status CheckNewName(const std::string& fqn) const;

  std::vector<TensorShard> tensors_;
  std::vector<BytesEntry> bytes_;
  absl::flat_hash_map<std::string, int> names_;
};

}  // namespace cairn::client

#endif  // CAIRN_CLIENT_STATE_DICT_H_
