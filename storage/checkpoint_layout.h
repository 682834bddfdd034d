// A checkpoint on a ShardStore: the commit protocol, reading, listing,
// deleting and verifying checkpoints. Where each lives (its keys, see
// checkpoint_keys.h): <job>/<step>/<data objects...> and
// <job>/<step>/MANIFEST, written last.
//
// Commit protocol (what makes a checkpoint all-or-nothing):
//   1. every data object is written with ObjectWriter and Close()d: each is
//      durable (fsync) and visible under its final key;
//   2. PublishManifest checks every object the manifest references exists
//      and is long enough, then makes the MANIFEST visible (Put, or an
//      ObjectWriter's Close: temp name, fsync, rename, directory fsync). The
//      rename is the commit point.
// A step whose MANIFEST is absent is incomplete: never listed as committed,
// never loadable, and its bytes are garbage (ListIncompleteSteps).
// Deletion runs the protocol backwards: MANIFEST first, then the data. Temp
// files of writers that died are not objects: ListIncompleteSteps does not
// see a step holding only those, DeleteStep removes them with the step, and
// DeleteUnreferenced removes them from a committed step.
//
// Thread-safe: these functions only call the (thread-safe) store.
#ifndef CAIRN_STORAGE_CHECKPOINT_LAYOUT_H_
#define CAIRN_STORAGE_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cairn/v1/cairn.pb.h"
#include "storage/checkpoint_keys.h"
#include "storage/manifest.h"
#include "storage/shard_store.h"

namespace cairn::storage {

// The largest manifest body cairn reads (manifest.h's decoders walk it with
// protobuf's int-sized streams): 2^31 - 1 bytes, ~28 M chunks at ~75 bytes
// a chunk (a 70B model saved by 16k FSDP x TP ranks has 18.3 M, 1.38 GB).
inline constexpr uint64_t kMaxManifestBodyBytes = (uint64_t{1} << 31) - 1;

// OK when a manifest of `body_bytes` can be read back; otherwise
// RESOURCE_EXHAUSTED naming the job, the step and both sizes. Publishing
// checks it, so no step is committed that cannot be loaded.
absl::Status CheckManifestSize(uint64_t body_bytes, absl::string_view job,
                               int64_t step);

// What ReadManifestByTensor and PublishManifest give besides the tensors.
struct ManifestSummary {
  v1::Manifest header;  // every field of the manifest but its tensors
  int num_tensors = 0;
};

// The commit: validates `manifest` (ValidateManifest), checks that every
// referenced object exists and covers its locations (FAILED_PRECONDITION
// naming the object otherwise), then atomically and durably publishes
// <job>/<step>/MANIFEST, replacing any previous one.
absl::Status PublishManifest(ShardStore& store, const v1::Manifest& manifest);

// A manifest made tensor by tensor (a commit's, from its save plan): fills
// `*header` with every field but the tensors (format_version set), then
// passes each tensor to `add` in fqn order; an error from `add` is returned
// as is. PublishManifest may run it twice, and both runs must make the same
// manifest.
using ManifestSource = absl::FunctionRef<absl::Status(
    v1::Manifest* header,
    absl::FunctionRef<absl::Status(const v1::ManifestTensor&)> add)>;

struct PublishOptions {
  // The largest body kept in memory between encoding and writing. The
  // frame's header (the body's length and crc32c) comes before the body, so
  // a larger one is written to the MANIFEST's writer as the run of the
  // source that checks and measures it makes it, behind a placeholder that
  // is rewritten last (ShardStore::CanRewritePrefix: posix, memory). Where
  // the store cannot rewrite (S3), it is encoded twice: the first run checks
  // and measures it, a second streams it in 4 MiB pieces. Default: 64 MiB (a
  // 70B model saved by 1024 ranks has an 86 MB manifest, by 16k ranks
  // 1.4 GB; streaming one costs less CPU than holding it whole).
  uint64_t max_held_bytes = uint64_t{64} << 20;
  // Whether every object the manifest names must be on `store`, durable and
  // long enough. False only for the manifest of a memory checkpoint, whose
  // bytes are in agents' memory (cairnd keeps it in a store of its own).
  bool check_objects = true;
};

// PublishManifest for a manifest `source` makes, never whole in memory as
// messages, nor (over options.max_held_bytes) as bytes. The same checks
// (before anything is visible; with a store that can rewrite, after the body
// is written), then RESOURCE_EXHAUSTED over kMaxManifestBodyBytes; INTERNAL
// (and nothing published) if a second run of the source makes another body.
// `published` (optional) gets the header and the number of tensors.
absl::Status PublishManifest(ShardStore& store, ManifestSource source,
                             const PublishOptions& options,
                             ManifestSummary* published);

// Reads, decodes and validates <job>/<step>/MANIFEST. NOT_FOUND (the step is
// not committed) if absent; DATA_LOSS if corrupt or if it names another
// job/step.
absl::StatusOr<v1::Manifest> ReadManifest(ShardStore& store,
                                          absl::string_view job, int64_t step);

// One tensor of a manifest as ReadManifestByTensor hands it over.
struct TensorOfManifest {
  v1::ManifestTensor& tensor;
  // chunk_objects[i]: the index in header.objects() of chunk i's object.
  absl::Span<const uint32_t> chunk_objects;
  // Every field of the manifest but its tensors (checked, as the tensor).
  const v1::Manifest& header;
};

// ReadManifest for a reader that takes the tensors one at a time, so that a
// large manifest's parsed chunks (~300 bytes each: GBs for a save of
// thousands of ranks) are never all in memory: each tensor is passed to
// `on_tensor` in order, after the checks ReadManifest makes of it. The checks
// of the whole manifest end before this returns; on any error (from
// on_tensor too, returned as is) the caller drops what on_tensor was given.
absl::StatusOr<ManifestSummary> ReadManifestByTensor(
    ShardStore& store, absl::string_view job, int64_t step,
    absl::FunctionRef<absl::Status(const TensorOfManifest&)> on_tensor);
// ReadManifestByTensor for what is not in the tensors (the record, the object
// list): every check of ReadManifest, none of its memory.
absl::StatusOr<ManifestSummary> ReadManifestSummary(ShardStore& store,
                                                    absl::string_view job,
                                                    int64_t step);

// Job names at the root of the store (valid names only), sorted.
absl::StatusOr<std::vector<std::string>> ListJobs(ShardStore& store);
// Steps of `job` with a MANIFEST, ascending.
absl::StatusOr<std::vector<int64_t>> ListCommittedSteps(ShardStore& store,
                                                        absl::string_view job);
// Steps of `job` holding objects but no MANIFEST, ascending.
absl::StatusOr<std::vector<int64_t>> ListIncompleteSteps(ShardStore& store,
                                                         absl::string_view job);

// Deletes MANIFEST first (the checkpoint stops being loadable atomically),
// then every object of the step. OK if the step does not exist.
absl::Status DeleteStep(ShardStore& store, absl::string_view job, int64_t step);

// Removes from the step of a committed `manifest` everything it does not
// need: temp files of writers that died (ShardStore::DeleteAbandonedWrites)
// and objects neither the MANIFEST nor named by it (objects of other,
// aborted attempts that a crash or a zombie rank left behind). Only for a
// step no writer can still be writing into (a committed one: every other
// attempt of it is aborted). `manifest` must be valid (ValidateManifest, as
// PublishManifest and ReadManifest check): the objects it keeps are the ones
// it lists (its tensors are not read: a ReadManifestSummary header will do).
// Returns the number of objects removed.
absl::StatusOr<int> DeleteUnreferenced(ShardStore& store,
                                       const v1::Manifest& manifest);

// Reads location (relative to the step prefix of job/step) into `out`
// (out.size() must be >= location.length()) and checks its crc32c.
// DATA_LOSS naming job, step, `what` (e.g. "tensor 'x' chunk [0:4]") and the
// object key on mismatch, or when the object is missing or too short.
absl::Status ReadVerified(ShardStore& store, absl::string_view job,
                          int64_t step, const v1::StorageLocation& location,
                          uint32_t crc32c, absl::string_view what,
                          absl::Span<char> out);

// ReadVerified for a location too large to hold at once (an exported
// tensor's chunk of GBs): streams it through `buffer` (one piece at a time;
// must not be empty), hands each piece to on_piece(offset in the location,
// bytes) in order, and checks the crc32c of the whole after the last piece.
// The pieces are unverified until this returns OK: on any error the caller
// must drop what it made of them. The errors of ReadVerified; an error from
// on_piece stops the read and is returned as is.
absl::Status ReadVerifiedPieces(
    ShardStore& store, absl::string_view job, int64_t step,
    const v1::StorageLocation& location, uint32_t crc32c,
    absl::string_view what, absl::Span<char> buffer,
    absl::FunctionRef<absl::Status(uint64_t offset, absl::Span<const char>)>
        on_piece);

// Reads every stored byte the manifest references and checks crc32c.
// DATA_LOSS naming job, step, fqn, chunk box and object key on a mismatch or
// a missing/short object. progress(bytes_done, bytes_total) is called after
// each piece (from the calling thread).
absl::Status VerifyCheckpoint(
    ShardStore& store, const v1::Manifest& manifest,
    std::function<void(uint64_t, uint64_t)> progress = nullptr);

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_CHECKPOINT_LAYOUT_H_
