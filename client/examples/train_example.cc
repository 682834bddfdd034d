// cairn_train_example: one rank of an example training job. Builds this
// rank's shards of a synthetic model under a DTensor-style layout, saves them
// through libcairn at the given steps, and/or loads a checkpoint into its own
// layout and checks every byte. The quick start, the end-to-end tests and the
// benchmarks run several of these as separate processes.
//
//   cairn_train_example --coordinator 127.0.0.1:7070 --job demo --rank 3
//       --world-size 8 --model small --layout 2x4:S0,S1 --save-steps 100,200
//   cairn_train_example ... --world-size 3 --layout 3:S1 --load latest
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/checkpointer.h"
#include "client/examples/synthetic_model.h"
#include "common/daemon.h"

namespace {

int Fail(int rank, const absl::Status& s) {
  std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
  return 1;
}

}  // namespace

// This process's I/O counters (/proc/self/io): bytes that reached the block
// layer (read_bytes) and bytes through read-like system calls (rchar).
struct IoCounters {
  uint64_t read_bytes = 0;
  uint64_t rchar = 0;
};
// CPU seconds (user + system) this process has used so far, all threads.
double ProcessCpuSeconds() {
  struct rusage u;
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

IoCounters ReadIoCounters() {
  IoCounters c;
  std::FILE* f = std::fopen("/proc/self/io", "r");
  if (f == nullptr) return c;
  char name[64];
  unsigned long long v;
  while (std::fscanf(f, "%63s %llu", name, &v) == 2) {
    if (std::strcmp(name, "read_bytes:") == 0) c.read_bytes = v;
    if (std::strcmp(name, "rchar:") == 0) c.rchar = v;
  }
  std::fclose(f);
  return c;
}

int main(int argc, char** argv) {
  using namespace cairn;  // NOLINT
  CLI::App app{"One rank of Cairn's example training job",
               "cairn_train_example"};
  client::CheckpointerOptions opts;
  std::string model_name = "small", layout_spec = "1:R", save_steps, load_ref;
  bool die_before_commit = false, json = false;
  std::string pause_after_plan_load;
  int64_t fill_step = -1;
  app.add_option("--coordinator", opts.coordinator, "cairnd host:port")
      ->required();
  app.add_option("--job", opts.job, "Job name")->required();
  app.add_option("--rank", opts.rank, "This rank")->required();
  app.add_option("--world-size", opts.world_size, "Number of ranks")
      ->required();
  app.add_option("--model", model_name, "small | bench:<bytes> | llm:<bytes>")
      ->capture_default_str();
  app.add_option("--layout", layout_spec,
                 "Device mesh and placements, e.g. 2x4:S0,S1 or 3:S1")
      ->capture_default_str();
  app.add_option("--save-steps", save_steps, "Comma-separated steps to save");
  app.add_option("--load", load_ref, "Load 'latest' or a step, then verify");
  app.add_option("--io-threads", opts.io_threads, "Parallel storage I/O")
      ->capture_default_str();
  const std::map<std::string, client::PartialChunkCheck> checks{
      {"collective", client::PartialChunkCheck::kCollective},
      {"whole", client::PartialChunkCheck::kReadWhole},
      {"none", client::PartialChunkCheck::kNone}};
  app.add_option("--partial-check", opts.partial_chunk_check,
                 "How to verify stored chunks this rank needs only part of: "
                 "collective (exact reads, crc terms combined by cairnd), "
                 "whole (read them whole), none (unverified)")
      ->transform(CLI::CheckedTransformer(checks, CLI::ignore_case))
      ->capture_default_str();
  app.add_flag(
      "--buffered-writes", [&](int64_t) { opts.store.use_odirect = false; },
      "Write data objects through the page cache instead of O_DIRECT");
  app.add_flag("--die-before-commit", die_before_commit,
               "Fault injection: exit(137) after writing, before CommitSave");
  app.add_option("--fill-step", fill_step,
                 "Fault injection: save the values of this step instead of "
                 "the saved step's (a restarted process whose state differs)");
  app.add_flag("--json", json, "Print one JSON line of stats per operation");
  app.add_option("--pause-after-plan-load", pause_after_plan_load,
                 "Test hook: after PlanLoad, write the step to PATH.planned "
                 "and wait until PATH.go exists");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<std::vector<examples::TensorSpec>> spec =
      examples::ModelSpec(model_name);
  if (!spec.ok()) return Fail(opts.rank, spec.status());
  absl::StatusOr<planner::DTensorLayout> layout =
      examples::ParseLayout(layout_spec);
  if (!layout.ok()) return Fail(opts.rank, layout.status());
  if (die_before_commit) {
    opts.before_commit_for_test = [] { _exit(137); };
  }
  if (!pause_after_plan_load.empty()) {
    opts.after_plan_load_for_test = [&](int64_t step) {
      // Whole or not at all: the test reads it as soon as it appears.
      if (absl::Status s = daemon::WriteFileAtomically(
              pause_after_plan_load + ".planned", absl::StrCat(step, "\n"));
          !s.ok()) {
        std::fprintf(stderr, "--pause-after-plan-load: %s\n",
                     s.ToString().c_str());
      }
      const std::string go = pause_after_plan_load + ".go";
      while (::access(go.c_str(), F_OK) != 0) ::usleep(10000);
    };
  }
  absl::StatusOr<std::unique_ptr<client::Checkpointer>> ckpt =
      client::Checkpointer::Connect(opts);
  if (!ckpt.ok()) return Fail(opts.rank, ckpt.status());

  // Around each Save/Load: its I/O counters and this process's CPU time
  // (the tensors are made before, and checked after: neither counts).
  IoCounters io_before;
  auto report = [&](const char* op, int64_t step, uint64_t local_bytes,
                    double cpu) {
    const client::TransferStats& s = (*ckpt)->last_stats();
    const double io = absl::ToDoubleSeconds(s.io_time);
    const IoCounters io_after = ReadIoCounters();
    if (json) {
      std::printf(
          "{\"op\":\"%s\",\"rank\":%d,\"step\":%ld,\"bytes\":%lu,"
          "\"storage_bytes\":%lu,\"block_read_bytes\":%lu,"
          "\"syscall_read_bytes\":%lu,\"chunks_verified_by_cairnd\":%ld,"
          "\"chunks_verified_locally\":%ld,\"plan_s\":%.6f,\"io_s\":%.6f,"
          "\"commit_s\":%.6f,\"cpu_s\":%.6f,\"plan_cached\":%s,"
          "\"fingerprint_only\":%s}\n",
          op, opts.rank, static_cast<long>(step),
          static_cast<unsigned long>(s.bytes),
          static_cast<unsigned long>(s.bytes_storage),
          static_cast<unsigned long>(io_after.read_bytes -
                                     io_before.read_bytes),
          static_cast<unsigned long>(io_after.rchar - io_before.rchar),
          static_cast<long>(s.chunks_verified_by_cairnd),
          static_cast<long>(s.chunks_verified_locally),
          absl::ToDoubleSeconds(s.plan_time), io,
          absl::ToDoubleSeconds(s.commit_time), cpu,
          s.plan_from_cache ? "true" : "false",
          s.sent_fingerprint_only ? "true" : "false");
    } else {
      std::printf(
          "rank %d: %s step %ld: %.1f MB of %.1f MB local in %.2f s%s\n",
          opts.rank, op, static_cast<long>(step), s.bytes / 1e6,
          local_bytes / 1e6, io, s.plan_from_cache ? " (cached plan)" : "");
    }
    std::fflush(stdout);
  };

  if (!save_steps.empty()) {
    for (absl::string_view part : absl::StrSplit(save_steps, ',')) {
      int64_t step;
      if (!absl::SimpleAtoi(part, &step)) {
        return Fail(opts.rank, absl::InvalidArgumentError(
                                   absl::StrCat("bad step '", part, "'")));
      }
      absl::StatusOr<std::unique_ptr<examples::ShardedModel>> model =
          examples::ShardedModel::Create(*spec, *layout, opts.rank, true,
                                         fill_step >= 0 ? fill_step : step);
      if (!model.ok()) return Fail(opts.rank, model.status());
      io_before = ReadIoCounters();
      const double cpu_before = ProcessCpuSeconds();
      absl::StatusOr<client::CheckpointInfo> rec =
          (*ckpt)->Save(step, (*model)->state());
      if (!rec.ok()) return Fail(opts.rank, rec.status());
      report("save", step, (*model)->local_bytes(),
             ProcessCpuSeconds() - cpu_before);
    }
  }
  if (!load_ref.empty()) {
    client::LoadRef ref = client::LoadRef::Latest();
    if (load_ref != "latest") {
      int64_t step;
      if (!absl::SimpleAtoi(load_ref, &step)) {
        return Fail(opts.rank, absl::InvalidArgumentError(absl::StrCat(
                                   "bad --load '", load_ref, "'")));
      }
      ref = client::LoadRef::Step(step);
    }
    absl::StatusOr<std::unique_ptr<examples::ShardedModel>> model =
        examples::ShardedModel::Create(*spec, *layout, opts.rank, false, 0);
    if (!model.ok()) return Fail(opts.rank, model.status());
    io_before = ReadIoCounters();
    const double cpu_before = ProcessCpuSeconds();
    absl::StatusOr<int64_t> step = (*ckpt)->Load(ref, (*model)->state());
    if (!step.ok()) return Fail(opts.rank, step.status());
    const double load_cpu = ProcessCpuSeconds() - cpu_before;
    if (absl::Status v = (*model)->Verify(*step); !v.ok()) {
      return Fail(opts.rank, v);
    }
    report("load", *step, (*model)->local_bytes(), load_cpu);
  }
  return 0;
}
