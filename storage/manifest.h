// The MANIFEST: the commit record of a checkpoint (message cairn.v1.Manifest),
// and its framing on storage.
//
// Framing (all integers little-endian), 32-byte header then the body:
//   [0, 8)   magic "CAIRNMF\n"
//   [8, 12)  format_version (uint32): kManifestFormatVersion when written
//   [12, 16) flags (uint32): 0
//   [16, 24) body_length (uint64)
//   [24, 28) crc32c of the body
//   [28, 32) crc32c of bytes [0, 28)
//   [32, 32 + body_length)  the serialized cairn.v1.Manifest
// Decoding is strict and bounded: the header is checked (magic, header crc,
// version, length against max_bytes and against the bytes actually present)
// before the body is parsed, so a truncated, oversized or hostile file is a
// clear error and never an unbounded allocation or a crash.
#ifndef CAIRN_STORAGE_MANIFEST_H_
#define CAIRN_STORAGE_MANIFEST_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cairn/v1/cairn.pb.h"

namespace cairn::storage {

inline constexpr uint32_t kManifestFormatVersion = 1;
inline constexpr size_t kManifestHeaderBytes = 32;
inline constexpr char kManifestMagic[] = "CAIRNMF\n";  // 8 bytes, no NUL
inline constexpr size_t kMaxFqnBytes = 1024;
inline constexpr int kMaxTensorRank = 8;

// Framed bytes of `manifest` (see the top of this file). The header's
// format_version is manifest.format_version(), or kManifestFormatVersion
// when that is 0.
std::string EncodeManifest(const v1::Manifest& manifest);

// Strict inverse of EncodeManifest. DATA_LOSS for corruption (bad magic,
// truncation, trailing bytes, crc mismatch, unparsable body, header/body
// version disagreement, body longer than max_bytes); FAILED_PRECONDITION for
// a format_version newer than this build understands. Does not run
// ValidateManifest.
absl::StatusOr<v1::Manifest> DecodeManifest(absl::string_view bytes,
                                            uint64_t max_bytes = 1ull << 30);

// DecodeManifest that hands over the tensors one at a time instead of
// holding them all (a parsed manifest takes ~300 bytes a stored chunk:
// GBs at thousands of ranks). `header` gets every field but the tensors;
// each tensor is parsed from `bytes` on its own and passed to `on_tensor`, in
// order; an error from on_tensor stops the decode and is returned as is. The
// tensor lives on an arena until on_tensor returns (moving from it copies).
// Returns the number of tensors. The same errors as DecodeManifest.
//
// The bytes are read forward through a buffer of about `window` bytes (and
// the largest tensor), twice: a manifest is never whole in memory.
inline constexpr size_t kManifestReadWindow = size_t{8} << 20;
absl::StatusOr<int> DecodeManifestByTensor(
    absl::string_view bytes, uint64_t max_bytes, v1::Manifest* header,
    absl::FunctionRef<absl::Status(v1::ManifestTensor&)> on_tensor,
    size_t window = kManifestReadWindow);

// Reads up to out.size() bytes at `offset` of a manifest's framed bytes into
// `out`; returns how many (fewer only at the end). An error is returned by
// the decoder as is.
using ManifestReader = absl::FunctionRef<absl::StatusOr<size_t>(
    uint64_t offset, absl::Span<char> out)>;
// DecodeManifestByTensor of the `size` bytes `read` gives (a file on
// storage). The same errors, and DATA_LOSS if they change while read.
absl::StatusOr<int> DecodeManifestByTensor(
    uint64_t size, ManifestReader read, uint64_t max_bytes,
    v1::Manifest* header,
    absl::FunctionRef<absl::Status(v1::ManifestTensor&)> on_tensor,
    size_t window = kManifestReadWindow);

// Semantic checks (INVALID_ARGUMENT naming job, step, fqn, chunk box and
// object key): known format version; valid job and step; world_size > 0;
// tensors and bytes entries sorted by fqn, fqns unique, non-empty, <= 1024
// bytes, no NUL; known dtypes; rank <= 8; every chunk box inside the global
// shape, boxes disjoint and covering the shape exactly; location lengths ==
// volume * dtype size; object keys valid and listed in `objects`; writer
// ranks in [0, world_size); total_bytes == sum of lengths.
absl::Status ValidateManifest(const v1::Manifest& manifest);
// The same checks; on success `object_ends[i]` is the end of the furthest
// byte any location places in `manifest.objects(i)` (0 for an object no
// location names): how long that object must be.
absl::Status ValidateManifest(const v1::Manifest& manifest,
                              std::vector<uint64_t>* object_ends);

// ValidateManifest in steps, for a manifest whose tensors are not all in
// memory at once: Start with the manifest's other fields, AddTensor for each
// tensor in order, then Finish. Each step returns the first error found;
// the result after Finish is ValidateManifest's. `header` must outlive the
// validator.
class ManifestValidator {
 public:
  explicit ManifestValidator(const v1::Manifest& header);
  // The header fields and the object list (tensors of `header` are ignored).
  absl::Status Start();
  absl::Status AddTensor(const v1::ManifestTensor& tensor);
  // After AddTensor succeeded: for each chunk of that tensor, the index of
  // its object in header.objects() (so a reader need not look the key up
  // again).
  absl::Span<const uint32_t> chunk_objects() const { return chunk_objects_; }
  // Bytes entries, layouts and total_bytes.
  absl::Status Finish();
  // After Finish: the furthest byte any location places in each object of
  // header.objects() (0 for an object no location names).
  std::vector<uint64_t>& object_ends() { return object_ends_; }

 private:
  template <typename... Parts>
  absl::Status Bad(const Parts&... parts) const;
  // On success *object (optional) is the index of loc's object. Its value
  // on entry is a guess, tried before the hash lookup: the object of the
  // same chunk of the previous tensor (a rank writes one chunk of every
  // tensor, so the objects repeat tensor after tensor).
  template <typename What>
  absl::Status CheckLocation(const v1::StorageLocation& loc, What&& what,
                             uint32_t* object = nullptr);
  template <typename What>
  absl::Status CheckRank(int32_t rank, What&& what) const;

  static constexpr size_t kMaxKnownTilingCoords = size_t{1} << 22;  // 32 MB

  // Whether `boxes` (the tensor's rank, then each box's offsets and sizes,
  // flat) is a tiling already found disjoint.
  bool KnownDisjoint(const std::vector<int64_t>& boxes) const;

  const v1::Manifest& m_;
  std::string where_;
  // Tilings found disjoint, by hash, while they take at most
  // kMaxKnownTilingCoords coordinates in all: the layers of a model have the
  // same shapes and layouts (a 70B model's 2,169 tensors have 7 tilings), and
  // the overlap check of a tensor of 16k chunks builds an index of them.
  absl::flat_hash_map<size_t, std::vector<std::vector<int64_t>>>
      disjoint_tilings_;
  size_t known_tiling_coords_ = 0;
  absl::flat_hash_map<absl::string_view, int> objects_;  // -> index
  std::vector<absl::string_view> object_keys_;           // index -> key
  std::vector<uint64_t> object_ends_;
  std::vector<uint32_t> chunk_objects_;   // of the last tensor added
  std::vector<std::string> tensor_fqns_;  // in order, so sorted
  unsigned __int128 total_ = 0;
};

// Encodes a manifest tensor by tensor, checking it as ValidateManifest does,
// so that a manifest of millions of chunks is never whole in memory as
// messages (~300 bytes a chunk; its encoding takes ~40): the header (every
// field but the tensors) first, complete, then each tensor in fqn order.
//
// It streams the body to a sink in pieces of about kManifestPieceBytes as it
// is encoded, counting it and taking its crc32c, so that not even the
// encoding is whole in memory (1.4 GB for a save of 16k ranks):
// PublishManifest frames the body from body_bytes() and body_crc32c().
class ManifestEncoder {
 public:
  // Takes the body in order, piece by piece; an error stops the encoding and
  // is returned by the call that flushed the piece. The sink may take the
  // piece's bytes (move or swap them out, leaving any buffer in their place):
  // the encoder clears `piece` after the call and reuses it.
  using Sink = std::function<absl::Status(std::string& piece)>;

  // `header` (its tensors are ignored) must outlive the encoder; its
  // format_version must be set. With `validate` false the checks are skipped
  // (a second encoding of a manifest already checked: PublishManifest).
  ManifestEncoder(const v1::Manifest& header, Sink sink, bool validate);

  // Checks the header; must come first.
  absl::Status Start();
  absl::Status AddTensor(const v1::ManifestTensor& tensor);
  // The checks of the whole; hands the sink the last piece.
  absl::Status Finish();

  int num_tensors() const { return num_tensors_; }
  // After Finish: the body's length and crc32c.
  uint64_t body_bytes() const { return streamed_; }
  uint32_t body_crc32c() const { return crc_; }
  // After Finish: ManifestValidator::object_ends.
  const std::vector<uint64_t>& object_ends() {
    return validator_.object_ends();
  }

 private:
  // Hands out_ to the sink once it holds a piece (or `all`).
  absl::Status Flush(bool all);

  const v1::Manifest& header_;
  ManifestValidator validator_;
  Sink sink_;
  bool validate_ = true;
  std::string out_;  // what is not yet flushed
  uint64_t streamed_ = 0;
  uint32_t crc_ = 0;
  int num_tensors_ = 0;
};

// The size of the pieces a streaming ManifestEncoder hands its sink.
inline constexpr size_t kManifestPieceBytes = size_t{4} << 20;

// The 32-byte frame header (see the top of this file) of a body of
// `body_bytes` bytes whose crc32c is `body_crc32c`.
std::string ManifestFrameHeader(uint32_t format_version, uint64_t body_bytes,
                                uint32_t body_crc32c);

// Size in bytes of one element; 0 for DTYPE_UNSPECIFIED or an unknown value.
size_t DTypeSize(v1::DType dtype);
// "float32", "bfloat16", ...; "unspecified" / "unknown(N)".
std::string DTypeName(v1::DType dtype);

// "[0:4096, 512:1024]" (offset:offset+size per dim; "[]" for a scalar).
std::string BoxToString(const v1::ChunkBox& box);

// A JSON view for the CLI (nlohmann_json, 2-space indent): header fields,
// objects, tensors (dtype names, shapes, and unless include_chunks is false
// every chunk with its box, location, crc32c as "0x%08x" and writer rank),
// bytes entries and layouts.
std::string ManifestToJson(const v1::Manifest& manifest,
                           bool include_chunks = true);

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_MANIFEST_H_
