// The read-only result types of cairn._cairn (see results.h).
#include "client/python/src/results.h"

#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/box.h"
#include "planner/dtype.h"

namespace cairn::python {

namespace py = pybind11;

namespace {

using client::BytesEntrySummary;
using client::CheckpointInfo;
using client::CheckpointSummary;
using client::TensorSummary;

client::CheckpointState StateFromName(const std::string& name) {
  for (client::CheckpointState s :
       {client::CheckpointState::kWriting, client::CheckpointState::kCommitted,
        client::CheckpointState::kAborted,
        client::CheckpointState::kDeleting}) {
    if (client::CheckpointStateName(s) == name) return s;
  }
  return client::CheckpointState::kUnknown;
}

absl::Time TimeFromObject(const py::object& o) {
  if (o.is_none()) return absl::InfinitePast();
  return absl::UnixEpoch() + absl::Seconds(o.cast<double>());
}

py::tuple InfoState(const CheckpointInfo& i) {
  return py::make_tuple(
      i.job, i.step, std::string(client::CheckpointStateName(i.state)),
      i.world_size, i.bytes, i.num_tensors, i.num_bytes_entries,
      UnixSecondsOrNone(i.created), UnixSecondsOrNone(i.committed),
      i.storage_uri, i.abort_reason);
}

CheckpointInfo InfoFromState(const py::tuple& t) {
  if (t.size() != 11) throw std::runtime_error("bad CheckpointInfo pickle");
  CheckpointInfo i;
  i.job = t[0].cast<std::string>();
  i.step = t[1].cast<int64_t>();
  i.state = StateFromName(t[2].cast<std::string>());
  i.world_size = t[3].cast<int>();
  i.bytes = t[4].cast<uint64_t>();
  i.num_tensors = t[5].cast<int>();
  i.num_bytes_entries = t[6].cast<int>();
  i.created = TimeFromObject(t[7]);
  i.committed = TimeFromObject(t[8]);
  i.storage_uri = t[9].cast<std::string>();
  i.abort_reason = t[10].cast<std::string>();
  return i;
}

// (offsets, sizes) of every stored chunk of `t`.
std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> ChunkList(
    const TensorSummary& t) {
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out;
  out.reserve(t.chunk_boxes.size());
  for (const planner::ChunkBox& box : t.chunk_boxes) {
    out.emplace_back(
        std::vector<int64_t>(box.offsets.begin(), box.offsets.end()),
        std::vector<int64_t>(box.sizes.begin(), box.sizes.end()));
  }
  return out;
}

}  // namespace

py::object UnixSecondsOrNone(absl::Time t) {
  if (t == absl::InfinitePast()) return py::none();
  return py::float_(absl::ToDoubleSeconds(t - absl::UnixEpoch()));
}

py::dict TransferStatsDict(const client::TransferStats& s) {
  py::dict d;
  d["bytes"] = s.bytes;
  d["bytes_storage"] = s.bytes_storage;
  d["items"] = s.items;
  d["chunks_verified_by_cairnd"] = s.chunks_verified_by_cairnd;
  d["chunks_verified_locally"] = s.chunks_verified_locally;
  d["plan_from_cache"] = s.plan_from_cache;
  d["sent_fingerprint_only"] = s.sent_fingerprint_only;
  d["plan_time"] = absl::ToDoubleSeconds(s.plan_time);
  d["io_time"] = absl::ToDoubleSeconds(s.io_time);
  d["commit_time"] = absl::ToDoubleSeconds(s.commit_time);
  return d;
}

void RegisterResults(py::module_& m) {
  py::class_<CheckpointInfo>(
      m, "CheckpointInfo",
      R"doc(cairnd's record of one checkpoint (job, step). Read-only.

Attributes:
  job, step: which checkpoint.
  state: "WRITING" (a save in progress, not loadable), "COMMITTED" (every
    rank's bytes durable, loadable), "ABORTED" (never loadable; see
    abort_reason), "DELETING" (being removed) or "UNKNOWN".
  world_size: ranks that saved it.
  bytes: stored bytes of every tensor and bytes entry.
  num_tensors, num_bytes_entries: what it holds.
  created: when its save began (Unix seconds), or None.
  committed: when it was committed (Unix seconds), or None.
  storage_uri: where its bytes are.
  abort_reason: ABORTED only: which rank aborted it and why.
)doc")
      .def_readonly("job", &CheckpointInfo::job)
      .def_readonly("step", &CheckpointInfo::step)
      .def_property_readonly(
          "state",
          [](const CheckpointInfo& i) {
            return std::string(client::CheckpointStateName(i.state));
          })
      .def_readonly("world_size", &CheckpointInfo::world_size)
      .def_readonly("bytes", &CheckpointInfo::bytes)
      .def_readonly("num_tensors", &CheckpointInfo::num_tensors)
      .def_readonly("num_bytes_entries", &CheckpointInfo::num_bytes_entries)
      .def_property_readonly(
          "created",
          [](const CheckpointInfo& i) { return UnixSecondsOrNone(i.created); })
      .def_property_readonly("committed",
                             [](const CheckpointInfo& i) {
                               return UnixSecondsOrNone(i.committed);
                             })
      .def_readonly("storage_uri", &CheckpointInfo::storage_uri)
      .def_readonly("abort_reason", &CheckpointInfo::abort_reason)
      .def(py::pickle(&InfoState, &InfoFromState))
      .def("__repr__", [](const CheckpointInfo& i) {
        std::string r =
            absl::StrCat("CheckpointInfo(job='", i.job, "', step=", i.step,
                         ", state=", client::CheckpointStateName(i.state),
                         ", world_size=", i.world_size, ", bytes=", i.bytes,
                         ", num_tensors=", i.num_tensors,
                         ", num_bytes_entries=", i.num_bytes_entries);
        if (!i.abort_reason.empty()) {
          absl::StrAppend(&r, ", abort_reason='", i.abort_reason, "'");
        }
        return r + ")";
      });

  py::class_<TensorSummary>(
      m, "TensorSummary",
      R"doc(One tensor of a committed checkpoint, as its manifest records it.

Attributes:
  fqn: the tensor's name.
  dtype: Cairn's dtype name ("float32", "bfloat16", ...).
  shape: the global shape.
  bytes: stored bytes of all its chunks.
  chunks: (offsets, sizes) of every stored chunk: how the saving ranks split
    the tensor.
)doc")
      .def_readonly("fqn", &TensorSummary::fqn)
      .def_property_readonly("dtype",
                             [](const TensorSummary& t) {
                               return std::string(planner::DTypeName(t.dtype));
                             })
      .def_property_readonly("shape",
                             [](const TensorSummary& t) {
                               return std::vector<int64_t>(t.shape.begin(),
                                                           t.shape.end());
                             })
      .def_readonly("bytes", &TensorSummary::bytes)
      .def_property_readonly("chunks", &ChunkList)
      .def("__repr__", [](const TensorSummary& t) {
        return absl::StrCat(
            "TensorSummary(fqn='", t.fqn,
            "', dtype=", planner::DTypeName(t.dtype),
            ", shape=", planner::BoxToString(planner::FullBox(t.shape)),
            ", bytes=", t.bytes, ")");
      });

  py::class_<BytesEntrySummary>(m, "BytesEntrySummary",
                                R"doc(One bytes entry of a committed checkpoint.

Attributes:
  fqn: the entry's name.
  bytes: its stored size.
)doc")
      .def_readonly("fqn", &BytesEntrySummary::fqn)
      .def_readonly("bytes", &BytesEntrySummary::bytes)
      .def("__repr__", [](const BytesEntrySummary& b) {
        return absl::StrCat("BytesEntrySummary(fqn='", b.fqn,
                            "', bytes=", b.bytes, ")");
      });

  py::class_<CheckpointSummary>(
      m, "CheckpointSummary",
      R"doc(What a committed checkpoint holds (Checkpointer.describe).

Attributes:
  info: its CheckpointInfo.
  tensors: list of TensorSummary, sorted by fqn.
  bytes_entries: list of BytesEntrySummary, sorted by fqn.
)doc")
      // Copies (not references into the summary), so they outlive it.
      .def_property_readonly("info",
                             [](const CheckpointSummary& s) { return s.info; })
      .def_property_readonly(
          "tensors", [](const CheckpointSummary& s) { return s.tensors; })
      .def_property_readonly(
          "bytes_entries",
          [](const CheckpointSummary& s) { return s.bytes_entries; })
      .def("__repr__", [](const CheckpointSummary& s) {
        return absl::StrCat("CheckpointSummary(job='", s.info.job,
                            "', step=", s.info.step,
                            ", tensors=", s.tensors.size(),
                            ", bytes_entries=", s.bytes_entries.size(), ")");
      });
}

}  // namespace cairn::python
