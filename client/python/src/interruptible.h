// Running a blocking libcairn call so that Ctrl-C still works.
//
// CallInterruptibly runs the call on a worker thread with the GIL released,
// while the calling thread waits in short slices; between slices it takes
// the GIL and runs PyErr_CheckSignals(), so Python's signal handlers run
// (only the main thread handles signals; elsewhere it is a plain wait). When
// a handler raises (SIGINT: KeyboardInterrupt), it calls `cancel` (which must
// be thread-safe and make the call return promptly), waits for the worker to
// finish, and re-raises that exception: the call's own result is dropped,
// and nothing the call borrows is used after this returns.
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

// Returns call()'s result, or raises what a signal handler raised after
// cancel() made the call return. Requires the GIL.
template <typename R>
R CallInterruptibly(absl::FunctionRef<R()> call,
                    absl::FunctionRef<void()> cancel) {
  std::optional<R> result;
  std::exception_ptr error;
  absl::Notification done;
  bool interrupted = false;
  {
    pybind11::gil_scoped_release release;
    std::thread worker([&] {
      try {
        result.emplace(call());
      } catch (...) {
        error = std::current_exception();
      }
      done.Notify();
    });
    while (!done.WaitForNotificationWithTimeout(kSignalCheckInterval)) {
      pybind11::gil_scoped_acquire acquire;
      if (PyErr_CheckSignals() != 0) {
        interrupted = true;
        break;
      }
    }
    if (interrupted) cancel();
    worker.join();
  }
  // The exception a handler raised is still set on this thread.
  if (interrupted) throw pybind11::error_already_set();
  if (error) std::rethrow_exception(error);
  return *std::move(result);
}

}  // namespace cairn::python

#endif  // CAIRN_CLIENT_PYTHON_SRC_INTERRUPTIBLE_H_
