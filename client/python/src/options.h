// Python keyword options -> client::CheckpointerOptions, shared by
// cairn._cairn.Checkpointer and AgentCheckpointer (its storage fallback).
#ifndef CAIRN_CLIENT_PYTHON_SRC_OPTIONS_H_
#define CAIRN_CLIENT_PYTHON_SRC_OPTIONS_H_

#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/checkpointer.h"

namespace cairn::python {

// The keyword arguments both classes take, as Python passes them. Their
// defaults are libcairn's (DefaultDirectOptions), never written out here or
// in the bindings.
struct DirectOptions {
  std::string coordinator;
  std::string job;
  int rank = 0;
  int world_size = 1;
  int io_threads = 0;
  double rpc_timeout = 0;         // seconds
  double collective_timeout = 0;  // seconds
  int max_retries = 0;
  double first_contact_timeout = 0;  // seconds
  std::string partial_chunk_check;
  bool use_odirect = false;
  // TLS and token for the calls to cairnd; unset: CAIRN_TLS_CA,
  // CAIRN_TLS_CERT, CAIRN_TLS_KEY, CAIRN_TOKEN.
  std::optional<std::string> tls_ca, tls_cert, tls_key, token;
};

// The keyword defaults: a default-constructed client::CheckpointerOptions's
// values, as Python passes them (seconds, "collective").
DirectOptions DefaultDirectOptions();

// The keyword arguments only AgentCheckpointer takes.
struct AgentOnlyOptions {
  int copy_threads = 0;
  double wait_for_space = 0;  // seconds
  bool allow_streaming = false;
};

// Their defaults: a default-constructed client::AgentCheckpointerOptions's.
AgentOnlyOptions DefaultAgentOnlyOptions();

// The keyword defaults as a dict (keyword -> value; None for tls_ca,
// tls_cert, tls_key, token): Checkpointer.default_options() and, with
// `agent`, AgentCheckpointer.default_options(). Requires the GIL.
pybind11::dict DefaultOptionsDict(bool agent);

// "collective", "read_whole" or "none".
const char* PartialChunkCheckName(client::PartialChunkCheck check);

// The options as the two classes' constructors receive them, in the order
// of their keyword arguments.
DirectOptions MakeDirectOptions(std::string coordinator, std::string job,
                                int rank, int world_size, int io_threads,
                                double rpc_timeout, double collective_timeout,
                                int max_retries,
                                std::string partial_chunk_check,
                                bool use_odirect);

// Seconds -> Duration; INVALID_ARGUMENT naming `what`, job and rank for a
// negative or non-finite value.
absl::StatusOr<absl::Duration> SecondsOption(double seconds,
                                             const std::string& what,
                                             const std::string& job, int rank);

// INVALID_ARGUMENT naming the job and rank for an unknown
// partial_chunk_check or a bad duration; Checkpointer::Connect checks the
// rest.
absl::StatusOr<client::CheckpointerOptions> ToCheckpointerOptions(
    const DirectOptions& o);

}  // namespace cairn::python

#endif  // CAIRN_CLIENT_PYTHON_SRC_OPTIONS_H_
