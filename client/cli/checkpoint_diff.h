// `cairn diff JOB STEP_A STEP_B`: what differs between two committed
// checkpoints, read from their MANIFESTs and, only where it must, their data.
//
// Entries (tensors and bytes entries) are matched by fqn:
//   added    in B only;
//   removed  in A only;
//   changed  in both, but another kind (tensor / bytes), dtype or shape;
//   differs  the same kind, dtype and shape, other bytes.
// How the bytes of an entry in both are compared:
//   * a tensor stored in the same chunk boxes in A and B (its layout did not
//     change, as when a job saves again on the same ranks): chunk by chunk,
//     by the crc32c values the MANIFESTs record. Nothing is read. Equal
//     crc32c is taken as equal bytes (a 2^-32 chance per changed chunk of
//     missing it);
//   * a tensor stored in other boxes (resharded, another world size): its
//     stored chunks are read, crc32c checked, and the bytes where a chunk of
//     A and a chunk of B overlap compared element by element;
//   * a bytes entry: by crc32c and length.
//
// Memory: the manifests, one chunk of A and a cache of B's chunks (at most
// DiffOptions::cache_bytes, or one chunk) at a time.
#ifndef CAIRN_CLIENT_CLI_CHECKPOINT_DIFF_H_
#define CAIRN_CLIENT_CLI_CHECKPOINT_DIFF_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cairn/v1/cairn.pb.h"
#include "storage/shard_store.h"

namespace cairn::cli {

// One side of an entry: what it is in that checkpoint.
struct DiffSide {
  bool present = false;
  bool is_tensor = false;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;  // tensors
  std::vector<int64_t> shape;               // tensors
  uint64_t bytes = 0;  // stored bytes (a tensor's: elements x dtype size)
};

struct EntryDiff {
  enum class Change { kAdded, kRemoved, kChanged, kDiffers };
  Change change = Change::kDiffers;
  std::string fqn;
  DiffSide a, b;
  // kDiffers: whether bytes were read (the layouts differ) or the stored
  // crc32c values compared.
  bool compared_bytes = false;
  // kDiffers of a tensor by crc32c: its chunks and how many differ.
  int64_t chunks = 0;
  int64_t chunks_differ = 0;
  // kDiffers of a tensor by bytes: its elements and how many differ.
  uint64_t elements = 0;
  uint64_t elements_differ = 0;
};

// "added", "removed", "changed", "differs".
const char* ChangeName(EntryDiff::Change change);

struct CheckpointDiff {
  std::vector<EntryDiff> entries;  // what differs, by fqn
  int identical = 0;               // entries in both with the same bytes
  // Entries in both of the same kind, dtype and shape, by how their bytes
  // were compared.
  int compared_by_crc32c = 0;
  int compared_by_bytes = 0;
  uint64_t bytes_read = 0;  // of data (both checkpoints)
  bool same() const { return entries.empty(); }
};

struct DiffOptions {
  // The most bytes of B's chunks kept for the chunks of A that overlap them
  // too. Default: 256 MiB.
  uint64_t cache_bytes = uint64_t{256} << 20;
};

// The store to read checkpoint `side` (0: a, 1: b) from; called only when
// bytes must be read (so a diff by crc32c works where the data is not
// reachable).
using DiffStoreOf = std::function<absl::StatusOr<storage::ShardStore*>(int)>;

// Compares two validated manifests (ReadManifest's or cairnd's) of the same
// job (see the top of this file). Errors: those of reading a stored chunk
// (DATA_LOSS naming the job, step, fqn, chunk and object), and of store_of.
absl::StatusOr<CheckpointDiff> DiffCheckpoints(const v1::Manifest& a,
                                               const v1::Manifest& b,
                                               const DiffStoreOf& store_of,
                                               const DiffOptions& options = {});

}  // namespace cairn::cli

#endif  // CAIRN_CLIENT_CLI_CHECKPOINT_DIFF_H_
