// The pybind11 extension module `cairn._cairn`: libcairn's public API
// (client/checkpointer.h, client/state_dict.h,
// client/agent/agent_checkpointer.h) for Python. The `cairn` package wraps
// it; see client/python/cairn/_cairn.pyi for the interface.
#include <pybind11/pybind11.h>

#include "client/python/src/agent_checkpointer.h"
#include "client/python/src/checkpointer.h"
#include "client/python/src/results.h"
#include "client/python/src/state_dict.h"

PYBIND11_MODULE(_cairn, m) {
  m.doc() =
      "libcairn for Python: StateDict, Checkpointer (direct mode), "
      "AgentCheckpointer and SaveFuture (agent mode). Errors are "
      "cairn.errors exceptions.";
  // Errors are raised through cairn.errors: import it now so a broken
  // package fails at import, not at the first error.
  pybind11::module_::import("cairn.errors");
  cairn::python::RegisterResults(m);
  cairn::python::RegisterStateDict(m);
  cairn::python::RegisterCheckpointer(m);
  cairn::python::RegisterAgentCheckpointer(m);
}
