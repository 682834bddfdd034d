#include "server/coordinator/agent_registry.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace cairn::coordinator {
namespace {

// At most this many holders are named in a "no free id" error.
constexpr int kHoldersNamed = 8;

// `s` shown in an error: escaped and cut to 64 bytes (it may be anything a
// client sent).
std::string Shown(absl::string_view s) {
  std::string out = absl::CHexEscape(s.substr(0, 64));
  if (s.size() > 64) absl::StrAppend(&out, "...");
  return out;
}

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

absl::Status ValidateNodeName(absl::string_view name, absl::string_view field) {
  if (name.empty() || name.size() > kMaxNodeNameBytes ||
      !std::all_of(name.begin(), name.end(), IsNameChar)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " '", Shown(name), "' (", name.size(), " bytes) must be 1 to ",
        kMaxNodeNameBytes,
        " bytes of [A-Za-z0-9._-] (a Kubernetes node name or a host name)"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePeerAddress(absl::string_view address,
                                 absl::string_view field) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " '", Shown(address), "' is not host:port: ", why));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("no ':port'");
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port_text = address.substr(colon + 1);
  int port = 0;
  if (port_text.empty() ||
      !std::all_of(port_text.begin(), port_text.end(), absl::ascii_isdigit) ||
      port_text.size() > 5 || !absl::SimpleAtoi(port_text, &port) || port < 1 ||
      port > 65535) {
    return bad("the port must be 1 to 65535");
  }
  if (host.empty() || host.size() > kMaxNodeNameBytes ||
      !std::all_of(host.begin(), host.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
               c == '-';
      })) {
    return bad("the host must be a host name or an IPv4 address");
  }
  if (host == "0.0.0.0") {
    return bad(
        "0.0.0.0 is a wildcard peers cannot connect to (advertise the pod "
        "or host IP: cairn-agent --peer-advertise)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AgentRegistry>> AgentRegistry::Open(
    storage::Catalog* catalog, int max_agents) {
  if (max_agents < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max agents must be >= 1, got ", max_agents));
  }
  CAIRN_ASSIGN_OR_RETURN(std::vector<v1::AgentRecord> records,
                         catalog->ListAgents());
  std::unique_ptr<AgentRegistry> r(new AgentRegistry(catalog, max_agents));
  absl::MutexLock lock(&r->mu_);
  for (v1::AgentRecord& record : records) {
    auto [it, inserted] =
        r->by_id_.emplace(record.node_id(), record.node_name());
    if (!inserted) {
      return absl::DataLossError(absl::StrCat(
          "catalog: nodes '", it->second, "' and '", record.node_name(),
          "' both hold agent id ", record.node_id()));
    }
    std::string name = record.node_name();
    r->by_name_.emplace(std::move(name), std::move(record));
  }
  return r;
}

absl::StatusOr<v1::RegisterAgentResponse> AgentRegistry::Register(
    const v1::RegisterAgentRequest& request) {
  CAIRN_RETURN_IF_ERROR(
      ValidateNodeName(request.node_name(), "RegisterAgent: node_name"));
  if (!request.peer_address().empty()) {
    CAIRN_RETURN_IF_ERROR(ValidatePeerAddress(request.peer_address(),
                                              "RegisterAgent: peer_address"));
  }
  const std::string& name = request.node_name();
  if (request.num_nodes() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterAgent of node '", name, "': num_nodes ",
                     request.num_nodes(), " must be >= 1"));
  }
  absl::MutexLock lock(&mu_);
  v1::RegisterAgentResponse response;
  v1::AgentRecord record;
  auto known = by_name_.find(name);
  if (known != by_name_.end()) {
    record = known->second;
    if (record.node_id() >= request.num_nodes()) {
      return absl::FailedPreconditionError(
          absl::StrCat("node '", name, "' holds agent id ", record.node_id(),
                       ", which is not below this agent's --num-nodes ",
                       request.num_nodes(), ": raise --num-nodes to at least ",
                       record.node_id() + 1, " on every agent"));
    }
  } else {
    if (static_cast<int>(by_name_.size()) >= max_agents_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "node '", name, "' cannot register: cairnd already records ",
          by_name_.size(),
          " agents (its --max-agents); forget nodes that are "
          "gone (cairn forget-agent NODE)"));
    }
    // The lowest id no recorded name holds.
    int id = 0;
    for (const auto& [held, holder] : by_id_) {
      if (held != id) break;
      ++id;
    }
    if (id >= request.num_nodes()) {
      std::vector<std::string> holders;
      for (const auto& [held, holder] : by_id_) {
        if (held >= request.num_nodes()) break;
        if (static_cast<int>(holders.size()) == kHoldersNamed) {
          holders.push_back("...");
          break;
        }
        holders.push_back(absl::StrCat(holder, "=", held));
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "node '", name, "' cannot get an agent id: ids 0..",
          request.num_nodes() - 1, " (--num-nodes ", request.num_nodes(),
          ") are all held (", absl::StrJoin(holders, ", "),
          "); raise --num-nodes on every agent, or forget nodes that are "
          "gone (cairn forget-agent NODE)"));
    }
    record.set_node_name(name);
    record.set_node_id(id);
    response.set_first_registration(true);
  }
  record.set_peer_address(request.peer_address());
  record.set_registered_unix_micros(absl::ToUnixMicros(absl::Now()));
  CAIRN_RETURN_IF_ERROR(catalog_->PutAgent(record));
  if (response.first_registration()) {
    CAIRN_LOG(info, "agent of node '{}' registered as new node id {} at {}",
              name, record.node_id(), record.peer_address());
  } else if (known->second.peer_address() != record.peer_address()) {
    CAIRN_LOG(info, "agent of node '{}' (id {}) now at '{}' (was '{}')", name,
              record.node_id(), record.peer_address(),
              known->second.peer_address());
  }
  response.set_node_id(record.node_id());
  by_id_[record.node_id()] = name;
  by_name_[name] = std::move(record);
  return response;
}

v1::ListAgentsResponse AgentRegistry::List() const {
  absl::MutexLock lock(&mu_);
  v1::ListAgentsResponse response;
  for (const auto& [id, name] : by_id_) {
    *response.add_agents() = by_name_.at(name);
  }
  return response;
}

absl::StatusOr<v1::ForgetAgentResponse> AgentRegistry::Forget(
    const v1::ForgetAgentRequest& request) {
  CAIRN_RETURN_IF_ERROR(
      ValidateNodeName(request.node_name(), "ForgetAgent: node_name"));
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(request.node_name());
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no agent of node '", request.node_name(), "' is registered"));
  }
  CAIRN_RETURN_IF_ERROR(catalog_->DeleteAgent(request.node_name()));
  v1::ForgetAgentResponse response;
  response.set_node_id(it->second.node_id());
  CAIRN_LOG(info, "agent of node '{}' forgotten: id {} is free",
            request.node_name(), it->second.node_id());
  by_id_.erase(it->second.node_id());
  by_name_.erase(it);
  return response;
}

}  // namespace cairn::coordinator
