#include "common/tls_pem.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace cairn::tls {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;

BioPtr MemoryBio(absl::string_view pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// OpenSSL's last error as text, clearing the queue.
std::string OpenSslError() {
  const unsigned long e = ERR_peek_last_error();  // NOLINT(runtime/int)
  ERR_clear_error();
  if (e == 0) return "not PEM";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no file given"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": cannot read: ", std::strerror(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": read error"));
  }
  return contents.str();
}

// The certificates of `pem`, in order; an error when there is none or one
// does not parse.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(
    absl::string_view pem, absl::string_view what, const std::string& path) {
  ERR_clear_error();
  BioPtr bio = MemoryBio(pem);
  std::vector<X509Ptr> certs;
  while (true) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    certs.push_back(std::move(cert));
  }
  // The loop ends with "no start line" at the end of the input; anything
  // else is a damaged certificate.
  const unsigned long e = ERR_peek_last_error();  // NOLINT(runtime/int)
  if (e != 0 && !(ERR_GET_LIB(e) == ERR_LIB_PEM &&
                  ERR_GET_REASON(e) == PEM_R_NO_START_LINE)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, ": a certificate does not parse: ", OpenSslError()));
  }
  ERR_clear_error();
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, ": no PEM certificate (BEGIN CERTIFICATE) in it"));
  }
  return certs;
}

std::string Asn1Time(const ASN1_TIME* t) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(bio.get(), t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);  // NOLINT(runtime/int)
  return std::string(data, n > 0 ? static_cast<size_t>(n) : 0);
}

}  // namespace

absl::StatusOr<std::string> ReadCertificates(const std::string& path,
                                             absl::string_view what) {
  absl::StatusOr<std::string> pem = ReadFile(path, what);
  if (!pem.ok()) return pem.status();
  absl::StatusOr<std::vector<X509Ptr>> certs =
      ParseCertificates(*pem, what, path);
  if (!certs.ok()) return certs.status();
  return pem;
}

absl::StatusOr<std::string> ReadPrivateKey(const std::string& path,
                                           absl::string_view what) {
  absl::StatusOr<std::string> pem = ReadFile(path, what);
  if (!pem.ok()) return pem.status();
  ERR_clear_error();
  BioPtr bio = MemoryBio(*pem);
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, ": no unencrypted PEM private key in it (",
        OpenSslError(), ")"));
  }
  return pem;
}

absl::StatusOr<KeyCertPair> ReadKeyCertPair(const std::string& cert_path,
                                            absl::string_view cert_what,
                                            const std::string& key_path,
                                            absl::string_view key_what) {
  KeyCertPair pair;
  absl::StatusOr<std::string> cert = ReadCertificates(cert_path, cert_what);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPrivateKey(key_path, key_what);
  if (!key.ok()) return key.status();
  ERR_clear_error();
  BioPtr cert_bio = MemoryBio(*cert);
  X509Ptr leaf(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  BioPtr key_bio = MemoryBio(*key);
  KeyPtr pkey(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (leaf == nullptr || pkey == nullptr ||
      X509_check_private_key(leaf.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(key_what, " ", key_path, " is not the private key of ",
                     cert_what, " ", cert_path));
  }
  pair.cert_chain = *std::move(cert);
  pair.private_key = *std::move(key);
  return pair;
}

absl::Status CheckValidNow(absl::string_view cert_chain,
                           absl::string_view what) {
  BioPtr bio = MemoryBio(cert_chain);
  X509Ptr leaf(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (leaf == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no certificate"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(leaf.get())) < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " expired on ", Asn1Time(X509_get0_notAfter(leaf.get()))));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(leaf.get())) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is not valid before ",
                     Asn1Time(X509_get0_notBefore(leaf.get()))));
  }
  return absl::OkStatus();
}

}  // namespace cairn::tls
