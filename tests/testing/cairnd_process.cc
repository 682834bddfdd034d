#include "tests/testing/cairnd_process.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace cairn::testing {

std::string MakeTempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl =
      absl::StrCat(base ? base : "/tmp", "/cairn-", name, "-XXXXXX");
  char* dir = mkdtemp(tmpl.data());
  return dir ? std::string(dir) : std::string();
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
  absl::StatusOr<Subprocess> p =
      Subprocess::Start(argv, data_dir + "/cairnd.log");
  if (!p.ok()) return p.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      return std::unique_ptr<CairndProcess>(
          new CairndProcess(std::move(*p), absl::StrCat("127.0.0.1:", port)));
    }
    absl::StatusOr<int> exited = p->Wait(absl::Milliseconds(20));
    if (exited.ok()) {
      return absl::InternalError(absl::StrCat("cairnd exited with ", *exited,
                                              " before serving: ", p->Log()));
    }
  }
  return absl::DeadlineExceededError("cairnd did not start within 30 s");
}

}  // namespace cairn::testing
