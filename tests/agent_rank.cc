// cairn_agent_rank: one rank of the example training job in AGENT mode, for
// the multi-process agent tests and benchmarks. Saves through the node's
// cairn-agent (AsyncSave) and/or loads through it (memory tiers, storage
// fallback), checking every byte of the synthetic model.
//
//   cairn_agent_rank --agent-socket /tmp/a0.sock --coordinator 127.0.0.1:7070
//       --job demo --rank 0 --world-size 4 --layout 2x2:S0,S1 --save-step 10
//       [--kill-after-async-save | --no-wait] [--agent-dies-before-commit]
//   cairn_agent_rank ... --load latest --expect-source memory
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/agent/agent_checkpointer.h"
#include "client/examples/synthetic_model.h"

namespace {

int Fail(int rank, const absl::Status& s) {
  std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cairn;  // NOLINT
  CLI::App app{"One rank of Cairn's example job in agent mode",
               "cairn_agent_rank"};
  client::AgentCheckpointerOptions opts;
  std::string model_name = "small", layout_spec = "1:R", load_ref,
              expect_source = "any";
  int64_t save_step = -1;
  bool kill_after = false, no_wait = false, json = false;
  int repeat = 1;
  app.add_option("--agent-socket", opts.agent_socket, "Agent's UDS path")
      ->required();
  app.add_option("--coordinator", opts.direct.coordinator, "cairnd host:port")
      ->required();
  app.add_option("--job", opts.direct.job, "Job name")->required();
  app.add_option("--rank", opts.direct.rank, "This rank")->required();
  app.add_option("--world-size", opts.direct.world_size, "Number of ranks")
      ->required();
  app.add_option("--model", model_name, "small | bench:<bytes> | llm:<bytes>")
      ->capture_default_str();
  app.add_option("--layout", layout_spec, "Device mesh and placements")
      ->capture_default_str();
  app.add_option("--save-step", save_step, "Save this step via the agent");
  std::string tier = "policy";
  app.add_option("--tier", tier,
                 "policy | persistent | memory: where the save goes")
      ->check(CLI::IsMember({"policy", "persistent", "memory"}));
  app.add_option("--repeat", repeat,
                 "Save --save-step, +1, ... this many times")
      ->capture_default_str();
  app.add_flag("--kill-after-async-save", kill_after,
               "Fault injection: SIGKILL this process right after AsyncSave "
               "returns");
  app.add_flag("--no-wait", no_wait, "Do not wait for the commit");
  app.add_option("--exit-after-stream-buckets",
                 opts.exit_after_stream_buckets_for_test,
                 "Fault injection: exit after filling this many streaming "
                 "buckets (a rank killed mid-stream)");
  app.add_flag("--agent-dies-before-commit",
               opts.agent_dies_before_commit_for_test,
               "Fault injection: the agent exits before CommitSave");
  app.add_option("--load", load_ref, "Load 'latest' or a step, then verify");
  app.add_option("--expect-source", expect_source,
                 "memory | storage | any: which tier must serve the load")
      ->capture_default_str();
  app.add_option("--copy-threads", opts.copy_threads, "memcpy threads")
      ->capture_default_str();
  app.add_flag("--json", json, "Print one JSON line per operation");
  CLI11_PARSE(app, argc, argv);
  const int rank = opts.direct.rank;

  auto spec = examples::ModelSpec(model_name);
  if (!spec.ok()) return Fail(rank, spec.status());
  auto layout = examples::ParseLayout(layout_spec);
  if (!layout.ok()) return Fail(rank, layout.status());
  auto ckpt = client::AgentCheckpointer::Connect(opts);
  if (!ckpt.ok()) return Fail(rank, ckpt.status());

  if (save_step >= 0) {
    for (int i = 0; i < repeat; ++i) {
      const int64_t step = save_step + i;
      auto model =
          examples::ShardedModel::Create(*spec, *layout, rank, true, step);
      if (!model.ok()) return Fail(rank, model.status());
      auto future = (*ckpt)->AsyncSave(
          step, (*model)->state(),
          tier == "memory"       ? client::SaveTier::kMemory
          : tier == "persistent" ? client::SaveTier::kPersistent
                                 : client::SaveTier::kPolicy);
      if (!future.ok()) return Fail(rank, future.status());
      const client::AgentSaveStats& s = (*ckpt)->last_save_stats();
      if (json) {
        std::printf(
            "{\"op\":\"async_save\",\"rank\":%d,\"step\":%ld,\"bytes\":%lu,"
            "\"blocked_s\":%.6f,\"copy_s\":%.6f,\"begin_s\":%.6f}\n",
            rank, static_cast<long>(step), static_cast<unsigned long>(s.bytes),
            absl::ToDoubleSeconds(s.blocked),
            absl::ToDoubleSeconds(s.copy_time),
            absl::ToDoubleSeconds(s.begin_time));
      } else {
        std::printf(
            "rank %d: async save step %ld returned (%.1f MB in %.3f s)\n", rank,
            static_cast<long>(step), s.bytes / 1e6,
            absl::ToDoubleSeconds(s.blocked));
      }
      std::fflush(stdout);
      if (kill_after) kill(getpid(), SIGKILL);
      if (!no_wait) {
        absl::Time t0 = absl::Now();
        auto rec = future->Wait(absl::Minutes(5));
        if (!rec.ok()) return Fail(rank, rec.status());
        if (json) {
          std::printf(
              "{\"op\":\"committed\",\"rank\":%d,\"step\":%ld,"
              "\"wait_s\":%.6f}\n",
              rank, static_cast<long>(step),
              absl::ToDoubleSeconds(absl::Now() - t0));
          std::fflush(stdout);
        }
      }
    }
  }
  if (!load_ref.empty()) {
    client::LoadRef ref = client::LoadRef::Latest();
    if (load_ref != "latest") {
      int64_t step;
      if (!absl::SimpleAtoi(load_ref, &step)) {
        return Fail(rank, absl::InvalidArgumentError("bad --load"));
      }
      ref = client::LoadRef::Step(step);
    }
    auto model = examples::ShardedModel::Create(*spec, *layout, rank, false, 0);
    if (!model.ok()) return Fail(rank, model.status());
    const absl::Time t0 = absl::Now();
    auto step = (*ckpt)->Load(ref, (*model)->state());
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!step.ok()) return Fail(rank, step.status());
    if (absl::Status v = (*model)->Verify(*step); !v.ok()) {
      return Fail(rank, v);
    }
    const bool memory =
        (*ckpt)->last_load_source() == client::LoadSource::kAgentMemory;
    if (json) {
      std::printf(
          "{\"op\":\"load\",\"rank\":%d,\"step\":%ld,\"bytes\":%lu,"
          "\"source\":\"%s\",\"bytes_local\":%lu,\"bytes_peers\":%lu,"
          "\"load_s\":%.6f}\n",
          rank, static_cast<long>(*step),
          static_cast<unsigned long>((*model)->local_bytes()),
          memory ? "memory" : "storage",
          static_cast<unsigned long>((*ckpt)->last_load_bytes_local()),
          static_cast<unsigned long>((*ckpt)->last_load_bytes_peers()), secs);
    } else {
      std::printf(
          "rank %d: loaded step %ld from %s (%lu B local, %lu B peers)%s\n",
          rank, static_cast<long>(*step), memory ? "agent memory" : "storage",
          static_cast<unsigned long>((*ckpt)->last_load_bytes_local()),
          static_cast<unsigned long>((*ckpt)->last_load_bytes_peers()),
          memory ? ""
                 : absl::StrCat(" agent said: ",
                                (*ckpt)->last_agent_load_error().ToString())
                       .c_str());
    }
    std::fflush(stdout);
    if (expect_source == "memory" && !memory) {
      return Fail(rank, absl::FailedPreconditionError(absl::StrCat(
                            "expected a load from agent memory; agent said: ",
                            (*ckpt)->last_agent_load_error().ToString())));
    }
    if (expect_source == "storage" && memory) {
      return Fail(
          rank, absl::FailedPreconditionError("expected a load from storage"));
    }
  }
  return 0;
}
