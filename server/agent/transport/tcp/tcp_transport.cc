#include "server/agent/transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/little_endian.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "storage/checksum.h"

namespace cairn::agent {
namespace {

using internal::kAckBytes;
using internal::kFrameHeaderBytes;
using internal::kHelloTag;
using internal::kMoreFrames;
using internal::PeerConn;

constexpr uint32_t kMagic = 0x324e5243;     // "CRN2"
constexpr uint32_t kAckMagic = 0x414e5243;  // "CRNA"
constexpr uint32_t kHelloVersion = 1;

struct Header {
  uint32_t flags = 0;
  uint64_t tag = 0;
  uint64_t length = 0;
  uint32_t payload_crc = 0;
};

void Encode(const Header& h, char* out) {
  little_endian::Store32(out, kMagic);
  little_endian::Store32(out + 4, h.flags);
  little_endian::Store64(out + 8, h.tag);
  little_endian::Store64(out + 16, h.length);
  little_endian::Store32(out + 24, h.payload_crc);
  little_endian::Store32(out + 28, storage::Crc32c(out, 28));
}

bool Decode(const char* in, Header* h) {
  if (little_endian::Load32(in) != kMagic ||
      little_endian::Load32(in + 28) != storage::Crc32c(in, 28)) {
    return false;
  }
  h->flags = little_endian::Load32(in + 4);
  h->tag = little_endian::Load64(in + 8);
  h->length = little_endian::Load64(in + 16);
  h->payload_crc = little_endian::Load32(in + 24);
  return true;
}

// Equal length and bytes, in time independent of where they differ.
bool TokensEqual(absl::string_view got, absl::string_view want) {
  unsigned char diff = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    const char g = i < got.size() ? got[i] : 0;
    diff |= static_cast<unsigned char>(g ^ want[i]);
  }
  return diff == 0;
}

absl::StatusOr<sockaddr_in> ParseAddress(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad peer address '", address, "': want host:port"));
  }
  std::string host(address.substr(0, colon));
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot resolve host of '", address, "'"));
    }
    sa.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
  }
  return sa;
}

std::string IpString(const sockaddr_in& sa) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
  return ip;
}

std::string AddressString(const sockaddr_in& sa) {
  return absl::StrCat(IpString(sa), ":", ntohs(sa.sin_port));
}

void TuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

void SetNonBlocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

const char* RefusalText(HelloRefusal r) {
  switch (r) {
    case HelloRefusal::kAccepted:
      return "accepted";
    case HelloRefusal::kMalformed:
      return "malformed hello (a different cairn-agent version?)";
    case HelloRefusal::kUnknownNode:
      return "unknown node id (check --num-nodes / --peers on every agent)";
    case HelloRefusal::kBadToken:
      return "wrong cluster token (every agent needs the same "
             "--peer-token-file / CAIRN_PEER_TOKEN)";
  }
  return "refused";
}

}  // namespace

namespace internal {

std::string EncodeFrameHeader(uint64_t tag, uint64_t length,
                              uint32_t payload_crc, uint32_t flags) {
  std::string out(kFrameHeaderBytes, '\0');
  Header h;
  h.flags = flags;
  h.tag = tag;
  h.length = length;
  h.payload_crc = payload_crc;
  Encode(h, out.data());
  return out;
}

std::string EncodeHello(int node_id, absl::string_view token) {
  std::string payload;
  payload.reserve(8 + token.size());
  little_endian::Append32(&payload, kHelloVersion);
  little_endian::Append32(&payload, static_cast<uint32_t>(node_id));
  payload.append(token.data(), token.size());
  return EncodeFrameHeader(kHelloTag, payload.size(),
                           storage::Crc32c(payload.data(), payload.size()), 0) +
         payload;
}

}  // namespace internal

// A connection in its handshake (owned by the acceptor thread).
struct TcpTransport::Pending {
  std::unique_ptr<PeerConn> conn;  // null once finished
  bool tls_done = false;           // TLS handshake done (or no TLS)
  std::string from;                // remote address, for logs
  std::string ip;                  // its IP, counted in conns_per_ip_
  absl::Time deadline;
  std::string buf;         // bytes of the hello read so far
  uint64_t hello_len = 0;  // payload length, once the header is in
};

namespace {

// The TLS context of `options`, or null when it has no TLS files.
absl::StatusOr<std::shared_ptr<SSL_CTX>> LoadTlsContext(
    const TcpTransportOptions& options) {
  const internal::PeerTlsFiles files{options.tls_ca_file, options.tls_cert_file,
                                     options.tls_key_file};
  if (!files.any()) return nullptr;
  // All three or none: half a TLS setup is a mistake, not plain TCP.
  for (const auto& [file, flag] :
       {std::pair(&files.ca_file, "--peer-tls-ca"),
        std::pair(&files.cert_file, "--peer-tls-cert"),
        std::pair(&files.key_file, "--peer-tls-key")}) {
    if (file->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer TLS needs --peer-tls-ca, --peer-tls-cert and "
                       "--peer-tls-key together; ",
                       flag, " is missing"));
    }
  }
  return internal::LoadPeerTlsContext(files);
}

}  // namespace

absl::Status TcpTransport::CheckTlsOptions(const TcpTransportOptions& options) {
  return LoadTlsContext(options).status();
}

TcpTransport::TcpTransport(TcpTransportOptions options)
    : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Start(
    TcpTransportOptions options) {
  if (options.node_id < 0 || !options.resolve_peer ||
      options.num_nodes <= options.node_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tcp transport needs a node id >= 0 below num_nodes (node ",
        options.node_id, ", num_nodes ", options.num_nodes,
        ") and a peer resolver"));
  }
  if (options.peer_token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the peer token has ", options.peer_token.size(),
                     " bytes; at most ", kMaxTokenBytes, " are allowed"));
  }
  if (options.max_frame_bytes < kMinFrameBytes ||
      options.max_pending_connections < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tcp transport: max_frame_bytes must be >= ", kMinFrameBytes, " (got ",
        options.max_frame_bytes, ") and max_pending_connections >= 1 (got ",
        options.max_pending_connections, ")"));
  }
  if (options.max_connections_per_address < 1 || options.max_connections < 0 ||
      options.max_mailbox_messages < 1 || options.max_mailbox_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tcp transport: max_connections_per_address (got ",
        options.max_connections_per_address, "), max_mailbox_messages (got ",
        options.max_mailbox_messages, ") and max_mailbox_bytes (got ",
        options.max_mailbox_bytes, ") must be >= 1, max_connections >= 0 (got ",
        options.max_connections, ")"));
  }
  if (options.max_connections == 0) {
    options.max_connections = options.max_pending_connections +
                              static_cast<int>(std::min<int64_t>(
                                  int64_t{2} * options.num_nodes,
                                  std::numeric_limits<int>::max() / 2));
  }
  CAIRN_ASSIGN_OR_RETURN(std::shared_ptr<SSL_CTX> tls_ctx,
                         LoadTlsContext(options));
  CAIRN_ASSIGN_OR_RETURN(sockaddr_in sa, ParseAddress(options.listen_address));
  std::unique_ptr<TcpTransport> t(new TcpTransport(std::move(options)));
  t->tls_enabled_ = tls_ctx != nullptr;
  {
    absl::MutexLock l(&t->tls_mu_);
    t->tls_ctx_ = std::move(tls_ctx);
  }
  t->listen_fd_.Reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int listen_fd = t->listen_fd_.get();
  int one = 1;
  setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listen_fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      listen(listen_fd, 128) != 0) {
    const int err = errno;
    t->listen_fd_.Reset();
    return absl::UnavailableError(
        absl::StrCat("node ", t->options_.node_id, ": cannot listen on ",
                     t->options_.listen_address, ": ", strerror(err)));
  }
  SetNonBlocking(listen_fd, true);
  t->wake_fd_.Reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!t->wake_fd_.valid()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("eventfd: ", strerror(errno)));
  }
  socklen_t len = sizeof(sa);
  getsockname(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len);
  t->port_ = ntohs(sa.sin_port);
  t->control_pool_ =
      std::make_unique<ThreadPool>(std::max(1, t->options_.control_threads));
  t->acceptor_ = std::thread([p = t.get()] { p->AcceptLoop(); });
  return t;
}

TcpTransport::~TcpTransport() {
  stopping_ = true;
  if (wake_fd_.valid()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_.get(), &one, sizeof(one));
  }
  if (acceptor_.joinable()) acceptor_.join();
  listen_fd_.Reset();
  wake_fd_.Reset();
  std::list<std::unique_ptr<Reader>> readers;
  {
    absl::MutexLock l(&mu_);
    for (auto& r : readers_) {
      if (r->conn != nullptr) r->conn->Shutdown();
    }
    readers.swap(readers_);
  }
  for (auto& r : readers) r->thread.join();
  {
    absl::MutexLock l(&out_mu_);
    for (auto& [peer, out] : outgoing_) {
      absl::MutexLock ol(&out->mu);
      out->conn.reset();
    }
  }
  control_pool_.reset();  // drains pending control handlers
}

std::string TcpTransport::last_refusal() {
  absl::MutexLock l(&log_mu_);
  return last_refusal_;
}

std::shared_ptr<SSL_CTX> TcpTransport::TlsContext() {
  absl::MutexLock l(&tls_mu_);
  return tls_ctx_;
}

absl::Status TcpTransport::ReloadTls() {
  if (!tls_enabled_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", options_.node_id, ": the peer transport runs without TLS"));
  }
  CAIRN_ASSIGN_OR_RETURN(std::shared_ptr<SSL_CTX> ctx,
                         internal::LoadPeerTlsContext({options_.tls_ca_file,
                                                       options_.tls_cert_file,
                                                       options_.tls_key_file}));
  absl::MutexLock l(&tls_mu_);
  tls_ctx_ = std::move(ctx);
  return absl::OkStatus();
}

int TcpTransport::reader_threads() {
  absl::MutexLock l(&mu_);
  int n = 0;
  for (const auto& r : readers_) n += r->done ? 0 : 1;
  return n;
}

int TcpTransport::queued_control_messages(int peer) {
  absl::MutexLock l(&mu_);
  auto it = control_queued_.find(peer);
  return it == control_queued_.end() ? 0 : it->second.messages;
}

uint64_t TcpTransport::mailbox_bytes(int peer) {
  absl::MutexLock l(&mu_);
  auto it = mailbox_use_.find(peer);
  return it == mailbox_use_.end() ? 0 : it->second.bytes;
}

int TcpTransport::open_connections(const std::string& ip) {
  absl::MutexLock l(&mu_);
  if (ip.empty()) return conns_;
  auto it = conns_per_ip_.find(ip);
  return it == conns_per_ip_.end() ? 0 : it->second;
}

std::string TcpTransport::AdmitConnection(const std::string& ip) {
  absl::MutexLock l(&mu_);
  int& from_ip = conns_per_ip_[ip];
  std::string why;
  if (from_ip >= options_.max_connections_per_address) {
    why = absl::StrCat(from_ip,
                       " connections from this address are open, the most "
                       "one address may have (max_connections_per_address ",
                       options_.max_connections_per_address, ")");
  } else if (conns_ >= options_.max_connections) {
    why = absl::StrCat(conns_,
                       " peer connections are open, the most this node "
                       "takes (max_connections ",
                       options_.max_connections, ")");
  }
  if (!why.empty()) {
    if (from_ip == 0) conns_per_ip_.erase(ip);
    return why;
  }
  ++from_ip;
  ++conns_;
  return "";
}

void TcpTransport::ReleaseConnection(const std::string& ip) {
  auto it = conns_per_ip_.find(ip);
  if (it != conns_per_ip_.end() && --it->second <= 0) conns_per_ip_.erase(it);
  --conns_;
}

void TcpTransport::OverMailboxBound(int peer, absl::string_view what) {
  size_t dropped = 0;
  {
    absl::MutexLock l(&mu_);
    MailboxUse& use = mailbox_use_[peer];
    for (auto it = mailbox_.lower_bound({peer, 0});
         it != mailbox_.end() && it->first.first == peer;) {
      use.bytes -= it->second.payload.size();
      --use.messages;
      it = mailbox_.erase(it);
      ++dropped;
    }
    // What remains is the message being assembled: its reader gives it
    // back as it ends.
  }
  OverControlBound(peer, absl::StrCat(what, "; dropping its ", dropped,
                                      " unreceived messages"));
}

void TcpTransport::OverControlBound(int peer, absl::string_view what) {
  // Every time (not rate-limited as refusals are): a peer is disconnected
  // for this at most once per connection it opens, and it says which.
  CAIRN_LOG(warn, "node {}: disconnecting node {}: {}", options_.node_id, peer,
            std::string(what));
  absl::MutexLock l(&log_mu_);
  last_refusal_ = absl::StrCat("node ", peer, ": ", what);
}

void TcpTransport::LogRefusal(const std::string& from, absl::string_view why) {
  // At most one line a second, so a flood cannot flood the log.
  absl::MutexLock l(&log_mu_);
  last_refusal_ = absl::StrCat(from, ": ", why);
  const absl::Time now = absl::Now();
  if (now - last_refusal_log_ < absl::Seconds(1)) {
    ++refusals_unlogged_;
    return;
  }
  CAIRN_LOG(warn,
            "node {}: refused a peer connection from {}: {} ({} more refused "
            "since the last such line)",
            options_.node_id, from, std::string(why), refusals_unlogged_);
  last_refusal_log_ = now;
  refusals_unlogged_ = 0;
}

void TcpTransport::AcceptLoop() {
  std::vector<std::unique_ptr<Pending>> pending;
  std::vector<pollfd> fds;
  while (!stopping_) {
    fds.clear();
    fds.push_back({listen_fd_.get(), POLLIN, 0});
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    absl::Time first_deadline = absl::InfiniteFuture();
    for (const auto& p : pending) {
      // A TLS handshake may need to write (its ServerHello and certificate
      // when the socket buffer is full).
      const bool out = !p->tls_done && p->conn->want_write();
      fds.push_back({p->conn->fd(),
                     static_cast<short>(POLLIN | POLLRDHUP |  // NOLINT
                                        (out ? POLLOUT : 0)),
                     0});
      first_deadline = std::min(first_deadline, p->deadline);
    }
    const int n = poll(
        fds.data(), fds.size(),
        pending.empty() ? -1
                        : internal::PollMillis(first_deadline - absl::Now()));
    if (n < 0 && errno != EINTR) {
      CAIRN_LOG(error, "node {}: peer acceptor poll: {}", options_.node_id,
                strerror(errno));
      absl::SleepFor(absl::Milliseconds(10));  // back off, then retry
      continue;
    }
    if (stopping_) break;
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = *pending[i];
      bool finished = false;
      if (n > 0 && fds[2 + i].revents != 0) finished = AdvanceHandshake(p);
      if (!finished && now >= p.deadline) {
        LogRefusal(p.from,
                   absl::StrCat(
                       p.tls_done ? "no hello" : "no TLS handshake", " within ",
                       absl::FormatDuration(options_.handshake_timeout)));
        finished = true;
      }
      if (finished) {
        // Still here: refused or timed out, never handed to a reader.
        if (p.conn != nullptr) {
          absl::MutexLock l(&mu_);
          ReleaseConnection(p.ip);
        }
        p.conn.reset();
      }
    }
    pending.erase(
        std::remove_if(pending.begin(), pending.end(),
                       [](const auto& p) { return p->conn == nullptr; }),
        pending.end());
    if (n <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    while (true) {
      sockaddr_in from{};
      socklen_t len = sizeof(from);
      UniqueFd fd(accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&from),
                          &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!fd.valid()) {
        if (errno == EINTR) continue;
        if (errno == EMFILE || errno == ENFILE) {
          LogRefusal("(not accepted)", strerror(errno));
          absl::SleepFor(absl::Milliseconds(10));  // back off, then retry
        }
        break;
      }
      // Over a cap: closed before anything else is done for it (and
      // before it could make an older connection give way below).
      const std::string ip = IpString(from);
      if (const std::string why = AdmitConnection(ip); !why.empty()) {
        LogRefusal(AddressString(from), why);
        continue;
      }
      if (static_cast<int>(pending.size()) >=
          options_.max_pending_connections) {
        // Full: the oldest gives way. A peer's hello takes one round trip,
        // so silent connections cannot keep a real peer out this way.
        LogRefusal(pending.front()->from,
                   absl::StrCat("no hello yet while ", pending.size(),
                                " connections are in their handshake"));
        {
          absl::MutexLock l(&mu_);
          ReleaseConnection(pending.front()->ip);
        }
        pending.erase(pending.begin());
      }
      auto p = std::make_unique<Pending>();
      SSL* ssl = nullptr;
      if (tls_enabled_) {
        ssl = SSL_new(TlsContext().get());
        if (ssl == nullptr || SSL_set_fd(ssl, fd.get()) != 1) {
          LogRefusal(AddressString(from),
                     absl::StrCat("SSL_new: ", internal::TlsErrorText(ssl)));
          if (ssl != nullptr) SSL_free(ssl);
          fd.Reset();
          absl::MutexLock l(&mu_);
          ReleaseConnection(ip);
          continue;
        }
        SSL_set_accept_state(ssl);
      }
      p->conn = std::make_unique<PeerConn>(std::move(fd), ssl);
      p->tls_done = ssl == nullptr;
      p->from = AddressString(from);
      p->ip = ip;
      p->deadline = now + options_.handshake_timeout;
      pending.push_back(std::move(p));
    }
  }
  {
    absl::MutexLock l(&mu_);
    for (const auto& p : pending) {
      if (p->conn != nullptr) ReleaseConnection(p->ip);
    }
  }
  pending.clear();  // closes them
}

bool TcpTransport::AdvanceHandshake(Pending& p) {
  PeerConn& conn = *p.conn;
  if (!p.tls_done) {
    const int r = conn.AdvanceAccept();
    if (r == 0) return false;  // more round trips to come
    if (r < 0) {
      LogRefusal(p.from, absl::StrCat("TLS handshake failed: ", conn.error()));
      return true;
    }
    p.tls_done = true;
  }
  HelloRefusal refusal = HelloRefusal::kMalformed;
  std::string why;
  int peer = -1;
  // Read until the socket has nothing more: with TLS, bytes of the hello
  // may already be decrypted and buffered, where poll would not see them.
  while (why.empty()) {
    const size_t want = p.buf.size() < kFrameHeaderBytes
                            ? kFrameHeaderBytes
                            : kFrameHeaderBytes + p.hello_len;
    char tmp[kFrameHeaderBytes + kMaxHelloBytes];
    const long r = conn.ReadSome(tmp, want - p.buf.size());  // NOLINT
    if (r == 0) return false;
    if (r < 0) {
      LogRefusal(p.from, absl::StrCat("closed before its hello was complete (",
                                      conn.error(), ")"));
      return true;
    }
    p.buf.append(tmp, static_cast<size_t>(r));
    if (p.buf.size() == kFrameHeaderBytes && p.hello_len == 0) {
      Header h;
      if (!Decode(p.buf.data(), &h) || h.tag != kHelloTag || h.flags != 0 ||
          h.length < 8 || h.length > kMaxHelloBytes) {
        why = "not a hello frame";
      } else {
        p.hello_len = h.length;
      }
    } else if (p.buf.size() == kFrameHeaderBytes + p.hello_len) {
      Header h;
      Decode(p.buf.data(), &h);
      const absl::string_view payload =
          absl::string_view(p.buf).substr(kFrameHeaderBytes);
      if (storage::Crc32c(payload.data(), payload.size()) != h.payload_crc) {
        why = "hello checksum mismatch";
      } else {
        refusal = CheckHello(payload, &peer);
        why = RefusalText(refusal);
      }
    }
  }
  char ack[kAckBytes];
  little_endian::Store32(ack, kAckMagic);
  little_endian::Store32(ack + 4, static_cast<uint32_t>(refusal));
  little_endian::Store64(ack + 8, options_.max_frame_bytes);
  // 16 bytes (one small TLS record) into a fresh socket's buffer: never
  // blocks, and the acceptor must not wait if it somehow would.
  const bool sent =
      conn.WriteFull(ack, sizeof(ack), nullptr, 0, absl::ZeroDuration());
  if (refusal != HelloRefusal::kAccepted || !sent) {
    LogRefusal(p.from,
               peer >= 0 ? absl::StrCat("node ", peer, ": ", why) : why);
    return true;
  }
  // The socket stays non-blocking: the reader waits in poll with its
  // timeouts, so a TLS record cut short cannot block it inside SSL_read.
  TuneSocket(conn.fd());
  StartReader(std::move(p.conn), peer, p.ip);
  return true;
}

HelloRefusal TcpTransport::CheckHello(absl::string_view payload,
                                      int* peer) const {
  const uint32_t version = little_endian::Load32(payload.data());
  const uint32_t node = little_endian::Load32(payload.data() + 4);
  if (version != kHelloVersion) return HelloRefusal::kMalformed;
  // Check the token first, so an unknown node learns nothing more.
  if (!TokensEqual(payload.substr(8), options_.peer_token)) {
    return HelloRefusal::kBadToken;
  }
  if (node >= static_cast<uint32_t>(options_.num_nodes) ||
      static_cast<int>(node) == options_.node_id) {
    return HelloRefusal::kUnknownNode;
  }
  *peer = static_cast<int>(node);
  return HelloRefusal::kAccepted;
}

void TcpTransport::StartReader(std::unique_ptr<PeerConn> conn, int peer,
                               const std::string& ip) {
  std::list<std::unique_ptr<Reader>> finished;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) {
      ReleaseConnection(ip);
      return;  // closes conn
    }
    for (auto it = readers_.begin(); it != readers_.end();) {
      if ((*it)->done) {
        finished.push_back(std::move(*it));
        it = readers_.erase(it);
      } else {
        ++it;
      }
    }
    auto r = std::make_unique<Reader>();
    r->conn = std::move(conn);
    r->peer = peer;
    r->ip = ip;
    Reader*& current = current_from_[peer];
    if (current != nullptr && current->conn != nullptr) {
      // One connection per peer: a new hello means the peer reconnected
      // (e.g. it restarted); its old connection is dead or about to be.
      CAIRN_LOG(info,
                "node {}: node {} reconnected; closing its older "
                "connection",
                options_.node_id, peer);
      current->conn->Shutdown();
    }
    current = r.get();
    ++open_from_[peer];
    r->thread = std::thread([this, p = r.get()] { ReadLoop(p); });
    readers_.push_back(std::move(r));
  }
  for (auto& r : finished) r->thread.join();
}

void TcpTransport::ReadLoop(Reader* reader) {
  PeerConn& conn = *reader->conn;
  const int peer = reader->peer;
  char hbuf[kFrameHeaderBytes];
  Header h;
  // The message being assembled from frames.
  std::string payload;
  uint64_t tag = 0;
  bool more = false;
  absl::Status status;
  bool idle = false;
  // Bytes of the data message being assembled counted in mailbox_use_.
  uint64_t counted = 0;
  while (!stopping_) {
    if (!conn.WaitReadable(more ? options_.io_timeout
                                : options_.idle_timeout)) {
      idle = !more;
      CAIRN_LOG(debug, "node {}: closing the {} connection from node {}",
                options_.node_id, more ? "stalled" : "idle", peer);
      break;
    }
    if (!conn.ReadFull(hbuf, kFrameHeaderBytes, options_.io_timeout)) break;
    if (!Decode(hbuf, &h)) {
      CAIRN_LOG(warn, "node {}: corrupt frame header from node {}; closing",
                options_.node_id, peer);
      break;
    }
    if (h.tag == kHelloTag || h.length > options_.max_frame_bytes ||
        (more && h.tag != tag)) {
      CAIRN_LOG(warn,
                "node {}: bad frame from node {} (tag {}, {} bytes, max {}{}); "
                "closing",
                options_.node_id, peer, h.tag, h.length,
                options_.max_frame_bytes,
                more ? absl::StrCat(", inside message tag ", tag) : "");
      break;
    }
    if (!more) {
      tag = h.tag;
      payload.clear();
      status = absl::OkStatus();
    }
    const bool control =
        (tag & kControlTagBit) != 0 && options_.control_handler != nullptr;
    if (control &&
        payload.size() + h.length > options_.max_queued_control_bytes) {
      OverControlBound(
          peer, absl::StrCat("control message tag ", tag, " of more than ",
                             options_.max_queued_control_bytes,
                             " bytes (max_queued_control_bytes)"));
      break;
    }
    if (!control) {
      // A data message's bytes count against its peer's mailbox as they
      // arrive (before they are allocated), so neither unreceived messages
      // nor one of endless frames can grow without bound.
      std::string over;
      {
        absl::MutexLock l(&mu_);
        MailboxUse& use = mailbox_use_[peer];
        if (payload.empty() && use.messages >= options_.max_mailbox_messages) {
          over = absl::StrCat(
              use.messages, " data messages unreceived and another (tag ", tag,
              "), over the bound of ", options_.max_mailbox_messages,
              " (max_mailbox_messages)");
        } else if (h.length > options_.max_mailbox_bytes - use.bytes) {
          over = absl::StrCat(
              use.bytes, " bytes of data messages unreceived or arriving and ",
              h.length, " more (tag ", tag, ", ", payload.size(),
              " of it so far), over the bound of ", options_.max_mailbox_bytes,
              " bytes (max_mailbox_bytes)");
        } else {
          use.bytes += h.length;
          counted += h.length;
        }
      }
      if (!over.empty()) {
        OverMailboxBound(peer, over);
        break;
      }
    }
    const size_t base = payload.size();
    payload.resize(base + h.length);
    if (!conn.ReadFull(payload.data() + base, h.length, options_.io_timeout)) {
      break;
    }
    const uint32_t crc = storage::Crc32c(payload.data() + base, h.length);
    if (crc != h.payload_crc && status.ok()) {
      status = absl::DataLossError(absl::StrCat(
          "node ", options_.node_id, ": message tag ", tag, " from node ", peer,
          " has a frame (bytes ", base, "+", h.length, ") with crc32c ", crc,
          ", sender said ", h.payload_crc));
    }
    more = (h.flags & kMoreFrames) != 0;
    if (more) continue;
    if (control && status.ok()) {
      const uint64_t bytes = payload.size();
      std::string over;
      {
        absl::MutexLock l(&mu_);
        ControlQueued& q = control_queued_[peer];
        if (q.messages >= options_.max_queued_control_messages ||
            q.bytes + bytes > options_.max_queued_control_bytes) {
          over = absl::StrCat(
              q.messages, " control messages (", q.bytes,
              " bytes) queued and another of ", bytes, " bytes (tag ", tag,
              "), over the bound of ", options_.max_queued_control_messages,
              " messages or ", options_.max_queued_control_bytes,
              " bytes (max_queued_control_messages/bytes)");
        } else {
          ++q.messages;
          q.bytes += bytes;
        }
      }
      if (!over.empty()) {
        OverControlBound(peer, over);
        break;
      }
      control_pool_->Schedule(
          [this, peer, tag, bytes, p = std::move(payload)]() mutable {
            options_.control_handler(peer, tag, std::move(p));
            absl::MutexLock l(&mu_);
            ControlQueued& q = control_queued_[peer];
            --q.messages;
            q.bytes -= bytes;
          });
      payload = std::string();
      continue;
    }
    Message m;
    m.status = status;
    m.payload = std::move(payload);
    payload = std::string();
    absl::MutexLock l(&mu_);
    MailboxUse& use = mailbox_use_[peer];
    if (abandoned_.erase({peer, tag}) > 0) {
      CAIRN_LOG(debug,
                "node {}: dropping message tag {} from node {}: its "
                "Recv gave up",
                options_.node_id, tag, peer);
      use.bytes -= m.payload.size();
      counted = 0;
      continue;
    }
    counted = 0;  // the mailbox's now
    auto [slot, inserted] = mailbox_.try_emplace({peer, tag});
    if (!inserted) {
      // A tag sent twice: the second message replaces the first.
      use.bytes -= slot->second.payload.size();
      --use.messages;
    }
    slot->second = std::move(m);
    ++use.messages;
  }
  absl::MutexLock l(&mu_);
  // A data message cut off: its frames so far were counted.
  mailbox_use_[peer].bytes -= counted;
  reader->conn.reset();  // closes the socket
  ReleaseConnection(reader->ip);
  --open_from_[peer];
  // An idle close is not a broken connection: the sender reconnects before
  // its next message, and a Recv waiting for it keeps waiting.
  if (!idle) ++broken_from_[peer];
  auto it = current_from_.find(peer);
  if (it != current_from_.end() && it->second == reader) {
    current_from_.erase(it);
  }
  reader->done = true;
}

TcpTransport::Outgoing& TcpTransport::OutgoingFor(int peer) {
  absl::MutexLock l(&out_mu_);
  std::unique_ptr<Outgoing>& o = outgoing_[peer];
  if (!o) o = std::make_unique<Outgoing>();
  return *o;
}

namespace {

void SetIoTimeouts(int fd, absl::Duration d) {
  timeval tv{};
  if (d > absl::ZeroDuration()) tv = absl::ToTimeval(d);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerConn>> TcpTransport::Connect(
    int peer, uint64_t* frame_bytes) {
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  absl::Status last = absl::UnavailableError("not tried");
  const std::string hello =
      internal::EncodeHello(options_.node_id, options_.peer_token);
  while (true) {
    absl::StatusOr<std::string> address = options_.resolve_peer(peer);
    if (address.ok()) {
      CAIRN_ASSIGN_OR_RETURN(sockaddr_in sa, ParseAddress(*address));
      UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) ==
          0) {
        TuneSocket(fd.get());
        const absl::Duration wait =
            std::max(deadline - absl::Now(), absl::Milliseconds(200));
        std::unique_ptr<PeerConn> conn;
        bool tls_ok = true;
        if (tls_enabled_) {
          SSL* ssl = SSL_new(TlsContext().get());
          if (ssl == nullptr || SSL_set_fd(ssl, fd.get()) != 1) {
            const std::string err = internal::TlsErrorText(ssl);
            if (ssl != nullptr) SSL_free(ssl);
            return absl::InternalError(absl::StrCat("SSL_new: ", err));
          }
          conn = std::make_unique<PeerConn>(std::move(fd), ssl);
          // A blocking handshake, bounded: a peer that never answers makes
          // SSL_connect return instead of hanging.
          SetIoTimeouts(conn->fd(), wait);
          tls_ok = conn->Connect();
        } else {
          conn = std::make_unique<PeerConn>(std::move(fd), nullptr);
        }
        char ack[kAckBytes];
        const std::string where = absl::StrCat(
            "node ", options_.node_id, ": peer node ", peer, " at ", *address);
        if (!tls_ok ||
            (!conn->WriteFull(hello.data(), hello.size(), nullptr, 0) &&
             conn->tls_failed())) {
          const std::string msg =
              absl::StrCat(where, ": TLS handshake failed: ", conn->error());
          // The peer refused this node's certificate or this node refused
          // the peer's: retrying cannot help.
          if (conn->tls_failed()) return absl::PermissionDeniedError(msg);
          last = absl::UnavailableError(msg);
        } else if (!conn->error().empty()) {
          last = absl::UnavailableError(absl::StrCat(
              "sending the hello to ", *address, ": ", conn->error()));
        } else if (!conn->ReadFull(ack, kAckBytes, wait)) {
          // TLS 1.3: the peer's verdict on this node's certificate comes
          // after SSL_connect, as an alert where the ack would be.
          if (conn->tls_failed()) {
            return absl::PermissionDeniedError(
                absl::StrCat(where, ": TLS handshake failed: ", conn->error()));
          }
          last = absl::UnavailableError(absl::StrCat(
              "no handshake answer from ", *address, ": ", conn->error()));
        } else {
          const uint32_t magic = little_endian::Load32(ack);
          const uint32_t code = little_endian::Load32(ack + 4);
          const uint64_t max_frame = little_endian::Load64(ack + 8);
          if (magic == kAckMagic &&
              code == static_cast<uint32_t>(HelloRefusal::kAccepted)) {
            *frame_bytes = std::max(max_frame, kMinFrameBytes);
            if (tls_enabled_) SetIoTimeouts(conn->fd(), absl::ZeroDuration());
            return conn;
          }
          const std::string why =
              magic == kAckMagic ? RefusalText(static_cast<HelloRefusal>(code))
                                 : "an answer that is not a cairn ack";
          const std::string msg =
              absl::StrCat(where, " refused the connection: ", why);
          if (code == static_cast<uint32_t>(HelloRefusal::kBadToken)) {
            return absl::PermissionDeniedError(msg);
          }
          return absl::FailedPreconditionError(msg);
        }
      } else {
        last = absl::UnavailableError(
            absl::StrCat("connect to ", *address, ": ", strerror(errno)));
      }
    } else {
      last = address.status();
      // The resolver knows no such node exists: retrying cannot help.
      if (absl::IsFailedPrecondition(last)) break;
    }
    if (absl::Now() >= deadline || stopping_) break;
    absl::SleepFor(absl::Milliseconds(20));  // the peer may be starting
  }
  return absl::UnavailableError(absl::StrCat("node ", options_.node_id,
                                             ": cannot reach peer node ", peer,
                                             ": ", last.message()));
}

absl::Status TcpTransport::SendFrames(Outgoing& out, int peer, uint64_t tag,
                                      absl::Span<const char> data) {
  const bool corrupt = corrupt_next_send_.exchange(false) && !data.empty();
  const size_t corrupt_at = data.size() / 2;
  size_t pos = 0;
  do {
    const size_t n = std::min<uint64_t>(data.size() - pos, out.frame_bytes);
    const char* p = data.data() + pos;
    char hbuf[kFrameHeaderBytes];
    Header h;
    h.tag = tag;
    h.length = n;
    h.flags = pos + n < data.size() ? kMoreFrames : 0;
    h.payload_crc = storage::Crc32c(p, n);
    Encode(h, hbuf);
    bool ok;
    if (corrupt && corrupt_at >= pos && corrupt_at < pos + n) {
      std::string copy(p, n);
      copy[corrupt_at - pos] ^= 0x5a;
      ok = out.conn->WriteFull(hbuf, kFrameHeaderBytes, copy.data(), n);
    } else {
      ok = out.conn->WriteFull(hbuf, kFrameHeaderBytes, p, n);
    }
    if (!ok) {
      return absl::UnavailableError(absl::StrCat(
          "node ", options_.node_id, ": sending tag ", tag, " (", data.size(),
          " bytes) to peer node ", peer, " failed: ", out.conn->error()));
    }
    pos += n;
  } while (pos < data.size());
  return absl::OkStatus();
}

absl::Status TcpTransport::Send(int peer, uint64_t tag,
                                absl::Span<const char> data) {
  if (peer < 0 || peer >= options_.num_nodes || tag == kHelloTag) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", options_.node_id, ": bad peer node ", peer,
                     " (num_nodes ", options_.num_nodes, ") or tag ", tag));
  }
  Outgoing& out = OutgoingFor(peer);
  absl::MutexLock l(&out.mu);
  if (out.conn != nullptr) {
    // The peer never writes on this connection after its ack: readable or
    // hung up means it closed (e.g. the agent restarted); reconnect instead
    // of writing into a dead socket. A connection unused for half the
    // receiver's idle timeout is replaced too, before the receiver could
    // close it under this write.
    pollfd p{out.conn->fd(), POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) > 0 ||
        absl::Now() - out.last_used > options_.idle_timeout / 2) {
      out.conn.reset();
    }
  }
  if (out.conn == nullptr) {
    CAIRN_ASSIGN_OR_RETURN(out.conn, Connect(peer, &out.frame_bytes));
  }
  absl::Status s = SendFrames(out, peer, tag, data);
  if (!s.ok()) {
    out.conn.reset();
    return s;
  }
  out.last_used = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpTransport::RecvMessage(int peer, uint64_t tag,
                                                      absl::Duration timeout) {
  const std::pair<int, uint64_t> key{peer, tag};
  absl::MutexLock l(&mu_);
  const int64_t broken_at_start = broken_from_[peer];
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return mailbox_.count(key) > 0 ||
           (broken_from_[peer] > broken_at_start && open_from_[peer] == 0) ||
           stopping_.load();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    AbandonLocked(key);
    return absl::DeadlineExceededError(absl::StrCat(
        "node ", options_.node_id, ": no message tag ", tag, " from peer node ",
        peer, " within ", absl::FormatDuration(timeout)));
  }
  auto it = mailbox_.find(key);
  if (it == mailbox_.end()) {
    AbandonLocked(key);
    return absl::UnavailableError(
        absl::StrCat("node ", options_.node_id, ": connection from peer node ",
                     peer, " closed before message tag ", tag, " arrived"));
  }
  Message m = std::move(it->second);
  mailbox_.erase(it);
  MailboxUse& use = mailbox_use_[peer];
  use.bytes -= m.payload.size();
  --use.messages;
  if (!m.status.ok()) return m.status;
  return std::move(m.payload);
}

void TcpTransport::Abandon(int peer, uint64_t tag) {
  absl::MutexLock l(&mu_);
  AbandonLocked({peer, tag});
}

void TcpTransport::AbandonLocked(const std::pair<int, uint64_t>& key) {
  if (auto it = mailbox_.find(key); it != mailbox_.end()) {
    MailboxUse& use = mailbox_use_[key.first];
    use.bytes -= it->second.payload.size();
    --use.messages;
    mailbox_.erase(it);
    return;
  }
  if (!abandoned_.insert(key).second) return;
  abandoned_order_.push_back(key);
  while (abandoned_order_.size() > kMaxAbandoned) {
    abandoned_.erase(abandoned_order_.front());
    abandoned_order_.pop_front();
  }
}

size_t TcpTransport::mailbox_size() {
  absl::MutexLock l(&mu_);
  return mailbox_.size();
}

absl::Status TcpTransport::Recv(int peer, uint64_t tag, absl::Span<char> out,
                                absl::Duration timeout) {
  CAIRN_ASSIGN_OR_RETURN(std::string payload, RecvMessage(peer, tag, timeout));
  if (payload.size() != out.size()) {
    return absl::DataLossError(absl::StrCat(
        "node ", options_.node_id, ": message tag ", tag, " from peer node ",
        peer, " has ", payload.size(), " bytes, expected ", out.size()));
  }
  std::memcpy(out.data(), payload.data(), out.size());
  return absl::OkStatus();
}

}  // namespace cairn::agent
