// Python keyword options -> client::CheckpointerOptions, shared by
// cairn._cairn.Checkpointer and AgentCheckpointer (its storage fallback).
#ifndef CAIRN_CLIENT_PYTHON_SRC_OPTIONS_H_
#define CAIRN_CLIENT_PYTHON_SRC_OPTIONS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/checkpointer.h"

namespace cairn::python {

// The keyword arguments both classes take, as Python passes them.
struct DirectOptions {
  std::string coordinator;
  std::string job;
  int rank = 0;
  int world_size = 1;
  int io_threads = 4;
  double rpc_timeout = 300.0;          // seconds
  double collective_timeout = 3900.0;  // seconds
  int max_retries = 16;
  std::string partial_chunk_check = "collective";
  bool use_odirect = true;
  // TLS and token for the calls to cairnd; unset: CAIRN_TLS_CA,
  // CAIRN_TLS_CERT, CAIRN_TLS_KEY, CAIRN_TOKEN.
  std::optional<std::string> tls_ca, tls_cert, tls_key, token;
};

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
