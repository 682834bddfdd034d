// A synthetic model for the example training job, the end-to-end tests and
// the benchmarks: a fixed set of tensors (several dtypes, uneven dims, a
// replicated one) laid out DTensor-style over a device mesh, filled with
// values that are a pure function of (fqn, global element index) so that any
// rank can check, bit for bit, what it loaded — whatever layout saved it.
#ifndef CAIRN_CLIENT_EXAMPLES_SYNTHETIC_MODEL_H_
#define CAIRN_CLIENT_EXAMPLES_SYNTHETIC_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/state_dict.h"
#include "planner/layout.h"

namespace cairn::examples {

struct TensorSpec {
  std::string fqn;
  planner::DType dtype;
  planner::Shape shape;
  bool replicated = false;  // held whole by every rank (e.g. a norm weight)
};

// "small": ~1 MB of mixed tensors for tests; "bench:<bytes>": 8 large fp32
// matrices totalling about <bytes>; "llm:<bytes>": a transformer-like mix of
// bf16/fp32/int64 tensors totalling about <bytes>.
absl::StatusOr<std::vector<TensorSpec>> ModelSpec(const std::string& name);

// Parses a layout "2x4:S0,S1" (mesh 2x4 over ranks 0..7, mesh dim 0 shards
// tensor dim 0, mesh dim 1 shards tensor dim 1), "4:S1", "3:S0", "8:R".
absl::StatusOr<planner::DTensorLayout> ParseLayout(const std::string& spec);

// The layout actually used for `tensor`: a Shard(d) with d >= rank of the
// tensor becomes Replicate; replicated tensors replicate on every mesh dim.
planner::DTensorLayout LayoutFor(const planner::DTensorLayout& layout,
                                 const TensorSpec& tensor);

// The deterministic value bytes of element `index` (row-major global index).
void ElementBytes(uint64_t fqn_hash, uint64_t index, size_t elem_size,
                  char* out);
uint64_t FqnHash(const std::string& fqn);

// Owns the buffers of one rank's shards of a model.
class ShardedModel {
 public:
  // Allocates this rank's chunks; fills them with the model's values when
  // `fill` (a saving rank) or with 0xEE poison (a loading rank).
  static absl::StatusOr<std::unique_ptr<ShardedModel>> Create(
      const std::vector<TensorSpec>& specs,
      const planner::DTensorLayout& layout, int rank, bool fill, int64_t step);

  client::StateDict& state() { return state_; }
  uint64_t local_bytes() const { return local_bytes_; }

  // Checks every chunk and bytes entry against the expected values for
  // `step`; the first mismatch is DATA_LOSS naming fqn, box and element.
  absl::Status Verify(int64_t step) const;

  // Expected bytes entries for a step.
  static std::string RngState(int64_t step);
  static std::string SchedulerState(int64_t step);

 private:
  ShardedModel() = default;
  std::vector<std::unique_ptr<char[]>> buffers_;
  client::StateDict state_;
  std::string rng_state_;
  std::string scheduler_state_;
  uint64_t local_bytes_ = 0;
};

}  // namespace cairn::examples

#endif  // CAIRN_CLIENT_EXAMPLES_SYNTHETIC_MODEL_H_
