// TcpTransport: the host-memory Transport over plain TCP sockets.
//
// Wire format: each direction of a node pair has its own connection (opened
// lazily by the sender, so a restarted peer is simply reconnected). A
// connection starts with a hello frame naming the sender's node id; then
// every message is one frame:
//   magic "CRNT" (u32) | tag (u64) | length (u64) | crc32c(payload) (u32)
//   | crc32c(header fields above) (u32) | payload
// all little-endian. A reader thread per accepted connection verifies both
// checksums and either hands the message to the control handler (tags with
// kControlTagBit) or queues it in a mailbox keyed by (peer, tag) for Recv.
// A corrupt header closes the connection; a corrupt payload is delivered as
// DATA_LOSS to the matching Recv.
//
// Thread-safe (see Transport). Sends to one peer are serialized on its
// connection; sends to different peers run in parallel.
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "server/agent/transport/transport.h"

namespace cairn::agent {

struct TcpTransportOptions {
  // This node's id (>= 0). Required.
  int node_id = -1;
  // host:port to listen on; port 0 picks a free port. Default: 127.0.0.1:0.
  std::string listen_address = "127.0.0.1:0";
  // Returns node `peer`'s listen address (host:port). Called on every
  // (re)connect, so it may re-read a rendezvous directory. Required.
  std::function<absl::StatusOr<std::string>(int peer)> resolve_peer;
  // Control messages (tags with kControlTagBit) go here. Optional.
  ControlHandler control_handler;
  // Threads running control handlers. Default: 4.
  int control_threads = 4;
  // Connect timeout, including retries while the peer starts. Default: 5 s.
  absl::Duration connect_timeout = absl::Seconds(5);
};

class TcpTransport : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Start(
      TcpTransportOptions options);
  // Closes every connection and joins the threads.
  ~TcpTransport() override;

  absl::string_view name() const override { return "tcp"; }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }
  int node_id() const override { return options_.node_id; }
  int port() const { return port_; }

  absl::Status Send(int peer, uint64_t tag,
                    absl::Span<const char> data) override;
  absl::Status Recv(int peer, uint64_t tag, absl::Span<char> out,
                    absl::Duration timeout) override;

  // Receives a message of any size (control replies).
  absl::StatusOr<std::string> RecvMessage(int peer, uint64_t tag,
                                          absl::Duration timeout);

  // Test hook: the next data frame sent carries a payload byte flipped after
  // its checksum was computed.
  void CorruptNextSendForTest() { corrupt_next_send_ = true; }

 private:
  struct Outgoing {
    absl::Mutex mu;
    int fd ABSL_GUARDED_BY(mu) = -1;
  };
  struct Message {
    absl::Status status;  // DATA_LOSS for a corrupt payload
    std::string payload;
  };

  explicit TcpTransport(TcpTransportOptions options);
  void AcceptLoop();
  void ReadLoop(int fd);
  absl::StatusOr<int> Connect(int peer);
  Outgoing& OutgoingFor(int peer);

  // Constant after construction.
  const TcpTransportOptions options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::unique_ptr<ThreadPool> control_pool_;

  std::atomic<bool> stopping_{false};
  std::atomic<bool> corrupt_next_send_{false};
  std::thread acceptor_;

  absl::Mutex out_mu_;
  std::map<int, std::unique_ptr<Outgoing>> outgoing_ ABSL_GUARDED_BY(out_mu_);

  // State below is protected by mu_.
  absl::Mutex mu_;
  std::map<std::pair<int, uint64_t>, Message> mailbox_ ABSL_GUARDED_BY(mu_);
  // Connections from each peer currently open (a Recv fails fast when 0
  // after the peer had connected).
  absl::flat_hash_map<int, int> open_from_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, int64_t> broken_from_ ABSL_GUARDED_BY(mu_);
  std::vector<int> reader_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> readers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_TCP_TCP_TRANSPORT_H_
