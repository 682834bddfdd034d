"""cairn.Checkpointer: save and load a training job's nested state_dict.

The direct Python API over the extension's `_cairn.Checkpointer` (and, with
an agent socket, `_cairn.AgentCheckpointer`): it turns the state_dict users
have into Cairn entries (cairn.state), runs the collective save or load, and
writes loaded values back into the caller's dict. SaveFuture is the handle
of an async_save.
"""

import numbers
import os
import sys
import threading
from typing import (Any, Callable, Dict, List, Literal, Optional, TypeVar,
                    Union, overload)

from cairn import _cairn
from cairn import state as _state
from cairn.errors import DeadlineExceededError, InvalidArgumentError

CheckpointInfo = _cairn.CheckpointInfo

# Options only cairn-agent's client takes (staging memory, copy threads), as
# the extension names them (their defaults are libcairn's, never restated).
_AGENT_ONLY_OPTIONS = (frozenset(_cairn.AgentCheckpointer.default_options())
                       - frozenset(_cairn.Checkpointer.default_options()))

StateDictLike = Union[Dict[Any, Any], _cairn.StateDict]

_T = TypeVar("_T")


def _env_int(name: str) -> Optional[int]:
    text = os.environ.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(
            f"environment variable {name}={text!r} is not an integer") from None


def _default_rank_and_world(rank: Optional[int], world_size: Optional[int]):
    """Explicit values, else torch.distributed's default group (when it is
    initialised), else CAIRN_RANK/CAIRN_WORLD_SIZE, else RANK/WORLD_SIZE,
    else 0 of 1."""
    dist = sys.modules.get("torch.distributed")
    if (dist is not None and dist.is_available() and dist.is_initialized()):
        if rank is None:
            rank = dist.get_rank()
        if world_size is None:
            world_size = dist.get_world_size()
    for rank_var, world_var in (("CAIRN_RANK", "CAIRN_WORLD_SIZE"),
                                ("RANK", "WORLD_SIZE")):
        if rank is None:
            rank = _env_int(rank_var)
        if world_size is None:
            world_size = _env_int(world_var)
    return (0 if rank is None else int(rank),
            1 if world_size is None else int(world_size))


# The largest step cairnd accepts (as libcairn checks it).
_MAX_STEP = 10**15


@overload
def _step_arg(step: Any, what: str, job: str, rank: int,
              allow_latest: Literal[False]) -> int: ...


@overload
def _step_arg(step: Any, what: str, job: str, rank: int,
              allow_latest: bool) -> Optional[int]: ...


def _step_arg(step: Any, what: str, job: str, rank: int,
              allow_latest: bool) -> Optional[int]:
    if allow_latest and (step is None or step == "latest"):
        return None
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        also = ' or "latest"' if allow_latest else ""
        raise InvalidArgumentError(
            f"{what} of job '{job}' rank {rank}: step {step!r} is not an "
            f"int{also}")
    if not 0 <= int(step) <= _MAX_STEP:
        raise InvalidArgumentError(
            f"{what} of job '{job}' rank {rank}: invalid step {int(step)}: "
            f"must be in [0, 10^15]")
    return int(step)


_TIERS = ("policy", "persistent", "memory")


def _tier_arg(tier: Any, agent: bool, where: str) -> None:
    if tier not in _TIERS:
        raise InvalidArgumentError(
            f"{where}: tier {tier!r} is not one of 'policy', 'persistent', "
            f"'memory'")
    if tier == "memory" and not agent:
        raise InvalidArgumentError(
            f"{where}: tier 'memory' keeps the checkpoint in cairn-agents' "
            f"memory, and this Checkpointer has no agent socket "
            f"(agent_socket, CAIRN_AGENT_SOCKET)")


class SaveFuture:
    """The outcome of one Checkpointer.async_save.

    The state was snapshotted when async_save returned; the save commits
    in the background. `result()` (or `wait()`) returns the committed
    CheckpointInfo or raises the save's error (an AbortedError if any rank
    failed, ...); `done()` says whether the outcome is known.
    """

    def __init__(self, step: int, job: str, rank: int,
                 native: Optional[_cairn.SaveFuture] = None):
        self.step = step
        self._job = job
        self._rank = rank
        self._native = native          # the agent path's
        self._event = threading.Event()
        self._info: Optional[CheckpointInfo] = None
        self._error: Optional[BaseException] = None

    # The background-thread path sets the outcome.
    def _set(self, info: Optional[CheckpointInfo],
             error: Optional[BaseException]) -> None:
        self._info, self._error = info, error
        self._event.set()

    def done(self) -> bool:
        """True once the save committed or failed; never blocks."""
        if self._event.is_set():
            return True
        return self._native is not None and self._native.done()

    def result(self, timeout: Optional[float] = None) -> CheckpointInfo:
        """Waits for the commit and returns its CheckpointInfo, or raises the
        save's error. DeadlineExceededError (naming job, rank, step and the
        timeout) if it is not known within `timeout` seconds (the save goes
        on; call again). Ctrl-C interrupts the wait, not the save.
        Checkpointer.cancel() stops the save: CancelledError (through an
        agent, a cancel() that came while nothing waited stops it here)."""
        if not self._event.is_set():
            if self._native is not None:
                try:
                    info = self._native.wait(timeout)
                except DeadlineExceededError:
                    raise
                except BaseException as e:  # the save's own failure
                    if isinstance(e, KeyboardInterrupt):
                        raise
                    self._set(None, e)
                else:
                    self._set(info, None)
            elif not self._event.wait(timeout):
                raise DeadlineExceededError(
                    f"async save of job '{self._job}' step {self.step} rank "
                    f"{self._rank}: not committed within {timeout} s (it is "
                    f"still running)")
        if self._error is not None:
            raise self._error
        assert self._info is not None
        return self._info

    def wait(self, timeout: Optional[float] = None) -> CheckpointInfo:
        """Same as result()."""
        return self.result(timeout)

    def exception(self, timeout: Optional[float] = None
                  ) -> Optional[BaseException]:
        """The save's error, or None if it committed (waits like result)."""
        try:
            self.result(timeout)
        except DeadlineExceededError as e:
            if not self.done():
                raise
            return e
        except Exception as e:  # pylint: disable=broad-except
            return e
        return None

    def __repr__(self) -> str:
        state = "pending" if not self.done() else (
            "failed" if self._error else "committed")
        return f"<cairn.SaveFuture job={self._job!r} step={self.step} {state}>"


class Checkpointer:
    """One training rank's handle for saving and loading its state through
    cairnd (the Cairn coordinator).

    Example (every rank of the job runs this)::

        ckpt = cairn.Checkpointer()     # coordinator, job, rank from env
        state = {"model": model.state_dict(), "optim": opt.state_dict(),
                 "sched": sched.state_dict(), "step": step,
                 "rng": torch.get_rng_state()}
        ckpt.save(step, state)          # collective; returns CheckpointInfo
        fut = ckpt.async_save(step, state)   # training may go on at once
        ckpt.load(state)                # latest, in place, any world size
        model.load_state_dict(state["model"]); ...

    The state_dict is the nested dict training code has: tensors (CPU),
    numpy arrays, ShardedTensors, DTensors (where torch has them) and any
    picklable object; see cairn.state for how it maps to Cairn entries.
    Every rank must call save/async_save/load with the same step: they are
    collective. A load reshards: the checkpoint may have been saved by a
    different number of ranks with a different sharding.

    Arguments (defaults from the environment):
      coordinator: cairnd's "HOST:PORT" (CAIRN_COORDINATOR).
      job: the training job's name (CAIRN_JOB).
      rank, world_size: torch.distributed's when initialised, else
        CAIRN_RANK/CAIRN_WORLD_SIZE, else RANK/WORLD_SIZE, else 0 and 1.
      agent_socket: cairn-agent's Unix socket (CAIRN_AGENT_SOCKET): saves
        then go through the node's agent (async_save returns after the copy
        into its shared memory) and loads read its memory tier first.
      **options: passed to _cairn.Checkpointer / AgentCheckpointer:
        io_threads, rpc_timeout, collective_timeout, max_retries (a
        cairnd that answered before and is restarting),
        first_contact_timeout (seconds to reach a cairnd that never answered
        before UnavailableError naming its address), partial_chunk_check,
        use_odirect, tls_ca, tls_cert, tls_key, token
        (TLS to cairnd and its bearer token; defaults CAIRN_TLS_CA,
        CAIRN_TLS_CERT, CAIRN_TLS_KEY, CAIRN_TOKEN); with an agent also
        copy_threads, wait_for_space, allow_streaming.

    One save is in flight per Checkpointer: save, async_save and load first
    wait for the previous async_save to finish (its outcome, success or
    failure, stays with its SaveFuture); latest_step, list and describe
    never wait for it. Errors are cairn.Error subclasses whose message
    names the job, step, rank and entry (fqn). Ctrl-C during save or load
    (and, with an agent, during async_save's copy) cancels it and raises
    KeyboardInterrupt; cancel() does the same from another thread.

    Attributes: coordinator, job, rank, world_size, agent_socket (None in
    direct mode), last_load_source ("agent_memory", "storage" or "none"),
    last_stats (see its doc).
    """

    def __init__(self, coordinator: Optional[str] = None,
                 job: Optional[str] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, *,
                 agent_socket: Optional[str] = None, **options: Any) -> None:
        if coordinator is None:
            coordinator = os.environ.get("CAIRN_COORDINATOR") or None
        if coordinator is None:
            raise InvalidArgumentError(
                "cairn.Checkpointer: no coordinator: pass coordinator="
                "'HOST:PORT' or set CAIRN_COORDINATOR")
        if job is None:
            job = os.environ.get("CAIRN_JOB") or None
        if job is None:
            raise InvalidArgumentError(
                "cairn.Checkpointer: no job: pass job='NAME' or set CAIRN_JOB")
        if agent_socket is None:
            agent_socket = os.environ.get("CAIRN_AGENT_SOCKET") or None
        self.coordinator: str = coordinator
        self.job: str = job
        self.rank, self.world_size = _default_rank_and_world(rank, world_size)
        self.agent_socket: Optional[str] = agent_socket
        self._direct_options = {k: v for k, v in options.items()
                                if k not in _AGENT_ONLY_OPTIONS}
        if agent_socket is None and len(self._direct_options) != len(options):
            extra = sorted(set(options) & _AGENT_ONLY_OPTIONS)
            raise InvalidArgumentError(
                f"cairn.Checkpointer of job '{job}' rank {self.rank}: options "
                f"{extra} need an agent_socket (or CAIRN_AGENT_SOCKET)")
        self._agent: Optional[_cairn.AgentCheckpointer] = None
        self._direct: Optional[_cairn.Checkpointer] = None
        if agent_socket is not None:
            self._agent = _cairn.AgentCheckpointer(
                agent_socket, coordinator, job, self.rank, self.world_size,
                **options)
        else:
            self._direct = self._connect()
        self._catalog: Optional[_cairn.Checkpointer] = None
        self._catalog_lock = threading.Lock()
        self._pending: Optional[SaveFuture] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._last_stats: Dict[str, Any] = {}
        # Where the last load read from: "agent_memory", "storage" (always
        # without an agent) or "none" before any load.
        self.last_load_source: str = "none"

    def _connect(self) -> _cairn.Checkpointer:
        return _cairn.Checkpointer(self.coordinator, self.job, self.rank,
                                   self.world_size, **self._direct_options)

    def _where(self, what: str, step: Any) -> str:
        return (f"{what} of job '{self.job}' step {step} rank {self.rank}")

    # --------------------------------------------------------------- save

    def save(self, step: int, state_dict: StateDictLike,
             tier: str = "policy") -> CheckpointInfo:
        """Saves `state_dict` as checkpoint `step` and returns its committed
        CheckpointInfo once every rank's data is durable (collective).

        Tensors are written from their own memory (no copy when
        contiguous); leave them unchanged until save returns. Ctrl-C aborts
        the save for every rank (the previous checkpoint stays the latest)
        and raises KeyboardInterrupt; so does cancel() from another thread,
        raising CancelledError. Errors: InvalidArgumentError (a bad entry,
        named), AbortedError (another rank failed), AlreadyExistsError
        (step already committed), UnavailableError (cairnd unreachable).
        With an agent socket this is async_save then the wait for its
        commit, as one call (Ctrl-C in either cancels the save: the agent
        aborts it at cairnd once it has joined it there).

        tier: "policy" (the job's checkpoint policy, `cairn policy`;
        storage without one), "persistent", or "memory" (held in the
        agents' memory only, on replicas + 1 distinct nodes; needs an agent
        socket).
        """
        step = _step_arg(step, "save", self.job, self.rank, False)
        _tier_arg(tier, self._agent is not None, self._where("save", step))
        self._wait_pending()
        runner = self._runner()
        with self._lock:
            if isinstance(state_dict, _cairn.StateDict):
                info = (runner.save(step, state_dict, tier)
                        if self._agent is not None else
                        runner.save(step, state_dict))
            else:
                prep = _state.prepare_save(state_dict,
                                           self._where("save", step))
                try:
                    info = (runner.save(step, prep.state, tier)
                            if self._agent is not None else
                            runner.save(step, prep.state))
                finally:
                    prep.release()
            self._last_stats = dict(
                runner.last_save_stats
                if isinstance(runner, _cairn.AgentCheckpointer)
                else runner.last_stats)
        return info

    def _runner(self) -> Union[_cairn.Checkpointer, _cairn.AgentCheckpointer]:
        """The native object saves and loads go through."""
        if self._agent is not None:
            return self._agent
        assert self._direct is not None
        return self._direct

    def async_save(self, step: int, state_dict: StateDictLike,
                   tier: str = "policy") -> SaveFuture:
        """Starts saving `state_dict` as checkpoint `step`; returns a
        SaveFuture as soon as the state is snapshotted, so training may
        modify its tensors at once (the checkpoint holds the values at the
        time of the call).

        With an agent socket the snapshot is the copy into cairn-agent's
        shared memory (Ctrl-C during it cancels the save and raises
        KeyboardInterrupt) and the agent commits it; without, the tensors
        are cloned in this process and saved on a background thread (costs
        the state's size in host memory until it commits). A previous
        async_save still in flight is waited for first. Invalid entries
        raise here; failures of the save itself come from the future.
        Wait for the future (or leave the Checkpointer's `with` block)
        before the process exits: a background save still running at
        interpreter exit is cancelled and does not commit.
        """
        step = _step_arg(step, "async_save", self.job, self.rank, False)
        where = self._where("async_save", step)
        _tier_arg(tier, self._agent is not None, where)
        self._wait_pending()
        if self._agent is not None:
            with self._lock:
                if isinstance(state_dict, _cairn.StateDict):
                    native = self._agent.async_save(step, state_dict, tier)
                else:
                    prep = _state.prepare_save(state_dict, where)
                    try:
                        native = self._agent.async_save(step, prep.state,
                                                        tier)
                    finally:
                        prep.release()
                self._last_stats = dict(self._agent.last_save_stats)
            future = SaveFuture(step, self.job, self.rank, native)
            self._pending = future
            return future
        direct = self._direct
        assert direct is not None
        if isinstance(state_dict, _cairn.StateDict):
            raise InvalidArgumentError(
                f"{where}: a _cairn.StateDict borrows memory that cannot be "
                f"snapshotted; pass the nested state_dict (or use save)")
        prep = _state.prepare_save(state_dict, where, snapshot=True)
        future = SaveFuture(step, self.job, self.rank)

        def run() -> None:
            info, error = None, None
            try:
                with self._lock:
                    info = direct.save(step, prep.state)
                    self._last_stats = dict(direct.last_stats)
            except BaseException as e:  # pylint: disable=broad-except
                error = e
            finally:
                prep.release()
            future._set(info, error)  # pylint: disable=protected-access

        thread = threading.Thread(target=run, daemon=True,
                                  name=f"cairn-save-{self.job}-{step}")
        self._pending, self._thread = future, thread
        thread.start()
        return future

    def _wait_pending(self) -> None:
        """Waits for the async_save in flight (its outcome stays with its
        future)."""
        pending = self._pending
        if pending is not None:
            try:
                pending.result()
            except Exception:  # pylint: disable=broad-except
                pass
            self._pending = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # --------------------------------------------------------------- load

    def load(self, state_dict: StateDictLike,
             step: Union[int, str] = "latest", *,
             weights_only: bool = True) -> int:
        """Fills `state_dict` from checkpoint `step` ("latest": the newest
        committed one) and returns the step loaded (collective).

        Tensors, numpy arrays and ShardedTensor/DTensor local shards are
        loaded in place, whatever world size and sharding saved them; every
        other leaf (ints, floats, strings, lists without tensors, ...) is
        replaced in `state_dict` by the saved value. Afterwards apply it:
        model.load_state_dict(state["model"]), opt.load_state_dict(...).
        With an agent socket the agent's memory tier is read first (see
        last_load_source). Errors: NotFoundError (no such step, or an entry
        the checkpoint lacks; names the job and step), InvalidArgumentError
        (shape or dtype differs, names the fqn; or an object entry holds a
        class weights-only loading does not build), DataLossError (damaged
        bytes), UnavailableError. Objects are loaded the way torch.load loads
        by default (weights_only): plain data, tensors and the classes of
        torch.serialization.add_safe_globals; weights_only=False unpickles
        anything (only for checkpoints you trust).
        """
        ref = _step_arg(step, "load", self.job, self.rank, True)
        self._wait_pending()
        where = self._where("load", "latest" if ref is None else ref)
        with self._lock:
            runner = self._runner()
            if isinstance(state_dict, _cairn.StateDict):
                loaded = runner.load(state_dict, ref)
                prep = None
            else:
                prep = _state.prepare_load(state_dict, where)
                try:
                    loaded = runner.load(prep.state, ref)
                except BaseException:
                    prep.release()
                    raise
            if isinstance(runner, _cairn.AgentCheckpointer):
                self.last_load_source = runner.last_load_source
            else:
                self.last_load_source = "storage"
                self._last_stats = dict(runner.last_stats)
        if prep is not None:
            prep.finish_load(weights_only)
        return int(loaded)

    # --------------------------------------------------------------- catalog

    def _catalog_call(self, fn: Callable[[_cairn.Checkpointer], _T]) -> _T:
        with self._catalog_lock:
            if self._catalog is None:
                self._catalog = self._connect()
            return fn(self._catalog)

    def latest_step(self) -> int:
        """The newest committed step of the job. Raises NotFoundError
        (naming the job) when it has none, as libcairn does."""
        return int(self._catalog_call(lambda c: c.latest_step()))

    def list(self, include_uncommitted: bool = False) -> List[CheckpointInfo]:
        """The job's checkpoints by step: committed ones, and with
        `include_uncommitted` also WRITING, ABORTED and DELETING ones."""
        return self._catalog_call(lambda c: c.list(include_uncommitted))

    def describe(self, step: int) -> _cairn.CheckpointSummary:
        """What committed checkpoint `step` holds (_cairn.CheckpointSummary:
        info, tensors with dtype/shape/chunks, bytes entries).
        NotFoundError if there is no such step."""
        step = _step_arg(step, "describe", self.job, self.rank, False)
        return self._catalog_call(lambda c: c.describe(step))

    # --------------------------------------------------------------- misc

    @property
    def last_stats(self) -> Dict[str, Any]:
        """What the last save or load did: libcairn's transfer stats (bytes,
        io_time, plan_from_cache, ...) in direct mode; the agent's save
        stats (bytes, blocked, copy_time, ...) after an agent save."""
        return dict(self._last_stats)

    def cancel(self) -> None:
        """Cancels the save or load in progress (or the next one) from any
        thread; the cancelled call (or future) raises CancelledError. A
        cancelled save is aborted at cairnd (the other ranks fail
        AbortedError at once) unless every rank had committed it.

        With an agent: cancels the save, async_save or load running, or the
        wait on a SaveFuture (result, wait, done); with none running, the
        next of them, so an async_save the agent still persists is
        cancelled by the next wait for it (save, async_save and load wait
        for it first). Cancelled before the agent joined the save at cairnd
        (while async_save copies), nothing is aborted there: the other
        ranks' saves end at cairnd's begin deadline."""
        self._runner().cancel()

    def close(self) -> None:
        """Waits for the async_save in flight (raising its error, if any)."""
        pending = self._pending
        self._wait_pending()
        if pending is not None:
            pending.result()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._wait_pending()

    def __repr__(self) -> str:
        via = f" agent={self.agent_socket!r}" if self.agent_socket else ""
        return (f"<cairn.Checkpointer job={self.job!r} rank={self.rank}/"
                f"{self.world_size} coordinator={self.coordinator!r}{via}>")
