// cairn._cairn.AgentCheckpointer and SaveFuture (see agent_checkpointer.h).
#include "client/python/src/agent_checkpointer.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/agent/agent_checkpointer.h"
#include "client/python/src/checkpointer.h"
#include "client/python/src/errors.h"
#include "client/python/src/interruptible.h"
#include "client/python/src/options.h"
#include "client/python/src/results.h"
#include "client/python/src/state_dict.h"

namespace cairn::python {

namespace py = pybind11;

namespace {

// How long SaveFuture.wait(None) waits: "forever" for a training job.
constexpr absl::Duration kWaitForever = absl::Hours(24 * 365);
// One WaitSave call of a longer wait (how soon Ctrl-C is noticed).
constexpr absl::Duration kWaitSlice = absl::Milliseconds(500);

// A SaveFuture plus its outcome once known (so done() followed by wait()
// asks the agent once). Thread-safe.
class PySaveFuture {
 public:
  PySaveFuture(client::SaveFuture future, std::string who)
      : future_(std::move(future)), who_(std::move(who)) {}

  int64_t step() const { return future_.step(); }

  // Waits in slices of kWaitSlice (GIL released), checking for signals in
  // between, so Ctrl-C interrupts a long wait (the save goes on in the
  // agent).
  client::CheckpointInfo Wait(std::optional<double> timeout_s) {
    absl::Duration timeout = kWaitForever;
    if (timeout_s.has_value()) {
      if (!std::isfinite(*timeout_s) || *timeout_s < 0) {
        ThrowStatus(absl::InvalidArgumentError(
            absl::StrCat(who_, " step ", step(), ": wait timeout ", *timeout_s,
                         " s is not a finite duration >= 0")));
      }
      timeout = absl::Seconds(*timeout_s);
    }
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      absl::StatusOr<client::CheckpointInfo> r =
          WithoutGil<absl::StatusOr<client::CheckpointInfo>>([&] {
            return WaitFor(
                std::max(absl::Milliseconds(1), std::min(left, kWaitSlice)));
          });
      if (!NotYet(r.status())) return ValueOrThrow(std::move(r));
      if (absl::Now() >= deadline) {
        ThrowStatus(absl::DeadlineExceededError(
            absl::StrCat(who_, " step ", step(), ": not persisted within ",
                         absl::FormatDuration(timeout))));
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  bool Done() {
    absl::StatusOr<client::CheckpointInfo> r =
        WithoutGil<absl::StatusOr<client::CheckpointInfo>>(
            [&] { return WaitFor(absl::Milliseconds(1)); });
    return !NotYet(r.status());
  }

 private:
  // The agent answers a wait that ran out of time DEADLINE_EXCEEDED "...
  // not persisted within ..." (server/agent/persister.cc); any other answer
  // is the save's outcome.
  static bool NotYet(const absl::Status& s) {
    return s.code() == absl::StatusCode::kDeadlineExceeded &&
           absl::StrContains(s.message(), "not persisted within");
  }

  absl::StatusOr<client::CheckpointInfo> WaitFor(absl::Duration timeout) {
    {
      absl::MutexLock l(&mu_);
      if (outcome_.has_value()) return *outcome_;
    }
    absl::StatusOr<client::CheckpointInfo> r = future_.Wait(timeout);
    if (!NotYet(r.status())) {
      absl::MutexLock l(&mu_);
      outcome_ = r;
    }
    return r;
  }

  const client::SaveFuture future_;
  const std::string who_;  // "job 'j' rank r", for messages
  absl::Mutex mu_;
  std::optional<absl::StatusOr<client::CheckpointInfo>> outcome_
      ABSL_GUARDED_BY(mu_);
};

const char* LoadSourceName(client::LoadSource s) {
  switch (s) {
    case client::LoadSource::kAgentMemory:
      return "agent_memory";
    case client::LoadSource::kStorage:
      return "storage";
    case client::LoadSource::kNone:
      break;
  }
  return "none";
}

class PyAgentCheckpointer {
 public:
  explicit PyAgentCheckpointer(const client::AgentCheckpointerOptions& o)
      : job_(o.direct.job),
        who_(absl::StrCat("job '", o.direct.job, "' rank ", o.direct.rank)) {
    using Result = absl::StatusOr<std::unique_ptr<client::AgentCheckpointer>>;
    impl_ = ValueOrThrow(WithoutGil<Result>(
        [&] { return client::AgentCheckpointer::Connect(o); }));
  }

  // Ctrl-C during the copy into staging cancels the save (Cancel) and
  // raises KeyboardInterrupt.
  // "policy", "persistent" or "memory" (client::SaveTier).
  client::SaveTier TierOf(const std::string& tier, int64_t step) const {
    if (tier == "policy") return client::SaveTier::kPolicy;
    if (tier == "persistent") return client::SaveTier::kPersistent;
    if (tier == "memory") return client::SaveTier::kMemory;
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat(who_, " step ", step, ": tier '", tier,
                     "' is not one of 'policy', 'persistent', 'memory'")));
  }

  std::unique_ptr<PySaveFuture> AsyncSave(int64_t step,
                                          const PyStateDict& state,
                                          const std::string& tier) {
    OneCallAtATime guard(busy_, who_, "async_save");
    const client::SaveTier save_tier = TierOf(tier, step);
    PyStateDict::InUse in_use(state, PyStateDict::Access::kRead);
    absl::StatusOr<client::SaveFuture> r =
        CallInterruptibly<absl::StatusOr<client::SaveFuture>>(
            [&] { return impl_->AsyncSave(step, state.state(), save_tier); },
            [&] { impl_->Cancel(); });
    if (!r.ok()) {
      ThrowStatus(WithJobContext(
          r.status(), job_, absl::StrCat(who_, " step ", step, " async_save")));
    }
    return std::make_unique<PySaveFuture>(*std::move(r), who_);
  }

  std::unique_ptr<PySaveFuture> FutureOf(int64_t step) {
    if (step < 0) {
      ThrowStatus(absl::InvalidArgumentError(
          absl::StrCat(who_, ": step ", step, " is negative")));
    }
    return std::make_unique<PySaveFuture>(impl_->FutureOf(step), who_);
  }

  // AsyncSave, then the wait for its commit, as one call: Ctrl-C anywhere
  // in it cancels the save (aborted at cairnd once the agent joined it) and
  // raises KeyboardInterrupt, as Checkpointer.save does.
  client::CheckpointInfo Save(int64_t step, const PyStateDict& state,
                              const std::string& tier) {
    OneCallAtATime guard(busy_, who_, "save");
    const client::SaveTier save_tier = TierOf(tier, step);
    PyStateDict::InUse in_use(state, PyStateDict::Access::kRead);
    absl::StatusOr<client::CheckpointInfo> r =
        CallInterruptibly<absl::StatusOr<client::CheckpointInfo>>(
            [&]() -> absl::StatusOr<client::CheckpointInfo> {
              absl::StatusOr<client::SaveFuture> f =
                  impl_->AsyncSave(step, state.state(), save_tier);
              if (!f.ok()) return f.status();
              return f->Wait(kWaitForever);
            },
            [&] { impl_->Cancel(); });
    if (!r.ok()) {
      ThrowStatus(WithJobContext(r.status(), job_,
                                 absl::StrCat(who_, " step ", step, " save")));
    }
    return *std::move(r);
  }

  // Thread-safe; no busy guard: it is meant for another thread.
  void Cancel() { impl_->Cancel(); }

  int64_t Load(PyStateDict& state, std::optional<int64_t> step) {
    OneCallAtATime guard(busy_, who_, "load");
    PyStateDict::InUse in_use(state, PyStateDict::Access::kWrite);
    if (step.has_value() && *step < 0) {
      ThrowStatus(absl::InvalidArgumentError(absl::StrCat(
          who_, ": step ", *step, " is negative (None loads the latest)")));
    }
    const client::LoadRef ref = step.has_value() ? client::LoadRef::Step(*step)
                                                 : client::LoadRef::Latest();
    absl::StatusOr<int64_t> r = CallInterruptibly<absl::StatusOr<int64_t>>(
        [&] { return impl_->Load(ref, state.state()); },
        [&] { impl_->Cancel(); });
    if (!r.ok()) {
      ThrowStatus(WithJobContext(
          r.status(), job_,
          absl::StrCat(who_, " load of ",
                       step.has_value() ? absl::StrCat("step ", *step)
                                        : std::string("the latest step"))));
    }
    return *std::move(r);
  }

  std::string LastLoadSource() const {
    return LoadSourceName(impl_->last_load_source());
  }

  py::dict LastSaveStats() const {
    const client::AgentSaveStats& s = impl_->last_save_stats();
    py::dict d;
    d["bytes"] = s.bytes;
    d["blocked"] = absl::ToDoubleSeconds(s.blocked);
    d["copy_time"] = absl::ToDoubleSeconds(s.copy_time);
    d["begin_time"] = absl::ToDoubleSeconds(s.begin_time);
    d["streamed_buckets"] = s.streamed_buckets;
    return d;
  }

 private:
  std::unique_ptr<client::AgentCheckpointer> impl_;
  std::string job_;
  std::string who_;
  std::atomic<bool> busy_{false};
};

}  // namespace

void RegisterAgentCheckpointer(py::module_& m) {
  // The keyword defaults are libcairn's (AgentCheckpointerOptions and, for
  // the storage fallback, CheckpointerOptions).
  const DirectOptions defaults = DefaultDirectOptions();
  const AgentOnlyOptions agent_defaults = DefaultAgentOnlyOptions();
  py::class_<PySaveFuture>(
      m, "SaveFuture",
      R"doc(Durability of one AgentCheckpointer.async_save. May be waited on from any
thread; the outcome is remembered once known.

Attributes:
  step: the step being saved.
)doc")
      .def_property_readonly("step", &PySaveFuture::step)
      .def(
          "wait", &PySaveFuture::Wait, py::arg("timeout") = py::none(),
          R"doc(Waits (GIL released) until the checkpoint is committed by every rank's agent
and this rank's copy is replicated to its peers; returns its CheckpointInfo.
Ctrl-C interrupts the wait (KeyboardInterrupt); the save goes on in the
agent. The AgentCheckpointer's cancel() (from another thread, or before
the wait) cancels the save: CancelledError, unless every rank had already
committed it.

Args:
  timeout: seconds to wait; None waits without limit.

Raises:
  DeadlineExceededError: not persisted within `timeout`.
  CancelledError: cancel() stopped the save.
  AbortedError, UnavailableError (the agent died), ...: the save failed.
)doc")
      .def("done", &PySaveFuture::Done,
           "True once the save's outcome is known (committed or failed); "
           "does not block (a pending cancel() of its AgentCheckpointer "
           "cancels the save first).");

  py::class_<PyAgentCheckpointer>(
      m, "AgentCheckpointer",
      R"doc(One rank's connection to its node's cairn-agent (agent mode): async_save
copies the state into the agent's shared memory and returns; the agent
persists and replicates it. Loads come from agent memory (local, then peer
agents) and fall back to storage (direct mode).

Every blocking call releases the GIL; one call at a time per object, except
cancel(), which any thread may call. Ctrl-C (SIGINT in the main thread)
during save, async_save or load cancels it and raises KeyboardInterrupt, as
Checkpointer's; during SaveFuture.wait it interrupts only the wait.
)doc")
      .def(
          py::init(
              [](std::string agent_socket, std::string coordinator,
                 std::string job, int rank, int world_size, int copy_threads,
                 double wait_for_space, bool allow_streaming, int io_threads,
                 double rpc_timeout, double collective_timeout, int max_retries,
                 double first_contact_timeout, std::string partial_chunk_check,
                 bool use_odirect, std::optional<std::string> tls_ca,
                 std::optional<std::string> tls_cert,
                 std::optional<std::string> tls_key,
                 std::optional<std::string> token) {
                DirectOptions d = MakeDirectOptions(
                    std::move(coordinator), std::move(job), rank, world_size,
                    io_threads, rpc_timeout, collective_timeout, max_retries,
                    std::move(partial_chunk_check), use_odirect);
                d.first_contact_timeout = first_contact_timeout;
                d.tls_ca = std::move(tls_ca);
                d.tls_cert = std::move(tls_cert);
                d.tls_key = std::move(tls_key);
                d.token = std::move(token);
                client::AgentCheckpointerOptions o;
                o.agent_socket = std::move(agent_socket);
                o.direct = ValueOrThrow(ToCheckpointerOptions(d));
                o.copy_threads = copy_threads;
                o.wait_for_space = ValueOrThrow(SecondsOption(
                    wait_for_space, "wait_for_space", d.job, rank));
                o.rpc_timeout = o.direct.rpc_timeout;
                o.allow_streaming = allow_streaming;
                return std::make_unique<PyAgentCheckpointer>(o);
              }),
          py::arg("agent_socket"), py::arg("coordinator"), py::arg("job"),
          py::arg("rank"), py::arg("world_size"), py::kw_only(),
          py::arg("copy_threads") = agent_defaults.copy_threads,
          py::arg("wait_for_space") = agent_defaults.wait_for_space,
          py::arg("allow_streaming") = agent_defaults.allow_streaming,
          py::arg("io_threads") = defaults.io_threads,
          py::arg("rpc_timeout") = defaults.rpc_timeout,
          py::arg("collective_timeout") = defaults.collective_timeout,
          py::arg("max_retries") = defaults.max_retries,
          py::arg("first_contact_timeout") = defaults.first_contact_timeout,
          py::arg("partial_chunk_check") = defaults.partial_chunk_check,
          py::arg("use_odirect") = defaults.use_odirect,
          py::arg("tls_ca") = py::none(), py::arg("tls_cert") = py::none(),
          py::arg("tls_key") = py::none(), py::arg("token") = py::none(),
          R"doc(Connects to the agent's Unix socket.

Every keyword defaults to libcairn's AgentCheckpointerOptions and
CheckpointerOptions (see default_options()).

Args:
  agent_socket: path of cairn-agent's Unix domain socket.
  coordinator, job, rank, world_size: as for Checkpointer.
  copy_threads: threads copying one large tensor into staging memory.
  wait_for_space: seconds async_save may wait for staging space.
  allow_streaming: let a save larger than the agent's staging budget stream
    through buckets (otherwise ResourceExhaustedError).
  io_threads, rpc_timeout, collective_timeout, max_retries,
  first_contact_timeout, partial_chunk_check, use_odirect, tls_ca,
  tls_cert, tls_key, token: as
    for Checkpointer (used by the storage
    fallback of load; rpc_timeout also bounds calls to the agent).

Raises:
  InvalidArgumentError naming job and rank: a bad option.
  UnavailableError: the agent does not answer on `agent_socket`.
)doc")
      .def(
          "async_save", &PyAgentCheckpointer::AsyncSave, py::arg("step"),
          py::arg("state"), py::arg("tier") = "policy",
          R"doc(Snapshots `state` into the agent's staging memory and returns a SaveFuture
as soon as the buffers of `state` may change again (training blocks only
for the copy). The agent commits the checkpoint even if this process exits.
tier: "policy" (the job's policy; storage without one), "persistent", or
"memory" (kept in the agents' memory only, committed once replicas + 1
agents on distinct nodes hold every rank's shards).

Ctrl-C during the copy cancels the save and raises KeyboardInterrupt.

Raises:
  ResourceExhaustedError: no staging space within wait_for_space.
  CancelledError: cancel() was called from another thread (or before).
  UnavailableError: the agent is down.
  InvalidArgumentError: the state dict is invalid.
)doc")
      .def(
          "save_future", &PyAgentCheckpointer::FutureOf, py::arg("step"),
          R"doc(The SaveFuture of this rank's save of `step` staged by an async_save of the
same job and rank, in this process or another (DCP's async_save PROCESS mode
waits in its child process for the copy the rank staged). cancel() stops its
wait, and the save only if this process staged it.
)doc")
      .def(
          "save", &PyAgentCheckpointer::Save, py::arg("step"), py::arg("state"),
          py::arg("tier") = "policy",
          R"doc(async_save, then waits for the commit (GIL released); returns the committed
CheckpointInfo. Ctrl-C anywhere in it cancels the save and raises
KeyboardInterrupt: the agent aborts it at cairnd once it has joined it
there (the other ranks fail AbortedError at once; the previous checkpoint
stays the latest); a save every rank had committed stays committed.

Raises: as async_save and SaveFuture.wait.
)doc")
      .def(
          "load", &PyAgentCheckpointer::Load, py::arg("state"),
          py::arg("step") = py::none(),
          R"doc(Fills `state` from checkpoint `step` (None: the latest): agent memory tiers
first, storage otherwise. Returns the step loaded; last_load_source says
which tier served it. Ctrl-C cancels the load and raises KeyboardInterrupt
(treat `state` as not loaded). Errors as Checkpointer.load.
)doc")
      .def(
          "cancel", &PyAgentCheckpointer::Cancel,
          R"doc(Cancels the save, async_save, load or SaveFuture.wait (of this object's
futures) in progress on another thread, or, with none in progress, the next
one to start; each cancel() is consumed by exactly one of them.
Thread-safe; returns at once. The cancelled call raises CancelledError
naming rank, job and step. A cancelled save is cancelled at the agent: a
copy being staged is dropped; once the agent has joined the save at cairnd
it is aborted there (the other ranks fail AbortedError at once), unless
every rank had committed it.
)doc")
      .def_static(
          "default_options", [] { return DefaultOptionsDict(true); },
          R"doc(The constructor's keyword defaults, a dict (keyword -> value; None for tls_ca,
tls_cert, tls_key, token: the environment's): libcairn's
AgentCheckpointerOptions and CheckpointerOptions, durations in seconds.
)doc")
      .def_property_readonly("last_load_source",
                             &PyAgentCheckpointer::LastLoadSource,
                             "Which tier served the last load: "
                             "\"agent_memory\", \"storage\" or \"none\".")
      .def_property_readonly(
          "last_save_stats", &PyAgentCheckpointer::LastSaveStats,
          R"doc(The last async_save, a dict: bytes (copied into staging), blocked (seconds
inside async_save), copy_time, begin_time (seconds waiting for space),
streamed_buckets (> 0: the save streamed through buckets).
)doc");
}

}  // namespace cairn::python
