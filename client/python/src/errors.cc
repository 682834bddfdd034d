// absl::Status -> cairn.errors exceptions (see errors.h).
#include "client/python/src/errors.h"

#include <pybind11/pybind11.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace cairn::python {

namespace py = pybind11;

absl::Status WithJobContext(const absl::Status& status, absl::string_view job,
                            absl::string_view context) {
  if (status.ok() ||
      absl::StrContains(status.message(), absl::StrCat("job '", job, "'"))) {
    return status;
  }
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

void ThrowStatus(const absl::Status& status) {
  const absl::Status s =
      status.ok() ? absl::InternalError("an OK status raised as an error")
                  : status;
  py::object from_status =
      py::module_::import("cairn.errors").attr("from_status");
  py::object exc =
      from_status(absl::StatusCodeToString(s.code()), std::string(s.message()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

}  // namespace cairn::python
