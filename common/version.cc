#include "common/version.h"

#include "absl/strings/str_cat.h"
#include "common/version_info.h"

namespace cairn {

const char* CairnVersion() { return CAIRN_VERSION; }

std::string VersionString(absl::string_view program) {
  const absl::string_view commit = CAIRN_GIT_COMMIT;
  return absl::StrCat(
      program, " ", CAIRN_VERSION,
      commit.empty() ? "" : absl::StrCat(" (commit ", commit, ")"));
}

}  // namespace cairn
