// PEM files for TLS (server and client certificates, private keys, CA
// bundles), read and checked before gRPC sees them: gRPC reports a bad file
// only at the first handshake, as a generic handshake failure that names no
// file. Here a missing file, one without a certificate or key, or a key that
// does not belong to its certificate is an error naming the file.
#ifndef CAIRN_COMMON_TLS_PEM_H_
#define CAIRN_COMMON_TLS_PEM_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cairn::tls {

// The contents of `path`, which must hold at least one PEM certificate and
// nothing unparsable. `what` names the file in errors ("--tls-cert").
absl::StatusOr<std::string> ReadCertificates(const std::string& path,
                                             absl::string_view what);

// The contents of `path`, which must hold a PEM private key.
absl::StatusOr<std::string> ReadPrivateKey(const std::string& path,
                                           absl::string_view what);

// A certificate chain and its private key, as gRPC takes them.
struct KeyCertPair {
  std::string cert_chain;
  std::string private_key;
};

// Reads `cert_path` and `key_path` and checks that the key is the one of the
// chain's first certificate.
absl::StatusOr<KeyCertPair> ReadKeyCertPair(const std::string& cert_path,
                                            absl::string_view cert_what,
                                            const std::string& key_path,
                                            absl::string_view key_what);

// Whether the first certificate in `cert_chain` is valid now; a description
// ("expired on ...", "not valid before ...") when it is not.
absl::Status CheckValidNow(absl::string_view cert_chain,
                           absl::string_view what);

}  // namespace cairn::tls

#endif  // CAIRN_COMMON_TLS_PEM_H_
