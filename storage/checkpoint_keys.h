// Where a checkpoint lives on a ShardStore: the keys of its step and its
// MANIFEST, and the checks of the job names and steps they are made of.
//
// Layout:
//   <job>/<step, 16 digits zero-padded>/<data objects...>
//   <job>/<step, 16 digits zero-padded>/MANIFEST        (written last)
// Object keys inside a manifest (StorageLocation.object_key, objects) are
// relative to the step prefix. Zero padding makes List() order == step order
// (steps go up to 10^15, which has 16 digits). checkpoint_layout.h has the
// protocol that writes, reads and deletes them.
#ifndef CAIRN_STORAGE_CHECKPOINT_KEYS_H_
#define CAIRN_STORAGE_CHECKPOINT_KEYS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cairn::storage {

inline constexpr int64_t kMaxStep = 1000000000000000;  // 10^15
inline constexpr int kStepDigits = 16;
inline constexpr char kManifestName[] = "MANIFEST";

// [A-Za-z0-9._-]{1,128}, not "." or "..": else INVALID_ARGUMENT naming it.
absl::Status ValidateJobName(absl::string_view job);
// 0 <= step <= 10^15: else INVALID_ARGUMENT.
absl::Status ValidateStep(int64_t step);

// "job/0000000000000123/". Arguments must be valid (not checked).
std::string StepPrefix(absl::string_view job, int64_t step);
// "job/0000000000000123/MANIFEST".
std::string ManifestKey(absl::string_view job, int64_t step);
// StepPrefix(job, step) + object_key.
std::string ObjectKey(absl::string_view job, int64_t step,
                      absl::string_view object_key);
// Parses a 16-digit step directory name ("0000000000000123" or with a
// trailing '/'); INVALID_ARGUMENT otherwise.
absl::StatusOr<int64_t> ParseStepDir(absl::string_view name);

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_CHECKPOINT_KEYS_H_
