"""Cairn as the storage layer of PyTorch Distributed Checkpoint (DCP).

``CairnStorageWriter`` and ``CairnStorageReader`` implement DCP's
StorageWriter / StorageReader for torch 1.13
(``torch.distributed._shard.checkpoint.save_state_dict`` /
``load_state_dict``) and for the current ``torch.distributed.checkpoint``
(``dcp.save`` / ``dcp.load`` with ``checkpoint_id``). DCP's planners run
unchanged; Cairn replaces only the storage:

- Save: each rank's write_data resolves every WriteItem of its plan into one
  Cairn state (tensor chunks from their own memory, pickled objects as bytes
  entries) and calls ``Checkpointer.save(step)`` once: the collective save
  through cairnd (global plan answered from cairnd's cache when nothing
  changed, crc32c on every byte, atomic commit). The checkpoint is COMMITTED
  when write_data returns; finish() only checks that. No DCP file
  (.metadata, *.distcp) is written anywhere: the catalog and MANIFEST are
  Cairn's.
- Load: read_metadata builds DCP's Metadata from cairnd's description of the
  checkpoint (every stored chunk's box); read_data hands cairnd each ReadItem
  as a global box backed by the planner's target tensor (zero copy when it is
  contiguous CPU memory) and loads them with one ``Checkpointer.load``:
  cairnd plans the exact byte ranges, whatever layout saved them.

Checkpoint ids (``checkpoint_id=`` of the constructor, of ``reset`` and of
current ``dcp.save/load``): an int step, a decimal string, ``"latest"``
(reader only) or ``"cairn://HOST:PORT/JOB/STEP"``.

Example (torch 1.13)::

    import cairn.torch  # first: fixes torch 1.13's sharding import on 3.11
    from torch.distributed._shard import checkpoint as dcp
    dcp.save_state_dict(sd, cairn.torch.CairnStorageWriter(
        "cairnd:7070", "llama", step))
    dcp.load_state_dict(sd, cairn.torch.CairnStorageReader(
        "cairnd:7070", "llama"))             # step "latest" by default

Example (current torch)::

    import torch.distributed.checkpoint as dcp
    from cairn.torch import CairnStorageReader, CairnStorageWriter
    dcp.save(sd, storage_writer=CairnStorageWriter(),  # CAIRN_* env
             checkpoint_id=f"cairn://cairnd:7070/llama/{step}")
    dcp.load(sd, storage_reader=CairnStorageReader(),
             checkpoint_id="cairn://cairnd:7070/llama/latest")

Without a process group (DCP's no_dist), rank 0 of 1 is assumed; with one
but no_dist=True, pass rank=0, world_size=1 to the constructor.

Migrating: ``import_dcp(path, job, step)`` saves a checkpoint that torch's
FileSystemWriter wrote (a directory of .metadata and __R_N.distcp files)
into Cairn as one committed checkpoint, from a single process; also
``python -m cairn.torch import-dcp PATH --job JOB --step STEP``
(cairn/_dcp_import.py).

Helpers live in cairn/_dcp.py; this module holds the two classes.
"""

import dataclasses
import os
import threading
from typing import Any, Dict, Optional, Union

from cairn import _torch_compat

_torch_compat.install()  # before torch.distributed._shard is imported

import torch  # noqa: E402  pylint: disable=wrong-import-position

from cairn import _dcp  # noqa: E402  pylint: disable=wrong-import-position
from cairn import _dcp_import  # noqa: E402  pylint: disable=wrong-import-position
from cairn import errors  # noqa: E402  pylint: disable=wrong-import-position
from cairn.checkpointer import _AGENT_ONLY_OPTIONS  # noqa: E402  pylint: disable=wrong-import-position
from cairn._dcp_import import ImportResult, import_dcp  # noqa: E402,F401  pylint: disable=wrong-import-position

_api = _dcp.api()

__all__ = ["CairnStorageWriter", "CairnStorageReader", "import_dcp",
           "ImportResult"]



@dataclasses.dataclass
class _Staged:
    """A save stage() handed to cairn-agent, until write_data waits for it."""
    step: int
    pid: int                      # the process whose native future it is
    native: Any                   # _cairn.SaveFuture (None once pickled)
    byte_sizes: Dict[str, int]    # staged bytes entries' sizes, by fqn


class _CairnStorage:
    """What the writer and the reader share: identity, rank, connection."""

    _allow_latest = False

    def __init__(self, coordinator: Optional[str], job: Optional[str],
                 step: Union[int, str, None], checkpoint_id: Any,
                 options: Dict[str, Any]):
        self._process_group = options.pop("process_group", None)
        self._rank_override = options.pop("rank", None)
        self._world_override = options.pop("world_size", None)
        self._options = options
        self.coordinator = coordinator or os.environ.get("CAIRN_COORDINATOR")
        self.job = job or os.environ.get("CAIRN_JOB")
        self.step: Union[int, str, None] = None
        if step is not None:
            self._set_id(step)
        if checkpoint_id is not None:
            self._set_id(checkpoint_id)
        self.is_coordinator = False
        self._no_dist = False
        self._use_collectives = True

    # ----------------------------------------------------- identity
    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        """True when `checkpoint_id` names a Cairn checkpoint: an int step, a
        decimal string, "cairn://HOST:PORT/JOB/STEP" (and "latest" for the
        reader)."""
        try:
            _dcp.parse_checkpoint_id(checkpoint_id, cls._allow_latest)
            return True
        except errors.InvalidArgumentError:
            return False

    def _set_id(self, checkpoint_id: Any) -> None:
        coordinator, job, step = _dcp.parse_checkpoint_id(
            checkpoint_id, self._allow_latest)
        if coordinator is not None:
            self.coordinator = coordinator
        if job is not None:
            self.job = job
        self.step = step

    @property
    def checkpoint_id(self) -> str:
        """This checkpoint as "cairn://HOST:PORT/JOB/STEP"."""
        return f"cairn://{self.coordinator}/{self.job}/{self.step}"

    def storage_meta(self):
        """DCP's StorageMeta naming this checkpoint (None on a torch without
        it, e.g. 1.13)."""
        storage_meta_cls = getattr(_api.metadata, "StorageMeta", None)
        if storage_meta_cls is None:
            return None
        try:
            return storage_meta_cls(checkpoint_id=self.checkpoint_id)
        except TypeError:
            return None

    # ----------------------------------------------------- ranks
    def _set_up(self, is_coordinator: bool, kwargs: Dict[str, Any]) -> None:
        self.is_coordinator = bool(is_coordinator)
        # use_collectives=False (DCP >= 2.6): DCP plans each rank alone and
        # runs no collective; the save is still one checkpoint of every rank
        # of the group (cairnd is what brings them together), so the rank
        # and world size stay the group's. Only the readiness exchange
        # before the save, a torch collective, is left out.
        self._use_collectives = kwargs.get("use_collectives") is not False
        if "rank" in kwargs and self._rank_override is None:
            self._rank_override = kwargs["rank"]

    def _where(self) -> str:
        return f"job '{self.job}' step {self.step}"

    def _rank_and_world(self):
        return _dcp.rank_and_world(self._process_group, self._rank_override,
                                   self._world_override, self._no_dist)

    def _connection(self) -> "_dcp.Connection":
        return self._open(None)

    def _open(self, agent_socket: Optional[str]) -> "_dcp.Connection":
        if not self.coordinator:
            raise errors.InvalidArgumentError(
                f"{type(self).__name__}: no coordinator (pass coordinator=, "
                f"a cairn://HOST:PORT/JOB/STEP checkpoint_id, or set "
                f"CAIRN_COORDINATOR)")
        if not self.job:
            raise errors.InvalidArgumentError(
                f"{type(self).__name__}: no job (pass job=, a "
                f"cairn://HOST:PORT/JOB/STEP checkpoint_id, or set CAIRN_JOB)")
        rank, world = self._rank_and_world()
        return _dcp.connection(self.coordinator, self.job, rank, world,
                               self._options, agent_socket)


class CairnStorageWriter(_CairnStorage, _api.StorageWriter):
    """DCP StorageWriter that saves through cairnd.

    CairnStorageWriter(coordinator=None, job=None, step=None, *,
                       checkpoint_id=None, process_group=None, **options)

    coordinator / job default to CAIRN_COORDINATOR / CAIRN_JOB; the step comes
    from `step`, `checkpoint_id` or a later ``reset(checkpoint_id)``. Rank and
    world size are those of `process_group` (default: torch.distributed's
    default group, or 0 of 1 without one), or rank= and world_size=. Other
    keyword options go to ``cairn._cairn.Checkpointer`` (io_threads,
    rpc_timeout, ...). ``tier``: "policy" (the job's checkpoint policy;
    storage without one), "persistent", or "memory" (in cairn-agents'
    memory only; needs ``agent_socket``).

    After a save, ``last_info`` is cairnd's CheckpointInfo (COMMITTED) and
    ``last_stats`` libcairn's stats (``plan_from_cache``,
    ``sent_fingerprint_only``, bytes, times).
    """

    _allow_latest = False
    # AsyncStager: stage() returns when the snapshot is complete.
    _synchronize_after_execute = False

    def __init__(self, coordinator: Optional[str] = None,
                 job: Optional[str] = None, step: Optional[int] = None, *,
                 checkpoint_id: Any = None, agent_socket: Optional[str] = None,
                 tier: str = "policy", **options: Any):
        _CairnStorage.__init__(self, coordinator, job, step, checkpoint_id,
                               options)
        self.agent_socket: Optional[str] = (
            agent_socket or os.environ.get("CAIRN_AGENT_SOCKET") or None)
        if tier not in ("policy", "persistent", "memory"):
            raise errors.InvalidArgumentError(
                f"CairnStorageWriter for job '{self.job}': tier {tier!r} is "
                f"not one of 'policy', 'persistent', 'memory'")
        if tier == "memory" and self.agent_socket is None:
            raise errors.InvalidArgumentError(
                f"CairnStorageWriter for job '{self.job}': tier 'memory' "
                f"keeps the checkpoint in cairn-agents' memory and needs an "
                f"agent_socket (or CAIRN_AGENT_SOCKET)")
        self.tier = tier
        extra = sorted(set(self._options) & _AGENT_ONLY_OPTIONS)
        if extra and self.agent_socket is None:
            raise errors.InvalidArgumentError(
                f"CairnStorageWriter for job '{self.job}': options {extra} "
                f"need an agent_socket (or CAIRN_AGENT_SOCKET)")
        # The step stage() may snapshot under: the constructor's, used once
        # (a reused writer learns later steps only from DCP's reset(), after
        # stage(), so it stages with a host copy instead).
        self._stage_step: Optional[int] = (
            self.step if isinstance(self.step, int) else None)
        self._staged: Dict[int, _Staged] = {}
        self.last_info = None
        self.last_stats: Dict[str, Any] = {}

    def __getstate__(self) -> Dict[str, Any]:
        # async_save's PROCESS mode pickles the writer: the staged save's
        # native future stays in this process (the copy waits by step).
        state = dict(self.__dict__)
        state["_staged"] = {step: dataclasses.replace(s, native=None)
                            for step, s in self._staged.items()}
        return state

    def reset(self, checkpoint_id: Any = None) -> None:
        """A new save begins; `checkpoint_id` (if given) names its step."""
        if checkpoint_id is not None:
            self._set_id(checkpoint_id)
        self.last_info = None

    def _connection(self) -> "_dcp.Connection":
        return self._open(self.agent_socket)

    # ----------------------------------------------------- AsyncStager
    @property
    def should_synchronize_after_execute(self) -> bool:
        """False: stage() has finished the snapshot when it returns."""
        return False

    def stage(self, state_dict: Any) -> Any:
        """async_save's snapshot, after which training may change its
        tensors. With an agent and the step known (``step=`` or
        ``checkpoint_id=`` of the writer, or ``reset(STEP)`` before
        async_save), one copy of this rank's tensors into cairn-agent's
        shared memory, which commits the checkpoint; DCP then plans from
        data-less stand-ins and write_data waits for the commit. Otherwise
        one host copy, saved by write_data in the background."""
        step, self._stage_step = self._stage_step, None
        if self.agent_socket is None or step is None:
            return _dcp.host_copy(state_dict)
        rank, world = self._rank_and_world()
        where = f"async_save of job '{self.job}' step {step} rank {rank}"
        built, failure = None, None
        try:
            plan, planner = _dcp.local_save_plan(state_dict, rank == 0)
            built = _dcp.build_save_state(plan, planner, self.job, step,
                                          rank, rank == 0)
        except Exception as e:  # pylint: disable=broad-except
            failure = e
        if world > 1 and not self._no_dist:
            _dcp.agree_or_raise(failure, self._process_group, world, rank,
                                where)
        if failure is not None:
            raise failure
        conn = self._connection()
        with conn.lock:
            native = conn.ckpt.async_save(step, built.state, self.tier)
            self.last_stats = dict(conn.ckpt.last_save_stats)
        del built.keep_alive
        byte_sizes = {item.index.fqn: nbytes for item, nbytes in built.results
                      if item.tensor_data is None}
        self._staged[step] = _Staged(step, os.getpid(), native, byte_sizes)
        return _dcp.skeleton(state_dict)

    def synchronize_staging(self) -> None:
        """Nothing to wait for: stage() is synchronous."""

    def close(self) -> None:
        """Nothing to release (connections are shared per process)."""

    def init(self, is_coordinator: bool) -> None:  # torch 1.13's name
        self.set_up_storage_writer(is_coordinator)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        del args
        self._set_up(is_coordinator, kwargs)
        if not isinstance(self.step, int):
            raise errors.InvalidArgumentError(
                f"CairnStorageWriter for job '{self.job}': no step to save "
                f"(pass step=, checkpoint_id=STEP or "
                f"cairn://HOST:PORT/JOB/STEP)")

    def prepare_local_plan(self, plan):
        # The step rides along so the coordinator can check every rank agrees.
        return dataclasses.replace(plan, storage_data=_dcp.PlanTag(
            self.job, self.step, self._rank_and_world()[0]))

    def prepare_global_plan(self, plans):
        _dcp.check_same_step(plans, "save", self.job)
        return plans

    def write_data(self, plan, planner):
        """Saves this rank's items with one collective Cairn save (returns
        once the checkpoint is COMMITTED; raises on every rank if any rank
        fails, leaving the previous checkpoint latest)."""
        if self.step in self._staged:
            return self._write_staged(plan, self._staged.pop(self.step))
        rank, world = self._rank_and_world()
        built = None
        failure = None
        try:
            built = _dcp.build_save_state(plan, planner, self.job, self.step,
                                          rank, self.is_coordinator)
        except Exception as e:  # pylint: disable=broad-except
            failure = e
        # Every rank learns whether all ranks are ready before any begins the
        # collective save: a rank that cannot even build its state would
        # otherwise leave the others parked in BeginSave until the deadline.
        if not self._no_dist and self._use_collectives and \
                self._may_run_collectives():
            _dcp.agree_or_raise(failure, self._process_group, world, rank,
                                f"save of {self._where()}")
        if failure is not None:
            raise failure
        conn = self._connection()
        with conn.lock:
            if self.agent_socket is not None:
                native = conn.ckpt.async_save(self.step, built.state,
                                              self.tier)
                self.last_stats = dict(conn.ckpt.last_save_stats)
            else:
                info = conn.ckpt.save(self.step, built.state)
                self.last_stats = dict(conn.ckpt.last_stats)
        del built.keep_alive
        if self.agent_socket is not None:
            info = native.wait(None)
        self.last_info = info
        return self._results(
            [(item, nbytes) for item, nbytes in built.results])

    def _may_run_collectives(self) -> bool:
        """Whether write_data may run its readiness exchange, a torch
        collective. DCP does not tell the storage layer which process group
        async_save was given: off the main thread (async_save's THREAD
        executor) with no process_group of the writer's own, the exchange
        would run on the default group beside training's own collectives
        (gloo then aborts or hangs), so it is left out there; a rank that
        cannot build its state then fails the others through cairnd's
        collective_timeout, and DCP reports every rank's cause."""
        return (self._process_group is not None or
                threading.current_thread() is threading.main_thread())

    def _results(self, sized):
        fut = torch.futures.Future()
        fut.set_result([
            _api.WriteResult(index=item.index, size_in_bytes=nbytes,
                             storage_data=self.step)
            for item, nbytes in sized])
        return fut

    def _write_staged(self, plan, staged: "_Staged"):
        """write_data of a save stage() put into cairn-agent: waits for its
        commit (from async_save's background process too, by step)."""
        rank = self._rank_and_world()[0]
        native = staged.native
        if native is None or staged.pid != os.getpid():
            native = self._connection().ckpt.save_future(staged.step)
        self.last_info = native.wait(None)
        sized = []
        for item in plan.items:
            try:
                sized.append((item, _dcp.item_nbytes(item, staged.byte_sizes)))
            except KeyError:
                raise errors.FailedPreconditionError(
                    f"async_save of job '{self.job}' step {self.step} rank "
                    f"{rank}: write item '{item.index.fqn}' was not staged "
                    f"(stage() plans with DefaultSavePlanner; a planner "
                    f"that renames or adds entries needs a writer without "
                    f"a step before async_save)") from None
        return self._results(sized)

    def finish(self, metadata, results) -> None:
        """The checkpoint is already committed by the collective save; this
        checks it is (and that every rank saved this step)."""
        del metadata
        for rank_results in results:
            for r in rank_results:
                if r.storage_data != self.step:
                    raise errors.FailedPreconditionError(
                        f"save of {self._where()}: '{r.index.fqn}' was "
                        f"written as step {r.storage_data}")
        info = self.last_info
        if info is None or info.state != "COMMITTED":
            raise errors.FailedPreconditionError(
                f"save of {self._where()} is not committed (state "
                f"{getattr(info, 'state', 'none')})")


class CairnStorageReader(_CairnStorage, _api.StorageReader):
    """DCP StorageReader that loads through cairnd (resharding any layout).

    CairnStorageReader(coordinator=None, job=None, step="latest", *,
                       checkpoint_id=None, process_group=None, **options)

    step "latest" is resolved once, in read_metadata, through cairnd on each
    rank and remembered; the ranks' steps are compared in the global plan,
    so a save that commits between two ranks' resolutions fails the load with
    AbortedError instead of mixing steps (load again; pass an explicit step to
    rule it out). ``reset()`` forgets the resolution.
    """

    _allow_latest = True

    def __init__(self, coordinator: Optional[str] = None,
                 job: Optional[str] = None,
                 step: Union[int, str, None] = "latest", *,
                 checkpoint_id: Any = None, **options: Any):
        self._weights_only = bool(options.pop("weights_only", True))
        _CairnStorage.__init__(self, coordinator, job, step, checkpoint_id,
                               options)
        self._requested = self.step
        self._metadata = None
        self.loaded_step: Optional[int] = None

    def reset(self, checkpoint_id: Any = None) -> None:
        """A new load begins; `checkpoint_id` (if given) names the step."""
        if checkpoint_id is not None:
            self._set_id(checkpoint_id)
            self._requested = self.step
        self.step = self._requested
        self._metadata = None

    def read_metadata(self):
        """DCP Metadata of the step (resolving "latest" once) from cairnd's
        description: dtype, size and every stored chunk box per tensor."""
        conn = self._connection()
        with conn.lock:
            if self.step == "latest" or self.step is None:
                self.step = conn.ckpt.latest_step()
            summary = conn.ckpt.describe(self.step)
        step = self.step

        def fetch_planner_data():
            with conn.lock:
                return _dcp.read_planner_data(conn.ckpt, step)

        return _dcp.metadata_from_summary(summary, self.job, self.step,
                                          fetch_planner_data)

    def init(self, metadata, is_coordinator: bool) -> None:  # 1.13's name
        self.set_up_storage_reader(metadata, is_coordinator)

    def set_up_storage_reader(self, metadata, is_coordinator: bool,
                              *args: Any, **kwargs: Any) -> None:
        del args
        self._set_up(is_coordinator, kwargs)
        tag = getattr(metadata, "storage_data", None)
        if isinstance(tag, _dcp.PlanTag):
            self.step = tag.step
        self._metadata = metadata

    def prepare_local_plan(self, plan):
        return dataclasses.replace(plan, storage_data=_dcp.PlanTag(
            self.job, self.step, self._rank_and_world()[0]))

    def prepare_global_plan(self, plans):
        _dcp.check_same_step(plans, "load", self.job)
        return plans

    def read_data(self, plan, planner):
        """Loads every ReadItem with one Cairn load (exact byte ranges,
        crc32c verified) into the planner's targets, then commits them."""
        rank, _ = self._rank_and_world()
        load = _dcp.build_load_state(plan, planner, self._metadata, self.job,
                                     self.step, rank)
        conn = self._connection()
        with conn.lock:
            self.loaded_step = conn.ckpt.load(load.state, self.step)
        load.finish(planner, self._weights_only)
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut


if __name__ == "__main__":
    import sys  # pylint: disable=ungrouped-imports
    sys.exit(_dcp_import.main())
