// cairnd: the Cairn coordinator daemon. Parses flags (cairnd_flags.h) and
// runs it (cairnd.h): serves until SIGTERM/SIGINT, drains and exits 0 (1
// when it stopped because its storage lease was lost, storage/lease.h);
// SIGHUP reloads the TLS files (--tls-cert, --tls-key, --tls-client-ca) and
// the token file (--auth-tokens), and so does a change of any of them seen
// by --reload-every (for Kubernetes Secrets and cert-manager renewals, which
// replace the files but send no signal).
#include <iostream>
#include <optional>

#include "CLI/CLI.hpp"
#include "common/cli_flags.h"
#include "server/coordinator/cairnd.h"
#include "server/coordinator/cairnd_flags.h"

int main(int argc, char** argv) {
  CLI::App app{
      "cairnd: Cairn's checkpoint coordinator. Plans every save (dedupe, "
      "balanced writers, cached plans) and load (resharding read items), and "
      "keeps the checkpoint catalog in RocksDB. Serves cairn.v1.Coordinator, "
      "grpc.health.v1 and server reflection (off with --auth-tokens), over "
      "TLS with --tls-cert and --tls-key (SIGHUP reloads them).",
      "cairnd"};
  cairn::coordinator::CairndFlags flags;
  cairn::coordinator::AddCairndFlags(app, &flags);
  if (std::optional<int> exit_code =
          cairn::flags::Parse(app, argc, argv, std::cout, std::cerr)) {
    return *exit_code;
  }
  return cairn::coordinator::RunCairnd(flags.Config());
}
