// How the coordinator's messages name things: a checkpoint, a list of ranks.
// Below everything in server/coordinator (includes none of it).
#ifndef CAIRN_SERVER_COORDINATOR_MESSAGES_H_
#define CAIRN_SERVER_COORDINATOR_MESSAGES_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace cairn::coordinator {

// "job '<job>' step <step>", as every message names a checkpoint.
inline std::string SaveName(absl::string_view job, int64_t step) {
  return absl::StrCat("job '", job, "' step ", step);
}

// Summarises a list of ranks for an error message: "[3, 5, 9] (3 of 8)".
inline std::string RankList(const std::vector<int>& ranks, int world_size) {
  std::vector<int> shown(ranks.begin(),
                         ranks.begin() + std::min<size_t>(ranks.size(), 16));
  return absl::StrCat("[", absl::StrJoin(shown, ", "),
                      ranks.size() > shown.size() ? ", ..." : "", "] (",
                      ranks.size(), " of ", world_size, ")");
}

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_MESSAGES_H_
