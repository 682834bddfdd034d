// Cairn's version, for every binary's --version: the VERSION file at the
// repository root, plus the git commit when built by CMake from a checkout.
#ifndef CAIRN_COMMON_VERSION_H_
#define CAIRN_COMMON_VERSION_H_

#include <string>

#include "absl/strings/string_view.h"

namespace cairn {

// "0.1.0".
const char* CairnVersion();

// "<program> 0.1.0 (commit 1a2b3c4d5e6f)", without the commit part when it
// is unknown (Bazel builds, builds outside a git checkout).
std::string VersionString(absl::string_view program);

}  // namespace cairn

#endif  // CAIRN_COMMON_VERSION_H_
