// An out-of-tree program built against an installed libcairn (CMake package
// or pkg-config; tests/install/install_test.py): it starts the installed
// cairnd, saves a small state dict from 2 rank processes, loads it back in 2
// rank processes with a different layout, and checks every byte.
//
//   save_load_consumer --cairnd PREFIX/bin/cairnd --dir DIR   (driver)
//   save_load_consumer --rank R --coordinator HOST:PORT --phase save|load
//                                                             (one rank)
// Exit code 0 when every rank saved, loaded and found the expected bytes.
#include <cairn/client/checkpointer.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace {

using cairn::planner::ChunkBox;
using cairn::planner::DTensorLayout;
using cairn::planner::DType;
using cairn::planner::Placement;
using cairn::planner::Shape;

constexpr int kWorld = 2;
constexpr int64_t kStep = 100;
constexpr char kJob[] = "install-consumer";
constexpr char kTensor[] = "model.w";
const Shape kShape = {7, 5};  // uneven: 4 + 3 rows, 3 + 2 columns

// The value of element (i, j) of the tensor: distinct everywhere.
int32_t Value(int64_t i, int64_t j) {
  return static_cast<int32_t>(1000 * i + j + 7);
}

std::string Blob() { return "rng-state:0123456789"; }

// A 1-D mesh over both ranks, sharding tensor dim `dim`.
DTensorLayout ShardedOn(int dim) {
  return DTensorLayout{{{kWorld}, {0, 1}}, {Placement::Shard(dim)}};
}

// The rows-major bytes of `box` of the tensor.
std::vector<int32_t> Expected(const ChunkBox& box) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < box.sizes[0]; ++i) {
    for (int64_t j = 0; j < box.sizes[1]; ++j) {
      out.push_back(Value(box.offsets[0] + i, box.offsets[1] + j));
    }
  }
  return out;
}

absl::StatusOr<ChunkBox> OnlyChunk(const DTensorLayout& layout, int rank) {
  absl::StatusOr<std::vector<ChunkBox>> chunks =
      cairn::planner::LocalChunks(layout, kShape, rank);
  if (!chunks.ok()) return chunks.status();
  if (chunks->size() != 1) {
    return absl::InternalError(
        absl::StrCat("rank ", rank, " holds ", chunks->size(), " chunks"));
  }
  return chunks->front();
}

absl::Span<char> Bytes(std::vector<int32_t>& v) {
  return absl::MakeSpan(reinterpret_cast<char*>(v.data()),
                        v.size() * sizeof(int32_t));
}

// One rank: saves rows (Shard(0)) or loads columns (Shard(1)).
absl::Status RunRank(int rank, const std::string& coordinator,
                     const std::string& phase) {
  cairn::client::CheckpointerOptions options;
  options.coordinator = coordinator;
  options.job = kJob;
  options.rank = rank;
  options.world_size = kWorld;
  options.max_retries = 2;
  absl::StatusOr<std::unique_ptr<cairn::client::Checkpointer>> ckpt =
      cairn::client::Checkpointer::Connect(options);
  if (!ckpt.ok()) return ckpt.status();

  const bool save = phase == "save";
  const DTensorLayout layout = ShardedOn(save ? 0 : 1);
  absl::StatusOr<ChunkBox> box = OnlyChunk(layout, rank);
  if (!box.ok()) return box.status();
  std::vector<int32_t> data = Expected(*box);
  std::string blob = Blob();
  if (!save) {
    std::fill(data.begin(), data.end(), -1);
    blob = "overwritten by the load";
  }
  cairn::client::StateDict state;
  absl::Status added = state.AddDTensor(kTensor, DType::kInt32, kShape, layout,
                                        rank, Bytes(data));
  if (!added.ok()) return added;
  added = state.AddBytes("rng", &blob);
  if (!added.ok()) return added;

  if (save) return (*ckpt)->Save(kStep, state).status();

  absl::StatusOr<int64_t> loaded =
      (*ckpt)->Load(cairn::client::LoadRef::Latest(), state);
  if (!loaded.ok()) return loaded.status();
  if (*loaded != kStep) {
    return absl::InternalError(
        absl::StrCat("rank ", rank, " loaded step ", *loaded));
  }
  const std::vector<int32_t> want = Expected(*box);
  for (size_t k = 0; k < want.size(); ++k) {
    if (data[k] != want[k]) {
      return absl::DataLossError(absl::StrCat("rank ", rank, " element ", k,
                                              " of '", kTensor, "' is ",
                                              data[k], ", want ", want[k]));
    }
  }
  if (blob != Blob()) {
    return absl::DataLossError(
        absl::StrCat("rank ", rank, " 'rng' is '", blob, "'"));
  }
  std::printf("rank %d: loaded step %lld, %zu elements and 'rng' match\n", rank,
              static_cast<long long>(*loaded), want.size());
  return absl::OkStatus();
}

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    return -1;
  }
  return pid;
}

// The exit code of `pid`, or -1 if it did not exit normally.
int WaitFor(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs `phase` in kWorld rank processes (this binary); OK if all succeed.
absl::Status RunPhase(const std::string& self, const std::string& coordinator,
                      const std::string& phase) {
  std::vector<pid_t> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.push_back(Spawn({self, "--rank", std::to_string(r), "--coordinator",
                           coordinator, "--phase", phase}));
    if (ranks.back() < 0) return absl::InternalError("cannot start a rank");
  }
  absl::Status result;
  for (int r = 0; r < kWorld; ++r) {
    const int code = WaitFor(ranks[r]);
    if (code != 0 && result.ok()) {
      result = absl::InternalError(
          absl::StrCat(phase, ": rank ", r, " exited with ", code));
    }
  }
  return result;
}

absl::Status RunDriver(const std::string& self, const std::string& cairnd,
                       const std::string& dir) {
  mkdir(dir.c_str(), 0755);
  const std::string port_file = dir + "/cairnd.port";
  const pid_t server =
      Spawn({cairnd, "--listen", "127.0.0.1:0", "--data-dir", dir + "/cairnd",
             "--port-file", port_file, "--log-level", "warn"});
  if (server < 0) return absl::InternalError("cannot start " + cairnd);

  // cairnd writes its port once it serves.
  int port = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (port <= 0 && std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(port_file);
    if (in >> port && port > 0) break;
    int status = 0;
    if (waitpid(server, &status, WNOHANG) == server) {
      return absl::InternalError("cairnd exited before serving");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  absl::Status result =
      port > 0 ? absl::OkStatus()
               : absl::DeadlineExceededError("cairnd did not serve in 30 s");
  const std::string coordinator = absl::StrCat("127.0.0.1:", port);
  if (result.ok()) result = RunPhase(self, coordinator, "save");
  if (result.ok()) result = RunPhase(self, coordinator, "load");
  kill(server, SIGTERM);
  const int code = WaitFor(server);
  if (result.ok() && code != 0) {
    result = absl::InternalError(absl::StrCat("cairnd exited with ", code));
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cairnd, dir, coordinator, phase;
  int rank = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--cairnd") {
      cairnd = value;
    } else if (flag == "--dir") {
      dir = value;
    } else if (flag == "--coordinator") {
      coordinator = value;
    } else if (flag == "--phase") {
      phase = value;
    } else if (flag == "--rank") {
      rank = std::stoi(value);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  absl::Status status;
  if (!cairnd.empty() && !dir.empty()) {
    status = RunDriver("/proc/self/exe", cairnd, dir);
  } else if (rank >= 0 && !coordinator.empty() &&
             (phase == "save" || phase == "load")) {
    status = RunRank(rank, coordinator, phase);
  } else {
    std::fprintf(stderr,
                 "usage: %s --cairnd PATH --dir DIR | --rank R "
                 "--coordinator HOST:PORT --phase save|load\n",
                 argv[0]);
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", argv[0], status.ToString().c_str());
    return 1;
  }
  if (!cairnd.empty()) std::printf("save and load through libcairn: OK\n");
  return 0;
}
