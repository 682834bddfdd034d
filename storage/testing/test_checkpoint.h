// Builds small but realistic checkpoints for tests: `num_tensors` float32
// tensors of shape [rows, cols] split by rows over `world_size` ranks
// (torch.chunk rule), plus one bytes entry written by rank 0. Each rank
// writes its items into one object "rank-<r>.data" (items 4096-aligned, one
// Append per item, crc32c computed while writing), exactly as the commit
// protocol expects: data objects closed first, MANIFEST published last.
#ifndef CAIRN_STORAGE_TESTING_TEST_CHECKPOINT_H_
#define CAIRN_STORAGE_TESTING_TEST_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "cairn/v1/cairn.pb.h"
#include "storage/shard_store.h"

namespace cairn::storage {

struct TestCheckpointSpec {
  std::string job = "job";
  int64_t step = 1;
  int world_size = 2;
  int num_tensors = 3;
  int64_t rows = 64;
  int64_t cols = 32;
  uint64_t seed = 1;  // the bytes are a deterministic function of it
};

// The chunk bytes of tensor `t`, rows [row_begin, row_end), for `seed`.
std::string TestChunkBytes(const TestCheckpointSpec& spec, int t,
                           int64_t row_begin, int64_t row_end);

// Writes and closes every rank's data object; returns the manifest (not
// published). Any store error is returned as is.
absl::StatusOr<v1::Manifest> WriteTestCheckpointData(
    ShardStore& store, const TestCheckpointSpec& spec);

// WriteTestCheckpointData, then PublishManifest.
absl::StatusOr<v1::Manifest> WriteTestCheckpoint(
    ShardStore& store, const TestCheckpointSpec& spec);

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_TESTING_TEST_CHECKPOINT_H_
