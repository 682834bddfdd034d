#include "protocol/client_security.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cairn::protocol {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

ClientSecurity ClientSecurity::FromEnvironment() {
  ClientSecurity s;
  s.ca_file = Env("CAIRN_TLS_CA");
  s.cert_file = Env("CAIRN_TLS_CERT");
  s.key_file = Env("CAIRN_TLS_KEY");
  s.token = Env("CAIRN_TOKEN");
  return s;
}

absl::StatusOr<std::string> ReadTokenFile(absl::string_view flag,
                                          const std::string& path,
                                          size_t max_bytes) {
  // stdio, not an ifstream: libstdc++'s stream buffer throws when the read
  // itself fails (a directory: EISDIR), and a bad flag must be an error.
  std::string token;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) token.append(buf, n);
    if (std::ferror(f)) token.clear();
    std::fclose(f);
  }
  while (!token.empty() &&
         std::isspace(static_cast<unsigned char>(token.back()))) {
    token.pop_back();
  }
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", path, ": cannot read it, or it holds no token"));
  }
  if (token.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": the token has ", token.size(),
                     " bytes; at most ", max_bytes, " are allowed"));
  }
  return token;
}

absl::StatusOr<std::string> TokenFromFileOrEnv(absl::string_view flag,
                                               const std::string& path,
                                               const char* env_var,
                                               size_t max_bytes) {
  if (!path.empty()) return ReadTokenFile(flag, path, max_bytes);
  return Env(env_var);
}

}  // namespace cairn::protocol
