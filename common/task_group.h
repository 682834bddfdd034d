// TaskGroup: runs a set of closures (on a ThreadPool, a thread each, or
// inline), waits for all of them, and collects their errors.
//
// It is Cairn's one fan-out helper: parallel reads and writes of a storage
// object, a checkpointer's parallel item I/O, an agent's fetches from peers.
//
// Semantics:
//   - Run(fn) queues `fn`; it runs on the pool (or a thread of its own), or
//     inline inside Run() when the group has neither.
//   - Wait() returns only once every task queued so far has finished, also
//     when some failed: no task outlives Wait(), so tasks may capture the
//     caller's stack by reference. The destructor waits too.
//   - Wait() returns the first error (the first task to fail, in time), with
//     the context string given to Run() prefixed to its message and its code
//     kept; AllErrors() returns every error, in the order tasks were queued.
//   - With `cancel_on_error`, the first error drops the tasks not started yet
//     (they never run and report nothing) and cancelled() turns true, so long
//     tasks may poll it and stop early.
//
// Nesting on a bounded pool does not deadlock: Wait() runs the group's tasks
// that no pool thread has started yet on the calling thread ("caller runs"),
// so a waiting thread only ever waits for tasks that are running on other
// threads. Hence a task running on pool P may itself fan out on P and Wait().
// The rule that keeps this true: a task must not block on anything but its
// own TaskGroups (not on a Notification set by a task queued behind it on a
// bounded pool, say). Tasks that block on the network or on peers for long
// should use `thread_per_task`, so they do not hold pool threads.
//
// Thread-safe: Run(), RunInline(), status(), cancelled() and AllErrors() may
// be called from any thread, including from a task of the same group; Wait()
// may be called more than once and from more than one thread, but never from
// a task of the same group (it would wait for itself).
//
// Example:
//   TaskGroup group(&pool);
//   for (const Piece& p : pieces) {
//     group.Run(absl::StrCat("reading '", key, "' at ", p.offset),
//               [&p] { return ReadPiece(p); });
//   }
//   CAIRN_RETURN_IF_ERROR(group.Wait());
#ifndef CAIRN_COMMON_TASK_GROUP_H_
#define CAIRN_COMMON_TASK_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"

namespace cairn {

class TaskGroup {
 public:
  struct Options {
    // Runs tasks here. Default: nullptr (inline in Run(), unless
    // thread_per_task). Not owned; must outlive the group.
    ThreadPool* pool = nullptr;
    // Runs each task on a thread of its own (joined by Wait()); `pool` is
    // then ignored. For few tasks that block for long (peer calls).
    // Default: false.
    bool thread_per_task = false;
    // Drops tasks not yet started once one fails; see cancelled().
    // Default: false (every task runs).
    bool cancel_on_error = false;
  };

  // Tasks on `pool`, or inline in Run() when `pool` is nullptr.
  explicit TaskGroup(ThreadPool* pool);
  explicit TaskGroup(const Options& options);
  // Waits for every task (ignoring their errors).
  ~TaskGroup();
  TaskGroup(const TaskGroup&) = delete;
  TaskGroup& operator=(const TaskGroup&) = delete;

  // Queues `fn`. An error it returns is reported as "<context>: <message>"
  // with its code (just "<message>" for an empty context).
  void Run(std::function<absl::Status()> fn) {
    Run(std::string(), std::move(fn));
  }
  void Run(std::string context, std::function<absl::Status()> fn);

  // Runs `fn` on the calling thread now and records its error like Run().
  // Skipped (not run) when the group is cancelled.
  void RunInline(const std::function<absl::Status()>& fn) {
    RunInline(std::string(), fn);
  }
  void RunInline(const std::string& context,
                 const std::function<absl::Status()>& fn);

  // Waits until every task queued so far has finished, running unstarted ones
  // on the calling thread; returns the first error (OK if none).
  absl::Status Wait();

  // The first error so far, without waiting.
  absl::Status status() const;
  // Every error so far, in the order their tasks were queued.
  std::vector<absl::Status> AllErrors() const;
  // True once a task failed in a group with `cancel_on_error`.
  bool cancelled() const;

 private:
  struct State;

  // Pops and runs one unstarted task of `state`; false if there was none.
  static bool RunOne(const std::shared_ptr<State>& state);

  const Options options_;
  // Shared with the closures scheduled on the pool, which may run after the
  // group is gone (and then find nothing to do).
  const std::shared_ptr<State> state_;

  absl::Mutex threads_mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(threads_mu_);
};

// Runs every closure of `fns` on `pool` (inline when nullptr), waits for all
// of them, and returns the first error.
absl::Status RunAll(ThreadPool* pool,
                    std::vector<std::function<absl::Status()>> fns);

}  // namespace cairn

#endif  // CAIRN_COMMON_TASK_GROUP_H_
