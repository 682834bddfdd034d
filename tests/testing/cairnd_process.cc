#include "tests/testing/cairnd_process.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/temp_dir.h"
#include "protocol/client_security.h"
#include "protocol/coordinator_call.h"

#ifndef CAIRN_MAKE_CERTS_PATH
#define CAIRN_MAKE_CERTS_PATH ""
#endif

namespace cairn::testing {
namespace {

// The cairnd flags of CAIRN_TEST_SECURITY (none when unset). Made once per
// process: certificates, a 0600 token file, and the clients' environment.
absl::StatusOr<std::vector<std::string>> SecurityFlags() {
  const char* mode = std::getenv("CAIRN_TEST_SECURITY");
  if (mode == nullptr || *mode == '\0') return std::vector<std::string>{};
  if (std::string(mode) != "tls+tokens") {
    return absl::InvalidArgumentError(absl::StrCat(
        "CAIRN_TEST_SECURITY='", mode, "': the only mode is tls+tokens"));
  }
  static const absl::StatusOr<std::vector<std::string>>* flags = [] {
    using Result = absl::StatusOr<std::vector<std::string>>;
    const char* script = std::getenv("CAIRN_MAKE_CERTS");
    const std::string make_certs =
        script != nullptr ? script : CAIRN_MAKE_CERTS_PATH;
    const std::string dir = MakeTempDir("security");
    if (make_certs.empty() || dir.empty()) {
      return new Result(absl::FailedPreconditionError(
          "CAIRN_TEST_SECURITY needs tests/testing/make_test_certs.sh "
          "(CAIRN_MAKE_CERTS)"));
    }
    const std::string cmd = absl::StrCat("sh '", make_certs, "' '", dir, "'");
    if (std::system(cmd.c_str()) != 0) {
      return new Result(absl::InternalError(absl::StrCat("failed: ", cmd)));
    }
    const std::string token = absl::StrCat("test-admin-", getpid(), "-",
                                           absl::ToUnixNanos(absl::Now()));
    const std::string tokens = dir + "/tokens";
    { std::ofstream(tokens) << token << " admin * test-admin\n"; }
    std::filesystem::permissions(tokens,
                                 std::filesystem::perms::owner_read |
                                     std::filesystem::perms::owner_write);
    // Before any rank, agent or CLI starts: they inherit or read these.
    setenv("CAIRN_TLS_CA", (dir + "/ca.crt").c_str(), 1);
    setenv("CAIRN_TOKEN", token.c_str(), 1);
    return new Result(
        std::vector<std::string>{"--tls-cert", dir + "/server.crt", "--tls-key",
                                 dir + "/server.key", "--auth-tokens", tokens});
  }();
  return *flags;
}

}  // namespace

std::shared_ptr<grpc::Channel> CairndChannel(const std::string& address) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> c =
      protocol::NewCoordinatorChannel(
          address, protocol::ClientSecurity::FromEnvironment());
  return c.ok() ? *c : protocol::NewCoordinatorChannel(address);
}

absl::StatusOr<std::unique_ptr<CairndProcess>> CairndProcess::Start(
    const std::string& binary, const std::string& data_dir,
    const std::vector<std::string>& flags) {
  std::filesystem::create_directories(data_dir);
  const std::string port_file = data_dir + "/cairnd.port";
  std::filesystem::remove(port_file);
  std::vector<std::string> argv = {binary,       "--listen", "127.0.0.1:0",
                                   "--data-dir", data_dir,   "--port-file",
                                   port_file};
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<std::vector<std::string>> security = SecurityFlags();
  if (!security.ok()) return security.status();
  argv.insert(argv.end(), security->begin(), security->end());
  absl::StatusOr<Subprocess> p =
      Subprocess::Start(argv, data_dir + "/cairnd.log");
  if (!p.ok()) return p.status();
  absl::StatusOr<std::string> port =
      WaitForFile(port_file, *p, absl::Seconds(30));
  if (!port.ok()) {
    return absl::Status(
        port.status().code(),
        absl::StrCat("cairnd did not start: ", port.status().message()));
  }
  return std::unique_ptr<CairndProcess>(new CairndProcess(
      std::move(*p),
      absl::StrCat("127.0.0.1:", absl::StripAsciiWhitespace(*port))));
}

}  // namespace cairn::testing
