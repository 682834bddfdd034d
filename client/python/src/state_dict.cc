// cairn._cairn.StateDict (see state_dict.h).
#include "client/python/src/state_dict.h"

#include <pybind11/stl.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/python/src/errors.h"
#include "planner/box.h"
#include "planner/dtype.h"

namespace cairn::python {

namespace py = pybind11;

PyStateDict::InUse::InUse(const PyStateDict& state, Access access)
    : state_(state), access_(access) {
  if (state.writers_ > 0 || (access == Access::kWrite && state.readers_ > 0)) {
    ThrowStatus(absl::FailedPreconditionError(
        absl::StrCat("the state dict is in use by a running ",
                     state.writers_ > 0 ? "load" : "save", "; a ",
                     access == Access::kWrite ? "load" : "save",
                     " into/from it must wait until that returns")));
  }
  (access == Access::kWrite ? state.writers_ : state.readers_)++;
}

PyStateDict::InUse::~InUse() {
  (access_ == Access::kWrite ? state_.writers_ : state_.readers_)--;
}

void PyStateDict::CheckNotInUse(const char* call, const std::string& fqn,
                                bool read_only) const {
  if (writers_ > 0 || (!read_only && readers_ > 0)) {
    ThrowStatus(absl::FailedPreconditionError(absl::StrCat(
        call, "('", fqn, "'): the state dict is in use by a running ",
        writers_ > 0 ? "load" : "save", " (call it after that returns)")));
  }
}

void PyStateDict::AddChunks(const std::string& fqn, const std::string& dtype,
                            std::vector<int64_t> global_shape,
                            const std::vector<PyChunk>& chunks) {
  CheckNotInUse("add_chunks", fqn, /*read_only=*/false);
  absl::StatusOr<planner::DType> parsed = planner::ParseDType(dtype);
  if (!parsed.ok()) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat("tensor '", fqn, "': ", parsed.status().message())));
  }
  std::vector<client::TensorChunk> converted;
  converted.reserve(chunks.size());
  for (const auto& [offsets, sizes, ptr, nbytes] : chunks) {
    planner::ChunkBox box{planner::Dims(offsets.begin(), offsets.end()),
                          planner::Dims(sizes.begin(), sizes.end())};
    if (ptr == 0 && nbytes != 0) {
      ThrowStatus(absl::InvalidArgumentError(
          absl::StrCat("tensor '", fqn, "' chunk ", planner::BoxToString(box),
                       ": null address with ", nbytes, " bytes")));
    }
    converted.push_back(client::TensorChunk{
        std::move(box), absl::Span<char>(reinterpret_cast<char*>(ptr),
                                         static_cast<size_t>(nbytes))});
  }
  ThrowIfError(state_.AddChunks(
      fqn, *parsed, planner::Shape(global_shape.begin(), global_shape.end()),
      std::move(converted)));
}

void PyStateDict::AddBytes(const std::string& fqn,
                           std::optional<py::bytes> data) {
  CheckNotInUse("add_bytes", fqn, /*read_only=*/false);
  auto blob = std::make_unique<std::string>();
  if (data.has_value()) *blob = std::string(*data);
  ThrowIfError(state_.AddBytes(fqn, blob.get()));
  blob_by_fqn_[fqn] = blob.get();
  blobs_.push_back(std::move(blob));
}

py::bytes PyStateDict::GetBytes(const std::string& fqn) const {
  CheckNotInUse("get_bytes", fqn, /*read_only=*/true);
  auto it = blob_by_fqn_.find(fqn);
  if (it == blob_by_fqn_.end()) {
    ThrowStatus(absl::NotFoundError(
        absl::StrCat("state dict has no bytes entry '", fqn, "'")));
  }
  return py::bytes(*it->second);
}

size_t PyStateDict::size() const {
  return state_.tensors().size() + state_.bytes().size();
}

void RegisterStateDict(py::module_& m) {
  py::class_<PyStateDict>(
      m, "StateDict",
      R"doc(What one rank saves or loads: chunks of tensors (borrowed memory) and opaque
bytes entries (owned copies).

Tensor memory is borrowed, not copied: the caller keeps every buffer alive,
unchanged (save) or writable (load), until save/load returns. Use
cairn._tensors.buffer_of(t) to get (ptr, nbytes) of a contiguous CPU tensor
or numpy array.

While a save or load uses it (from another thread), it cannot change:
add_chunks and add_bytes raise FailedPreconditionError, and so does
get_bytes during a load.
)doc")
      .def(py::init<>())
      .def("add_chunks", &PyStateDict::AddChunks, py::arg("fqn"),
           py::arg("dtype"), py::arg("global_shape"), py::arg("chunks"),
           R"doc(Adds tensor `fqn` with the chunks this rank holds.

Args:
  fqn: the tensor's unique name, e.g. "model.layers.0.wq".
  dtype: Cairn's dtype name: "float32", "bfloat16", "float16", "float64",
    "int8", "uint8", "int16", "int32", "int64", "bool", "float8_e4m3fn",
    "float8_e5m2".
  global_shape: the whole tensor's shape (all ranks' chunks together).
  chunks: (offsets, sizes, ptr, nbytes) per chunk: its box in global
    coordinates, and the address and length of a contiguous row-major buffer
    of exactly prod(sizes) * itemsize bytes (ptr may be 0 only if nbytes is
    0). An empty list: this rank holds none of it.

Raises:
  InvalidArgumentError naming fqn: unknown dtype, a box outside the shape, a
    buffer of the wrong size, overlapping chunks.
  AlreadyExistsError: the state dict already has an entry `fqn`.
)doc")
      .def(
          "add_bytes", &PyStateDict::AddBytes, py::arg("fqn"),
          py::arg("data") = py::none(),
          R"doc(Adds an opaque bytes entry `fqn` (pickled objects, RNG state, ...).

Args:
  fqn: the entry's unique name.
  data: the bytes to save (copied); None for an entry to load into.

Raises:
  AlreadyExistsError: the state dict already has an entry `fqn`.
)doc")
      .def(
          "get_bytes", &PyStateDict::GetBytes, py::arg("fqn"),
          R"doc(The current value of bytes entry `fqn` (after a load: the loaded bytes).

Raises:
  NotFoundError: no bytes entry `fqn`.
)doc")
      .def("__len__", &PyStateDict::size,
           "Number of tensors plus bytes entries.");
}

}  // namespace cairn::python
