// Temporary directories for tests.
#ifndef CAIRN_COMMON_TESTING_TEMP_DIR_H_
#define CAIRN_COMMON_TESTING_TEMP_DIR_H_

#include <string>

#include "absl/strings/string_view.h"

namespace cairn::testing {

// Makes a fresh directory `<base>/cairn-<name>-XXXXXX` and returns its path:
// <base> is $TEST_TMPDIR (set by Bazel) or /tmp; `name` defaults to the
// running test's name (a '/' of a parameterized test's name becomes '_').
// Records a test failure and returns "" when the directory cannot be made.
// The caller removes it when done (tests keep a failed test's directory for
// the post-mortem).
//
// Example:
//   const std::string dir = MakeTempDir();
//   ASSERT_FALSE(dir.empty());
std::string MakeTempDir(absl::string_view name = "");

// The same under /tmp whatever $TEST_TMPDIR says, for a directory that holds
// Unix sockets: a socket's path must fit sun_path's 107 bytes, and Bazel's
// TEST_TMPDIR is long. Give it a short `name`.
std::string MakeSocketTempDir(absl::string_view name);

// MakeTempDir(name), removed with everything in it when the test program
// exits (not when a forked child does): for directories a fixture cannot
// remove (a store's root handed to a conformance suite).
std::string MakeTempDirRemovedAtExit(absl::string_view name = "");

}  // namespace cairn::testing

#endif  // CAIRN_COMMON_TESTING_TEMP_DIR_H_
