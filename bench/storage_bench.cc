// storage_bench: durable write and cold read throughput of the posix
// ShardStore (issue 4 item 10).
//
// For each thread count T: T threads write `total_bytes` as objects of
// `item_bytes` (thread t writes items t, t + T, ...), each through
// NewWriter -> Append(64 MiB) -> Close (fdatasync + rename + directory
// fsync): the clock stops when the last object is durable. Then the page
// cache is dropped (sync; echo 3 > /proc/sys/vm/drop_caches) and the same T
// threads Read() every object whole into their own buffers. GB = 1e9 bytes.
// Each item carries its index in its first 8 bytes, checked after the read.
// The data is deleted afterwards. bench/storage_bench.sh runs this next to
// fio (the machine's limit) and prints the ratios.
//
// --smoke: 8 MiB in 1 MiB objects, threads 1,2, no cache drop, in a fresh
// temporary directory that is removed afterwards (unless --dir is given):
// seconds, for ctest (label bench-smoke). Explicit flags still win.
//
// Output: one JSON line per thread count on stdout; a table on stderr.
//   {"tool":"cairn","threads":T,"odirect":false,"write_GBps":..,
//    "read_GBps":..,"bytes":..,"item_bytes":..,"cold":true}
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "storage/shard_store.h"

namespace cairn::storage {
namespace {

struct Flags {
  std::string dir = "/tmp/cairn-storage-bench";
  uint64_t total_bytes = 4ull << 30;
  uint64_t item_bytes = 64ull << 20;
  std::string threads = "1,2,3,4";
  bool odirect = false;
  int io_threads = 4;
  uint64_t io_chunk_mib = 8;
  bool drop_caches = true;
  int repeat = 1;
  bool keep = false;
};

struct AlignedFree {
  void operator()(char* p) const { std::free(p); }
};

double Seconds(std::chrono::steady_clock::time_point a,
               std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool DropCaches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3" << std::endl;
  return static_cast<bool>(f);
}

// Runs fn(t) on T threads released together; returns the wall time.
template <typename Fn>
double RunThreads(int threads, Fn fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ++ready;
      while (!go.load()) std::this_thread::yield();
      fn(t);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go = true;
  for (auto& th : pool) th.join();
  return Seconds(start, std::chrono::steady_clock::now());
}

int Run(const Flags& flags) {
  std::vector<int> thread_counts;
  for (absl::string_view s : absl::StrSplit(flags.threads, ',')) {
    thread_counts.push_back(std::atoi(std::string(s).c_str()));
    if (thread_counts.back() < 1) {
      std::fprintf(stderr, "bad --threads '%s'\n", flags.threads.c_str());
      return 2;
    }
  }
  const uint64_t items = flags.total_bytes / flags.item_bytes;
  const uint64_t bytes = items * flags.item_bytes;
  if (items == 0) {
    std::fprintf(stderr, "--total_bytes must be >= --item_bytes\n");
    return 2;
  }
  StoreOptions options;
  options.io_threads = flags.io_threads;
  options.use_odirect = flags.odirect;
  options.io_chunk_bytes = flags.io_chunk_mib << 20;
  auto store = OpenShardStore(absl::StrCat("file://", flags.dir), options);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  const int max_threads =
      *std::max_element(thread_counts.begin(), thread_counts.end());
  std::vector<std::unique_ptr<char, AlignedFree>> buffers;
  std::mt19937_64 rng(1);
  for (int t = 0; t < max_threads; ++t) {
    buffers.emplace_back(
        static_cast<char*>(std::aligned_alloc(4096, flags.item_bytes)));
    uint64_t* words = reinterpret_cast<uint64_t*>(buffers.back().get());
    for (uint64_t i = 0; i < flags.item_bytes / 8; ++i) words[i] = rng();
  }
  std::fprintf(stderr, "%-8s %-8s %12s %12s %6s\n", "threads", "odirect",
               "write GB/s", "read GB/s", "cold");
  int failures = 0;
  for (int rep = 0; rep < flags.repeat; ++rep) {
    for (int threads : thread_counts) {
      const std::string prefix = absl::StrCat("bench-", threads, "/");
      (void)(*store)->DeletePrefix(prefix);
      std::atomic<int> errors{0};
      auto key = [&](uint64_t i) { return absl::StrCat(prefix, "item-", i); };
      const double write_s = RunThreads(threads, [&](int t) {
        char* buf = buffers[t].get();
        for (uint64_t i = t; i < items; i += threads) {
          std::memcpy(buf, &i, sizeof(i));  // stamp
          auto writer = (*store)->NewWriter(key(i));
          absl::Status s = writer.status();
          if (s.ok()) {
            s = (*writer)->Append(
                absl::Span<const char>(buf, flags.item_bytes));
          }
          if (s.ok()) s = (*writer)->Close();
          if (!s.ok()) {
            std::fprintf(stderr, "write: %s\n", s.ToString().c_str());
            ++errors;
          }
        }
      });
      const bool cold = flags.drop_caches && DropCaches();
      const double read_s = RunThreads(threads, [&](int t) {
        char* buf = buffers[t].get();
        for (uint64_t i = t; i < items; i += threads) {
          auto n = (*store)->Read(key(i), ByteRange{0, flags.item_bytes},
                                  absl::Span<char>(buf, flags.item_bytes));
          uint64_t stamp = 0;
          std::memcpy(&stamp, buf, sizeof(stamp));
          if (!n.ok() || stamp != i) {
            std::fprintf(
                stderr, "read of item %lu: %s\n", static_cast<unsigned long>(i),
                n.ok() ? "wrong bytes" : n.status().ToString().c_str());
            ++errors;
          }
        }
      });
      if (!flags.keep) (void)(*store)->DeletePrefix(prefix);
      failures += errors.load();
      const double write_gbps = bytes / write_s / 1e9;
      const double read_gbps = bytes / read_s / 1e9;
      std::fprintf(stderr, "%-8d %-8s %12.3f %12.3f %6s\n", threads,
                   flags.odirect ? "yes" : "no", write_gbps, read_gbps,
                   cold ? "yes" : "NO");
      std::printf(
          "%s\n",
          absl::StrFormat(
              "{\"tool\":\"cairn\",\"threads\":%d,\"odirect\":%s,"
              "\"write_GBps\":%.4f,\"read_GBps\":%.4f,\"bytes\":%d,"
              "\"item_bytes\":%d,\"io_threads\":%d,\"cold\":%s,\"errors\":%d}",
              threads, flags.odirect ? "true" : "false", write_gbps, read_gbps,
              bytes, flags.item_bytes, flags.io_threads,
              cold ? "true" : "false", errors.load())
              .c_str());
      std::fflush(stdout);
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace cairn::storage

int main(int argc, char** argv) {
  cairn::storage::Flags flags;
  CLI::App app{"Cairn posix ShardStore write/read throughput"};
  app.add_option("--dir", flags.dir,
                 "store root (created; data deleted after)");
  app.add_option("--total_bytes", flags.total_bytes, "bytes per run");
  app.add_option("--item_bytes", flags.item_bytes, "bytes per object");
  app.add_option("--threads", flags.threads, "comma-separated thread counts");
  app.add_flag("--odirect", flags.odirect, "StoreOptions.use_odirect");
  app.add_option("--io_threads", flags.io_threads, "StoreOptions.io_threads");
  app.add_option("--io_chunk_mib", flags.io_chunk_mib,
                 "StoreOptions.io_chunk_bytes in MiB");
  app.add_option("--drop_caches", flags.drop_caches,
                 "drop the page cache before reading (needs root)");
  app.add_option("--repeat", flags.repeat, "runs per thread count");
  app.add_flag("--keep", flags.keep, "keep the data of the last run");
  bool smoke = false;
  app.add_flag("--smoke", smoke,
               "tiny sizes for a quick check that the benchmark runs");
  CLI11_PARSE(app, argc, argv);
  std::string scratch;
  if (smoke) {
    auto unset = [&app](const char* name) { return app.count(name) == 0; };
    if (unset("--total_bytes")) flags.total_bytes = 8ull << 20;
    if (unset("--item_bytes")) flags.item_bytes = 1ull << 20;
    if (unset("--threads")) flags.threads = "1,2";
    if (unset("--io_chunk_mib")) flags.io_chunk_mib = 1;
    if (unset("--drop_caches")) flags.drop_caches = false;
    if (unset("--dir")) {
      std::string tmpl = (std::filesystem::temp_directory_path() /
                          "cairn-storage-bench.XXXXXX")
                             .string();
      if (::mkdtemp(tmpl.data()) == nullptr) {
        std::perror("mkdtemp");
        return 1;
      }
      flags.dir = scratch = tmpl;
    }
  }
  const int rc = cairn::storage::Run(flags);
  if (!scratch.empty()) std::filesystem::remove_all(scratch);
  return rc;
}
