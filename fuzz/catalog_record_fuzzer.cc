// catalog_record_fuzzer: a catalog entry as RocksDB hands it back ->
// DecodeCheckpointRecord (what GetCheckpoint, ListCheckpoints and
// LatestCommitted do with every record they read).
//
// Input: byte 0 is the key length n (capped by the input size), bytes
// [1, 1 + n) the key, the rest the value. Invariants checked: every error is
// DATA_LOSS naming the key; a decoded record is the one its key names (job
// valid, step valid, CheckpointRecordKey(job, step) == key) and re-serializes
// to a value that decodes to the same record.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/util/message_differencer.h"
#include "storage/catalog/catalog.h"
#include "storage/checkpoint_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cairn;  // NOLINT
  if (size == 0) return 0;
  const absl::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t n = std::min<size_t>(data[0], size - 1);
  const absl::string_view key = in.substr(1, n);
  const absl::string_view value = in.substr(1 + n);

  absl::StatusOr<v1::CheckpointRecord> record =
      storage::DecodeCheckpointRecord(key, value);
  if (!record.ok()) {
    FUZZ_CHECK(
        absl::IsDataLoss(record.status()) &&
            absl::StrContains(record.status().message(), "catalog: record '"),
        "unexpected error %s", record.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(storage::ValidateJobName(record->job()).ok() &&
                 storage::ValidateStep(record->step()).ok(),
             "decoded a record with an invalid job or step");
  FUZZ_CHECK(storage::CheckpointRecordKey(record->job(), record->step()) == key,
             "record of job '%s' step %lld decoded from another key",
             record->job().c_str(), static_cast<long long>(record->step()));
  const std::string again = record->SerializeAsString();
  absl::StatusOr<v1::CheckpointRecord> round =
      storage::DecodeCheckpointRecord(key, again);
  FUZZ_CHECK(round.ok() && google::protobuf::util::MessageDifferencer::Equals(
                               *record, *round),
             "record does not round-trip");
  return 0;
}
