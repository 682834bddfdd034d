// The byte stream of one peer connection of TcpTransport: a TCP socket,
// either plain or wrapped in TLS (OpenSSL's libssl), behind one interface so
// the frame code does not care which. Also the TLS context of the peer
// transport (mutual TLS against a cluster CA).
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_TCP_PEER_CONN_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_TCP_PEER_CONN_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace cairn::agent::internal {

// poll(2)'s timeout for `d`: -1 for infinite, 0 when no time is left,
// else whole milliseconds rounded up (never 0 too early), capped at 2^30.
int PollMillis(absl::Duration d);

// PEM files of the peer transport's mutual TLS.
struct PeerTlsFiles {
  std::string ca_file;    // CA bundle peers' certificates must chain to
  std::string cert_file;  // this node's certificate (chain)
  std::string key_file;   // its private key
  bool any() const {
    return !ca_file.empty() || !cert_file.empty() || !key_file.empty();
  }
};

// An SSL_CTX for both directions: TLS 1.2+, this node's certificate, and
// peers verified against the CA only (no host name check: peers are
// addressed by host:port, so the CA must be dedicated to the cluster).
// Errors name the file (and flag) that is wrong.
absl::StatusOr<std::shared_ptr<SSL_CTX>> LoadPeerTlsContext(
    const PeerTlsFiles& files);

// OpenSSL's queued errors as text (and the certificate verification result
// of `ssl` when it failed), clearing the queue.
std::string TlsErrorText(SSL* ssl);

class PeerConn {
 public:
  // Takes ownership of `ssl` (null for a plain connection).
  PeerConn(UniqueFd fd, SSL* ssl);
  ~PeerConn();
  PeerConn(const PeerConn&) = delete;
  PeerConn& operator=(const PeerConn&) = delete;

  int fd() const { return fd_.get(); }
  bool tls() const { return ssl_ != nullptr; }

  // Server side of the TLS handshake on a non-blocking socket: 1 when done,
  // 0 when it needs more I/O (want_write(): wait for POLLOUT, else POLLIN),
  // -1 when it failed (error()).
  int AdvanceAccept();
  bool want_write() const { return want_write_; }

  // Client side of the TLS handshake on a blocking socket (bounded by its
  // SO_RCVTIMEO/SO_SNDTIMEO). false: error(), tls_failed().
  bool Connect();

  // Reads up to n bytes without blocking: > 0 bytes read, 0 when none are
  // available now, -1 on EOF or error (error()).
  long ReadSome(char* p, size_t n);  // NOLINT(runtime/int)

  // Waits until bytes can be read (buffered in TLS or on the socket) or the
  // peer hung up. false after `timeout`.
  bool WaitReadable(absl::Duration timeout);

  // Reads exactly n bytes; false on EOF, error, or no progress for `stall`.
  bool ReadFull(char* p, size_t n,
                absl::Duration stall = absl::InfiniteDuration());

  // Writes a then b (b may be empty); false on error (error()) or, on a
  // non-blocking socket, when the socket stays full for `stall`.
  bool WriteFull(const char* a, size_t an, const char* b, size_t bn,
                 absl::Duration stall = absl::InfiniteDuration());

  // Wakes a reader blocked on this connection (shutdown(2)); thread-safe.
  void Shutdown();

  // Why the last operation failed.
  const std::string& error() const { return error_; }
  // Whether that was a TLS protocol failure (a refused certificate, a peer
  // not speaking TLS, ...), as opposed to the connection breaking.
  bool tls_failed() const { return tls_failed_; }

 private:
  bool WaitFd(short events, absl::Duration timeout);  // NOLINT(runtime/int)
  // Records why an SSL call returning `r` failed; true when it only needs
  // to be retried after waiting (want_write_ says for what).
  bool TlsRetry(int r);

  UniqueFd fd_;
  SSL* ssl_;
  bool want_write_ = false;
  bool tls_failed_ = false;
  std::string error_;
};

}  // namespace cairn::agent::internal

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_TCP_PEER_CONN_H_
