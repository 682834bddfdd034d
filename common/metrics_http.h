// The daemons' Prometheus endpoint: GET /metrics answers a Registry's
// Render() (Content-Type text/plain; version=0.0.4); every other path is 404.
// Built on cpp-httplib (Debian's libcpp-httplib-dev) with two threads: a
// scrape is one small request every few seconds.
//
// Example (tests bind port 0 and ask for the port):
//   CAIRN_ASSIGN_OR_RETURN(auto http,
//                          MetricsHttpServer::Start("127.0.0.1:0", &registry));
//   Scrape(absl::StrCat("http://127.0.0.1:", http->port(), "/metrics"));
//
// Thread-safe.
#ifndef CAIRN_COMMON_METRICS_HTTP_H_
#define CAIRN_COMMON_METRICS_HTTP_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace cairn::metrics {

class MetricsHttpServer {
 public:
  // Listens on `listen_address` (host:port, [v6]:port; port 0 picks a free
  // port). INVALID_ARGUMENT for an address that is not host:port,
  // UNAVAILABLE naming the address when it cannot be bound (in use, not
  // local). `registry` must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen_address, const Registry* registry);
  // Stops serving and joins the server's threads.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port (useful with port 0).
  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace cairn::metrics

#endif  // CAIRN_COMMON_METRICS_HTTP_H_
