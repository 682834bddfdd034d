#include "server/agent/peer_client.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace cairn::agent {

uint64_t PeerClient::NewTag() {
  return (static_cast<uint64_t>(node_id_) << 40) |
         (next_tag_.fetch_add(1) & ((uint64_t{1} << 40) - 1));
}

absl::StatusOr<v1::PeerResponse> PeerClient::Call(
    int peer, v1::PeerRequest request,
    const std::function<absl::Status()>& after_send) {
  const uint64_t reply_tag = NewTag();
  request.set_reply_tag(reply_tag);
  request.set_from_node(node_id_);
  CAIRN_RETURN_IF_ERROR(transport_.Send(peer, kControlTagBit | NewTag(),
                                        request.SerializeAsString()));
  if (after_send) CAIRN_RETURN_IF_ERROR(after_send());
  CAIRN_ASSIGN_OR_RETURN(std::string reply,
                         transport_.RecvMessage(peer, reply_tag, timeout_));
  v1::PeerResponse response;
  if (!response.ParseFromString(reply)) {
    return absl::DataLossError(
        absl::StrCat("unparsable reply from peer node ", peer));
  }
  return response;
}

}  // namespace cairn::agent
