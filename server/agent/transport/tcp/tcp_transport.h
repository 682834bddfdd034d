// TcpTransport: the host-memory Transport over plain TCP sockets.
//
// Wire format: each direction of a node pair has its own connection (opened
// lazily by the sender, so a restarted peer is simply reconnected). Every
// frame is
//   magic "CRN2" (u32) | flags (u32) | tag (u64) | length (u64)
//   | crc32c(payload) (u32) | crc32c(header fields above) (u32) | payload
// all little-endian.
//
// Handshake: a connection starts with a hello frame (tag kHelloTag, payload
// version (u32) | sender node id (u32) | cluster token), at most
// kMaxHelloBytes. The receiver answers with one ack
//   magic (u32) | HelloRefusal code (u32) | its max_frame_bytes (u64)
// and, when the code is kAccepted, only ever reads from the connection
// after that. A hello is refused (and the connection closed, with a log
// line) when it is malformed, names a node outside [0, num_nodes), or does
// not carry the configured peer_token (compared in constant time); the
// sender's Send then fails with the reason instead of retrying.
// Connections still in their handshake are handled by the acceptor thread
// itself (non-blocking, no thread each): at most max_pending_connections
// of them (when full, the oldest is closed to make room: a real peer's
// hello takes one round trip, a silent connection gives way), each for at
// most handshake_timeout.
// Connections open at once (in their handshake or authenticated) are capped
// per remote address (max_connections_per_address) and in all
// (max_connections): a connection over a cap is closed as soon as it is
// accepted, with a log line naming its address, so one host cannot take
// the handshake slots of every other.
//
// Frames: a message larger than the receiver's max_frame_bytes is split
// into frames of at most that size (flag kMoreFrames on all but the last),
// sent back to back on the connection. A header is validated (magic, header
// crc, length <= max_frame_bytes, fragments of one tag) before anything is
// allocated for its payload; a bad one closes the connection. So memory
// grows only with bytes that really arrived, never with a length claimed.
//
// Readers: one thread per accepted (authenticated) connection, and at most
// one connection per peer node: a newer hello from the same node replaces
// the older connection (a peer that restarted). Threads are therefore
// bounded by num_nodes + the acceptor + control_threads. A connection with
// no frame for idle_timeout is closed; a sender drops (and reconnects) a
// connection it has not used for idle_timeout / 2, so the receiver never
// closes one the sender is about to write to. A frame whose bytes stop
// coming for io_timeout closes its connection too.
//
// Each verified message either goes to the control handler (tags with
// kControlTagBit) or is queued in a mailbox keyed by (peer, tag) for Recv.
// Control messages of one peer queued or running at once are bounded
// (max_queued_control_messages, max_queued_control_bytes, the message being
// assembled included): a peer over a bound is disconnected, with a log line
// and last_refusal() naming it, and its message dropped. A real peer waits
// for each request's reply, so it has at most its calling threads' worth
// queued.
// Data messages of one peer received and not yet taken by a Recv (its
// mailbox) are bounded too (max_mailbox_messages, max_mailbox_bytes, the
// frames of a message being assembled counted as they arrive, so a message
// of endless frames is cut off): a peer over a bound is disconnected, with a
// log line and last_refusal() naming it, and its unreceived messages are
// dropped (their Recvs fail as for a broken connection). A real peer sends
// data only for transfers the receiver asked for or accepted, so its
// mailbox holds at most those transfers' bytes.
// A corrupt payload is delivered as DATA_LOSS to the matching Recv. A
// message whose Recv timed out (or that the caller Abandon()ed) is dropped
// when it arrives instead of staying in the mailbox forever.
//
// TLS (tls_ca_file, tls_cert_file, tls_key_file): every connection is
// mutual TLS 1.2+ (1.3 preferred) before its hello. Both sides present their
// certificate and verify the other's chain against the CA; a peer without a
// certificate from that CA is refused during the TLS handshake (logged, and
// the sender's Send fails saying "TLS handshake failed"). Host names are not
// checked (peers are addressed by host:port), so the CA must be dedicated to
// the cluster: any certificate it signed is a peer. The hello (and token,
// still checked when set) then travel inside TLS. The acceptor runs the
// server side of the handshake non-blocking in its poll loop, under the same
// handshake_timeout and max_pending_connections. ReloadTls() re-reads the
// files for new connections; open ones keep theirs.
//
// Security without TLS: the token authenticates peers but travels in clear
// text; run the peer network on a trusted fabric (or a VPN) as for NCCL.
//
// Thread-safe (see Transport). Sends to one peer are serialized on its
// connection; sends to different peers run in parallel.
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "common/unique_fd.h"
#include "server/agent/transport/tcp/peer_conn.h"
#include "server/agent/transport/transport.h"

namespace cairn::agent {

struct TcpTransportOptions {
  // This node's id (>= 0). Required.
  int node_id = -1;
  // Nodes of the cluster: hellos from node ids outside [0, num_nodes) are
  // refused. Required (> node_id).
  int num_nodes = 0;
  // host:port to listen on; port 0 picks a free port. Default: 127.0.0.1:0.
  std::string listen_address = "127.0.0.1:0";
  // Returns node `peer`'s listen address (host:port). Called on every
  // (re)connect, so it may re-read a rendezvous directory. An error is
  // retried until connect_timeout, except FAILED_PRECONDITION (no such node
  // exists), which fails the connect at once. Required.
  std::function<absl::StatusOr<std::string>(int peer)> resolve_peer;
  // Shared cluster secret every hello must carry (at most kMaxTokenBytes).
  // Empty: no token is required, so any host that can reach the port may
  // act as a peer by naming a valid node id. Default: empty.
  std::string peer_token;
  // Mutual TLS (see above): PEM files of the cluster CA bundle, this node's
  // certificate (chain; usable as TLS server and client: no extended key
  // usage, or both serverAuth and clientAuth) and its private key. All three
  // or none. Default: none (plain TCP).
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // Largest frame payload this node accepts (senders split messages to fit,
  // see the ack). At least kMinFrameBytes. Default: 32 MiB.
  uint64_t max_frame_bytes = uint64_t{32} << 20;
  // Connections in their handshake held at once; when full, the oldest is
  // closed (with a log line) to make room. Default: 64.
  int max_pending_connections = 64;
  // Time a new connection has to complete its hello. Default: 5 s.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // An accepted connection with no frame for this long is closed. Default:
  // 10 min.
  absl::Duration idle_timeout = absl::Minutes(10);
  // A frame whose bytes stop coming for this long closes its connection.
  // Default: 60 s.
  absl::Duration io_timeout = absl::Seconds(60);
  // Control messages (tags with kControlTagBit) go here. Optional.
  ControlHandler control_handler;
  // Threads running control handlers. Default: 4.
  int control_threads = 4;
  // Control messages of one peer waiting for or running in a handler at
  // once, and their payload bytes (see above). Default: 1024 messages,
  // 256 MiB.
  int max_queued_control_messages = 1024;
  uint64_t max_queued_control_bytes = uint64_t{256} << 20;
  // Data messages of one peer received and not yet taken by a Recv, and
  // their payload bytes with those of the message being assembled (see
  // above). Default: 65536 messages, 1 GiB.
  int max_mailbox_messages = 65536;
  uint64_t max_mailbox_bytes = uint64_t{1} << 30;
  // Connections open at once from one remote IP address, in their handshake
  // or authenticated (an agent has one to each peer, and one replacing it
  // when it reconnects; agents sharing a host share the address). Default:
  // 16.
  int max_connections_per_address = 16;
  // Connections open at once in all. 0: max_pending_connections + 2 x
  // num_nodes (every peer's connection and one replacing it, with a full
  // handshake table). Default: 0.
  int max_connections = 0;
  // Connect timeout, including retries while the peer starts. Default: 5 s.
  absl::Duration connect_timeout = absl::Seconds(5);
};

// Why a hello was refused (sent in the ack).
enum class HelloRefusal : uint32_t {
  kAccepted = 0,
  kMalformed = 1,
  kUnknownNode = 2,
  kBadToken = 3,
};

inline constexpr size_t kMaxTokenBytes = 1024;
inline constexpr size_t kMaxHelloBytes = 8 + kMaxTokenBytes;
inline constexpr uint64_t kMinFrameBytes = 64 << 10;

namespace internal {
inline constexpr size_t kFrameHeaderBytes = 32;
inline constexpr size_t kAckBytes = 16;
inline constexpr uint64_t kHelloTag = ~uint64_t{0};
// Flag of a frame that is not the last of its message.
inline constexpr uint32_t kMoreFrames = 1;
// A frame header (for tests that speak the wire format from raw sockets).
std::string EncodeFrameHeader(uint64_t tag, uint64_t length,
                              uint32_t payload_crc, uint32_t flags);
// A whole hello frame: header + payload.
std::string EncodeHello(int node_id, absl::string_view token);
}  // namespace internal

class TcpTransport : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Start(
      TcpTransportOptions options);
  // The checks Start makes of the TLS files (all three or none; each
  // readable, a certificate or key, the key the certificate's), for a
  // daemon to report before it does anything else.
  static absl::Status CheckTlsOptions(const TcpTransportOptions& options);
  // Closes every connection and joins the threads.
  ~TcpTransport() override;

  absl::string_view name() const override { return "tcp"; }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }
  int node_id() const override { return options_.node_id; }
  int port() const override { return port_; }

  absl::Status Send(int peer, uint64_t tag,
                    absl::Span<const char> data) override;
  absl::Status Recv(int peer, uint64_t tag, absl::Span<char> out,
                    absl::Duration timeout) override;

  absl::StatusOr<std::string> RecvMessage(int peer, uint64_t tag,
                                          absl::Duration timeout) override;
  // The last kMaxAbandoned abandoned tags are remembered.
  void Abandon(int peer, uint64_t tag) override;
  static constexpr size_t kMaxAbandoned = 1 << 16;
  size_t mailbox_size() override;

  // Test hook: the next data frame sent carries a payload byte flipped after
  // its checksum was computed.
  void CorruptNextSendForTest() { corrupt_next_send_ = true; }

  // Re-reads the TLS files: connections opened from now on (both
  // directions) use them; open ones continue with what they had. On error
  // (naming the file) the previous certificates stay in use.
  // FAILED_PRECONDITION when the transport was started without TLS.
  absl::Status ReloadTls() override;
  bool tls() const { return tls_enabled_; }

  // The reason of the last refused peer connection (also logged, at most
  // once a second), for tests.
  std::string last_refusal();

  // Accepted connections with a reader thread now (at most one per peer,
  // plus ones being replaced).
  int reader_threads();

  // Control messages of `peer` waiting for or running in a handler now.
  int queued_control_messages(int peer);

  // Payload bytes of `peer`'s data messages in the mailbox and being
  // assembled now.
  uint64_t mailbox_bytes(int peer);

  // Connections open now (in their handshake or authenticated) from the IP
  // address `ip` ("" = from all addresses).
  int open_connections(const std::string& ip = "");

 private:
  struct Outgoing {
    absl::Mutex mu;
    std::unique_ptr<internal::PeerConn> conn ABSL_GUARDED_BY(mu);
    // The receiver's max frame payload (from its ack).
    uint64_t frame_bytes ABSL_GUARDED_BY(mu) = 0;
    absl::Time last_used ABSL_GUARDED_BY(mu);
  };
  struct Message {
    absl::Status status;  // DATA_LOSS for a corrupt payload
    std::string payload;
  };
  struct Pending;
  struct Reader {
    // Set while the reader runs (closed and reset under mu_ when it ends).
    std::unique_ptr<internal::PeerConn> conn;
    int peer = -1;
    std::string ip;  // remote address, counted in conns_per_ip_
    std::thread thread;
    bool done = false;
  };

  explicit TcpTransport(TcpTransportOptions options);
  void AcceptLoop();
  // Advances a connection's handshake with the bytes readable now. Returns
  // true when it is finished (accepted: handed to a reader; or refused).
  bool AdvanceHandshake(Pending& p);
  HelloRefusal CheckHello(absl::string_view payload, int* peer) const;
  void StartReader(std::unique_ptr<internal::PeerConn> conn, int peer,
                   const std::string& ip);
  // Counts a new connection from `ip`; "" when it fits the caps, else why
  // not (and it is not counted).
  std::string AdmitConnection(const std::string& ip);
  void ReleaseConnection(const std::string& ip)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Disconnect bookkeeping of a peer over its mailbox bound: logs it and
  // drops its unreceived messages.
  void OverMailboxBound(int peer, absl::string_view what);
  void ReadLoop(Reader* reader);
  void LogRefusal(const std::string& from, absl::string_view why);
  // Logs (and records as last_refusal) why `peer` is disconnected for its
  // control messages.
  void OverControlBound(int peer, absl::string_view what);
  void AbandonLocked(const std::pair<int, uint64_t>& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::unique_ptr<internal::PeerConn>> Connect(
      int peer, uint64_t* frame_bytes);
  std::shared_ptr<SSL_CTX> TlsContext();
  absl::Status SendFrames(Outgoing& out, int peer, uint64_t tag,
                          absl::Span<const char> data)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(out.mu);
  Outgoing& OutgoingFor(int peer);

  // Constant after construction.
  const TcpTransportOptions options_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: wakes the acceptor to stop
  int port_ = 0;
  std::unique_ptr<ThreadPool> control_pool_;

  std::atomic<bool> stopping_{false};
  std::atomic<bool> corrupt_next_send_{false};
  std::thread acceptor_;

  absl::Mutex out_mu_;
  std::map<int, std::unique_ptr<Outgoing>> outgoing_ ABSL_GUARDED_BY(out_mu_);

  // TLS: set at Start, swapped by ReloadTls (each SSL holds a reference to
  // the context it was made from).
  bool tls_enabled_ = false;
  absl::Mutex tls_mu_;
  std::shared_ptr<SSL_CTX> tls_ctx_ ABSL_GUARDED_BY(tls_mu_);

  absl::Mutex log_mu_;
  std::string last_refusal_ ABSL_GUARDED_BY(log_mu_);
  absl::Time last_refusal_log_ ABSL_GUARDED_BY(log_mu_) = absl::InfinitePast();
  int64_t refusals_unlogged_ ABSL_GUARDED_BY(log_mu_) = 0;

  // State below is protected by mu_.
  absl::Mutex mu_;
  std::map<std::pair<int, uint64_t>, Message> mailbox_ ABSL_GUARDED_BY(mu_);
  // Connections from each peer currently open (a Recv fails fast when 0
  // after the peer's connection broke).
  absl::flat_hash_map<int, int> open_from_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, int64_t> broken_from_ ABSL_GUARDED_BY(mu_);
  // Tags given up on (Abandon), oldest first.
  std::set<std::pair<int, uint64_t>> abandoned_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<int, uint64_t>> abandoned_order_ ABSL_GUARDED_BY(mu_);
  // Reader threads; finished ones are joined when the next one starts.
  std::list<std::unique_ptr<Reader>> readers_ ABSL_GUARDED_BY(mu_);
  // The newest accepted connection of each peer.
  absl::flat_hash_map<int, Reader*> current_from_ ABSL_GUARDED_BY(mu_);
  // Control messages of each peer waiting for or running in a handler.
  struct ControlQueued {
    int messages = 0;
    uint64_t bytes = 0;
  };
  absl::flat_hash_map<int, ControlQueued> control_queued_ ABSL_GUARDED_BY(mu_);
  // Each peer's data messages in the mailbox (count) and their bytes plus
  // those of messages being assembled.
  struct MailboxUse {
    int messages = 0;
    uint64_t bytes = 0;
  };
  absl::flat_hash_map<int, MailboxUse> mailbox_use_ ABSL_GUARDED_BY(mu_);
  // Open connections (in their handshake or with a reader) by remote IP.
  absl::flat_hash_map<std::string, int> conns_per_ip_ ABSL_GUARDED_BY(mu_);
  int conns_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_TCP_TCP_TRANSPORT_H_
