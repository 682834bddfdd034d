// Python keyword options -> client::CheckpointerOptions (see options.h).
#include "client/python/src/options.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/agent/agent_checkpointer.h"
#include "common/status_macros.h"

namespace cairn::python {

namespace py = pybind11;

const char* PartialChunkCheckName(client::PartialChunkCheck check) {
  switch (check) {
    case client::PartialChunkCheck::kCollective:
      return "collective";
    case client::PartialChunkCheck::kReadWhole:
      return "read_whole";
    case client::PartialChunkCheck::kNone:
      return "none";
  }
  return "collective";
}

DirectOptions DefaultDirectOptions() {
  const client::CheckpointerOptions d;
  DirectOptions o;
  o.rank = d.rank;
  o.world_size = d.world_size;
  o.io_threads = d.io_threads;
  o.rpc_timeout = absl::ToDoubleSeconds(d.rpc_timeout);
  o.collective_timeout = absl::ToDoubleSeconds(d.collective_timeout);
  o.max_retries = d.max_retries;
  o.first_contact_timeout = absl::ToDoubleSeconds(d.first_contact_timeout);
  o.partial_chunk_check = PartialChunkCheckName(d.partial_chunk_check);
  o.use_odirect = d.store.use_odirect;
  return o;
}

AgentOnlyOptions DefaultAgentOnlyOptions() {
  const client::AgentCheckpointerOptions d;
  AgentOnlyOptions o;
  o.copy_threads = d.copy_threads;
  o.wait_for_space = absl::ToDoubleSeconds(d.wait_for_space);
  o.allow_streaming = d.allow_streaming;
  return o;
}

py::dict DefaultOptionsDict(bool agent) {
  py::dict out;
  if (agent) {
    const AgentOnlyOptions a = DefaultAgentOnlyOptions();
    out["copy_threads"] = a.copy_threads;
    out["wait_for_space"] = a.wait_for_space;
    out["allow_streaming"] = a.allow_streaming;
  }
  const DirectOptions d = DefaultDirectOptions();
  out["io_threads"] = d.io_threads;
  out["rpc_timeout"] = d.rpc_timeout;
  out["collective_timeout"] = d.collective_timeout;
  out["max_retries"] = d.max_retries;
  out["first_contact_timeout"] = d.first_contact_timeout;
  out["partial_chunk_check"] = d.partial_chunk_check;
  out["use_odirect"] = d.use_odirect;
  for (const char* k : {"tls_ca", "tls_cert", "tls_key", "token"}) {
    out[k] = py::none();
  }
  return out;
}

DirectOptions MakeDirectOptions(std::string coordinator, std::string job,
                                int rank, int world_size, int io_threads,
                                double rpc_timeout, double collective_timeout,
                                int max_retries,
                                std::string partial_chunk_check,
                                bool use_odirect) {
  DirectOptions o;
  o.coordinator = std::move(coordinator);
  o.job = std::move(job);
  o.rank = rank;
  o.world_size = world_size;
  o.io_threads = io_threads;
  o.rpc_timeout = rpc_timeout;
  o.collective_timeout = collective_timeout;
  o.max_retries = max_retries;
  o.partial_chunk_check = std::move(partial_chunk_check);
  o.use_odirect = use_odirect;
  return o;
}

absl::StatusOr<absl::Duration> SecondsOption(double seconds,
                                             const std::string& what,
                                             const std::string& job, int rank) {
  if (!std::isfinite(seconds) || seconds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", job, "' rank ", rank, ": ", what, " = ", seconds,
                     " s is not a finite duration >= 0"));
  }
  return absl::Seconds(seconds);
}

absl::StatusOr<client::CheckpointerOptions> ToCheckpointerOptions(
    const DirectOptions& o) {
  client::CheckpointerOptions out;
  out.coordinator = o.coordinator;
  out.job = o.job;
  out.rank = o.rank;
  out.world_size = o.world_size;
  out.io_threads = o.io_threads;
  CAIRN_ASSIGN_OR_RETURN(
      out.rpc_timeout,
      SecondsOption(o.rpc_timeout, "rpc_timeout", o.job, o.rank));
  CAIRN_ASSIGN_OR_RETURN(
      out.collective_timeout,
      SecondsOption(o.collective_timeout, "collective_timeout", o.job, o.rank));
  out.max_retries = o.max_retries;
  CAIRN_ASSIGN_OR_RETURN(out.first_contact_timeout,
                         SecondsOption(o.first_contact_timeout,
                                       "first_contact_timeout", o.job, o.rank));
  // out.security already holds the environment's settings.
  if (o.tls_ca) out.security.ca_file = *o.tls_ca;
  if (o.tls_cert) out.security.cert_file = *o.tls_cert;
  if (o.tls_key) out.security.key_file = *o.tls_key;
  if (o.token) out.security.token = *o.token;
  if (o.partial_chunk_check == "collective") {
    out.partial_chunk_check = client::PartialChunkCheck::kCollective;
  } else if (o.partial_chunk_check == "read_whole") {
    out.partial_chunk_check = client::PartialChunkCheck::kReadWhole;
  } else if (o.partial_chunk_check == "none") {
    out.partial_chunk_check = client::PartialChunkCheck::kNone;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", o.job, "' rank ", o.rank,
                     ": partial_chunk_check '", o.partial_chunk_check,
                     "' is not one of 'collective', 'read_whole', 'none'"));
  }
  out.store.use_odirect = o.use_odirect;
  return out;
}

}  // namespace cairn::python
