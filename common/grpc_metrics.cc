#include "common/grpc_metrics.h"

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace cairn::metrics {
namespace {

namespace ge = grpc::experimental;

struct RpcMetrics {
  Family<Counter>* calls;
  Family<Histogram>* latency;
};

class RpcMetricsInterceptor final : public ge::Interceptor {
 public:
  RpcMetricsInterceptor(const RpcMetrics& metrics, const char* full_method)
      : metrics_(metrics), start_(absl::Now()) {
    // "/cairn.v1.Coordinator/BeginSave"
    std::string_view m = full_method == nullptr ? "" : full_method;
    if (!m.empty() && m.front() == '/') m.remove_prefix(1);
    const size_t slash = m.rfind('/');
    service_ = std::string(slash == m.npos ? "" : m.substr(0, slash));
    method_ = std::string(slash == m.npos ? m : m.substr(slash + 1));
  }
  ~RpcMetricsInterceptor() override {
    // A call that ended without sending a status (the client went away).
    if (!recorded_) Record(grpc::StatusCode::CANCELLED);
  }

  void Intercept(ge::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            ge::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Record(grpc::StatusCode code) {
    if (recorded_) return;
    recorded_ = true;
    metrics_.calls->Get({service_, method_, GrpcCodeName(code)})->Increment();
    metrics_.latency->Get({service_, method_})
        ->Observe(absl::ToDoubleSeconds(absl::Now() - start_));
  }

  const RpcMetrics metrics_;
  const absl::Time start_;
  std::string service_, method_;
  bool recorded_ = false;
};

class Factory final : public ge::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(RpcMetrics metrics) : metrics_(metrics) {}
  ge::Interceptor* CreateServerInterceptor(ge::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(metrics_, info->method());
  }

 private:
  const RpcMetrics metrics_;
};

}  // namespace

std::string GrpcCodeName(int code) {
  static constexpr std::array<const char*, 17> kNames = {"OK",
                                                         "CANCELLED",
                                                         "UNKNOWN",
                                                         "INVALID_ARGUMENT",
                                                         "DEADLINE_EXCEEDED",
                                                         "NOT_FOUND",
                                                         "ALREADY_EXISTS",
                                                         "PERMISSION_DENIED",
                                                         "RESOURCE_EXHAUSTED",
                                                         "FAILED_PRECONDITION",
                                                         "ABORTED",
                                                         "OUT_OF_RANGE",
                                                         "UNIMPLEMENTED",
                                                         "INTERNAL",
                                                         "UNAVAILABLE",
                                                         "DATA_LOSS",
                                                         "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(kNames.size())) return kNames[code];
  return std::to_string(code);
}

std::unique_ptr<ge::ServerInterceptorFactoryInterface>
RpcMetricsInterceptorFactory(Registry* registry) {
  RpcMetrics m;
  m.calls = registry->AddCounterFamily(
      "cairn_rpcs_total",
      "gRPC calls served, by service, method and status code.",
      {"service", "method", "code"});
  m.latency = registry->AddHistogramFamily(
      "cairn_rpc_duration_seconds",
      "Time from a gRPC call's start to its status, by service and method "
      "(BeginSave and CommitSave include the wait for the other ranks).",
      {"service", "method"}, Histogram::LatencyBuckets());
  return std::make_unique<Factory>(m);
}

}  // namespace cairn::metrics
