// Certificates for the peer transport's TLS tests, made once per test
// process with the openssl CLI by tests/testing/make_test_certs.sh (see there
// for the names) in a temporary directory removed at exit.
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_TCP_TEST_CERTS_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_TCP_TEST_CERTS_H_

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "server/agent/transport/tcp/tcp_transport.h"

// CMake passes the script's source path; Bazel its runfiles path.
#ifndef CAIRN_MAKE_CERTS_PATH
#define CAIRN_MAKE_CERTS_PATH "tests/testing/make_test_certs.sh"
#endif

namespace cairn::agent::testing {

class TestCerts {
 public:
  // The directory, or "" when the script failed (it printed why).
  static const std::string& Dir() {
    static TestCerts* certs = new TestCerts();
    return certs->dir_;
  }
  static std::string Path(const std::string& file) {
    return absl::StrCat(Dir(), "/", file);
  }
  // Sets o's TLS files to `name`.crt/.key signed by `ca`.crt.
  static void Use(TcpTransportOptions& o, const std::string& name = "peer",
                  const std::string& ca = "ca") {
    o.tls_ca_file = Path(ca + ".crt");
    o.tls_cert_file = Path(name + ".crt");
    o.tls_key_file = Path(name + ".key");
  }

 private:
  TestCerts() {
    const std::string dir =
        ::cairn::testing::MakeTempDirRemovedAtExit("peer-certs");
    if (dir.empty()) return;
    const std::string cmd =
        absl::StrCat("sh '", CAIRN_MAKE_CERTS_PATH, "' '", dir, "'");
    if (std::system(cmd.c_str()) != 0) return;
    dir_ = dir;
  }
  std::string dir_;
};

}  // namespace cairn::agent::testing

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_TCP_TEST_CERTS_H_
