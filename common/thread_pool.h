// A fixed-size pool of worker threads running queued closures in FIFO order.
//
// Cairn's servers run blocking work (storage I/O, RocksDB, plan building) here
// instead of on gRPC's callback threads, which must never block.
//
// Thread-safe: Schedule() may be called concurrently from any thread,
// including from a closure running on the pool. The destructor drains the
// queue: every closure scheduled before it runs.
//
// Example:
//   ThreadPool pool(4);
//   pool.Schedule([&] { PublishManifest(store, manifest); });
#ifndef CAIRN_COMMON_THREAD_POOL_H_
#define CAIRN_COMMON_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace cairn {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> fn);
  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void WorkLoop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Constant after construction.
  std::vector<std::thread> threads_;
};

}  // namespace cairn

#endif  // CAIRN_COMMON_THREAD_POOL_H_
