// agent_bench (issue 6): agent mode's numbers for bench/README.md, each next to
// the machine's own limit measured in the same run.
//
//  1. Blocked time: how long a rank waits in AsyncSave (the snapshot memcpy
//     into the agent's shared-memory staging) vs the time memcpy takes for
//     the same bytes between two warm buffers. Target: <= 1.5x.
//  2. End-to-end save throughput: AsyncSave + wait for the commit through
//     the agent vs a direct-mode Checkpointer::Save, same bytes, same store.
//  3. Load: two nodes' agents hold a checkpoint saved as 2:S0; each rank loads
//     it resharded as 2:S1 from the agents' memory (local + peer over tcp) vs
//     from storage (direct mode; page cache dropped first when possible).
//
// Everything runs in this process except storage: a CoordinatorServer, two
// Agents (UDS + tcp peer transport on loopback) and the ranks' clients.
//
// The two ranks of each load run concurrently, as in a job (the load is a
// collective: every rank's VerifyLoad waits for the others); the time is
// from the start of both to the end of the slower.
//
//   agent_bench --bytes 1073741824 --dir /tmp/agent-bench [--repeat 3]
//   agent_bench --smoke   # 4 MB, 1 measured save, non-durable, a fresh
//                         # temporary --dir: seconds, for ctest
//   agent_bench --peer-tls-dir DIR  # the agents' peer transport over mutual
//                         # TLS with DIR/{ca,peer}.crt, DIR/peer.key (as
//                         # tests/testing/make_test_certs.sh makes them)
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/agent/agent_checkpointer.h"
#include "client/checkpointer.h"
#include "client/examples/synthetic_model.h"
#include "common/logging.h"
#include "server/agent/agent_server.h"
#include "server/coordinator/coordinator_server.h"

namespace {

using namespace cairn;  // NOLINT

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "agent_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) Die(v.status());
  return std::move(*v);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool DropPageCache() {
  sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Agent-mode benchmark (issue 6)", "agent_bench"};
  uint64_t bytes = uint64_t{512} << 20;
  std::string dir = "/tmp/cairn-agent-bench";
  int repeat = 3;
  bool durable = true;
  app.add_option("--bytes", bytes, "Model bytes (one rank saves all)")
      ->capture_default_str();
  app.add_option("--dir", dir, "Scratch directory (storage, catalog)")
      ->capture_default_str();
  app.add_option("--repeat", repeat, "Measured saves (median reported)")
      ->capture_default_str();
  app.add_option("--durable", durable, "fsync storage writes")
      ->capture_default_str();
  std::string peer_tls_dir;
  app.add_option("--peer-tls-dir", peer_tls_dir,
                 "Run the agents' peer transport over mutual TLS with "
                 "ca.crt, peer.crt and peer.key from this directory");
  bool smoke = false;
  app.add_flag("--smoke", smoke,
               "tiny sizes (4 MB, 1 save, non-durable, temporary --dir) to "
               "check quickly that the benchmark runs; explicit flags win");
  CLI11_PARSE(app, argc, argv);
  if (smoke) {
    if (app.count("--bytes") == 0) bytes = 4'000'000;
    if (app.count("--repeat") == 0) repeat = 1;
    if (app.count("--durable") == 0) durable = false;
    if (app.count("--dir") == 0) {
      std::string tmpl =
          (std::filesystem::temp_directory_path() / "cairn-agent-bench.XXXXXX")
              .string();
      if (::mkdtemp(tmpl.data()) == nullptr) {
        std::perror("mkdtemp");
        return 1;
      }
      dir = tmpl;
    }
  }
  if (repeat < 1) {
    std::fprintf(stderr, "agent_bench: --repeat must be >= 1\n");
    return 2;
  }
  (void)SetLogLevel("warn");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  coordinator::CoordinatorServer::Spec cspec;
  cspec.listen_address = "127.0.0.1:0";
  cspec.coordinator.storage_uri = absl::StrCat("file://", dir, "/ckpt");
  cspec.coordinator.catalog_path = dir + "/catalog";
  auto cairnd = Check(coordinator::CoordinatorServer::Start(cspec));
  const std::string address = absl::StrCat("127.0.0.1:", cairnd->port());

  std::vector<int> ports(2, 0);
  std::vector<std::unique_ptr<agent::AgentServer>> agents;
  for (int node = 0; node < 2; ++node) {
    agent::AgentServer::Spec spec;
    spec.unix_socket =
        absl::StrCat("/tmp/cairn-agent-bench-", getpid(), "-", node, ".sock");
    spec.agent.node_id = node;
    spec.agent.num_nodes = 2;
    spec.agent.coordinator = address;
    spec.agent.staging_budget_bytes = bytes * 4 + (uint64_t{64} << 20);
    spec.agent.store.durable = durable;
    if (!peer_tls_dir.empty()) {
      spec.agent.peer_tls_ca_file = peer_tls_dir + "/ca.crt";
      spec.agent.peer_tls_cert_file = peer_tls_dir + "/peer.crt";
      spec.agent.peer_tls_key_file = peer_tls_dir + "/peer.key";
    }
    spec.agent.resolve_peer = [&ports](int n) -> absl::StatusOr<std::string> {
      return absl::StrCat("127.0.0.1:", ports[n]);
    };
    agents.push_back(Check(agent::AgentServer::Start(std::move(spec))));
    ports[node] = agents.back()->agent().peer_port();
  }
  auto socket = [&](int node) {
    return absl::StrCat("/tmp/cairn-agent-bench-", getpid(), "-", node,
                        ".sock");
  };
  auto options = [&](int rank, int world, const std::string& job) {
    client::AgentCheckpointerOptions o;
    o.agent_socket = socket(rank % 2);
    o.direct.coordinator = address;
    o.direct.job = job;
    o.direct.rank = rank;
    o.direct.world_size = world;
    o.direct.store.durable = durable;
    return o;
  };

  auto specs = Check(examples::ModelSpec(absl::StrCat("bench:", bytes)));
  auto one = Check(examples::ParseLayout("1:R"));
  auto model = Check(examples::ShardedModel::Create(specs, one, 0, true, 1));
  const uint64_t n = model->local_bytes();

  // 1. memcpy limit: the same bytes, between two warm buffers.
  std::vector<char> a(n, 1), b(n, 2);
  std::vector<double> memcpy_s;
  for (int i = 0; i < repeat + 1; ++i) {
    const absl::Time t0 = absl::Now();
    std::memcpy(b.data(), a.data(), n);
    memcpy_s.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  memcpy_s.erase(memcpy_s.begin());
  const double memcpy_t = Median(memcpy_s);
  std::vector<char>().swap(a);
  std::vector<char>().swap(b);

  // 1+2. AsyncSave blocked time and end-to-end throughput through the agent.
  auto ckpt = Check(client::AgentCheckpointer::Connect(options(0, 1, "agent")));
  std::vector<double> blocked, copy, e2e;
  double first_blocked = 0;
  for (int i = 0; i < repeat + 1; ++i) {
    const absl::Time t0 = absl::Now();
    client::SaveFuture f = Check(ckpt->AsyncSave(10 + i, model->state()));
    const double bl = absl::ToDoubleSeconds(ckpt->last_save_stats().blocked);
    Check(f.Wait(absl::Minutes(10)));
    const double total = absl::ToDoubleSeconds(absl::Now() - t0);
    if (i == 0) {
      first_blocked = bl;  // first touch of new staging memory
      continue;
    }
    blocked.push_back(bl);
    copy.push_back(absl::ToDoubleSeconds(ckpt->last_save_stats().copy_time));
    e2e.push_back(total);
  }
  // 2. Direct mode, same bytes and store.
  client::CheckpointerOptions d = options(0, 1, "direct").direct;
  auto direct = Check(client::Checkpointer::Connect(d));
  std::vector<double> direct_s;
  for (int i = 0; i < repeat; ++i) {
    const absl::Time t0 = absl::Now();
    Check(direct->Save(10 + i, model->state()));
    direct_s.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  model.reset();

  // 3. Load: saved 2:S0 over two nodes (one rank each), loaded as 2:S1.
  auto s0 = Check(examples::ParseLayout("2:S0"));
  auto s1 = Check(examples::ParseLayout("2:S1"));
  {
    std::vector<client::SaveFuture> fs;
    std::vector<std::unique_ptr<client::AgentCheckpointer>> cs;
    for (int r = 0; r < 2; ++r) {
      auto m = Check(examples::ShardedModel::Create(specs, s0, r, true, 5));
      cs.push_back(
          Check(client::AgentCheckpointer::Connect(options(r, 2, "load"))));
      fs.push_back(Check(cs.back()->AsyncSave(5, m->state())));
    }
    for (auto& f : fs) Check(f.Wait(absl::Minutes(10)));
  }
  // Both ranks load at once (fn(r) on rank r's thread); returns the time
  // from the start of both to the end of the slower. Set up is not timed.
  auto concurrently = [](auto&& fn) {
    std::vector<absl::Status> status(2);
    std::vector<std::thread> threads;
    const absl::Time t0 = absl::Now();
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] { status[r] = fn(r); });
    }
    for (std::thread& t : threads) t.join();
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    for (const absl::Status& st : status) {
      if (!st.ok()) Die(st);
    }
    return s;
  };
  std::vector<std::unique_ptr<examples::ShardedModel>> targets;
  for (int r = 0; r < 2; ++r) {
    targets.push_back(
        Check(examples::ShardedModel::Create(specs, s1, r, false, 0)));
  }
  uint64_t mem_bytes = 0, peer_bytes = 0;
  std::vector<std::unique_ptr<client::AgentCheckpointer>> agent_loaders;
  for (int r = 0; r < 2; ++r) {
    agent_loaders.push_back(
        Check(client::AgentCheckpointer::Connect(options(r, 2, "load"))));
  }
  const double mem_s = concurrently([&](int r) -> absl::Status {
    return agent_loaders[r]
        ->Load(client::LoadRef::Latest(), targets[r]->state())
        .status();
  });
  for (int r = 0; r < 2; ++r) {
    const client::AgentCheckpointer& c = *agent_loaders[r];
    if (c.last_load_source() != client::LoadSource::kAgentMemory) {
      Die(absl::InternalError(
          absl::StrCat("rank ", r, "'s load did not come from memory: ",
                       c.last_agent_load_error().ToString())));
    }
    if (absl::Status v = targets[r]->Verify(5); !v.ok()) Die(v);
    mem_bytes += targets[r]->local_bytes();
    peer_bytes += c.last_load_bytes_peers();
  }
  agent_loaders.clear();
  targets.clear();
  for (int r = 0; r < 2; ++r) {
    targets.push_back(
        Check(examples::ShardedModel::Create(specs, s1, r, false, 0)));
  }
  std::vector<std::unique_ptr<client::Checkpointer>> direct_loaders;
  for (int r = 0; r < 2; ++r) {
    direct_loaders.push_back(
        Check(client::Checkpointer::Connect(options(r, 2, "load").direct)));
  }
  const bool cold = !smoke && DropPageCache();  // smoke: never disturb others
  const double sto_s = concurrently([&](int r) -> absl::Status {
    return direct_loaders[r]
        ->Load(client::LoadRef::Latest(), targets[r]->state())
        .status();
  });
  for (int r = 0; r < 2; ++r) {
    if (absl::Status v = targets[r]->Verify(5); !v.ok()) Die(v);
  }
  direct_loaders.clear();
  targets.clear();

  const double gb = n / 1e9;
  const double blocked_t = Median(blocked);
  std::printf(
      "agent_bench: %.3f GB model, %d measured saves (median), %s, peer "
      "transport %s\n",
      gb, repeat, durable ? "durable storage" : "non-durable storage",
      peer_tls_dir.empty() ? "tcp" : "tcp + mutual TLS");
  std::printf("  memcpy (warm buffers)        %8.3f s  %6.2f GB/s\n", memcpy_t,
              gb / memcpy_t);
  std::printf(
      "  AsyncSave blocked            %8.3f s  %6.2f GB/s  ratio %.2fx "
      "memcpy (copy %.3f s; first save %.3f s)\n",
      blocked_t, gb / blocked_t, blocked_t / memcpy_t, Median(copy),
      first_blocked);
  std::printf("  save end-to-end via agent    %8.3f s  %6.2f GB/s\n",
              Median(e2e), gb / Median(e2e));
  std::printf("  save direct mode             %8.3f s  %6.2f GB/s\n",
              Median(direct_s), gb / Median(direct_s));
  std::printf(
      "  load 2:S0->2:S1 agent memory %8.3f s  %6.2f GB/s  (%.3f GB "
      "over %s from the peer)\n",
      mem_s, mem_bytes / 1e9 / mem_s, peer_bytes / 1e9,
      peer_tls_dir.empty() ? "tcp" : "tls");
  std::printf("  load 2:S0->2:S1 storage      %8.3f s  %6.2f GB/s  (%s)\n",
              sto_s, mem_bytes / 1e9 / sto_s,
              cold ? "page cache dropped" : "page cache warm");
  std::printf(
      "{\"bytes\":%lu,\"memcpy_s\":%.6f,\"blocked_s\":%.6f,\"ratio\":%.3f,"
      "\"save_agent_s\":%.6f,\"save_direct_s\":%.6f,\"load_memory_s\":%.6f,"
      "\"load_storage_s\":%.6f}\n",
      static_cast<unsigned long>(n), memcpy_t, blocked_t, blocked_t / memcpy_t,
      Median(e2e), Median(direct_s), mem_s, sto_s);
  agents.clear();
  cairnd.reset();
  std::filesystem::remove_all(dir);
  return 0;
}
