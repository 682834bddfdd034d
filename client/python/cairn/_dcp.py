"""Helpers of cairn.torch (the DCP storage layer): checkpoint ids, ranks and
connections, and the translation between DCP plans and Cairn states.

- parse_checkpoint_id: int / "123" / "latest" / "cairn://HOST:PORT/JOB/STEP".
- build_save_state: a SavePlan's WriteItems -> one _cairn.StateDict (tensor
  chunks from the tensors' own memory, BYTE_IO items as bytes entries).
- metadata_from_summary: cairnd's CheckpointSummary -> DCP's Metadata.
- build_load_state: a LoadPlan's ReadItems -> one _cairn.StateDict whose
  chunks are the planner's target tensors (or temporaries copied into them).
"""

import collections.abc
import dataclasses
import io
import os
import re
import threading
import types
from typing import Any, Dict, List, Optional, Tuple

import torch

from cairn import _cairn
from cairn import _objects
from cairn import state as _state
from cairn import _tensors
from cairn import errors

_API = None


def api() -> types.SimpleNamespace:
    """DCP's classes from the installed torch: torch.distributed.checkpoint
    (torch >= 2.0) or torch.distributed._shard.checkpoint (1.13)."""
    global _API  # pylint: disable=global-statement
    if _API is None:
        try:
            from torch.distributed.checkpoint import (  # pylint: disable=import-outside-toplevel
                metadata, planner, storage)
        except ImportError:
            from torch.distributed._shard.checkpoint import (  # pylint: disable=import-outside-toplevel
                metadata, planner, storage)
        _API = types.SimpleNamespace(
            metadata=metadata, planner=planner, storage=storage,
            StorageWriter=storage.StorageWriter,
            StorageReader=storage.StorageReader,
            WriteResult=storage.WriteResult)
    return _API


# ------------------------------------------------------------ identity

_URI = re.compile(r"^cairn://([^/]+)/(.+)/([^/]+)$")


def _parse_step(text: str, allow_latest: bool, original: Any) -> Any:
    if allow_latest and text == "latest":
        return "latest"
    if re.fullmatch(r"[0-9]+", text):
        return int(text)
    raise errors.InvalidArgumentError(
        f"checkpoint_id {original!r} is not a Cairn checkpoint id: the step "
        f"must be a non-negative integer{' or latest' if allow_latest else ''}"
        f" (forms: STEP, cairn://HOST:PORT/JOB/STEP)")


def parse_checkpoint_id(checkpoint_id: Any, allow_latest: bool
                        ) -> Tuple[Optional[str], Optional[str], Any]:
    """(coordinator or None, job or None, step) of a checkpoint id: an int
    step, a decimal string, "latest" (if allowed) or
    "cairn://HOST:PORT/JOB/STEP". InvalidArgumentError otherwise."""
    if isinstance(checkpoint_id, bool):
        raise errors.InvalidArgumentError(
            f"checkpoint_id {checkpoint_id!r} is not a Cairn checkpoint id")
    if isinstance(checkpoint_id, int):
        if checkpoint_id < 0:
            raise errors.InvalidArgumentError(
                f"checkpoint_id {checkpoint_id}: a step is non-negative")
        return None, None, checkpoint_id
    if isinstance(checkpoint_id, str):
        m = _URI.match(checkpoint_id)
        if m:
            return m.group(1), m.group(2), _parse_step(
                m.group(3), allow_latest, checkpoint_id)
        if checkpoint_id.startswith("cairn:"):
            raise errors.InvalidArgumentError(
                f"checkpoint_id {checkpoint_id!r} is not of the form "
                f"cairn://HOST:PORT/JOB/STEP")
        return None, None, _parse_step(checkpoint_id, allow_latest,
                                       checkpoint_id)
    raise errors.InvalidArgumentError(
        f"checkpoint_id {checkpoint_id!r} ({type(checkpoint_id).__name__}) is "
        f"not a Cairn checkpoint id (STEP or cairn://HOST:PORT/JOB/STEP)")


@dataclasses.dataclass(frozen=True)
class PlanTag:
    """What a rank's plan (and the loaded Metadata) carries in storage_data:
    the checkpoint it is about, so the coordinator can check every rank
    agrees before anything is written or read."""
    job: str
    step: Any
    rank: int


def check_same_step(plans: List[Any], what: str, job: str) -> None:
    """AbortedError unless every rank's plan names the same step."""
    steps = {}
    for i, plan in enumerate(plans):
        tag = plan.storage_data
        steps.setdefault(tag.step if isinstance(tag, PlanTag) else None,
                         []).append(i)
    if len(steps) > 1:
        detail = "; ".join(f"ranks {r}: step {s}" for s, r in steps.items())
        raise errors.AbortedError(
            f"{what} of job '{job}': the ranks name different steps ({detail})"
            f"{'; a save committed while they resolved latest: load again' if what == 'load' else ''}")


# ------------------------------------------------------------ ranks

def rank_and_world(process_group: Any, rank: Optional[int],
                   world_size: Optional[int], no_dist: bool
                   ) -> Tuple[int, int]:
    """This process's rank and the world size: explicit values, else the
    process group's (torch.distributed's default group), else 0 of 1."""
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    if not no_dist and dist.is_available() and dist.is_initialized():
        r = dist.get_rank(process_group) if rank is None else rank
        w = (dist.get_world_size(process_group)
             if world_size is None else world_size)
        return int(r), int(w)
    return (int(rank) if rank is not None else 0,
            int(world_size) if world_size is not None else 1)


def agree_or_raise(failure: Optional[BaseException], process_group: Any,
                   world_size: int, rank: int, what: str) -> None:
    """Tells every rank whether each rank is ready; a ready rank raises
    AbortedError naming the first rank that is not (whose own error it
    raises itself). Without a process group (or one rank) nothing to do."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    if world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return
    mine = None if failure is None else (
        f"{type(failure).__name__}: {failure}")
    gathered: List[Optional[str]] = [None] * world_size
    dist.all_gather_object(gathered, mine, group=process_group)
    if failure is not None:
        return
    for r, msg in enumerate(gathered):
        if msg is not None:
            raise errors.AbortedError(
                f"{what} not begun on rank {rank}: rank {r} failed preparing "
                f"its data ({msg})")


class Connection:
    """A libcairn Checkpointer and the lock that keeps its calls serial."""

    def __init__(self, ckpt: Any):
        self.ckpt = ckpt
        self.lock = threading.Lock()


_CONNECTIONS: Dict[Tuple, Connection] = {}
_CONNECTIONS_LOCK = threading.Lock()


def connection(coordinator: str, job: str, rank: int, world_size: int,
               options: Dict[str, Any],
               agent_socket: Optional[str] = None) -> Connection:
    """The process's Checkpointer for (coordinator, job, rank, world size,
    options), made once: a new writer per save still sends only its plan's
    fingerprint when the plan is unchanged. With `agent_socket`, an
    AgentCheckpointer through that node's cairn-agent."""
    key = (os.getpid(), coordinator, job, rank, world_size, agent_socket,
           tuple(sorted(options.items())))
    with _CONNECTIONS_LOCK:
        conn = _CONNECTIONS.get(key)
        if conn is None:
            if agent_socket is not None:
                native = _cairn.AgentCheckpointer(
                    agent_socket, coordinator, job, rank, world_size,
                    **options)
            else:
                native = _cairn.Checkpointer(coordinator, job, rank,
                                             world_size, **options)
            conn = Connection(native)
            _CONNECTIONS[key] = conn
        return conn


# ------------------------------------------------------------ save

@dataclasses.dataclass
class SaveState:
    state: Any                          # _cairn.StateDict
    keep_alive: List[Any]               # tensors whose memory it borrows
    results: List[Tuple[Any, int]]      # (WriteItem, bytes) for WriteResults


def _where(job: str, step: Any, rank: int) -> str:
    return f"job '{job}' step {step} rank {rank}"


# The bytes entry that keeps the saving planner's planner_data (DCP's map
# of each flattened fqn to its path in the nested state_dict), which
# Metadata.planner_data hands back on load (_load_state_dict_from_keys
# rebuilds the nesting from it). Not listed among the checkpoint's entries.
PLANNER_DATA_FQN = "__cairn_dcp_planner_data__"


def build_save_state(plan: Any, planner: Any, job: str, step: Any,
                     rank: int, is_coordinator: bool = False) -> SaveState:
    """Resolves every WriteItem of `plan` into one Cairn state: tensor items
    as explicit chunks (contiguous CPU tensors zero copy, others made
    contiguous), BYTE_IO items as bytes entries; on the coordinator, the
    plan's planner_data as the PLANNER_DATA_FQN entry."""
    byte_io = api().planner.WriteItemType.BYTE_IO
    state = _cairn.StateDict()
    keep: List[Any] = []
    results: List[Tuple[Any, int]] = []
    tensors: Dict[str, Tuple[str, List[int], List[Tuple]]] = {}
    for item in plan.items:
        fqn = item.index.fqn
        if fqn == PLANNER_DATA_FQN:
            raise errors.InvalidArgumentError(
                f"save of {_where(job, step, rank)}: '{fqn}' is the name "
                f"Cairn keeps DCP's planner_data under; rename this entry")
        data = planner.resolve_data(item)
        if item.type == byte_io:
            if isinstance(data, io.BytesIO):
                payload = data.getvalue()
            elif isinstance(data, (bytes, bytearray)):
                payload = bytes(data)
            else:
                buf = io.BytesIO()
                torch.save(data, buf)
                payload = buf.getvalue()
            state.add_bytes(fqn, payload)
            results.append((item, len(payload)))
            continue
        td = item.tensor_data
        if not isinstance(data, torch.Tensor) or td is None:
            raise errors.InvalidArgumentError(
                f"save of {_where(job, step, rank)}: write item '{fqn}' "
                f"resolved to a {type(data).__name__}, not a tensor")
        tensor = data.detach()
        _tensors.check_cpu(tensor, fqn, "saved")
        sizes = [int(s) for s in td.chunk.sizes]
        offsets = [int(o) for o in td.chunk.offsets]
        if list(tensor.shape) != sizes:
            raise errors.InvalidArgumentError(
                f"save of {_where(job, step, rank)}: tensor '{fqn}' at "
                f"offsets {offsets} has shape {list(tensor.shape)}, its write "
                f"item says {sizes}")
        dtype = td.properties.dtype
        if tensor.dtype != dtype:
            raise errors.InvalidArgumentError(
                f"save of {_where(job, step, rank)}: tensor '{fqn}' is "
                f"{tensor.dtype}, its write item says {dtype}")
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        keep.append(tensor)
        ptr, nbytes = _tensors.buffer_of(tensor, fqn)
        entry = tensors.setdefault(
            fqn, (_tensors.cairn_dtype(dtype, fqn),
                  [int(s) for s in td.size], []))
        entry[2].append((offsets, sizes, ptr, nbytes))
        results.append((item, nbytes))
    for fqn, (dtype_name, global_shape, chunks) in tensors.items():
        state.add_chunks(fqn, dtype_name, global_shape, chunks)
    mapping = getattr(plan, "planner_data", None)
    if is_coordinator and isinstance(mapping, dict) and mapping:
        state.add_bytes(PLANNER_DATA_FQN, _objects.dumps(
            {str(k): tuple(v) for k, v in mapping.items()}))
    return SaveState(state, keep, results)


def local_save_plan(state_dict: Any, is_coordinator: bool) -> Tuple:
    """DCP's DefaultSavePlanner over `state_dict` and this rank's local plan
    (every item, before the global plan's replica dedup): what stage()
    snapshots into cairn-agent."""
    from torch.distributed.checkpoint import DefaultSavePlanner  # pylint: disable=import-outside-toplevel
    planner = DefaultSavePlanner()
    planner.set_up_planner(state_dict, is_coordinator=is_coordinator)
    return planner.create_local_plan(), planner


def host_copy(state_dict: Any) -> Any:
    """async_save's staging without an agent: the nested state_dict with
    every tensor (a DTensor's local shard included) cloned once into host
    memory, containers rebuilt, other objects shared (DCP pickles them when
    it writes)."""
    if isinstance(state_dict, torch.Tensor):
        return state_dict.detach().clone()
    if isinstance(state_dict, dict):
        items = [(k, host_copy(v)) for k, v in state_dict.items()]
        try:
            return type(state_dict)(items)  # OrderedDict stays one
        except TypeError:
            return dict(items)
    if isinstance(state_dict, list):
        return [host_copy(v) for v in state_dict]
    if isinstance(state_dict, tuple) and not hasattr(state_dict, "_fields"):
        return tuple(host_copy(v) for v in state_dict)
    return state_dict


def _meta_like(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor with `tensor`'s shape, strides and dtype and no data (a
    DTensor keeps its mesh and placements around a meta local shard)."""
    if _state.is_dtensor(tensor):
        local = tensor.to_local()
        return type(tensor).from_local(
            torch.empty_strided(local.shape, local.stride(), dtype=local.dtype,
                                device="meta"),
            tensor.device_mesh, tensor.placements, run_check=False,
            shape=tensor.shape, stride=tensor.stride())
    return torch.empty_strided(tensor.shape, tensor.stride(),
                               dtype=tensor.dtype, device="meta")


def skeleton(state_dict: Any) -> Any:
    """The nested state_dict with every tensor replaced by a data-less meta
    tensor of the same shape, dtype and placement: what DCP plans from once
    the bytes already sit in cairn-agent's staging memory (no copy, and
    nothing of the training tensors for async_save's PROCESS mode to
    pickle)."""
    if isinstance(state_dict, torch.Tensor):
        return _meta_like(state_dict.detach())
    if isinstance(state_dict, dict):
        return {k: skeleton(v) for k, v in state_dict.items()}
    if isinstance(state_dict, list):
        return [skeleton(v) for v in state_dict]
    if isinstance(state_dict, tuple) and not hasattr(state_dict, "_fields"):
        return tuple(skeleton(v) for v in state_dict)
    return state_dict


def item_nbytes(item: Any, byte_sizes: Dict[str, int]) -> int:
    """The bytes a WriteItem of a staged save stands for: its chunk's for a
    tensor, the pickled object's (as staged) for BYTE_IO."""
    td = item.tensor_data
    if td is None:
        return byte_sizes[item.index.fqn]
    numel = 1
    for s in td.chunk.sizes:
        numel *= int(s)
    return numel * torch.empty((), dtype=td.properties.dtype).element_size()


# ------------------------------------------------------------ load

class MissingEntryError(errors.NotFoundError, KeyError):
    """A state_dict key the checkpoint does not hold (a KeyError too, so
    code that looks entries up in Metadata still sees one)."""

    def __str__(self) -> str:
        return errors.NotFoundError.__str__(self)


class Entries(dict):
    """Metadata.state_dict_metadata whose missing keys raise
    MissingEntryError naming the fqn, the job and the step (torch 1.13's
    default planner indexes it for every key of the state_dict)."""

    def __init__(self, job: str, step: Any):
        super().__init__()
        self.job = job
        self.step = step

    def __missing__(self, fqn: str):
        held = sorted(self.keys())
        shown = ", ".join(held[:8]) + (", ..." if len(held) > 8 else "")
        raise MissingEntryError(
            f"checkpoint of job '{self.job}' step {self.step} has no entry "
            f"'{fqn}' (it holds {len(held)}: {shown})")

    def __reduce__(self):
        return (_rebuild_entries, (self.job, self.step, dict(self)))


def _rebuild_entries(job: str, step: Any, items: Dict[str, Any]) -> Entries:
    e = Entries(job, step)
    e.update(items)
    return e


class PlannerData(collections.abc.Mapping):
    """Metadata.planner_data: {fqn: path in the nested state_dict}, read
    from the checkpoint's PLANNER_DATA_FQN entry on first use (most loads
    never look at it), or, for a checkpoint saved without DCP, each fqn's
    dotted parts (how the direct API names nested entries)."""

    def __init__(self, fqns: List[str], fetch: Optional[Any]):
        self._fqns = fqns
        self._fetch = fetch
        self._map: Optional[Dict[str, Tuple]] = None

    def _data(self) -> Dict[str, Tuple]:
        if self._map is None:
            if self._fetch is not None:
                self._map = dict(self._fetch())
            else:
                self._map = {f: tuple(f.split(".")) for f in self._fqns}
        return self._map

    def __getitem__(self, fqn: str) -> Tuple:
        return self._data()[fqn]

    def __iter__(self):
        return iter(self._data())

    def __len__(self) -> int:
        return len(self._data())

    def __reduce__(self):
        return (dict, (dict(self._data()),))


def metadata_from_summary(summary: Any, job: str, step: int,
                          fetch_planner_data: Optional[Any] = None) -> Any:
    """DCP's Metadata of a committed checkpoint: every tensor with its dtype,
    global size and stored chunk boxes; every bytes entry; planner_data
    (fetch_planner_data() reads the stored one when there is one)."""
    md = api().metadata
    entries = Entries(job, step)
    for t in summary.tensors:
        shape = torch.Size(t.shape)
        chunks = [md.ChunkStorageMetadata(offsets=torch.Size(o),
                                          sizes=torch.Size(s))
                  for o, s in t.chunks]
        if not chunks:  # a cairnd that does not list boxes: the whole tensor
            chunks = [md.ChunkStorageMetadata(
                offsets=torch.Size([0] * len(shape)), sizes=shape)]
        entries[t.fqn] = md.TensorStorageMetadata(
            properties=md.TensorProperties(dtype=_tensors.torch_dtype(t.dtype)),
            size=shape, chunks=chunks)
    stored_planner_data = False
    for b in summary.bytes_entries:
        if b.fqn == PLANNER_DATA_FQN:
            stored_planner_data = True
            continue
        entries[b.fqn] = md.BytesStorageMetadata()
    planner_data = PlannerData(
        list(entries), fetch_planner_data if stored_planner_data else None)
    return md.Metadata(state_dict_metadata=entries,
                       planner_data=planner_data,
                       storage_data=PlanTag(job, step, -1))


def read_planner_data(ckpt: Any, step: int) -> Dict[str, Tuple]:
    """The PLANNER_DATA_FQN entry of `step`, loaded through `ckpt` (a
    collective load when the ranks all ask, as DCP's planners do)."""
    state = _cairn.StateDict()
    state.add_bytes(PLANNER_DATA_FQN)
    ckpt.load(state, step)
    return _objects.loads(state.get_bytes(PLANNER_DATA_FQN))


class LoadState:
    """One Cairn state for a LoadPlan, and what to do once it is loaded."""

    def __init__(self):
        self.state = _cairn.StateDict()
        self._keep: List[Any] = []
        self._copies: List[Tuple[Any, Any]] = []   # (target, temporary)
        self._commits: List[Tuple[Any, Any]] = []  # (ReadItem, target)
        self._bytes: List[Any] = []                # BYTE_IO ReadItems

    def finish(self, planner: Any, weights_only: bool = True) -> None:
        """Copies temporaries into their targets, commits every tensor and
        hands every bytes entry to the planner."""
        for target, tmp in self._copies:
            target.copy_(tmp)
        for item, target in self._commits:
            planner.commit_tensor(item, target)
        for item in self._bytes:
            # An entry the direct API pickled is re-serialised the way DCP's
            # planner reads it (torch.load).
            fqn = item.storage_index.fqn
            try:
                data = _objects.as_torch_save(self.state.get_bytes(fqn),
                                              weights_only)
            except _objects.UnsafeObjectError as e:
                raise errors.InvalidArgumentError(f"entry '{fqn}': {e}") from None
            planner.load_bytes(item, io.BytesIO(data))
        self._keep.clear()
        self._copies.clear()


def build_load_state(plan: Any, planner: Any, metadata: Any, job: str,
                     step: Any, rank: int) -> LoadState:
    """Each tensor ReadItem becomes a chunk with its global box (stored
    chunk's offsets + storage_offsets, lengths) backed by the planner's
    target (zero copy when contiguous CPU memory, else a temporary)."""
    byte_io = api().planner.LoadItemType.BYTE_IO
    load = LoadState()
    tensors: Dict[str, Tuple[str, List[int], List[Tuple]]] = {}
    seen_bytes = set()
    for item in plan.items:
        fqn = item.storage_index.fqn
        if item.type == byte_io:
            if fqn not in seen_bytes:
                load.state.add_bytes(fqn)
                seen_bytes.add(fqn)
            load._bytes.append(item)  # pylint: disable=protected-access
            continue
        stored = metadata.state_dict_metadata.get(fqn) if metadata else None
        if stored is None or not hasattr(stored, "size"):
            raise errors.NotFoundError(
                f"load of {_where(job, step, rank)}: the checkpoint has no "
                f"tensor '{fqn}'")
        target = planner.resolve_tensor(item).detach()
        _tensors.check_cpu(target, fqn, "loaded")
        lengths = [int(n) for n in item.lengths]
        if list(target.shape) != lengths:
            raise errors.InvalidArgumentError(
                f"load of {_where(job, step, rank)}: tensor '{fqn}': the "
                f"planner's target has shape {list(target.shape)}, the read "
                f"item {lengths}")
        base = item.storage_index.offset
        base = [0] * len(lengths) if base is None else [int(o) for o in base]
        offsets = [b + int(o) for b, o in zip(base, item.storage_offsets)]
        load._commits.append((item, target))  # pylint: disable=protected-access
        if target.numel() == 0:
            continue
        buf = target
        if not target.is_contiguous():
            buf = torch.empty(lengths, dtype=target.dtype)
            load._copies.append((target, buf))  # pylint: disable=protected-access
        load._keep.append(buf)  # pylint: disable=protected-access
        ptr, nbytes = _tensors.buffer_of(buf, fqn)
        entry = tensors.setdefault(
            fqn, (_tensors.cairn_dtype(target.dtype, fqn),
                  [int(s) for s in stored.size], []))
        entry[2].append((offsets, lengths, ptr, nbytes))
    for fqn, (dtype_name, global_shape, chunks) in tensors.items():
        load.state.add_chunks(fqn, dtype_name, global_shape, chunks)
    return load
