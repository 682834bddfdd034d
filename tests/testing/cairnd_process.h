// cairnd as a real child process for end-to-end tests: binds port 0 on
// loopback and reports its port through --port-file.
//
// With CAIRN_TEST_SECURITY=tls+tokens in the test's environment (the
// secure.* ctests), every cairnd started here serves TLS (certificates from
// tests/testing/make_test_certs.sh, at CAIRN_MAKE_CERTS) and requires a
// token (--auth-tokens with one admin token), and the test process's
// environment gets CAIRN_TLS_CA and CAIRN_TOKEN, which ranks, the CLI,
// agents and CairndChannel() read: the same suites then run end to end
// with TLS and tokens on.
#ifndef CAIRN_TESTS_TESTING_CAIRND_PROCESS_H_
#define CAIRN_TESTS_TESTING_CAIRND_PROCESS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "tests/testing/subprocess.h"

namespace cairn::testing {

class CairndProcess {
 public:
  // Starts `binary` with --data-dir `data_dir` plus `flags`, and waits until
  // it serves.
  static absl::StatusOr<std::unique_ptr<CairndProcess>> Start(
      const std::string& binary, const std::string& data_dir,
      const std::vector<std::string>& flags = {});

  const std::string& address() const { return address_; }
  Subprocess& process() { return process_; }

 private:
  CairndProcess(Subprocess p, std::string address)
      : process_(std::move(p)), address_(std::move(address)) {}
  Subprocess process_;
  std::string address_;
};

// A channel to cairnd at `address` as clients make it: TLS and token from
// CAIRN_TLS_CA/CERT/KEY and CAIRN_TOKEN when set (the secure mode above),
// plaintext otherwise.
std::shared_ptr<grpc::Channel> CairndChannel(const std::string& address);

}  // namespace cairn::testing

#endif  // CAIRN_TESTS_TESTING_CAIRND_PROCESS_H_
