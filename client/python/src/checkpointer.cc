// cairn._cairn.Checkpointer (see checkpointer.h).
#include "client/python/src/checkpointer.h"

#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/python/src/errors.h"
#include "client/python/src/interruptible.h"
#include "client/python/src/options.h"
#include "client/python/src/results.h"
#include "client/python/src/state_dict.h"

namespace cairn::python {

namespace py = pybind11;

OneCallAtATime::OneCallAtATime(std::atomic<bool>& busy, const std::string& who,
                               const char* call)
    : busy_(busy) {
  bool expected = false;
  if (!busy_.compare_exchange_strong(expected, true)) {
    ThrowStatus(absl::FailedPreconditionError(absl::StrCat(
        who, ": ", call,
        "() called while another call on the same object is running (use "
        "one call at a time, or one object per thread)")));
  }
}

OneCallAtATime::~OneCallAtATime() { busy_.store(false); }

namespace {

class PyCheckpointer {
 public:
  explicit PyCheckpointer(const DirectOptions& o) {
    client::CheckpointerOptions options =
        ValueOrThrow(ToCheckpointerOptions(o));
    using Result = absl::StatusOr<std::unique_ptr<client::Checkpointer>>;
    impl_ = ValueOrThrow(WithoutGil<Result>(
        [&] { return client::Checkpointer::Connect(options); }));
    who_ = absl::StrCat("job '", o.job, "' rank ", o.rank);
  }

  client::CheckpointInfo Save(int64_t step, const PyStateDict& state) {
    OneCallAtATime guard(busy_, who_, "save");
    PyStateDict::InUse in_use(state, PyStateDict::Access::kRead);
    absl::StatusOr<client::CheckpointInfo> r =
        CallInterruptibly<absl::StatusOr<client::CheckpointInfo>>(
            [&] { return impl_->Save(step, state.state()); },
            [&] { impl_->Cancel(); });
    if (!r.ok()) {
      ThrowStatus(WithJobContext(r.status(), job(),
                                 absl::StrCat(who_, " step ", step, " save")));
    }
    return *std::move(r);
  }

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
          r.status(), job(),
          absl::StrCat(who_, " load of ",
                       step.has_value() ? absl::StrCat("step ", *step)
                                        : std::string("the latest step"))));
    }
    return *std::move(r);
  }

  std::vector<client::CheckpointInfo> List(bool include_uncommitted) {
    OneCallAtATime guard(busy_, who_, "list");
    absl::StatusOr<std::vector<client::CheckpointInfo>> r =
        WithoutGil<absl::StatusOr<std::vector<client::CheckpointInfo>>>(
            [&] { return impl_->List(include_uncommitted); });
    if (!r.ok()) {
      ThrowStatus(
          WithJobContext(r.status(), job(), absl::StrCat(who_, " list")));
    }
    return *std::move(r);
  }

  int64_t LatestStep() {
    OneCallAtATime guard(busy_, who_, "latest_step");
    absl::StatusOr<int64_t> r = WithoutGil<absl::StatusOr<int64_t>>(
        [&] { return impl_->LatestStep(); });
    if (!r.ok()) {
      ThrowStatus(WithJobContext(r.status(), job(),
                                 absl::StrCat(who_, " latest_step")));
    }
    return *std::move(r);
  }

  client::CheckpointSummary Describe(int64_t step) {
    OneCallAtATime guard(busy_, who_, "describe");
    absl::StatusOr<client::CheckpointSummary> r =
        WithoutGil<absl::StatusOr<client::CheckpointSummary>>(
            [&] { return impl_->Describe(step); });
    if (!r.ok()) {
      ThrowStatus(WithJobContext(
          r.status(), job(), absl::StrCat(who_, " describe of step ", step)));
    }
    return *std::move(r);
  }

  // Thread-safe; no busy guard: it is meant for another thread.
  void Cancel() { impl_->Cancel(); }

  const std::string& job() const { return impl_->options().job; }
  py::dict LastStats() const { return TransferStatsDict(impl_->last_stats()); }
  const client::CheckpointerOptions& options() const {
    return impl_->options();
  }
  uint64_t incarnation() const { return impl_->incarnation(); }

 private:
  std::unique_ptr<client::Checkpointer> impl_;
  std::string who_;
  std::atomic<bool> busy_{false};
};

}  // namespace

void RegisterCheckpointer(py::module_& m) {
  // The keyword defaults are libcairn's (CheckpointerOptions).
  const DirectOptions defaults = DefaultDirectOptions();
  py::class_<PyCheckpointer>(
      m, "Checkpointer",
      R"doc(One rank's connection to cairnd, saving and loading in direct mode: the rank
writes and reads checkpoint storage itself, planned by cairnd.

Every blocking call releases the GIL. Use one call at a time per object (a
concurrent call from another thread raises FailedPreconditionError), except
cancel(), which any thread may call. Ctrl-C (SIGINT in the main thread)
during save or load cancels it and raises KeyboardInterrupt: a save is
aborted at cairnd (the other ranks fail AbortedError at once) and the
previous checkpoint stays the latest.
Errors are cairn.errors exceptions whose message names the job, step, rank
and tensor: UnavailableError (cairnd never answered within
first_contact_timeout, or did not answer again after max_retries),
AbortedError (the save was aborted by this or another rank: the message says
which and why), InvalidArgumentError (the state dict, step or an option is
wrong), NotFoundError (no such checkpoint), DataLossError (stored bytes are
damaged).

Attributes:
  job, rank, world_size, coordinator: as given to the constructor.
  incarnation: the random nonzero id this object's saves carry.
  last_stats: what the last save or load did (a dict).
)doc")
      .def(
          py::init([](std::string coordinator, std::string job, int rank,
                      int world_size, int io_threads, double rpc_timeout,
                      double collective_timeout, int max_retries,
                      double first_contact_timeout,
                      std::string partial_chunk_check, bool use_odirect,
                      std::optional<std::string> tls_ca,
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
            return std::make_unique<PyCheckpointer>(d);
          }),
          py::arg("coordinator"), py::arg("job"), py::arg("rank"),
          py::arg("world_size"), py::kw_only(),
          py::arg("io_threads") = defaults.io_threads,
          py::arg("rpc_timeout") = defaults.rpc_timeout,
          py::arg("collective_timeout") = defaults.collective_timeout,
          py::arg("max_retries") = defaults.max_retries,
          py::arg("first_contact_timeout") = defaults.first_contact_timeout,
          py::arg("partial_chunk_check") = defaults.partial_chunk_check,
          py::arg("use_odirect") = defaults.use_odirect,
          py::arg("tls_ca") = py::none(), py::arg("tls_cert") = py::none(),
          py::arg("tls_key") = py::none(), py::arg("token") = py::none(),
          R"doc(Sets up the connection (does not wait for cairnd to be up: the first
call does, for first_contact_timeout).

Every keyword defaults to libcairn's CheckpointerOptions (see
default_options()).

Args:
  coordinator: cairnd's address, "host:port".
  job: the training job's name ([A-Za-z0-9._-]{1,128}).
  rank: this process's rank, 0 <= rank < world_size.
  world_size: number of ranks saving/loading together.
  io_threads: parallel reads/writes this rank issues to storage.
  rpc_timeout: seconds any single RPC may take (except the collective ones).
  collective_timeout: seconds a save's begin/commit may wait for the other
    ranks (a backstop: cairnd's own deadlines answer first).
  max_retries: retries of a call cairnd did not answer (UNAVAILABLE) once it
    has answered this object (a cairnd restarting), with backoff from 0.1 s
    to 5 s; then UnavailableError.
  first_contact_timeout: seconds a call tries to reach a cairnd that never
    answered this object (a wrong address, cairnd not running, a refused
    TLS handshake); then UnavailableError naming the address and gRPC's
    reason.
  partial_chunk_check: how a resharding load verifies the crc32c of a stored
    chunk it reads only part of: "collective" (cairnd combines the ranks'
    partial checksums), "read_whole" (read it whole, check locally) or
    "none" (unverified).
  use_odirect: write data objects with O_DIRECT (falls back to buffered
    where the filesystem refuses it).
  tls_ca: PEM CA bundle of cairnd's certificate: call cairnd over TLS
    (default: CAIRN_TLS_CA).
  tls_cert, tls_key: PEM client certificate and key, for cairnd with
    --tls-client-ca (default: CAIRN_TLS_CERT, CAIRN_TLS_KEY).
  token: bearer token sent with every call (default: CAIRN_TOKEN).

Raises:
  InvalidArgumentError naming job and rank: a bad option.
)doc")
      .def(
          "save", &PyCheckpointer::Save, py::arg("step"), py::arg("state"),
          R"doc(Saves `state` as checkpoint `step`; collective: every rank of the job calls
it with its own state. Returns the committed CheckpointInfo.

The buffers of `state` must stay alive and unchanged until it returns.
Ctrl-C cancels the save (aborted at cairnd: the other ranks fail AbortedError
at once, the step is listed ABORTED, the previous checkpoint stays the
latest) and raises KeyboardInterrupt; a save every rank had already
committed stays committed.
Raises (message naming job, step, rank):
  CancelledError: cancel() was called from another thread.
  AbortedError: the save was aborted (by this rank or another: the message
    says which and why); no committed checkpoint is affected.
  AlreadyExistsError: `step` was saved before.
  InvalidArgumentError: the state dict disagrees with the other ranks' or
    is invalid.
  UnavailableError: cairnd did not answer after max_retries.
)doc")
      .def(
          "load", &PyCheckpointer::Load, py::arg("state"),
          py::arg("step") = py::none(),
          R"doc(Fills every chunk and bytes entry of `state` from checkpoint `step` (None:
the latest committed one), resharding from whatever layout saved it, and
returns the step loaded. Every byte is crc32c-verified. Ctrl-C cancels the
load and raises KeyboardInterrupt (treat `state` as not loaded).

Raises (message naming job, step, rank, fqn):
  NotFoundError: no such committed checkpoint (or none at all).
  CancelledError: cancel() was called from another thread.
  InvalidArgumentError: a tensor is missing from the checkpoint or has a
    different shape or dtype; a negative step.
  DataLossError: stored bytes are damaged.
  UnavailableError: cairnd did not answer after max_retries.
)doc")
      .def(
          "list", &PyCheckpointer::List, py::arg("include_uncommitted") = false,
          R"doc(The job's checkpoints (list of CheckpointInfo) by step: committed ones, and
with include_uncommitted=True also those being written, aborted or being
deleted.
)doc")
      .def("latest_step", &PyCheckpointer::LatestStep,
           R"doc(The job's newest committed step (what load(step=None) loads).

Raises:
  NotFoundError naming the job: it has no committed checkpoint.
)doc")
      .def(
          "describe", &PyCheckpointer::Describe, py::arg("step"),
          R"doc(What committed checkpoint `step` holds: a CheckpointSummary (its record,
tensors with dtype, shape, chunk boxes and bytes, bytes entries).

Raises:
  NotFoundError naming job and step: cairnd has no record of it.
  FailedPreconditionError naming its state: it is not committed.
)doc")
      .def(
          "cancel", &PyCheckpointer::Cancel,
          R"doc(Cancels the save or load in progress on another thread, or, with none in
progress, the next one to start; each cancel() is consumed by exactly one
save or load. Thread-safe; returns at once. The cancelled call raises
CancelledError naming rank, job and step; a cancelled save is aborted at
cairnd (the other ranks fail AbortedError at once). list, latest_step and
describe are never cancelled.
)doc")
      .def_static(
          "default_options", [] { return DefaultOptionsDict(false); },
          R"doc(The constructor's keyword defaults, a dict (keyword -> value; None for tls_ca,
tls_cert, tls_key, token: the environment's): libcairn's CheckpointerOptions,
durations in seconds.
)doc")
      .def_property_readonly(
          "last_stats", &PyCheckpointer::LastStats,
          R"doc(What the last save or load did, a dict: bytes (payload written or
delivered), bytes_storage (moved to/from storage), items,
chunks_verified_by_cairnd, chunks_verified_locally, plan_from_cache,
sent_fingerprint_only, plan_time, io_time, commit_time (seconds).
)doc")
      .def_property_readonly(
          "job", [](const PyCheckpointer& c) { return c.options().job; })
      .def_property_readonly(
          "rank", [](const PyCheckpointer& c) { return c.options().rank; })
      .def_property_readonly(
          "world_size",
          [](const PyCheckpointer& c) { return c.options().world_size; })
      .def_property_readonly(
          "coordinator",
          [](const PyCheckpointer& c) { return c.options().coordinator; })
      .def_property_readonly("incarnation", &PyCheckpointer::incarnation,
                             "The random nonzero id this object's saves "
                             "carry (tells a restarted rank from a retry).");
}

}  // namespace cairn::python
