/// \file
/// Crash points: named places in cairnd, the client library and cairn-agent
/// where a crash test (tests/crash/) can kill the process, to land a crash in
/// exactly the window it wants to test (after a MANIFEST is published and
/// before the catalog records the commit, between deleting a step's bytes and
/// dropping its record, in the middle of an object write, ...).
///
/// `CAIRN_CRASH_POINT("coordinator.after_manifest_publish");` does nothing
/// unless the environment variable CAIRN_CRASH_POINTS names that point when
/// the process starts. Then, on the chosen hit, the process writes one line
/// to stderr ("cairn: crash point 'NAME' hit N: SIGKILL") and raises SIGKILL
/// on itself: no destructor, no flush, no atexit handler runs, as after a
/// power cut (the kernel still keeps what was written to the page cache).
///
/// CAIRN_CRASH_POINTS is a comma-separated list of
///   NAME       die on the first hit of NAME
///   NAME@N     die on the N-th hit (N >= 1) of NAME in this process
///   NAME%P     die on each hit with probability P (0 < P <= 1)
/// NAME may end in '*' to match every point with that prefix
/// ("coordinator.delete.*"). Example:
///   CAIRN_CRASH_POINTS=client.mid_write@3 cairn_train_example ...
///
/// Cost when the variable is unset: one load of a global bool per point (the
/// environment is read once, before main). Malformed entries are reported on
/// stderr once and ignored.
///
/// Thread-safe: points may be hit concurrently from any thread.
#ifndef CAIRN_COMMON_CRASH_POINT_H_
#define CAIRN_COMMON_CRASH_POINT_H_

#include "absl/base/optimization.h"
#include "absl/strings/string_view.h"

namespace cairn {
namespace crash_point_internal {

// True when CAIRN_CRASH_POINTS named at least one valid point.
extern bool armed;

// Counts a hit of `name` and kills the process if a spec says so.
void Hit(const char* name);

}  // namespace crash_point_internal

// Replaces the specs read from CAIRN_CRASH_POINTS (and resets hit counts);
// an empty string disarms every point. Returns false if `specs` has a
// malformed entry (the valid ones are still armed). Not thread-safe: call
// before the threads that hit points start.
bool SetCrashPointsForTest(absl::string_view specs);

}  // namespace cairn

#define CAIRN_CRASH_POINT(name)                                     \
  do {                                                              \
    if (ABSL_PREDICT_FALSE(::cairn::crash_point_internal::armed)) { \
      ::cairn::crash_point_internal::Hit(name);                     \
    }                                                               \
  } while (0)

#endif  // CAIRN_COMMON_CRASH_POINT_H_
