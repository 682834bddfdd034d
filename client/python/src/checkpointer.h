// cairn._cairn.Checkpointer: client::Checkpointer for Python (direct mode).
//
// Every call into libcairn runs with the GIL released. A Checkpointer is
// used by one call at a time (libcairn's contract); a second call from
// another Python thread while one runs raises FailedPreconditionError
// instead of racing.
#ifndef CAIRN_CLIENT_PYTHON_SRC_CHECKPOINTER_H_
#define CAIRN_CLIENT_PYTHON_SRC_CHECKPOINTER_H_

#include <pybind11/pybind11.h>

#include <atomic>
#include <string>

#include "absl/status/status.h"

namespace cairn::python {

// Marks an object busy for the duration of one call; raises
// FailedPreconditionError naming `who` when it already is.
class OneCallAtATime {
 public:
  OneCallAtATime(std::atomic<bool>& busy, const std::string& who,
                 const char* call);
  ~OneCallAtATime();
  OneCallAtATime(const OneCallAtATime&) = delete;
  OneCallAtATime& operator=(const OneCallAtATime&) = delete;

 private:
  std::atomic<bool>& busy_;
};

void RegisterCheckpointer(pybind11::module_& m);

}  // namespace cairn::python

#endif  // CAIRN_CLIENT_PYTHON_SRC_CHECKPOINTER_H_
