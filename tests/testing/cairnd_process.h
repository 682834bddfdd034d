// cairnd as a real child process for end-to-end tests: binds port 0 on
// loopback and reports its port through --port-file.
#ifndef CAIRN_TESTS_TESTING_CAIRND_PROCESS_H_
#define CAIRN_TESTS_TESTING_CAIRND_PROCESS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
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

// A fresh directory under the test's temp dir.
std::string MakeTempDir(const std::string& name);

}  // namespace cairn::testing

#endif  // CAIRN_TESTS_TESTING_CAIRND_PROCESS_H_
