// The read-only result types of cairn._cairn: CheckpointInfo, TensorSummary,
// BytesEntrySummary, CheckpointSummary (bound straight over libcairn's
// structs), and TransferStats as a dict.
#ifndef CAIRN_CLIENT_PYTHON_SRC_RESULTS_H_
#define CAIRN_CLIENT_PYTHON_SRC_RESULTS_H_

#include <pybind11/pybind11.h>

#include "absl/time/time.h"
#include "client/checkpointer.h"

namespace cairn::python {

// Unix seconds, or None for absl::InfinitePast() (never happened).
pybind11::object UnixSecondsOrNone(absl::Time t);

// last_stats: bytes, bytes_storage, items, chunks_verified_by_cairnd,
// chunks_verified_locally, plan_from_cache, sent_fingerprint_only,
// plan_time, io_time, commit_time (durations in float seconds).
pybind11::dict TransferStatsDict(const client::TransferStats& s);

void RegisterResults(pybind11::module_& m);

}  // namespace cairn::python

#endif  // CAIRN_CLIENT_PYTHON_SRC_RESULTS_H_
