// cairn._cairn.AgentCheckpointer and SaveFuture: client::AgentCheckpointer
// (agent mode: async saves through the node-local cairn-agent) for Python.
#ifndef CAIRN_CLIENT_PYTHON_SRC_AGENT_CHECKPOINTER_H_
#define CAIRN_CLIENT_PYTHON_SRC_AGENT_CHECKPOINTER_H_

#include <pybind11/pybind11.h>

namespace cairn::python {

void RegisterAgentCheckpointer(pybind11::module_& m);

}  // namespace cairn::python

#endif  // CAIRN_CLIENT_PYTHON_SRC_AGENT_CHECKPOINTER_H_
