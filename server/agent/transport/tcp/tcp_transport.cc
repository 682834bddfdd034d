#include "server/agent/transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "storage/checksum.h"

namespace cairn::agent {
namespace {

constexpr uint32_t kMagic = 0x544e5243;  // "CRNT"
constexpr uint64_t kHelloTag = ~uint64_t{0};
constexpr size_t kHeaderBytes = 4 + 8 + 8 + 4 + 4;

struct Header {
  uint64_t tag = 0;
  uint64_t length = 0;
  uint32_t payload_crc = 0;
};

void Encode(const Header& h, char* out) {
  uint32_t magic = kMagic;
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, &h.tag, 8);
  std::memcpy(out + 12, &h.length, 8);
  std::memcpy(out + 20, &h.payload_crc, 4);
  const uint32_t hcrc = storage::Crc32c(out, 24);
  std::memcpy(out + 24, &hcrc, 4);
}

bool Decode(const char* in, Header* h) {
  uint32_t magic, hcrc;
  std::memcpy(&magic, in, 4);
  std::memcpy(&hcrc, in + 24, 4);
  if (magic != kMagic || hcrc != storage::Crc32c(in, 24)) return false;
  std::memcpy(&h->tag, in + 4, 8);
  std::memcpy(&h->length, in + 12, 8);
  std::memcpy(&h->payload_crc, in + 20, 4);
  return true;
}

bool ReadFull(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, const char* a, size_t an, const char* b, size_t bn) {
  iovec iov[2] = {{const_cast<char*>(a), an}, {const_cast<char*>(b), bn}};
  int iovcnt = bn > 0 ? 2 : 1;
  iovec* v = iov;
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = v;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    // MSG_NOSIGNAL: a peer that went away is an error, not a SIGPIPE.
    ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    size_t left = static_cast<size_t>(w);
    while (iovcnt > 0 && left >= v->iov_len) {
      left -= v->iov_len;
      ++v;
      --iovcnt;
    }
    if (iovcnt > 0) {
      v->iov_base = static_cast<char*>(v->iov_base) + left;
      v->iov_len -= left;
    }
  }
  return true;
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

void TuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

}  // namespace

TcpTransport::TcpTransport(TcpTransportOptions options)
    : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Start(
    TcpTransportOptions options) {
  if (options.node_id < 0 || !options.resolve_peer) {
    return absl::InvalidArgumentError(
        "tcp transport needs a node id >= 0 and a peer resolver");
  }
  CAIRN_ASSIGN_OR_RETURN(sockaddr_in sa, ParseAddress(options.listen_address));
  std::unique_ptr<TcpTransport> t(new TcpTransport(std::move(options)));
  t->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(t->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(t->listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      listen(t->listen_fd_, 128) != 0) {
    const int err = errno;
    close(t->listen_fd_);
    t->listen_fd_ = -1;
    return absl::UnavailableError(
        absl::StrCat("node ", t->options_.node_id, ": cannot listen on ",
                     t->options_.listen_address, ": ", strerror(err)));
  }
  socklen_t len = sizeof(sa);
  getsockname(t->listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  t->port_ = ntohs(sa.sin_port);
  t->control_pool_ =
      std::make_unique<ThreadPool>(std::max(1, t->options_.control_threads));
  t->acceptor_ = std::thread([p = t.get()] { p->AcceptLoop(); });
  return t;
}

TcpTransport::~TcpTransport() {
  stopping_ = true;
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  std::vector<std::thread> readers;
  {
    absl::MutexLock l(&mu_);
    for (int fd : reader_fds_) shutdown(fd, SHUT_RDWR);
    readers.swap(readers_);
  }
  for (std::thread& r : readers) r.join();
  {
    absl::MutexLock l(&out_mu_);
    for (auto& [peer, out] : outgoing_) {
      absl::MutexLock ol(&out->mu);
      if (out->fd >= 0) close(out->fd);
      out->fd = -1;
    }
  }
  control_pool_.reset();  // drains pending control handlers
}

void TcpTransport::AcceptLoop() {
  while (!stopping_) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (stopping_) return;
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    TuneSocket(fd);
    absl::MutexLock l(&mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    reader_fds_.push_back(fd);
    readers_.emplace_back([this, fd] { ReadLoop(fd); });
  }
}

void TcpTransport::ReadLoop(int fd) {
  char hbuf[kHeaderBytes];
  Header h;
  int peer = -1;
  if (ReadFull(fd, hbuf, kHeaderBytes) && Decode(hbuf, &h) &&
      h.tag == kHelloTag && h.length == 0) {
    peer = static_cast<int>(h.payload_crc);
    absl::MutexLock l(&mu_);
    ++open_from_[peer];
  }
  while (peer >= 0 && !stopping_) {
    if (!ReadFull(fd, hbuf, kHeaderBytes)) break;
    if (!Decode(hbuf, &h)) {
      CAIRN_LOG(warn, "node {}: corrupt frame header from node {}; closing",
                options_.node_id, peer);
      break;
    }
    std::string payload(h.length, '\0');
    if (!ReadFull(fd, payload.data(), payload.size())) break;
    Message m;
    const uint32_t crc = storage::Crc32c(payload.data(), payload.size());
    if (crc != h.payload_crc) {
      m.status = absl::DataLossError(absl::StrCat(
          "node ", options_.node_id, ": message tag ", h.tag, " from node ",
          peer, " (", h.length, " bytes) has crc32c ", crc, ", sender said ",
          h.payload_crc));
    }
    if ((h.tag & kControlTagBit) && options_.control_handler && m.status.ok()) {
      control_pool_->Schedule(
          [this, peer, tag = h.tag, p = std::move(payload)]() mutable {
            options_.control_handler(peer, tag, std::move(p));
          });
      continue;
    }
    m.payload = std::move(payload);
    absl::MutexLock l(&mu_);
    mailbox_[{peer, h.tag}] = std::move(m);
  }
  close(fd);
  absl::MutexLock l(&mu_);
  if (peer >= 0) {
    --open_from_[peer];
    ++broken_from_[peer];
  }
  for (int& f : reader_fds_) {
    if (f == fd) f = -1;
  }
}

TcpTransport::Outgoing& TcpTransport::OutgoingFor(int peer) {
  absl::MutexLock l(&out_mu_);
  std::unique_ptr<Outgoing>& o = outgoing_[peer];
  if (!o) o = std::make_unique<Outgoing>();
  return *o;
}

absl::StatusOr<int> TcpTransport::Connect(int peer) {
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  absl::Status last = absl::UnavailableError("not tried");
  while (true) {
    absl::StatusOr<std::string> address = options_.resolve_peer(peer);
    if (address.ok()) {
      CAIRN_ASSIGN_OR_RETURN(sockaddr_in sa, ParseAddress(*address));
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
        TuneSocket(fd);
        char hello[kHeaderBytes];
        Header h;
        h.tag = kHelloTag;
        h.payload_crc = static_cast<uint32_t>(options_.node_id);
        Encode(h, hello);
        if (WriteFull(fd, hello, kHeaderBytes, nullptr, 0)) return fd;
      }
      last = absl::UnavailableError(
          absl::StrCat("connect to ", *address, ": ", strerror(errno)));
      close(fd);
    } else {
      last = address.status();
    }
    if (absl::Now() >= deadline || stopping_) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::UnavailableError(absl::StrCat("node ", options_.node_id,
                                             ": cannot reach peer node ", peer,
                                             ": ", last.message()));
}

absl::Status TcpTransport::Send(int peer, uint64_t tag,
                                absl::Span<const char> data) {
  if (peer < 0 || tag == kHelloTag) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad peer ", peer, " or tag ", tag));
  }
  Outgoing& out = OutgoingFor(peer);
  absl::MutexLock l(&out.mu);
  if (out.fd >= 0) {
    // The peer never writes on this connection: readable or hung up means
    // it closed (e.g. the agent restarted); reconnect instead of writing
    // into a dead socket.
    pollfd p{out.fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) > 0) {
      close(out.fd);
      out.fd = -1;
    }
  }
  if (out.fd < 0) {
    CAIRN_ASSIGN_OR_RETURN(out.fd, Connect(peer));
  }
  Header h;
  h.tag = tag;
  h.length = data.size();
  h.payload_crc = storage::Crc32c(data.data(), data.size());
  char hbuf[kHeaderBytes];
  Encode(h, hbuf);
  bool ok;
  if (corrupt_next_send_.exchange(false) && !data.empty()) {
    std::string copy(data.data(), data.size());
    copy[copy.size() / 2] ^= 0x5a;
    ok = WriteFull(out.fd, hbuf, kHeaderBytes, copy.data(), copy.size());
  } else {
    ok = WriteFull(out.fd, hbuf, kHeaderBytes, data.data(), data.size());
  }
  if (!ok) {
    const int err = errno;
    close(out.fd);
    out.fd = -1;
    return absl::UnavailableError(absl::StrCat(
        "node ", options_.node_id, ": sending tag ", tag, " (", data.size(),
        " bytes) to peer node ", peer, " failed: ", strerror(err)));
  }
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
    return absl::DeadlineExceededError(absl::StrCat(
        "node ", options_.node_id, ": no message tag ", tag, " from peer node ",
        peer, " within ", absl::FormatDuration(timeout)));
  }
  auto it = mailbox_.find(key);
  if (it == mailbox_.end()) {
    return absl::UnavailableError(
        absl::StrCat("node ", options_.node_id, ": connection from peer node ",
                     peer, " closed before message tag ", tag, " arrived"));
  }
  Message m = std::move(it->second);
  mailbox_.erase(it);
  if (!m.status.ok()) return m.status;
  return std::move(m.payload);
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
