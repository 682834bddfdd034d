// NcclTransport: the Transport of `cairn-agent --transport=nccl`. Bulk bytes
// are staged into GPU memory and moved GPU to GPU with ncclSend/ncclRecv
// (through a DeviceLink); everything else runs on the host over an owned
// TcpTransport ("control"), which also gives the peer port, the peer token
// check and the control-message handler.
//
// Messages: control messages (kControlTagBit) and messages of at most
// kInlineBytes travel on the control transport as they are. A larger
// message is announced on the control transport — announce frame
//   magic "CRNA" (u32) | reserved (u32) | tag (u64) | length (u64) | seq (u64)
// little-endian, seq counting this sender's device messages to the receiver
// — and then sent on the device link. NCCL carries neither tag nor
// checksum and matches a pair's calls in issue order, so the receiver posts
// its device Recvs in announce order (a "pump" per direction, ordered by
// seq) and files each message under its announced tag in a mailbox; a
// Recv/RecvMessage then takes it from there as with tcp. End-to-end
// integrity stays with the agent, which verifies every item's crc32c.
//
// No deadlock: device calls of one direction (up: to higher node ids, down:
// to lower) are serialized by one lock; a sender holds it from its announce
// until the peer received the bytes, the receiver's pump takes it only for
// announced messages (the sender is already sending). A wait therefore only
// ever points to a higher node on "up" and a lower node on "down". Control
// handlers run on this transport's own bounded pool, so announces are never
// stuck behind handlers blocked in device sends.
//
// Bootstrap (lazy, collective): on first use, or when asked by a peer, node 0
// makes the communicator ids (DeviceLink::NewUniqueId) and sends them to
// every node on the control transport; each node then joins
// (DeviceLink::Init) in the background. A node that cannot join within
// init_timeout fails its device messages with that error (and retries on
// the next one). Nodes that never send still join: the ids reach them.
//
// A device message is bounded by transfer_timeout on both sides (see
// NcclTransportOptions): a peer dying mid-transfer fails it naming the peer
// instead of hanging the sender, or the receiver's pump and with it every
// later message of that direction.
//
// Thread-safe (see Transport).
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_NCCL_NCCL_TRANSPORT_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_NCCL_NCCL_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "server/agent/transport/nccl/device_link.h"
#include "server/agent/transport/tcp/tcp_transport.h"

namespace cairn::agent {

struct NcclTransportOptions {
  // The control transport (peer port, token, control handler). Required.
  TcpTransportOptions control;
  // How long a node waits for every node to join the communicators.
  // Default: 60 s.
  absl::Duration init_timeout = absl::Seconds(60);
  // Threads running control handlers (see above). Default: 8.
  int handler_threads = 8;
  // Largest device message accepted from a peer (the agent sets its
  // staging budget). Default: 1 GiB.
  uint64_t max_message_bytes = uint64_t{1} << 30;
  // How long one device message may take on the device link, sending or
  // receiving (including waiting for the peer's earlier messages of that
  // direction). A peer that dies or stalls mid-transfer never completes its
  // side: past this the communicator of that direction is aborted and the
  // message fails DEADLINE_EXCEEDED naming the peer node and its address;
  // later device messages of that direction fail at once with the reason
  // (loads fall back to storage) until the agents restart together.
  // Default: 2 minutes.
  absl::Duration transfer_timeout = absl::Minutes(2);
};

namespace internal {
// Control tags reserved by the NCCL transport: the agent's tags carry a node
// id below 2^22 in bits 40..61, so bit 62 is never set by them.
inline constexpr uint64_t kNcclTagBase = kControlTagBit | (uint64_t{1} << 62);
inline constexpr uint64_t kNcclAnnounceTag = kNcclTagBase | 1;
inline constexpr uint64_t kNcclInitRequestTag = kNcclTagBase | 2;
inline constexpr uint64_t kNcclInitIdsTag = kNcclTagBase | 3;
inline constexpr size_t kAnnounceBytes = 32;

struct Announce {
  uint64_t tag = 0;
  uint64_t length = 0;
  uint64_t seq = 0;
};
std::string EncodeAnnounce(const Announce& a);
// INVALID_ARGUMENT for a frame that is not an announce.
absl::StatusOr<Announce> DecodeAnnounce(absl::string_view frame);
}  // namespace internal

class NcclTransport : public Transport {
 public:
  // Messages up to this size go on the control transport, not the device.
  static constexpr uint64_t kInlineBytes = 64 << 10;

  // Starts the control transport; the device link joins lazily (see above).
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Start(
      NcclTransportOptions options, std::unique_ptr<DeviceLink> link);
  ~NcclTransport() override;

  absl::string_view name() const override { return "nccl"; }
  MemoryKind memory_kind() const override { return MemoryKind::kDevice; }
  int node_id() const override { return node_; }
  int port() const override { return control_->port(); }
  absl::Status ReloadTls() override { return control_->ReloadTls(); }

  absl::Status Send(int peer, uint64_t tag,
                    absl::Span<const char> data) override;
  absl::Status Recv(int peer, uint64_t tag, absl::Span<char> out,
                    absl::Duration timeout) override;
  absl::StatusOr<std::string> RecvMessage(int peer, uint64_t tag,
                                          absl::Duration timeout) override;
  void Abandon(int peer, uint64_t tag) override;
  size_t mailbox_size() override;

  // Messages that went through the device link, sent and received.
  uint64_t device_messages_sent();
  uint64_t device_messages_received();

 private:
  struct Direction {
    absl::Mutex mu;  // serializes device calls of this direction
    std::map<int, uint64_t> sent ABSL_GUARDED_BY(mu);  // announces per peer
  };
  struct Pump {
    absl::Mutex mu;
    // Announces by (peer, seq), consumed in seq order per peer.
    std::map<std::pair<int, uint64_t>, internal::Announce> pending
        ABSL_GUARDED_BY(mu);
    std::map<int, uint64_t> next_seq ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
    std::thread thread;
  };

  NcclTransport(NcclTransportOptions options, std::unique_ptr<DeviceLink> link);
  void OnControl(int peer, uint64_t tag, std::string payload);
  void PumpLoop(bool up);
  // Starts joining the communicators (once; again after a failure).
  void StartInit() ABSL_LOCKS_EXCLUDED(init_mu_);
  void InitThread();
  absl::Status EnsureInit();
  void Deliver(int peer, uint64_t tag, absl::Status status,
               std::string payload);
  Direction& DirectionTo(int peer) { return peer > node_ ? up_ : down_; }
  // "node <peer> (<address>)" for errors (the address from resolve_peer).
  std::string PeerName(int peer) const;

  // Constant after construction.
  const NcclTransportOptions options_;
  const int node_;
  const int num_nodes_;
  const std::unique_ptr<DeviceLink> link_;
  std::unique_ptr<ThreadPool> handlers_;
  std::unique_ptr<TcpTransport> control_;

  Direction up_, down_;
  Pump up_pump_, down_pump_;

  // Bootstrap state.
  absl::Mutex init_mu_;
  bool init_running_ ABSL_GUARDED_BY(init_mu_) = false;
  bool init_done_ ABSL_GUARDED_BY(init_mu_) = false;
  absl::Status init_status_ ABSL_GUARDED_BY(init_mu_);
  std::string up_id_ ABSL_GUARDED_BY(init_mu_);
  std::string down_id_ ABSL_GUARDED_BY(init_mu_);
  bool stopping_ ABSL_GUARDED_BY(init_mu_) = false;
  std::thread init_thread_ ABSL_GUARDED_BY(init_mu_);

  // State below is protected by mu_.
  absl::Mutex mu_;
  struct Message {
    absl::Status status;
    std::string payload;
  };
  std::map<std::pair<int, uint64_t>, Message> mailbox_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<int, uint64_t>> abandoned_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<int, uint64_t>> abandoned_order_ ABSL_GUARDED_BY(mu_);
  uint64_t device_sent_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t device_received_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_NCCL_NCCL_TRANSPORT_H_
