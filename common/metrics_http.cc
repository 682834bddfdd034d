#include "common/metrics_http.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "httplib.h"

namespace cairn::metrics {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen_address, const Registry* registry) {
  const size_t colon = listen_address.rfind(':');
  int port = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(listen_address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", listen_address,
                     "' is not host:port (e.g. 0.0.0.0:7080; port 0 picks "
                     "a free port)"));
  }
  std::string host = listen_address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";

  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->server_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *s->server_;
  // httplib's default sets SO_REUSEPORT, which lets a second daemon "bind"
  // the same port and steal half the scrapes: only SO_REUSEADDR here, so a
  // port in use is an error.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  http.Get("/metrics",
           [registry](const httplib::Request&, httplib::Response& response) {
             response.set_content(registry->Render(), Registry::kContentType);
           });
  errno = 0;
  if (port == 0) {
    s->port_ = http.bind_to_any_port(host);
  } else if (http.bind_to_port(host, port)) {
    s->port_ = port;
  }
  if (s->port_ <= 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", listen_address, ": ",
        err != 0 ? std::strerror(err)
                 : "cannot bind (in use, or not a local address)"));
  }
  s->thread_ = std::thread([&http] { http.listen_after_bind(); });
  // stop() only stops a running server: wait until it runs, so the
  // destructor never waits on a listener that started after stop().
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!http.is_running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (!http.is_running()) {
    return absl::InternalError(
        absl::StrCat("metrics server on ", listen_address, " did not start"));
  }
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace cairn::metrics
