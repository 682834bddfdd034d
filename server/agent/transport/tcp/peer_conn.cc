#include "server/agent/transport/tcp/peer_conn.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/tls_pem.h"

namespace cairn::agent::internal {

int PollMillis(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return -1;
  if (d <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(d + absl::Milliseconds(1) -
                                                  absl::Nanoseconds(1)),
                        1 << 30));
}

namespace {

// OpenSSL writes to the socket with write(2): a peer that went away would
// raise SIGPIPE. Blocks it around TLS calls on this thread and swallows the
// one raised meanwhile (the call itself reports EPIPE), as MSG_NOSIGNAL does
// for the plain path.
class ScopedNoSigpipe {
 public:
  ScopedNoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~ScopedNoSigpipe() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedNoSigpipe(const ScopedNoSigpipe&) = delete;
  ScopedNoSigpipe& operator=(const ScopedNoSigpipe&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

struct CtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};

}  // namespace

std::string TlsErrorText(SSL* ssl) {
  std::string text;
  while (const unsigned long e = ERR_get_error()) {  // NOLINT(runtime/int)
    const char* reason = ERR_reason_error_string(e);
    absl::StrAppend(&text, text.empty() ? "" : "; ",
                    reason != nullptr ? reason : "error");
  }
  if (ssl != nullptr) {
    const long v = SSL_get_verify_result(ssl);  // NOLINT(runtime/int)
    if (v != X509_V_OK) {
      absl::StrAppend(&text, text.empty() ? "" : ": ",
                      "certificate: ", X509_verify_cert_error_string(v));
    }
  }
  return text.empty() ? "unknown TLS error" : text;
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> LoadPeerTlsContext(
    const PeerTlsFiles& files) {
  // Checked first for errors that name the file; OpenSSL's own loaders
  // below then read the same files.
  absl::StatusOr<std::string> ca =
      tls::ReadCertificates(files.ca_file, "--peer-tls-ca");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<tls::KeyCertPair> pair = tls::ReadKeyCertPair(
      files.cert_file, "--peer-tls-cert", files.key_file, "--peer-tls-key");
  if (!pair.ok()) return pair.status();
  if (absl::Status valid = tls::CheckValidNow(
          pair->cert_chain, "--peer-tls-cert " + files.cert_file);
      !valid.ok()) {
    // Loaded anyway (peers refuse it): a renewed file can be loaded with
    // SIGHUP without a restart.
    CAIRN_LOG(warn, "cairn-agent: {}", std::string(valid.message()));
  }
  ERR_clear_error();
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_method()), CtxFree());
  if (ctx == nullptr) {
    return absl::InternalError(
        absl::StrCat("SSL_CTX_new: ", TlsErrorText(nullptr)));
  }
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  // Connections live long and are never resumed: no session tickets, so a
  // server writes nothing after the handshake that a sender would take for
  // the peer closing (TcpTransport::Send polls for that).
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  // Both directions verify the other side's chain against the CA; a server
  // refuses a client without a certificate.
  SSL_CTX_set_verify(
      ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  if (SSL_CTX_load_verify_locations(ctx.get(), files.ca_file.c_str(),
                                    nullptr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer-tls-ca ", files.ca_file,
                     ": cannot load: ", TlsErrorText(nullptr)));
  }
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), files.cert_file.c_str()) !=
      1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer-tls-cert ", files.cert_file,
                     ": cannot load: ", TlsErrorText(nullptr)));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), files.key_file.c_str(),
                                  SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer-tls-key ", files.key_file,
                     ": cannot load: ", TlsErrorText(nullptr)));
  }
  return ctx;
}

PeerConn::PeerConn(UniqueFd fd, SSL* ssl) : fd_(std::move(fd)), ssl_(ssl) {}

PeerConn::~PeerConn() {
  // No close_notify: the socket closing is the end either way, and a
  // blocking write here could hang on a peer that stopped reading.
  if (ssl_ != nullptr) SSL_free(ssl_);
  // Then fd_ closes the socket.
}

void PeerConn::Shutdown() { shutdown(fd_.get(), SHUT_RDWR); }

bool PeerConn::WaitFd(short events, absl::Duration timeout) {  // NOLINT
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // A hang-up wakes a reader (the read then reports it), not a writer: a
    // write waiting for room would spin on it.
    pollfd p{fd_.get(),
             static_cast<short>(  // NOLINT(runtime/int)
                 (events & POLLIN) != 0 ? (events | POLLRDHUP) : events),
             0};
    const int n = poll(&p, 1, PollMillis(deadline - absl::Now()));
    if (n > 0) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return true;  // let the read or write report the error
    if (absl::Now() >= deadline) return false;
  }
}

bool PeerConn::TlsRetry(int r) {
  const int e = SSL_get_error(ssl_, r);
  switch (e) {
    case SSL_ERROR_WANT_READ:
      want_write_ = false;
      return true;
    case SSL_ERROR_WANT_WRITE:
      want_write_ = true;
      return true;
    case SSL_ERROR_ZERO_RETURN:
      error_ = "the peer closed the connection (TLS close_notify)";
      return false;
    case SSL_ERROR_SYSCALL:
      error_ = errno != 0 ? strerror(errno) : "the peer closed the connection";
      ERR_clear_error();
      return false;
    case SSL_ERROR_SSL: {
      const unsigned long first = ERR_peek_error();  // NOLINT(runtime/int)
      // A bare EOF is the peer going away, not a TLS disagreement.
      if (ERR_GET_LIB(first) == ERR_LIB_SSL &&
          ERR_GET_REASON(first) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        ERR_clear_error();
        error_ = "the peer closed the connection";
        return false;
      }
      error_ = TlsErrorText(ssl_);
      tls_failed_ = true;
      return false;
    }
    default:
      error_ = TlsErrorText(ssl_);
      return false;
  }
}

int PeerConn::AdvanceAccept() {
  ScopedNoSigpipe no_sigpipe;
  ERR_clear_error();
  const int r = SSL_accept(ssl_);
  if (r == 1) return 1;
  return TlsRetry(r) ? 0 : -1;
}

bool PeerConn::Connect() {
  ScopedNoSigpipe no_sigpipe;
  ERR_clear_error();
  const int r = SSL_connect(ssl_);
  if (r == 1) return true;
  // Blocking socket: a "retry" is its SO_RCVTIMEO/SO_SNDTIMEO running out.
  if (TlsRetry(r)) error_ = "no answer in time";
  return false;
}

long PeerConn::ReadSome(char* p, size_t n) {  // NOLINT(runtime/int)
  if (ssl_ == nullptr) {
    const ssize_t r = read(fd_.get(), p, n);
    if (r > 0) return r;
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return 0;
    error_ = r == 0 ? "the peer closed the connection" : strerror(errno);
    return -1;
  }
  ScopedNoSigpipe no_sigpipe;
  ERR_clear_error();
  const int r =
      SSL_read(ssl_, p, static_cast<int>(std::min<size_t>(n, INT_MAX)));
  if (r > 0) return r;
  return TlsRetry(r) ? 0 : -1;
}

bool PeerConn::WaitReadable(absl::Duration timeout) {
  // Bytes TLS already decrypted are not on the socket any more.
  if (ssl_ != nullptr && SSL_pending(ssl_) > 0) return true;
  return WaitFd(POLLIN, timeout);
}

bool PeerConn::ReadFull(char* p, size_t n, absl::Duration stall) {
  std::optional<ScopedNoSigpipe> no_sigpipe;
  if (ssl_ != nullptr) no_sigpipe.emplace();
  short wait_for = POLLIN;  // NOLINT(runtime/int)
  while (n > 0) {
    const bool buffered = ssl_ != nullptr && SSL_pending(ssl_) > 0;
    if (!buffered && !WaitFd(wait_for, stall)) {
      error_ = absl::StrCat("no bytes for ", absl::FormatDuration(stall));
      return false;
    }
    long r;  // NOLINT(runtime/int)
    if (ssl_ == nullptr) {
      r = read(fd_.get(), p, n);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) {
        error_ = r == 0 ? "the peer closed the connection" : strerror(errno);
        return false;
      }
    } else {
      ERR_clear_error();
      r = SSL_read(ssl_, p, static_cast<int>(std::min<size_t>(n, INT_MAX)));
      if (r <= 0) {
        if (!TlsRetry(static_cast<int>(r))) return false;
        wait_for = want_write_ ? POLLOUT : POLLIN;
        continue;
      }
      wait_for = POLLIN;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool PeerConn::WriteFull(const char* a, size_t an, const char* b, size_t bn,
                         absl::Duration stall) {
  if (ssl_ == nullptr) {
    iovec iov[2] = {{const_cast<char*>(a), an}, {const_cast<char*>(b), bn}};
    int iovcnt = bn > 0 ? 2 : 1;
    iovec* v = iov;
    while (iovcnt > 0) {
      msghdr msg{};
      msg.msg_iov = v;
      msg.msg_iovlen = static_cast<size_t>(iovcnt);
      // MSG_NOSIGNAL: a peer that went away is an error, not a SIGPIPE.
      ssize_t w = sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        error_ = w < 0 ? strerror(errno) : "nothing written";
        return false;
      }
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
  ScopedNoSigpipe no_sigpipe;
  auto write_all = [&](const char* p, size_t n) {
    while (n > 0) {
      const int chunk = static_cast<int>(std::min<size_t>(n, 1 << 30));
      ERR_clear_error();
      const int w = SSL_write(ssl_, p, chunk);
      if (w <= 0) {
        if (!TlsRetry(w)) return false;
        // Retried with the same arguments, as SSL_write requires.
        if (!WaitFd(want_write_ ? POLLOUT : POLLIN, stall)) {
          error_ =
              absl::StrCat("could not write for ", absl::FormatDuration(stall));
          return false;
        }
        continue;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  };
  // A small frame goes as one TLS record (header and payload together).
  constexpr size_t kCoalesce = 16 << 10;
  if (bn > 0 && an + bn <= kCoalesce) {
    char buf[kCoalesce];
    std::memcpy(buf, a, an);
    std::memcpy(buf + an, b, bn);
    return write_all(buf, an + bn);
  }
  return write_all(a, an) && (bn == 0 || write_all(b, bn));
}

}  // namespace cairn::agent::internal
