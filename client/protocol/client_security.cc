#include "client/protocol/client_security.h"

#include <cstdlib>

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

}  // namespace cairn::protocol
