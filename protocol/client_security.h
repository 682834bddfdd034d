// How a client (libcairn, the Python package, the cairn CLI, cairn-agent)
// secures its calls to cairnd: TLS with a CA bundle and an optional client
// certificate, and a bearer token.
#ifndef CAIRN_CLIENT_PROTOCOL_CLIENT_SECURITY_H_
#define CAIRN_CLIENT_PROTOCOL_CLIENT_SECURITY_H_

#include <cstddef>
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cairn::protocol {

struct ClientSecurity {
  // PEM CA bundle that signed cairnd's certificate. Setting it (or
  // cert_file) makes the channel TLS; empty with a cert_file: the system's
  // roots.
  std::string ca_file;
  // PEM client certificate chain and its key, for cairnd with
  // --tls-client-ca (mutual TLS). Both or neither.
  std::string cert_file;
  std::string key_file;
  // Sent with every call as "authorization: Bearer <token>" (also over
  // plaintext loopback). Never logged.
  std::string token;

  bool tls() const { return !ca_file.empty() || !cert_file.empty(); }

  // CAIRN_TLS_CA, CAIRN_TLS_CERT, CAIRN_TLS_KEY and CAIRN_TOKEN (unset:
  // empty).
  static ClientSecurity FromEnvironment();
};

// The bearer token stored in `path` (a Secret's file, `--token-file`):
// its bytes with trailing whitespace (a newline) dropped. INVALID_ARGUMENT
// naming `flag` and the path when the file cannot be read, holds no token,
// or holds more than `max_bytes`. The token is never in the message.
absl::StatusOr<std::string> ReadTokenFile(
    absl::string_view flag, const std::string& path,
    size_t max_bytes = std::numeric_limits<size_t>::max());

// A command's token: ReadTokenFile(flag, path, max_bytes) when `path` (the
// flag's value) is set, else environment variable `env_var` ("" when unset).
// A token from the environment is never checked against `max_bytes` here:
// the receiving side refuses an oversize one.
absl::StatusOr<std::string> TokenFromFileOrEnv(
    absl::string_view flag, const std::string& path, const char* env_var,
    size_t max_bytes = std::numeric_limits<size_t>::max());

}  // namespace cairn::protocol

#endif  // CAIRN_CLIENT_PROTOCOL_CLIENT_SECURITY_H_
