// The `cairn` command-line tool, as a library so tests run it in-process.
//
//   cairn [--coordinator HOST:PORT | --storage URI] <command> ...
//     ls [JOB] [--all] [--json]        jobs and checkpoints
//     show JOB STEP|latest [--json] [--chunks]
//     verify JOB STEP|latest           re-read every byte, check crc32c
//     export JOB STEP|latest --out DIR [--format safetensors]
//            [--max-shard-size 5GB] [--filter PREFIX]...
//                                      whole tensors as safetensors files
//                                      (safetensors_export.h)
//     diff JOB STEP_A STEP_B [--json]  entries added, removed, changed, and
//                                      whose bytes differ (checkpoint_diff.h)
//     rm JOB STEP [--yes]              delete a checkpoint
//     gc JOB --keep N [--dry-run]      keep the newest N committed
//     agents                           cairnd's agent registry (--coordinator)
//     forget-agent NODE [--yes]        free the id of a node gone for good
//
// With --coordinator it asks a running cairnd; with --storage it reads the
// MANIFESTs on storage directly (offline: no cairnd needed).
// Exit codes: 0 success, 1 the operation failed, 2 usage error (a bad flag,
// job name or step). diff, as diff(1): 0 identical, 1 different, 2 error.
#ifndef CAIRN_CLIENT_CLI_CLI_H_
#define CAIRN_CLIENT_CLI_CLI_H_

#include <istream>
#include <ostream>

namespace cairn::cli {

// Runs the tool on argv (argv[0] is the program name) and returns its exit
// code; `in` answers rm's confirmation prompt.
int RunCli(int argc, const char* const* argv, std::istream& in,
           std::ostream& out, std::ostream& err);
// The same with std::cin.
int RunCli(int argc, const char* const* argv, std::ostream& out,
           std::ostream& err);

}  // namespace cairn::cli

#endif  // CAIRN_CLIENT_CLI_CLI_H_
