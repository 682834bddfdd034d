// Running blocking libcairn calls without the GIL, so that other Python
// threads run and Ctrl-C still works.
//
// WithoutGil(call) runs `call` with the GIL released. CallInterruptibly runs
// the call on a worker thread while the calling thread waits in short
// slices; between slices it takes the GIL and runs PyErr_CheckSignals(), so
// Python's signal handlers run (only the main thread handles signals;
// elsewhere it is a plain wait). When a handler raises (SIGINT:
// KeyboardInterrupt), it calls `cancel` (which must be thread-safe and make
// the call return promptly), waits for the worker to finish, and re-raises
// that exception: the call's own result is dropped, and nothing the call
// borrows is used after this returns.
//
// Both take the GIL back in the normal flow of the code, never in a
// destructor: a daemon thread still inside a call when the interpreter
// exits is ended by CPython (pthread_exit) when it takes the GIL back, and
// that unwinding must not pass through a noexcept destructor (pybind11's
// gil_scoped_release), which would std::terminate the whole process. On
// that path the worker thread is cancelled and joined by WorkerGuard.
#ifndef CAIRN_CLIENT_PYTHON_SRC_INTERRUPTIBLE_H_
#define CAIRN_CLIENT_PYTHON_SRC_INTERRUPTIBLE_H_

#include <pybind11/pybind11.h>

#include <exception>
#include <optional>
#include <thread>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace cairn::python {

// How often a waiting call checks for signals.
inline constexpr absl::Duration kSignalCheckInterval = absl::Milliseconds(50);

// Returns call() run with the GIL released. Requires the GIL.
template <typename R>
R WithoutGil(absl::FunctionRef<R()> call) {
  PyThreadState* state = PyEval_SaveThread();
  std::optional<R> result;
  try {
    result.emplace(call());
  } catch (...) {
    PyEval_RestoreThread(state);
    throw;
  }
  PyEval_RestoreThread(state);
  return *std::move(result);
}

namespace internal {

// Joins the worker on every way out; if it still runs (the waiting thread
// is being unwound), cancels its call first so the join is prompt.
class WorkerGuard {
 public:
  WorkerGuard(std::thread& worker, absl::FunctionRef<void()> cancel)
      : worker_(worker), cancel_(cancel) {}
  ~WorkerGuard() {
    if (worker_.joinable()) {
      cancel_();
      worker_.join();
    }
  }
  WorkerGuard(const WorkerGuard&) = delete;
  WorkerGuard& operator=(const WorkerGuard&) = delete;

 private:
  std::thread& worker_;
  absl::FunctionRef<void()> cancel_;
};

}  // namespace internal

// Returns call()'s result, or raises what a signal handler raised after
// cancel() made the call return. Requires the GIL.
template <typename R>
R CallInterruptibly(absl::FunctionRef<R()> call,
                    absl::FunctionRef<void()> cancel) {
  std::optional<R> result;
  std::exception_ptr error;
  absl::Notification done;
  bool interrupted = false;
  std::thread worker;
  internal::WorkerGuard guard(worker, cancel);
  PyThreadState* state = PyEval_SaveThread();
  worker = std::thread([&] {
    try {
      result.emplace(call());
    } catch (...) {
      error = std::current_exception();
    }
    done.Notify();
  });
  while (!done.WaitForNotificationWithTimeout(kSignalCheckInterval)) {
    PyEval_RestoreThread(state);
    interrupted = PyErr_CheckSignals() != 0;
    state = PyEval_SaveThread();
    if (interrupted) break;
  }
  if (interrupted) cancel();
  worker.join();
  PyEval_RestoreThread(state);
  // The exception a handler raised is still set on this thread.
  if (interrupted) throw pybind11::error_already_set();
  if (error) std::rethrow_exception(error);
  return *std::move(result);
}

}  // namespace cairn::python

#endif  // CAIRN_CLIENT_PYTHON_SRC_INTERRUPTIBLE_H_
