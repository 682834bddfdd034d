// absl::Status -> the cairn.errors exceptions (cairn/errors.py), for the
// pybind11 extension `cairn._cairn`.
//
// Every failed libcairn call is raised as cairn.errors.from_status(code name,
// message): e.g. NOT_FOUND -> cairn.NotFoundError, whose message is
// libcairn's (naming job, step, rank, fqn). Never RuntimeError.
#ifndef CAIRN_CLIENT_PYTHON_SRC_ERRORS_H_
#define CAIRN_CLIENT_PYTHON_SRC_ERRORS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cairn::python {

// `status` with "`context`: " in front of its message unless the message
// already names `job` ("job '<job>'"); libcairn names the job in most
// messages, but e.g. "cairnd did not answer" does not.
absl::Status WithJobContext(const absl::Status& status, absl::string_view job,
                            absl::string_view context);

// Sets the Python exception for `status` (which must not be OK) and throws
// pybind11::error_already_set. Requires the GIL.
[[noreturn]] void ThrowStatus(const absl::Status& status);

// Returns normally when `status` is OK; raises its exception otherwise.
inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

// The value of `result`, or raises its error. Requires the GIL.
template <typename T>
T ValueOrThrow(absl::StatusOr<T> result) {
  if (!result.ok()) ThrowStatus(result.status());
  return *std::move(result);
}

}  // namespace cairn::python

#endif  // CAIRN_CLIENT_PYTHON_SRC_ERRORS_H_
