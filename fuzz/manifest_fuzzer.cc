// manifest_fuzzer: a MANIFEST read from storage -> DecodeManifest ->
// ValidateManifest -> what cairnd does with a valid one on PlanLoad
// (StoredTensorsFromManifest, LoadPlanner::Create, Plan) and what `cairn show
// --json` does with any decoded one (ManifestToJson).
//
// Input: the first byte selects how the rest is read.
//   even: a MANIFEST file exactly as stored (header + body): exercises the
//         framing checks (magic, crcs, version, flags, lengths).
//   odd:  a manifest body (a serialized cairn.v1.Manifest), framed here with
//         correct crcs, so that mutations reach the protobuf parser and
//         ValidateManifest instead of stopping at the body crc.
// Invariants checked (a violation aborts): decode errors are DATA_LOSS or
// FAILED_PRECONDITION; validation errors are INVALID_ARGUMENT; a decoded
// manifest re-encodes to bytes that decode to the same message; a valid
// manifest converts to planner types and gets a LoadPlanner, its locations
// end by 2^63 - 1 (objects are files); reading each
// tensor whole succeeds and its read segments cover exactly the tensor's
// bytes, each inside its stored chunk.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/util/message_differencer.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "planner/load_plan.h"
#include "proto/convert/plan_convert.h"
#include "storage/checksum.h"
#include "storage/manifest.h"

namespace {

using namespace cairn;  // NOLINT

// What the coordinator and the CLI accept (storage/checkpoint_layout.h uses
// the same order of magnitude); small here so each run stays fast.
constexpr uint64_t kMaxBodyBytes = 1 << 20;

// The storage framing of `body` (see storage/manifest.h), with the version
// the body claims so that the header/body agreement check passes when the
// body parses.
std::string Frame(absl::string_view body) {
  v1::Manifest probe;
  uint32_t version = storage::kManifestFormatVersion;
  if (probe.ParseFromArray(body.data(), static_cast<int>(body.size())) &&
      probe.format_version() != 0) {
    version = probe.format_version();
  }
  std::string out =
      storage::ManifestFrameHeader(version, body.size(), storage::Crc32c(body));
  out.append(body.data(), body.size());
  return out;
}

void CheckLoadPlanning(const v1::Manifest& manifest) {
  absl::StatusOr<std::vector<planner::StoredTensor>> tensors =
      convert::StoredTensorsFromManifest(manifest);
  FUZZ_CHECK(tensors.ok(), "valid manifest does not convert: %s",
             tensors.status().ToString().c_str());
  absl::StatusOr<std::unique_ptr<planner::LoadPlanner>> planner =
      planner::LoadPlanner::Create(*tensors);
  FUZZ_CHECK(planner.ok(), "valid manifest gets no LoadPlanner: %s",
             planner.status().ToString().c_str());
  for (const planner::StoredTensor& t : *tensors) {
    for (const planner::StoredChunk& c : t.chunks) {
      FUZZ_CHECK(c.location.offset <= INT64_MAX &&
                     c.location.length <= INT64_MAX - c.location.offset,
                 "valid manifest has a location beyond 2^63 - 1 in '%s'",
                 t.fqn.c_str());
    }
    const uint64_t elem = planner::DTypeSize(t.dtype);
    const int64_t elements = planner::NumElements(t.global_shape);
    // Reading a tensor whole makes one segment per contiguous run: at most
    // one per element. Skip the few valid manifests that would make the
    // check itself allocate gigabytes (a real load would hold the bytes).
    if (elements > (int64_t{1} << 20)) continue;
    planner::WantedChunk whole{t.fqn, t.dtype, t.global_shape,
                               planner::FullBox(t.global_shape)};
    absl::StatusOr<std::vector<planner::ReadItem>> reads =
        (*planner)->Plan({whole});
    FUZZ_CHECK(reads.ok(), "reading valid tensor '%s' whole failed: %s",
               t.fqn.c_str(), reads.status().ToString().c_str());
    uint64_t covered = 0;
    for (const planner::ReadItem& r : *reads) {
      for (const planner::CopySegment& s : r.segments) {
        FUZZ_CHECK(s.src_offset + s.length <= r.source.length,
                   "segment [%llu, +%llu) outside stored chunk of %llu bytes",
                   static_cast<unsigned long long>(s.src_offset),
                   static_cast<unsigned long long>(s.length),
                   static_cast<unsigned long long>(r.source.length));
        FUZZ_CHECK(s.dst_offset + s.length <= elem * elements,
                   "segment outside the destination buffer");
        covered += s.length;
      }
    }
    FUZZ_CHECK(covered == elem * static_cast<uint64_t>(elements),
               "tensor '%s': reads cover %llu of %llu bytes", t.fqn.c_str(),
               static_cast<unsigned long long>(covered),
               static_cast<unsigned long long>(elem * elements));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  const std::string framed = (data[0] & 1) ? Frame(rest) : std::string(rest);

  absl::StatusOr<v1::Manifest> m =
      storage::DecodeManifest(framed, kMaxBodyBytes);
  // Decoding tensor by tensor (how cairnd loads a checkpoint) agrees.
  {
    v1::Manifest by_tensor;
    std::vector<v1::ManifestTensor> tensors;
    // Read through a window of a few bytes (a field head or a tensor split
    // across reads) or of the default size.
    const size_t window = (data[0] & 2) ? size_t{1} + (data[0] >> 2)
                                        : storage::kManifestReadWindow;
    absl::StatusOr<int> n = storage::DecodeManifestByTensor(
        framed, kMaxBodyBytes, &by_tensor,
        [&](v1::ManifestTensor& t) {
          tensors.push_back(std::move(t));
          return absl::OkStatus();
        },
        window);
    FUZZ_CHECK(n.status().code() == m.status().code(),
               "decoding by tensor: %s, whole: %s",
               n.status().ToString().c_str(), m.status().ToString().c_str());
    if (n.ok()) {
      for (v1::ManifestTensor& t : tensors) {
        *by_tensor.add_tensors() = std::move(t);
      }
      FUZZ_CHECK(
          google::protobuf::util::MessageDifferencer::Equals(*m, by_tensor),
          "decoding by tensor gives another manifest");
    }
  }
  if (!m.ok()) {
    FUZZ_CHECK(
        absl::IsDataLoss(m.status()) || absl::IsFailedPrecondition(m.status()),
        "unexpected decode error %s", m.status().ToString().c_str());
    return 0;
  }
  // A decoded manifest re-encodes losslessly.
  absl::StatusOr<v1::Manifest> again =
      storage::DecodeManifest(storage::EncodeManifest(*m), kMaxBodyBytes);
  FUZZ_CHECK(again.ok() &&
                 google::protobuf::util::MessageDifferencer::Equals(*m, *again),
             "re-encoded manifest does not decode to itself: %s",
             again.status().ToString().c_str());
  // `cairn show --json` on whatever decodes.
  (void)storage::ManifestToJson(*m, /*include_chunks=*/true);

  absl::Status valid = storage::ValidateManifest(*m);
  if (!valid.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(valid), "unexpected validation error %s",
               valid.ToString().c_str());
    return 0;
  }
  CheckLoadPlanning(*m);
  return 0;
}
