// `cairn export --format safetensors`: a committed checkpoint written out as
// Hugging Face safetensors files, every tensor whole (all ranks' chunks
// assembled), as transformers' save_pretrained writes a model.
//
// The safetensors format (one file):
//   [0, 8)        N, the header's length (uint64, little-endian)
//   [8, 8 + N)    the JSON header, padded with spaces so 8 + N is a multiple
//                 of 8: {"__metadata__": {"format": "pt", ...},
//                        fqn: {"dtype": "BF16", "shape": [4096, 1024],
//                              "data_offsets": [begin, end]}, ...}
//   [8 + N, ...)  the tensors' row-major little-endian bytes; data_offsets
//                 are relative to 8 + N.
// The header's keys are sorted by name. The data is laid out by element size
// (largest first), then name, as safetensors' own writer does, so each
// tensor starts aligned to its element size. Dtypes are the saved ones
// (bfloat16 stays BF16: no conversion).
//
// Files (transformers' sharding): tensors in fqn order fill a file until the
// next would take it over max_shard_bytes; a tensor larger than the cap goes
// alone in a file of its own. One file is `model.safetensors`; several are
// `model-00001-of-0000N.safetensors` ... plus `model.safetensors.index.json`:
//   {"metadata": {"total_size": <tensor bytes>},
//    "weight_map": {fqn: file name, ...}}
//
// Memory: tensor by tensor. A tensor of at most assemble_in_memory_bytes is
// assembled in memory from its chunks and written at once; a larger one is
// written chunk by chunk straight to its place in the file, each chunk
// streamed through a read buffer of read_buffer_bytes. Every stored chunk is
// read through storage::ReadVerifiedPieces: crc32c checked.
//
// All or nothing: the files are written into a temporary sibling directory
// `<out_dir>.tmp-XXXXXX`, fsynced, and renamed to out_dir at the end (which
// must not exist; missing parents are created). On any error or cancellation
// the temporary directory is removed, and so are the parents the export
// created (those still empty); a process killed outright (SIGKILL, power
// loss) can leave it, never a partial out_dir.
//
// Example:
//   ExportOptions options;
//   options.out_dir = "/data/export/llama-1200";
//   options.filters = {"model."};
//   CAIRN_ASSIGN_OR_RETURN(ExportResult r,
//                          ExportSafetensors(store, manifest, options));
#ifndef CAIRN_CLIENT_CLI_SAFETENSORS_EXPORT_H_
#define CAIRN_CLIENT_CLI_SAFETENSORS_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cairn/v1/cairn.pb.h"
#include "storage/shard_store.h"

namespace cairn::cli {

// transformers' default max_shard_size, "5GB" (decimal, as it counts).
inline constexpr uint64_t kDefaultMaxShardBytes = 5000000000;
inline constexpr char kSafetensorsIndexName[] = "model.safetensors.index.json";

// "5GB", "500MB", "2GiB", "1024": a number of bytes. KB/MB/GB/TB are powers
// of 1000 and KiB/MiB/GiB/TiB of 1024 (as transformers reads them); a plain
// number (optionally with B) is bytes; case-insensitive. INVALID_ARGUMENT for
// anything else, for 0 and for more than 2^63 bytes.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view s);

// The safetensors name of a dtype ("F32", "BF16", "BOOL", "F8_E4M3", ...);
// "" for one it has none for.
std::string SafetensorsDType(v1::DType dtype);

// Splits tensors of `sizes` bytes (in order) into files as transformers
// does: a file takes the next tensor while its bytes stay <= max_shard_bytes;
// a tensor larger than the cap closes the file being filled and goes alone.
// Returns each file's tensors as indices into `sizes`, in order; no file is
// empty (none at all for no tensors).
std::vector<std::vector<int>> PlanShards(absl::Span<const uint64_t> sizes,
                                         uint64_t max_shard_bytes);

// "model.safetensors" for one file, else "model-00002-of-00005.safetensors"
// (index 1 of 5).
std::string ShardFileName(int index, int num_files);

struct ExportProgress {
  std::string file;  // name of the file being written
  int file_index = 0;
  int num_files = 0;
  uint64_t file_done = 0;  // tensor bytes of this file written so far
  uint64_t file_total = 0;
  uint64_t done = 0;  // of all files
  uint64_t total = 0;
};

struct ExportOptions {
  // The directory to create (must not exist; its parents are created).
  std::string out_dir;
  // Default: kDefaultMaxShardBytes.
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // fqn prefixes: only tensors starting with one of them are exported; each
  // must match some tensor (NOT_FOUND naming it otherwise). Default: none
  // (every tensor).
  std::vector<std::string> filters;
  // Tensors up to this size are assembled in memory, larger ones written
  // chunk by chunk into the file. Default: 64 MiB.
  uint64_t assemble_in_memory_bytes = uint64_t{64} << 20;
  // The piece size stored chunks are read in. Default: 8 MiB.
  size_t read_buffer_bytes = size_t{8} << 20;
  // Called from the calling thread after each piece and when a file starts.
  std::function<void(const ExportProgress&)> progress;
  // Polled between pieces; true stops the export with CANCELLED (nothing is
  // left behind). Default: never.
  std::function<bool()> cancelled;
};

struct ExportedFile {
  std::string name;  // relative to out_dir
  int num_tensors = 0;
  uint64_t bytes = 0;  // the file's size
};

struct ExportResult {
  std::vector<ExportedFile> files;  // the safetensors files, in order
  bool wrote_index = false;         // kSafetensorsIndexName (several files)
  int num_tensors = 0;
  uint64_t tensor_bytes = 0;  // the index's total_size
  // Bytes entries (pickled objects) that pass the filters: safetensors holds
  // only tensors, so they are not exported.
  std::vector<std::string> skipped_bytes_entries;
};

// Exports the tensors of `manifest` (a committed, validated one: ReadManifest
// or cairnd's) from `store` into options.out_dir (see the top of this file).
// Errors: ALREADY_EXISTS when out_dir exists; NOT_FOUND naming the job, step,
// each --filter prefix that matches no tensor and a few fqns that exist;
// FAILED_PRECONDITION when nothing is left to export (no tensors);
// INVALID_ARGUMENT for a cap of 0 or an fqn safetensors cannot hold;
// DATA_LOSS naming the job, step, fqn, chunk box and object for a missing,
// short or damaged stored chunk; RESOURCE_EXHAUSTED for a full disk (or
// quota), naming the export, out_dir, the file and the bytes free
// ("export of job 'llama' step 1200 to 'DIR': no space left on device
// reserving N bytes for 'model-00002-of-00003.safetensors' (M bytes free)");
// CANCELLED when options.cancelled said so. Nothing is left at out_dir, in a
// temporary directory or in parents it created after an error.
absl::StatusOr<ExportResult> ExportSafetensors(storage::ShardStore& store,
                                               const v1::Manifest& manifest,
                                               const ExportOptions& options);

}  // namespace cairn::cli

#endif  // CAIRN_CLIENT_CLI_SAFETENSORS_EXPORT_H_
