#include "common/grpc_logging.h"

#include <grpc/support/log.h>

#include "common/logging.h"

namespace cairn {
namespace {

void LogToCairn(gpr_log_func_args* args) {
  const char* file = args->file != nullptr ? args->file : "?";
  switch (args->severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      CAIRN_LOG(trace, "grpc {}:{}: {}", file, args->line, args->message);
      break;
    case GPR_LOG_SEVERITY_INFO:  // chatty (pollers, fds): below Cairn's info
      CAIRN_LOG(debug, "grpc {}:{}: {}", file, args->line, args->message);
      break;
    case GPR_LOG_SEVERITY_ERROR:
      CAIRN_LOG(error, "grpc {}:{}: {}", file, args->line, args->message);
      break;
  }
}

}  // namespace

void RouteGrpcLogsToCairnLogger() {
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_DEBUG);
  gpr_set_log_function(&LogToCairn);
}

}  // namespace cairn
