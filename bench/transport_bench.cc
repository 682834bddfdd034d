// transport_bench (issue 16): the agents' tcp peer transport throughput on
// loopback, plaintext vs mutual TLS, in one process: node 0 sends
// --message-bytes messages (the transfer bucket size) to node 1, whose
// receiver takes each as it arrives. The connection (and TLS handshake) is
// made by a warm-up message first; the time is from the first measured
// Send to the last message received.
//
//   transport_bench --bytes 2147483648 --tls-dir DIR [--repeat 3]
//     DIR holds ca.crt, peer.crt and peer.key (as tests/testing/
//     make_test_certs.sh makes them); without --tls-dir only plaintext runs.
//   transport_bench --smoke ...   # 64 MiB, 1 run: seconds, for ctest
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "server/agent/transport/tcp/tcp_transport.h"

namespace {

using cairn::agent::TcpTransport;
using cairn::agent::TcpTransportOptions;

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "transport_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

// Seconds to move `count` messages of `message` bytes from node 0 to 1.
double Run(const std::string& tls_dir, uint64_t message, int count) {
  std::vector<int> ports(2, 0);
  std::vector<std::unique_ptr<TcpTransport>> nodes;
  for (int i = 0; i < 2; ++i) {
    TcpTransportOptions o;
    o.node_id = i;
    o.num_nodes = 2;
    o.max_frame_bytes = message;
    o.resolve_peer = [&ports](int n) -> absl::StatusOr<std::string> {
      return absl::StrCat("127.0.0.1:", ports[n]);
    };
    if (!tls_dir.empty()) {
      o.tls_ca_file = tls_dir + "/ca.crt";
      o.tls_cert_file = tls_dir + "/peer.crt";
      o.tls_key_file = tls_dir + "/peer.key";
    }
    auto t = TcpTransport::Start(o);
    if (!t.ok()) Die(t.status());
    ports[i] = (*t)->port();
    nodes.push_back(std::move(*t));
  }
  const std::string payload(message, 'x');
  if (absl::Status s = nodes[0]->Send(1, 0, payload); !s.ok()) Die(s);
  if (auto m = nodes[1]->RecvMessage(0, 0, absl::Minutes(1)); !m.ok()) {
    Die(m.status());
  }
  const absl::Time start = absl::Now();
  std::thread receiver([&] {
    for (int i = 1; i <= count; ++i) {
      auto m = nodes[1]->RecvMessage(0, i, absl::Minutes(5));
      if (!m.ok()) Die(m.status());
      if (m->size() != message) Die(absl::DataLossError("short message"));
    }
  });
  for (int i = 1; i <= count; ++i) {
    if (absl::Status s = nodes[0]->Send(1, i, payload); !s.ok()) Die(s);
  }
  receiver.join();
  return absl::ToDoubleSeconds(absl::Now() - start);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Peer transport throughput, plaintext vs mutual TLS",
               "transport_bench"};
  uint64_t bytes = uint64_t{2} << 30, message = uint64_t{32} << 20;
  int repeat = 3;
  std::string tls_dir;
  bool smoke = false;
  app.add_option("--bytes", bytes, "Bytes per run")->capture_default_str();
  app.add_option("--message-bytes", message, "Bytes per message (>= 64 KiB)")
      ->capture_default_str();
  app.add_option("--repeat", repeat, "Runs per mode (median reported)")
      ->capture_default_str();
  app.add_option("--tls-dir", tls_dir,
                 "ca.crt, peer.crt, peer.key: also measure mutual TLS");
  app.add_flag("--smoke", smoke, "64 MiB, 1 run; explicit flags win");
  CLI11_PARSE(app, argc, argv);
  if (smoke) {
    if (app.count("--bytes") == 0) bytes = uint64_t{64} << 20;
    if (app.count("--repeat") == 0) repeat = 1;
  }
  if (repeat < 1 || message < cairn::agent::kMinFrameBytes) {
    std::fprintf(stderr,
                 "transport_bench: --repeat must be >= 1 and "
                 "--message-bytes >= %lu\n",
                 static_cast<unsigned long>(cairn::agent::kMinFrameBytes));
    return 2;
  }
  (void)cairn::SetLogLevel("warn");
  const int count = static_cast<int>(std::max<uint64_t>(1, bytes / message));
  const double gb = static_cast<double>(count) * message / 1e9;
  std::vector<std::string> modes = {""};
  if (!tls_dir.empty()) modes.push_back(tls_dir);
  double plain_gbs = 0;
  for (const std::string& mode : modes) {
    std::vector<double> times;
    for (int r = 0; r < repeat; ++r) times.push_back(Run(mode, message, count));
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    const double gbs = gb / t;
    if (mode.empty()) plain_gbs = gbs;
    std::printf(
        "transport_bench: %-10s %.3f GB in %d messages of %lu B: %.3f s, "
        "%.2f GB/s%s\n",
        mode.empty() ? "plaintext" : "mutual-tls", gb, count,
        static_cast<unsigned long>(message), t, gbs,
        mode.empty()
            ? ""
            : absl::StrCat(" (", static_cast<int>(100 * gbs / plain_gbs),
                           "% of plaintext)")
                  .c_str());
  }
  return 0;
}
