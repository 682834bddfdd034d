#include "storage/checkpoint_keys.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cairn::storage {

absl::Status ValidateJobName(absl::string_view job) {
  if (job.empty() || job.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid job name '", job.substr(0, 200),
                     "': must be 1 to 128 characters of [A-Za-z0-9._-]"));
  }
  if (job == "." || job == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid job name '", job, "'"));
  }
  for (char c : job) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid job name '", absl::CHexEscape(job),
                       "': only [A-Za-z0-9._-] are allowed"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateStep(int64_t step) {
  if (step < 0 || step > kMaxStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid step ", step, ": must be in [0, 10^15]"));
  }
  return absl::OkStatus();
}

std::string StepPrefix(absl::string_view job, int64_t step) {
  return absl::StrFormat("%s/%016d/", job, step);
}

std::string ManifestKey(absl::string_view job, int64_t step) {
  return absl::StrCat(StepPrefix(job, step), kManifestName);
}

std::string ObjectKey(absl::string_view job, int64_t step,
                      absl::string_view object_key) {
  return absl::StrCat(StepPrefix(job, step), object_key);
}

absl::StatusOr<int64_t> ParseStepDir(absl::string_view name) {
  if (absl::EndsWith(name, "/")) name.remove_suffix(1);
  int64_t step = 0;
  if (name.size() != kStepDigits ||
      !std::all_of(name.begin(), name.end(),
                   [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(name, &step) || step > kMaxStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a step directory (16 digits)"));
  }
  return step;
}

}  // namespace cairn::storage
