// Manifest framing, strict decoding, semantic validation and the JSON view.
//
// Decoding checks the fixed 32-byte header before touching the body: magic,
// header crc (so a flipped version or length byte reads as corruption, not
// as a "newer format"), version, flags, the declared length against
// max_bytes and against the bytes present, then the body crc, and only then
// parses the protobuf. Nothing is allocated from a declared length.
//
// ValidateManifest checks that chunks tile each tensor exactly: every box is
// inside the shape, the volumes add up to the shape's volume, and no two
// non-empty boxes intersect. The geometry is the planner's (planner/box.h,
// overlap_index.h), as its check of a save's chunks: boxes that form a grid
// (TilesAsGrid: every DTensor layout) are disjoint; others ask an
// OverlapIndex of them all, for each box, whether another one meets it.
// Both are O(n log n).
#include "storage/manifest.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/little_endian.h"
#include "common/status_macros.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "nlohmann/json.hpp"
#include "planner/box.h"
#include "planner/overlap_index.h"
#include "storage/checkpoint_keys.h"
#include "storage/checksum.h"
#include "storage/shard_store.h"

namespace cairn::storage {
namespace {

constexpr size_t kMagicBytes = 8;
static_assert(sizeof(kManifestMagic) == kMagicBytes + 1);
static_assert(kMaxTensorRank == planner::kMaxDims);

std::string Crc(uint32_t crc) { return absl::StrFormat("0x%08x", crc); }

constexpr uint32_t kTensorsField = 6;  // Manifest.tensors
static_assert(v1::Manifest::kTensorsFieldNumber == kTensorsField);

// The wire types of the protobuf encoding.
enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

bool ValidFqn(const std::string& fqn) {
  return !fqn.empty() && fqn.size() <= kMaxFqnBytes &&
         fqn.find('\0') == std::string::npos;
}

}  // namespace

size_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_INT64:
      return 8;
    case v1::DTYPE_FLOAT32:
    case v1::DTYPE_INT32:
      return 4;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
    case v1::DTYPE_INT16:
      return 2;
    case v1::DTYPE_INT8:
    case v1::DTYPE_UINT8:
    case v1::DTYPE_BOOL:
    case v1::DTYPE_FLOAT8_E4M3:
    case v1::DTYPE_FLOAT8_E5M2:
      return 1;
    default:
      return 0;
  }
}

std::string DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
      return "unspecified";
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_FLOAT64:
      return "float64";
    case v1::DTYPE_FLOAT16:
      return "float16";
    case v1::DTYPE_BFLOAT16:
      return "bfloat16";
    case v1::DTYPE_INT8:
      return "int8";
    case v1::DTYPE_UINT8:
      return "uint8";
    case v1::DTYPE_INT16:
      return "int16";
    case v1::DTYPE_INT32:
      return "int32";
    case v1::DTYPE_INT64:
      return "int64";
    case v1::DTYPE_BOOL:
      return "bool";
    case v1::DTYPE_FLOAT8_E4M3:
      return "float8_e4m3";
    case v1::DTYPE_FLOAT8_E5M2:
      return "float8_e5m2";
    default:
      return absl::StrCat("unknown(", static_cast<int>(dtype), ")");
  }
}

std::string BoxToString(const v1::ChunkBox& box) {
  std::string out = "[";
  const int n = std::max(box.offsets_size(), box.sizes_size());
  for (int d = 0; d < n; ++d) {
    if (d > 0) out += ", ";
    const int64_t off = d < box.offsets_size() ? box.offsets(d) : 0;
    const int64_t size = d < box.sizes_size() ? box.sizes(d) : 0;
    absl::StrAppend(&out, off, ":", off + size);
  }
  out += "]";
  return out;
}

namespace {

// Writes the 32-byte header before the body that follows it in `framed`.
void FrameBody(uint32_t format_version, std::string& framed) {
  const char* body = framed.data() + kManifestHeaderBytes;
  const size_t body_size = framed.size() - kManifestHeaderBytes;
  const std::string header =
      ManifestFrameHeader(format_version, body_size, Crc32c(body, body_size));
  std::memcpy(framed.data(), header.data(), kManifestHeaderBytes);
}

}  // namespace

std::string ManifestFrameHeader(uint32_t format_version, uint64_t body_bytes,
                                uint32_t body_crc32c) {
  std::string h(kManifestHeaderBytes, '\0');
  std::memcpy(h.data(), kManifestMagic, kMagicBytes);
  little_endian::Store32(&h[8], format_version);
  little_endian::Store32(&h[12], 0);
  little_endian::Store64(&h[16], body_bytes);
  little_endian::Store32(&h[24], body_crc32c);
  little_endian::Store32(&h[28], Crc32c(h.data(), 28));
  return h;
}

std::string EncodeManifest(const v1::Manifest& manifest) {
  if (manifest.format_version() == 0) {
    v1::Manifest copy = manifest;
    copy.set_format_version(kManifestFormatVersion);
    return EncodeManifest(copy);
  }
  // The body is serialized in place after the header: a manifest of
  // millions of chunks is ~100 MB, not worth a second copy.
  const size_t body_size = manifest.ByteSizeLong();
  std::string out(kManifestHeaderBytes + body_size, '\0');
  manifest.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(out.data() + kManifestHeaderBytes));
  FrameBody(manifest.format_version(), out);
  return out;
}

ManifestEncoder::ManifestEncoder(const v1::Manifest& header, Sink sink,
                                 bool validate)
    : header_(header),
      validator_(header),
      sink_(std::move(sink)),
      validate_(validate) {}

// Protobuf writes a message's fields in field-number order: format_version,
// job, step, world_size and created_unix_micros (1-5) before the tensors
// (6), the rest (7-10, then unknown fields) after them.
absl::Status ManifestEncoder::Start() {
  if (validate_) CAIRN_RETURN_IF_ERROR(validator_.Start());
  v1::Manifest front;
  front.set_format_version(header_.format_version());
  front.set_job(header_.job());
  front.set_step(header_.step());
  front.set_world_size(header_.world_size());
  front.set_created_unix_micros(header_.created_unix_micros());
  out_.clear();
  front.AppendToString(&out_);
  return Flush(/*all=*/false);
}

absl::Status ManifestEncoder::AddTensor(const v1::ManifestTensor& tensor) {
  if (validate_) CAIRN_RETURN_IF_ERROR(validator_.AddTensor(tensor));
  const size_t size = tensor.ByteSizeLong();
  uint8_t tag[1 + 10];
  tag[0] = (kTensorsField << 3) | kLengthDelimited;
  const uint8_t* end =
      google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(size,
                                                                    tag + 1);
  out_.append(reinterpret_cast<const char*>(tag), end - tag);
  const size_t at = out_.size();
  out_.resize(at + size);
  tensor.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(out_.data() + at));
  ++num_tensors_;
  return Flush(/*all=*/false);
}

absl::Status ManifestEncoder::Finish() {
  if (validate_) CAIRN_RETURN_IF_ERROR(validator_.Finish());
  v1::Manifest back = header_;
  back.clear_format_version();
  back.clear_job();
  back.clear_step();
  back.clear_world_size();
  back.clear_created_unix_micros();
  back.clear_tensors();
  back.AppendToString(&out_);
  return Flush(/*all=*/true);
}

absl::Status ManifestEncoder::Flush(bool all) {
  if (out_.empty() || (!all && out_.size() < kManifestPieceBytes)) {
    return absl::OkStatus();
  }
  crc_ = Crc32cExtend(crc_, out_.data(), out_.size());
  streamed_ += out_.size();
  CAIRN_RETURN_IF_ERROR(sink_(out_));
  out_.clear();
  // A sink that took the bytes may have left a smaller buffer: the next
  // piece grows in place, not by doubling.
  if (!all && out_.capacity() < 2 * kManifestPieceBytes) {
    out_.reserve(2 * kManifestPieceBytes);
  }
  return absl::OkStatus();
}

namespace {

// The checks of the 32-byte header and the body's crc32c; returns the
// header's format_version and the body.
struct Frame {
  uint32_t version = 0;
  uint64_t body_length = 0;
  uint32_t body_crc = 0;
};

absl::Status BodyCrcError(uint32_t got, uint32_t stored);

// The checks of the 32-byte header `h` of a manifest of `size` bytes.
absl::StatusOr<Frame> CheckFrameHeader(const char* h, uint64_t size,
                                       uint64_t max_bytes) {
  if (size < kManifestHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("manifest truncated: ", size, " bytes, shorter than its ",
                     kManifestHeaderBytes, "-byte header"));
  }
  if (std::memcmp(h, kManifestMagic, kMagicBytes) != 0) {
    return absl::DataLossError(
        "not a Cairn manifest: bad magic (expected \"CAIRNMF\\n\")");
  }
  const uint32_t header_crc = Crc32c(h, 28);
  if (header_crc != little_endian::Load32(h + 28)) {
    return absl::DataLossError(
        absl::StrCat("manifest header is corrupt: crc32c ", Crc(header_crc),
                     " != stored ", Crc(little_endian::Load32(h + 28))));
  }
  const uint32_t version = little_endian::Load32(h + 8);
  if (version == 0) {
    return absl::DataLossError("manifest header has format_version 0");
  }
  if (version > kManifestFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("manifest format_version ", version,
                     " is newer than this build understands (",
                     kManifestFormatVersion, "): upgrade Cairn to read it"));
  }
  if (little_endian::Load32(h + 12) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("manifest header has unknown flags ",
                     Crc(little_endian::Load32(h + 12))));
  }
  const uint64_t body_length = little_endian::Load64(h + 16);
  if (body_length > max_bytes) {
    return absl::DataLossError(absl::StrCat("manifest body of ", body_length,
                                            " bytes exceeds the limit of ",
                                            max_bytes));
  }
  const uint64_t present = size - kManifestHeaderBytes;
  if (present < body_length) {
    return absl::DataLossError(absl::StrCat("manifest truncated: body has ",
                                            present, " of ", body_length,
                                            " bytes"));
  }
  if (present > body_length) {
    return absl::DataLossError(absl::StrCat("manifest has ",
                                            present - body_length,
                                            " trailing bytes after its body"));
  }
  return Frame{version, body_length, little_endian::Load32(h + 24)};
}

absl::Status BodyCrcError(uint32_t got, uint32_t stored) {
  return absl::DataLossError(absl::StrCat("manifest body is corrupt: crc32c ",
                                          Crc(got), " != stored ",
                                          Crc(stored)));
}

absl::StatusOr<std::pair<uint32_t, absl::string_view>> CheckFraming(
    absl::string_view bytes, uint64_t max_bytes) {
  CAIRN_ASSIGN_OR_RETURN(
      const Frame frame,
      CheckFrameHeader(bytes.data(), bytes.size(), max_bytes));
  const absl::string_view body = bytes.substr(kManifestHeaderBytes);
  const uint32_t body_crc = Crc32c(body.data(), body.size());
  if (body_crc != frame.body_crc) return BodyCrcError(body_crc, frame.body_crc);
  return std::make_pair(frame.version, body);
}

// A length-delimited field's length, as protobuf reads it: a varint of up to
// 64 bits (not truncated to 32) that must fit in an int.
bool ReadLength(google::protobuf::io::CodedInputStream& in, int* length) {
  uint64_t v = 0;
  if (!in.ReadVarint64(&v) || v > static_cast<uint64_t>(INT32_MAX)) {
    return false;
  }
  *length = static_cast<int>(v);
  return true;
}

// Skips the field whose tag `tag` was just read, groups (unknown fields to
// Manifest, but protobuf accepts them) with everything in them; false if
// the input ends or is malformed first. Iterative: a hostile nesting depth
// costs memory in `open`, not stack (protobuf's own parse of what is kept
// applies its recursion limit).
bool SkipField(google::protobuf::io::CodedInputStream& in, uint32_t tag) {
  std::vector<uint32_t> open;  // field numbers of the groups being skipped
  int length = 0;
  for (;;) {
    uint64_t varint = 0;
    switch (tag & 7) {
      case kVarint:
        if (!in.ReadVarint64(&varint)) return false;
        break;
      case kFixed64:
        if (!in.Skip(8)) return false;
        break;
      case kLengthDelimited:
        if (!ReadLength(in, &length) || !in.Skip(length)) {
          return false;
        }
        break;
      case kStartGroup:
        open.push_back(tag >> 3);
        break;
      case kEndGroup:
        if (open.empty() || open.back() != (tag >> 3)) return false;
        open.pop_back();
        break;
      case kFixed32:
        if (!in.Skip(4)) return false;
        break;
      default:
        return false;
    }
    if (open.empty()) return true;
    tag = in.ReadTag();
    if ((tag >> 3) == 0) return false;  // the end, or field number 0
  }
}

}  // namespace

absl::StatusOr<v1::Manifest> DecodeManifest(absl::string_view bytes,
                                            uint64_t max_bytes) {
  CAIRN_ASSIGN_OR_RETURN(auto framed, CheckFraming(bytes, max_bytes));
  const auto [version, body] = framed;
  v1::Manifest manifest;
  if (body.size() > static_cast<size_t>(INT32_MAX) ||
      !manifest.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::DataLossError(
        "manifest body does not parse as cairn.v1.Manifest");
  }
  if (manifest.format_version() != version) {
    return absl::DataLossError(absl::StrCat(
        "manifest body says format_version ", manifest.format_version(),
        " but its header says ", version));
  }
  return manifest;
}

namespace {

// A manifest body read forward through one buffer: Ensure(pos, n) makes the
// bytes [pos, pos + n) present (fewer only where the body ends), dropping
// those before pos. Every byte of the body is read once, in order (bytes
// skipped over are read and dropped), and checksummed as it is read, so
// the crc32c is the body's once the end was reached.
class BodyWindow {
 public:
  BodyWindow(uint64_t body_length, ManifestReader read, size_t window)
      : length_(body_length),
        read_(read),
        window_(std::max<size_t>(window, 1)) {}

  absl::StatusOr<absl::string_view> Ensure(uint64_t pos, uint64_t n) {
    pos = std::min(pos, length_);
    n = std::min(n, length_ - pos);
    if (pos > fetched_) {  // skip: read through what lies before pos
      buf_.clear();
      while (fetched_ < pos) {
        CAIRN_RETURN_IF_ERROR(
            Fetch(std::min<uint64_t>(pos - fetched_, window_)));
        buf_.clear();
      }
      start_ = pos;
    }
    if (fetched_ < pos + n && pos > start_) {
      // The bytes before pos are done with: dropped only when more must be
      // read, so the buffer moves once a refill, not once a field or tensor.
      buf_.erase(0, static_cast<size_t>(pos - start_));
      start_ = pos;
    }
    while (fetched_ < pos + n) {
      CAIRN_RETURN_IF_ERROR(
          Fetch(std::max<uint64_t>(pos + n - fetched_, window_)));
    }
    return absl::string_view(buf_).substr(static_cast<size_t>(pos - start_),
                                          static_cast<size_t>(n));
  }
  uint32_t crc() const { return crc_; }

 private:
  // Appends up to `want` more bytes of the body to buf_.
  absl::Status Fetch(uint64_t want) {
    const size_t n = static_cast<size_t>(std::min(want, length_ - fetched_));
    const size_t old = buf_.size();
    buf_.resize(old + n);
    CAIRN_ASSIGN_OR_RETURN(const size_t got,
                           read_(kManifestHeaderBytes + fetched_,
                                 absl::Span<char>(&buf_[old], n)));
    if (got != n) {
      return absl::DataLossError(
          absl::StrCat("manifest truncated while read: body has ",
                       fetched_ + got, " of ", length_, " bytes"));
    }
    crc_ = Crc32cExtend(crc_, &buf_[old], n);
    fetched_ += n;
    return absl::OkStatus();
  }

  const uint64_t length_;
  const ManifestReader read_;
  const size_t window_;
  std::string buf_;  // body bytes [start_, fetched_)
  uint64_t start_ = 0;
  uint64_t fetched_ = 0;
  uint32_t crc_ = 0;
};

// The most bytes a field's tag and length take: two varints.
constexpr uint64_t kMaxFieldHead = 20;

}  // namespace

absl::StatusOr<int> DecodeManifestByTensor(
    absl::string_view bytes, uint64_t max_bytes, v1::Manifest* header,
    absl::FunctionRef<absl::Status(v1::ManifestTensor&)> on_tensor,
    size_t window) {
  return DecodeManifestByTensor(
      bytes.size(),
      [bytes](uint64_t offset, absl::Span<char> out) -> absl::StatusOr<size_t> {
        if (offset >= bytes.size()) return 0;
        const size_t n = std::min<size_t>(out.size(), bytes.size() - offset);
        std::memcpy(out.data(), bytes.data() + offset, n);
        return n;
      },
      max_bytes, header, on_tensor, window);
}

absl::StatusOr<int> DecodeManifestByTensor(
    uint64_t size, ManifestReader read, uint64_t max_bytes,
    v1::Manifest* header,
    absl::FunctionRef<absl::Status(v1::ManifestTensor&)> on_tensor,
    size_t window) {
  char h[kManifestHeaderBytes] = {};
  if (size >= kManifestHeaderBytes) {
    CAIRN_ASSIGN_OR_RETURN(const size_t got,
                           read(0, absl::Span<char>(h, sizeof(h))));
    if (got != sizeof(h)) {
      return absl::DataLossError("manifest truncated while read: no header");
    }
  }
  CAIRN_ASSIGN_OR_RETURN(const Frame frame,
                         CheckFrameHeader(h, size, max_bytes));
  const absl::Status unparsable =
      absl::DataLossError("manifest body does not parse as cairn.v1.Manifest");
  if (frame.body_length > static_cast<uint64_t>(INT32_MAX)) return unparsable;
  const uint64_t length = frame.body_length;
  // Two passes over the body, each reading it forward through a window of
  // `window` bytes (a 16k-rank save's manifest is 1.4 GB; holding it whole
  // would cost more than parsing it). The first checks the body's crc32c,
  // copies every field but the tensors into `rest` (parsed as the header:
  // protobuf merges repeated occurrences as it would in the whole message) and
  // notes where each tensor is; the second parses the tensors one by one, after
  // the header is known (fields are written in field-number order, so the
  // tensors (6) come before the object list (10) that checking them needs).
  std::string rest;
  std::vector<std::pair<uint64_t, int>> tensors;  // (offset, length) in body
  {
    BodyWindow body(length, read, window);
    bool parsed = true;
    uint64_t pos = 0;
    while (parsed && pos < length) {
      uint64_t need = kMaxFieldHead;
      for (;;) {
        CAIRN_ASSIGN_OR_RETURN(absl::string_view view, body.Ensure(pos, need));
        google::protobuf::io::CodedInputStream in(
            reinterpret_cast<const uint8_t*>(view.data()),
            static_cast<int>(view.size()));
        const uint32_t tag = in.ReadTag();
        const uint32_t field = tag >> 3;
        int field_length = 0;
        if (field == kTensorsField && (tag & 7) == kLengthDelimited) {
          if (!ReadLength(in, &field_length)) {
            parsed = false;  // a field head fits in kMaxFieldHead bytes
            break;
          }
          const uint64_t payload =
              pos + static_cast<uint64_t>(in.CurrentPosition());
          if (static_cast<uint64_t>(field_length) > length - payload) {
            parsed = false;
            break;
          }
          tensors.emplace_back(payload, field_length);
          pos = payload + static_cast<uint64_t>(field_length);
          break;
        }
        if (field != 0 && SkipField(in, tag)) {
          rest.append(view.data(), static_cast<size_t>(in.CurrentPosition()));
          pos += static_cast<uint64_t>(in.CurrentPosition());
          break;
        }
        // Malformed, or a field longer than the bytes at hand: more, if the
        // body has more.
        if (field == 0 || pos + view.size() >= length) {
          parsed = false;
          break;
        }
        need = std::max<uint64_t>(need, view.size()) * 2;
      }
    }
    // The whole body is checksummed before anything is handed over, and a
    // corrupt body is reported as such even where it also fails to parse.
    CAIRN_RETURN_IF_ERROR(body.Ensure(length, 0).status());
    if (body.crc() != frame.body_crc) {
      return BodyCrcError(body.crc(), frame.body_crc);
    }
    if (!parsed) return unparsable;
  }
  if (!header->ParseFromString(rest)) return unparsable;
  if (header->format_version() != frame.version) {
    return absl::DataLossError(absl::StrCat(
        "manifest body says format_version ", header->format_version(),
        " but its header says ", frame.version));
  }
  google::protobuf::ArenaOptions arena_options;
  arena_options.max_block_size = 1 << 20;
  google::protobuf::Arena arena(arena_options);
  BodyWindow body(length, read, window);
  for (const auto& [offset, tensor_length] : tensors) {
    CAIRN_ASSIGN_OR_RETURN(absl::string_view view,
                           body.Ensure(offset, tensor_length));
    // Parsed as the embedded message it is: one level of protobuf's
    // recursion budget is the Manifest's, and it must end where its length
    // says.
    google::protobuf::io::CodedInputStream in(
        reinterpret_cast<const uint8_t*>(view.data()), tensor_length);
    in.SetRecursionLimit(
        google::protobuf::io::CodedInputStream::GetDefaultRecursionLimit() - 1);
    // On an arena, freed whole before the next tensor: a tensor of a
    // 16k-rank save is 16k stored chunks of ~6 allocations each.
    arena.Reset();
    auto* tensor =
        google::protobuf::Arena::CreateMessage<v1::ManifestTensor>(&arena);
    if (!tensor->ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
      return unparsable;
    }
    CAIRN_RETURN_IF_ERROR(on_tensor(*tensor));
  }
  // The bytes parsed are the bytes checked: a body that changed between the
  // passes is an error (the caller drops what it was given).
  CAIRN_RETURN_IF_ERROR(body.Ensure(length, 0).status());
  if (body.crc() != frame.body_crc) {
    return absl::DataLossError(
        absl::StrCat("manifest changed while read: body crc32c ",
                     Crc(body.crc()), " != stored ", Crc(frame.body_crc)));
  }
  return static_cast<int>(tensors.size());
}

absl::Status ValidateManifest(const v1::Manifest& m) {
  std::vector<uint64_t> object_ends;
  return ValidateManifest(m, &object_ends);
}

absl::Status ValidateManifest(const v1::Manifest& m,
                              std::vector<uint64_t>* object_ends) {
  ManifestValidator v(m);
  CAIRN_RETURN_IF_ERROR(v.Start());
  for (const v1::ManifestTensor& t : m.tensors()) {
    CAIRN_RETURN_IF_ERROR(v.AddTensor(t));
  }
  CAIRN_RETURN_IF_ERROR(v.Finish());
  *object_ends = std::move(v.object_ends());
  return absl::OkStatus();
}

ManifestValidator::ManifestValidator(const v1::Manifest& header) : m_(header) {}

template <typename... Parts>
absl::Status ManifestValidator::Bad(const Parts&... parts) const {
  return absl::InvalidArgumentError(absl::StrCat(where_, ": ", parts...));
}

// `what` names the entry; it is called only to report an error. Every key in
// the object list was validated by Start, so a listed key needs no check.
template <typename What>
absl::Status ManifestValidator::CheckLocation(const v1::StorageLocation& loc,
                                              What&& what,
                                              uint32_t* object_index) {
  int index = -1;
  if (object_index != nullptr && *object_index < object_keys_.size() &&
      object_keys_[*object_index] == loc.object_key()) {
    index = static_cast<int>(*object_index);
  } else if (auto object = objects_.find(loc.object_key());
             object != objects_.end()) {
    index = object->second;
  }
  if (index < 0) {
    if (absl::Status s = ValidateKey(loc.object_key()); !s.ok()) {
      return Bad(what(), ": ", s.message());
    }
    return Bad(what(), ": object '", loc.object_key(),
               "' is not in the manifest's object list");
  }
  // Objects are files: every byte must be addressable by an off_t.
  if (loc.offset() > static_cast<uint64_t>(INT64_MAX) ||
      loc.length() > static_cast<uint64_t>(INT64_MAX) - loc.offset()) {
    return Bad(what(), ": location offset ", loc.offset(), " + length ",
               loc.length(), " exceeds 2^63 - 1");
  }
  uint64_t& end = object_ends_[index];
  end = std::max(end, loc.offset() + loc.length());
  if (object_index != nullptr) *object_index = static_cast<uint32_t>(index);
  return absl::OkStatus();
}

template <typename What>
absl::Status ManifestValidator::CheckRank(int32_t rank, What&& what) const {
  if (rank < 0 || rank >= m_.world_size()) {
    return Bad(what(), ": writer_rank ", rank, " outside [0, ", m_.world_size(),
               ")");
  }
  return absl::OkStatus();
}

absl::Status ManifestValidator::Start() {
  const v1::Manifest& m = m_;
  // Here, not in the constructor: a header may be filled in between
  // (PublishManifest's sources fill it as they run).
  where_ = absl::StrCat("manifest of job '", m.job(), "' step ", m.step());
  if (m.format_version() == 0 || m.format_version() > kManifestFormatVersion) {
    return Bad("unsupported format_version ", m.format_version());
  }
  if (absl::Status s = ValidateJobName(m.job()); !s.ok()) {
    return Bad(s.message());
  }
  if (absl::Status s = ValidateStep(m.step()); !s.ok()) return Bad(s.message());
  if (m.world_size() <= 0) return Bad("world_size ", m.world_size(), " <= 0");

  // Views into the header: nothing is copied per object or chunk, and the
  // messages naming a chunk are built only when it is wrong.
  objects_.reserve(m.objects_size());
  object_keys_.reserve(m.objects_size());
  for (const std::string& key : m.objects()) {
    if (absl::Status s = ValidateKey(key); !s.ok()) {
      return Bad("object list: ", s.message());
    }
    if (!objects_.try_emplace(key, static_cast<int>(objects_.size())).second) {
      return Bad("object '", key, "' listed twice");
    }
    object_keys_.push_back(key);
  }
  object_ends_.assign(m.objects_size(), 0);
  return absl::OkStatus();
}

absl::Status ManifestValidator::AddTensor(const v1::ManifestTensor& t) {
  const v1::TensorEntry& e = t.entry();
  const std::string& fqn = e.fqn();
  if (!ValidFqn(fqn)) {
    return Bad("invalid tensor fqn '", fqn.substr(0, 200),
               "' (empty, over 1024 bytes or containing NUL)");
  }
  // Strictly sorted, so also unique.
  if (!tensor_fqns_.empty() && !(tensor_fqns_.back() < fqn)) {
    return Bad("tensors not sorted by fqn: '", fqn, "' after '",
               tensor_fqns_.back(), "'");
  }
  tensor_fqns_.push_back(fqn);
  const size_t elem = DTypeSize(e.dtype());
  if (elem == 0) {
    return Bad("tensor '", fqn, "' has dtype ", DTypeName(e.dtype()));
  }
  const int rank = e.global_shape_size();
  if (rank > kMaxTensorRank) {
    return Bad("tensor '", fqn, "' has ", rank, " dims (max ", kMaxTensorRank,
               ")");
  }
  // The shape as a box. ValidateShape bounds its volume (at 2^60 elements,
  // as a save's plan and a load's do), so no volume below overflows.
  const planner::ChunkBox whole = planner::FullBox(
      planner::Shape(e.global_shape().begin(), e.global_shape().end()));
  if (!planner::ValidateShape(whole.sizes).ok()) {
    return Bad("tensor '", fqn, "' has an invalid or too large shape [",
               absl::StrJoin(e.global_shape(), ", "), "]");
  }
  const uint64_t shape_volume = planner::Volume(whole);
  unsigned __int128 covered = 0;
  std::vector<const v1::ChunkBox*> boxes;  // the non-empty ones
  boxes.reserve(t.chunks_size());
  // Each chunk's box, copied into one ChunkBox of the tensor's rank.
  planner::ChunkBox chunk{planner::Dims(rank), planner::Dims(rank)};
  chunk_objects_.resize(static_cast<size_t>(t.chunks_size()));
  uint32_t* chunk_object = chunk_objects_.data();
  for (const v1::StoredChunk& c : t.chunks()) {
    const v1::ChunkBox& box = c.box();
    auto what = [&] {
      return absl::StrCat("tensor '", fqn, "' chunk ", BoxToString(box));
    };
    if (box.offsets_size() != rank || box.sizes_size() != rank) {
      return Bad(what(), " has ", box.offsets_size(), " offsets and ",
                 box.sizes_size(), " sizes for a tensor of rank ", rank);
    }
    std::copy(box.offsets().begin(), box.offsets().end(),
              chunk.offsets.begin());
    std::copy(box.sizes().begin(), box.sizes().end(), chunk.sizes.begin());
    if (!planner::Contains(whole, chunk)) {
      return Bad(what(), " exceeds shape [",
                 absl::StrJoin(e.global_shape(), ", "), "]");
    }
    const uint64_t volume = planner::Volume(chunk);
    const unsigned __int128 want =
        static_cast<unsigned __int128>(volume) * elem;
    if (want != c.location().length()) {
      return Bad(what(), " has length ", c.location().length(),
                 " bytes, expected ", volume, " elements x ", elem, " bytes");
    }
    CAIRN_RETURN_IF_ERROR(CheckLocation(
        c.location(),
        [&] {
          return absl::StrCat(what(), " in object '", c.location().object_key(),
                              "'");
        },
        chunk_object++));
    CAIRN_RETURN_IF_ERROR(CheckRank(c.writer_rank(), what));
    covered += volume;
    total_ += c.location().length();
    if (volume > 0) boxes.push_back(&box);
  }
  if (covered != shape_volume) {
    return Bad("chunks of tensor '", fqn, "' cover ",
               static_cast<uint64_t>(covered), " elements of ", shape_volume,
               " (shape [", absl::StrJoin(e.global_shape(), ", "), "])");
  }
  std::vector<int64_t> tiling;
  tiling.reserve(1 + boxes.size() * 2 * static_cast<size_t>(rank));
  tiling.push_back(rank);
  for (const v1::ChunkBox* box : boxes) {
    tiling.insert(tiling.end(), box->offsets().begin(), box->offsets().end());
    tiling.insert(tiling.end(), box->sizes().begin(), box->sizes().end());
  }
  if (KnownDisjoint(tiling)) return absl::OkStatus();
  // A new tiling: disjoint if it is a grid, else when no box meets another
  // in an index of them all.
  std::vector<planner::ChunkBox> chunk_boxes(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    chunk_boxes[i].offsets.assign(boxes[i]->offsets().begin(),
                                  boxes[i]->offsets().end());
    chunk_boxes[i].sizes.assign(boxes[i]->sizes().begin(),
                                boxes[i]->sizes().end());
  }
  if (!planner::TilesAsGrid(whole.sizes, chunk_boxes)) {
    const planner::OverlapIndex index(chunk_boxes);
    for (int i = 0; i < index.size(); ++i) {
      int other = -1;
      if (index.AnyOverlap(chunk_boxes[i], i, &other)) {
        const auto [a, b] = std::minmax(i, other);
        return Bad("chunks ", BoxToString(*boxes[a]), " and ",
                   BoxToString(*boxes[b]), " of tensor '", fqn, "' overlap");
      }
    }
  }
  if (known_tiling_coords_ + tiling.size() <= kMaxKnownTilingCoords) {
    known_tiling_coords_ += tiling.size();
    disjoint_tilings_[absl::HashOf(tiling)].push_back(std::move(tiling));
  }
  return absl::OkStatus();
}

bool ManifestValidator::KnownDisjoint(const std::vector<int64_t>& boxes) const {
  auto it = disjoint_tilings_.find(absl::HashOf(boxes));
  if (it == disjoint_tilings_.end()) return false;
  for (const std::vector<int64_t>& known : it->second) {
    if (known == boxes) return true;
  }
  return false;
}

absl::Status ManifestValidator::Finish() {
  const v1::Manifest& m = m_;
  auto is_tensor = [&](const std::string& fqn) {
    return std::binary_search(tensor_fqns_.begin(), tensor_fqns_.end(), fqn);
  };
  const std::string* prev = nullptr;
  for (const v1::ManifestBytes& b : m.bytes_entries()) {
    const std::string& fqn = b.fqn();
    if (!ValidFqn(fqn)) {
      return Bad("invalid bytes entry fqn '", fqn.substr(0, 200), "'");
    }
    if (prev != nullptr && !(*prev < fqn)) {
      return Bad("bytes entries not sorted by fqn: '", fqn, "' after '", *prev,
                 "'");
    }
    prev = &fqn;
    if (is_tensor(fqn)) return Bad("fqn '", fqn, "' appears twice");
    auto what = [&] { return absl::StrCat("bytes entry '", fqn, "'"); };
    CAIRN_RETURN_IF_ERROR(CheckLocation(b.location(), what));
    CAIRN_RETURN_IF_ERROR(CheckRank(b.writer_rank(), what));
    total_ += b.location().length();
  }
  auto is_bytes_entry = [&](const std::string& fqn) {
    auto it = std::lower_bound(
        m.bytes_entries().begin(), m.bytes_entries().end(), fqn,
        [](const v1::ManifestBytes& b, const std::string& f) {
          return b.fqn() < f;
        });
    return it != m.bytes_entries().end() && it->fqn() == fqn;
  };
  for (const v1::TensorLayout& layout : m.layouts()) {
    if (!is_tensor(layout.fqn()) && !is_bytes_entry(layout.fqn())) {
      return Bad("layout for unknown tensor '", layout.fqn(), "'");
    }
  }
  if (total_ != m.total_bytes()) {
    return Bad("total_bytes ", m.total_bytes(), " != sum of stored lengths ",
               static_cast<uint64_t>(total_));
  }
  return absl::OkStatus();
}

std::string ManifestToJson(const v1::Manifest& m, bool include_chunks) {
  using Json = nlohmann::ordered_json;
  auto location = [](const v1::StorageLocation& loc) {
    Json j;
    j["object_key"] = loc.object_key();
    j["offset"] = loc.offset();
    j["length"] = loc.length();
    return j;
  };
  Json root;
  root["format_version"] = m.format_version();
  root["job"] = m.job();
  root["step"] = m.step();
  root["world_size"] = m.world_size();
  root["created_unix_micros"] = m.created_unix_micros();
  root["total_bytes"] = m.total_bytes();
  root["num_tensors"] = m.tensors_size();
  root["num_bytes_entries"] = m.bytes_entries_size();
  root["objects"] = Json::array();
  for (const std::string& o : m.objects()) root["objects"].push_back(o);
  Json tensors = Json::array();
  for (const v1::ManifestTensor& t : m.tensors()) {
    Json jt;
    jt["fqn"] = t.entry().fqn();
    jt["dtype"] = DTypeName(t.entry().dtype());
    jt["global_shape"] = Json::array();
    for (int64_t d : t.entry().global_shape()) jt["global_shape"].push_back(d);
    jt["num_chunks"] = t.chunks_size();
    uint64_t bytes = 0;
    for (const v1::StoredChunk& c : t.chunks()) bytes += c.location().length();
    jt["bytes"] = bytes;
    if (include_chunks) {
      Json chunks = Json::array();
      for (const v1::StoredChunk& c : t.chunks()) {
        Json jc;
        jc["offsets"] = Json::array();
        for (int64_t v : c.box().offsets()) jc["offsets"].push_back(v);
        jc["sizes"] = Json::array();
        for (int64_t v : c.box().sizes()) jc["sizes"].push_back(v);
        jc["location"] = location(c.location());
        jc["crc32c"] = Crc(c.crc32c());
        jc["writer_rank"] = c.writer_rank();
        chunks.push_back(std::move(jc));
      }
      jt["chunks"] = std::move(chunks);
    }
    tensors.push_back(std::move(jt));
  }
  root["tensors"] = std::move(tensors);
  Json bytes_entries = Json::array();
  for (const v1::ManifestBytes& b : m.bytes_entries()) {
    Json jb;
    jb["fqn"] = b.fqn();
    jb["location"] = location(b.location());
    jb["crc32c"] = Crc(b.crc32c());
    jb["writer_rank"] = b.writer_rank();
    bytes_entries.push_back(std::move(jb));
  }
  root["bytes_entries"] = std::move(bytes_entries);
  Json layouts = Json::array();
  for (const v1::TensorLayout& l : m.layouts()) {
    Json jl;
    jl["fqn"] = l.fqn();
    if (l.has_dtensor()) {
      const v1::DTensorLayout& d = l.dtensor();
      Json jd;
      jd["mesh_shape"] = Json::array();
      for (int64_t v : d.mesh().shape()) jd["mesh_shape"].push_back(v);
      jd["mesh_ranks"] = Json::array();
      for (int32_t v : d.mesh().ranks()) jd["mesh_ranks"].push_back(v);
      jd["placements"] = Json::array();
      for (const v1::Placement& p : d.placements()) {
        if (p.has_shard_dim()) {
          jd["placements"].push_back(
              absl::StrCat("Shard(", p.shard_dim(), ")"));
        } else if (p.has_replicate()) {
          jd["placements"].push_back("Replicate()");
        } else if (p.has_partial()) {
          jd["placements"].push_back("Partial()");
        } else {
          jd["placements"].push_back("unset");
        }
      }
      jl["dtensor"] = std::move(jd);
    } else if (l.has_explicit_chunks()) {
      Json je = Json::array();
      for (const auto& rc : l.explicit_chunks().ranks()) {
        Json jr;
        jr["rank"] = rc.rank();
        jr["chunks"] = Json::array();
        for (const v1::ChunkBox& box : rc.chunks()) {
          jr["chunks"].push_back(BoxToString(box));
        }
        je.push_back(std::move(jr));
      }
      jl["explicit_chunks"] = std::move(je);
    }
    layouts.push_back(std::move(jl));
  }
  root["layouts"] = std::move(layouts);
  // Replace invalid UTF-8 (fqns are arbitrary bytes) instead of throwing.
  return root.dump(2, ' ', false, Json::error_handler_t::replace);
}

}  // namespace cairn::storage
