"""cairn.torch.import_dcp: a PyTorch DCP directory checkpoint saved into Cairn.

A checkpoint written by ``dcp.save(..., storage_writer=FileSystemWriter(DIR))``
is DIR/.metadata (DCP's Metadata, pickled: every tensor's dtype, global size
and chunk boxes, every bytes entry, and where each item lies) and the
__R_N.distcp files the ranks wrote, each a run of items: a tensor chunk is a
``torch.save`` archive (a zip) of that chunk, a bytes entry the raw bytes of
the object DCP's planner serialised (``torch.save`` output). Two variants of
it import too:

- ``dcp.save(..., use_collectives=False)``: no .metadata; each rank R wrote
  __R.metadata listing only its own items (replicated tensors and objects
  once per rank). torch's reader hands rank R its own file back, so torch
  loads it only into the ranks that saved it; import_dcp merges the files
  into the Metadata a collective save would have written (see
  _merge_rank_metadata), after which it is imported like any other.
- ``FileSystemWriter(..., serialization_format=SerializationFormat.
  SAFETENSORS)``: each __R_N.distcp holds its bytes entries, then one
  safetensors blob of its tensor chunks (see _locate_safetensors). torch's
  FileSystemReader cannot read it back (it torch.loads every chunk);
  import_dcp maps the chunks from the blob.

import_dcp reads it from one process (no process group) and saves it with
one Cairn save as rank 0 of 1: each tensor becomes one logical Cairn tensor
holding every rank's chunks at their boxes, so it loads afterwards into any
world size and layout (CairnStorageReader, cairn.Checkpointer).

How, in order (nothing is sent to cairnd before every item was found):

1. The arguments, then cairnd: a step already committed is refused before
   any file is read.
2. .metadata (or every __R.metadata) is unpickled weights-only: DCP's own
   metadata classes, torch's dtypes and sizes and plain data; anything else
   is refused naming it (``weights_only=False`` unpickles it as torch's
   FileSystemReader does). Per-rank files are merged, checked for agreement
   and for covering every tensor.
3. Every item is checked against its file: a missing file, or one shorter
   than the items the metadata places in it, is DataLossError naming the
   file, the fqn and the sizes.
4. Tensor chunks are located inside their archives (zipfile's view of the
   item, and the tensor's dtype, shape and strides from ``torch.load`` onto
   the meta device, which reads no data). A contiguous chunk stored
   uncompressed, little-endian, is *mapped*: the file is mmapped read-only
   and the Cairn save reads the chunk's bytes from the mapping, so it costs
   page cache, not process memory, whatever the checkpoint's size. With
   ``verify`` (the default) each mapped chunk's CRC-32, which torch.save
   records in the archive, is checked first (DataLossError naming file and
   fqn on a mismatch): one more read of the data. A chunk in a safetensors
   blob is mapped the same way once the blob's header agrees with the
   metadata (safetensors records no checksum to verify). Any other item (DCP's
   stream transforms, a non-contiguous chunk, a big-endian archive) is read
   into memory by torch's FileSystemReader: only those need memory.
5. Bytes entries are kept byte for byte (DCP's torch.save form, which both
   Cairn APIs load). With weights_only (the default) each is loaded once,
   weights-only, first: an object a later weights-only load would refuse
   fails the import now, naming the fqn and the class.
6. One save: tensors, bytes entries and DCP's planner_data (as the hidden
   entry cairn.torch's writer keeps, so ``_load_state_dict_from_keys``
   rebuilds the nesting). It commits atomically, or nothing is committed.
"""

import argparse
import ctypes
import dataclasses
import enum
import io
import json
import os
import pathlib
import pickle
import re
import struct
import sys
import zipfile
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from cairn import _cairn
from cairn import _dcp
from cairn import _objects
from cairn import _tensors
from cairn import errors

_METADATA = ".metadata"
_JOB = re.compile(r"[A-Za-z0-9._-]{1,128}")
_MAX_STEP = 10**15  # as libcairn checks it
_DATA_RECORD = re.compile(r"^[^/]+/data/[^/]+$")  # archive/data/<key>
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature .. name, extra lengths


@dataclasses.dataclass
class ImportResult:
    """What import_dcp did. `info` is cairnd's record of the committed
    checkpoint; `mapped_bytes` were saved straight from the mmapped files,
    `read_bytes` read into memory first (items stored with DCP's stream
    transforms, non-contiguous chunks)."""
    info: Any                   # _cairn.CheckpointInfo, state COMMITTED
    tensors: int = 0
    chunks: int = 0             # holding elements (empty shards hold none)
    bytes_entries: int = 0
    mapped_bytes: int = 0
    read_bytes: int = 0


# ------------------------------------------------------------ metadata

_DCP_MODULE = "torch.distributed.checkpoint"
_PLAIN_GLOBALS = {("collections", "OrderedDict"), ("pathlib", "PosixPath"),
                  ("pathlib", "PurePosixPath"), ("builtins", "set"),
                  ("builtins", "frozenset")}


def _is_dcp_class(obj: Any) -> bool:
    return (isinstance(obj, type)
            and (obj.__module__ == _DCP_MODULE
                 or obj.__module__.startswith(_DCP_MODULE + "."))
            and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)))


def _enum_member(cls: Any, name: Any) -> Any:
    """What the metadata's getattr calls may do: name a member of one of
    DCP's enums (how Python pickles an Enum member)."""
    if _is_dcp_class(cls) and issubclass(cls, enum.Enum) and isinstance(
            name, str) and name in cls.__members__:
        return cls[name]
    raise _objects.UnsafeObjectError(
        f"it calls getattr({getattr(cls, '__name__', cls)!r}, {name!r}), "
        f"which is not an enum member of DCP's metadata")


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's Metadata and nothing else: its dataclasses and enums
    (torch.distributed.checkpoint.*), what torch's weights-only unpickler
    allows (dtypes, torch.Size, layouts) and plain data."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self._torch_allowed = _objects._torch_safe_globals(torch)  # pylint: disable=protected-access

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == _DCP_MODULE or module.startswith(_DCP_MODULE + "."):
            obj = super().find_class(module, name)
            if _is_dcp_class(obj):
                return obj
        if (module, name) in _PLAIN_GLOBALS:
            return super().find_class(module, name)
        allowed = self._torch_allowed.get((module, name))
        if allowed is not None:
            return allowed
        raise _objects.UnsafeObjectError(
            f"it holds a {module}.{name}, which is not part of DCP's metadata")


def _read_metadata(path: pathlib.Path, weights_only: bool,
                   rank: Optional[int] = None) -> Any:
    """DCP's Metadata in `path`: .metadata, or (`rank` given) the
    __R.metadata one rank of a use_collectives=False save wrote."""
    md_cls = _dcp.api().metadata.Metadata
    what = ("" if rank is None else
            f" (rank {rank}'s metadata, saved with use_collectives=False)")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise errors.DataLossError(
            f"import_dcp: {path}{what} cannot be read: {e.strerror}") from None
    try:
        if weights_only:
            md = _MetadataUnpickler(data).load()
        else:
            md = pickle.loads(data)
    except _objects.UnsafeObjectError as e:
        raise errors.InvalidArgumentError(
            f"import_dcp: {path}: {e}: not loaded weights-only (pass "
            f"weights_only=False if you trust this checkpoint)") from None
    except Exception as e:  # pylint: disable=broad-except
        if rank is not None:
            # One of several ranks' files: the checkpoint is DCP's, this
            # piece of it is damaged.
            raise errors.DataLossError(
                f"import_dcp: {path}{what} is truncated or damaged: it does "
                f"not unpickle ({type(e).__name__}: {e})") from None
        raise errors.InvalidArgumentError(
            f"import_dcp: {path} is not a DCP checkpoint's metadata (it does "
            f"not unpickle: {type(e).__name__}: {e})") from None
    if (not isinstance(md, md_cls)
            or not isinstance(getattr(md, "state_dict_metadata", None), dict)
            or not isinstance(getattr(md, "storage_data", None), dict)):
        raise errors.InvalidArgumentError(
            f"import_dcp: {path}{what} is not a DCP checkpoint's metadata (it "
            f"holds a {type(md).__name__}, not the state_dict_metadata and "
            f"storage_data of a FileSystemWriter checkpoint)")
    return md


# ------------------------------------------------------------ rank metadata

_RANK_METADATA = re.compile(r"__(0|[1-9][0-9]*)\.metadata")
_RANK_DATA = re.compile(r"__(0|[1-9][0-9]*)_[0-9]+\.distcp")


def _rank_files(root: pathlib.Path) -> Tuple[Dict[int, str],
                                              Dict[int, List[str]]]:
    """({rank: __R.metadata}, {rank: its __R_N.distcp files}) in root."""
    metadata: Dict[int, str] = {}
    data: Dict[int, List[str]] = {}
    for name in os.listdir(root):
        m = _RANK_METADATA.fullmatch(name)
        if m:
            metadata[int(m.group(1))] = name
            continue
        m = _RANK_DATA.fullmatch(name)
        if m:
            data.setdefault(int(m.group(1)), []).append(name)
    return metadata, data


def _box_text(box: Tuple[Tuple[int, ...], Tuple[int, ...]]) -> str:
    return f"offsets {list(box[0])} sizes {list(box[1])}"


def _volume(sizes: Sequence[int]) -> int:
    n = 1
    for s in sizes:
        n *= int(s)
    return n


def _first_overlap(chunks: List[Tuple[Any, int]]) -> Optional[Tuple[Any,
                                                                     Any]]:
    """Two of `chunks` ((offsets, sizes), rank), none empty, whose boxes
    intersect, or None. A sweep along the dimension the chunks' offsets
    vary most in: near-linear for the shardings DCP writes."""
    if len(chunks) < 2:
        return None
    ndim = len(chunks[0][0][0])
    if ndim == 0:
        return chunks[0], chunks[1]
    dim = max(range(ndim), key=lambda d: len({c[0][0][d] for c in chunks}))
    active: List[Tuple[Any, int]] = []
    for c in sorted(chunks, key=lambda c: c[0][0][dim]):
        (offsets, sizes), _ = c
        active = [a for a in active
                  if a[0][0][dim] + a[0][1][dim] > offsets[dim]]
        for a in active:
            if all(a[0][0][d] < offsets[d] + sizes[d]
                   and offsets[d] < a[0][0][d] + a[0][1][d]
                   for d in range(ndim)):
                return a, c
        active.append(c)
    return None


def _merge_rank_metadata(root: pathlib.Path, files: "_Files",
                         weights_only: bool) -> Any:
    """One Metadata from the __R.metadata files of a use_collectives=False
    save. Each rank's file lists only what that rank saved (torch's reader
    gives rank R its own file back, so torch loads such a checkpoint only
    into the ranks and layout that saved it); their union is what a
    collective save's .metadata would have held. Per fqn: the global shape
    and dtype every rank lists must agree; a chunk several ranks list at
    the same box (a replicated tensor, saved once per rank) is kept once,
    from the lowest rank, as DCP's deduplication keeps one; a bytes entry
    several ranks saved must hold the same bytes in each. The chunks must
    then tile the tensor: ranks 0 to N-1 all present, and their chunks
    neither overlapping nor leaving elements out (what a missing rank's
    metadata leaves)."""
    api = _dcp.api().metadata
    names, data_files = _rank_files(root)
    world = max(max(names), max(data_files, default=-1)) + 1
    for r in range(world):
        if r in names:
            continue
        held = ", ".join(str(k) for k in sorted(names))
        orphans = sorted(data_files.get(r, []))
        tail = (f", and {', '.join(orphans)}, which only rank {r}'s metadata "
                f"places items in" if orphans else "")
        raise errors.DataLossError(
            f"import_dcp: {root / f'__{r}.metadata'} is missing: the "
            f"checkpoint holds the per-rank metadata of ranks {held} (saved "
            f"with use_collectives=False){tail}")

    entries: Dict[str, Any] = {}
    first: Dict[str, Tuple[int, str, Any]] = {}   # fqn: (rank, file, info)
    boxes: Dict[str, Dict[Any, int]] = {}          # fqn: {box: rank}
    storage: Dict[Any, Any] = {}
    repeated_bytes: List[Tuple[str, int, Any]] = []
    planner_data: Dict[str, Any] = {}

    def described(entry: Any) -> str:
        if isinstance(entry, api.TensorStorageMetadata):
            dtype = str(entry.properties.dtype).rsplit(".", 1)[-1]
            return f"{dtype} {[int(s) for s in entry.size]}"
        return "a bytes entry"

    for r in range(world):
        name = names[r]
        md = _read_metadata(root / name, weights_only, rank=r)
        for fqn, entry in md.state_dict_metadata.items():
            if fqn == _dcp.PLANNER_DATA_FQN:
                continue
            prev = entries.get(fqn)
            is_tensor = isinstance(entry, api.TensorStorageMetadata)
            if not is_tensor and not isinstance(entry,
                                                api.BytesStorageMetadata):
                raise errors.InvalidArgumentError(
                    f"import_dcp: {root / name}: entry '{fqn}' is a "
                    f"{type(entry).__name__}, neither a tensor nor bytes")
            if prev is not None and (
                    is_tensor != isinstance(prev, api.TensorStorageMetadata)
                    or (is_tensor and (
                        prev.properties.dtype != entry.properties.dtype
                        or list(prev.size) != list(entry.size)))):
                kind = "tensor" if is_tensor else "bytes entry"
                raise errors.InvalidArgumentError(
                    f"import_dcp: {root}: {kind} '{fqn}' is "
                    f"{described(prev)} in {first[fqn][1]} but "
                    f"{described(entry)} in {name}: the ranks' metadata "
                    f"disagree")
            if not is_tensor:
                index = api.MetadataIndex(fqn)
                info = md.storage_data.get(index)
                if info is None:
                    raise errors.DataLossError(
                        f"import_dcp: {root / name} lists bytes entry "
                        f"'{fqn}' but no file holding it")
                if prev is None:
                    entries[fqn] = entry
                    first[fqn] = (r, name, info)
                    storage[index] = info
                else:
                    repeated_bytes.append((fqn, r, info))
                continue
            if prev is None:
                prev = api.TensorStorageMetadata(
                    properties=entry.properties, size=entry.size, chunks=[])
                entries[fqn] = prev
                first[fqn] = (r, name, None)
                boxes[fqn] = {}
            keys = {api.MetadataIndex(fqn, c.offsets) for c in prev.chunks}
            for i, c in enumerate(entry.chunks):
                box = (tuple(int(o) for o in c.offsets),
                       tuple(int(s) for s in c.sizes))
                info = md.storage_data.get(api.MetadataIndex(fqn, c.offsets,
                                                             i))
                what = f"'{fqn}' chunk at {_box_text(box)}"
                if info is None:
                    raise errors.DataLossError(
                        f"import_dcp: {root / name} lists {what} but no file "
                        f"holding it")
                key = api.MetadataIndex(fqn, c.offsets, len(prev.chunks))
                empty = _volume(box[1]) == 0
                if key in keys and not empty and box not in boxes[fqn]:
                    # An empty shard kept at these offsets holds nothing:
                    # this chunk replaces it (a nonempty one there is an
                    # overlap, found below).
                    gone = [b for b in boxes[fqn] if b[0] == box[0]
                            and _volume(b[1]) == 0]
                    for b in gone:
                        del boxes[fqn][b]
                    prev.chunks = [k for k in prev.chunks if not (
                        tuple(int(o) for o in k.offsets) == box[0]
                        and _volume(k.sizes) == 0)]
                if box in boxes[fqn] or (empty and key in keys):
                    # Another rank's copy (or an empty shard at a kept
                    # chunk's offsets, holding nothing): not read, but
                    # there and as long as the metadata says.
                    files.check(info.relative_path, info.offset, info.length,
                                what)
                    continue
                boxes[fqn][box] = r
                keys.add(key)
                prev.chunks.append(api.ChunkStorageMetadata(
                    offsets=c.offsets, sizes=c.sizes))
                storage[key] = info
        mapping = getattr(md, "planner_data", None)
        if isinstance(mapping, dict):
            for k, v in mapping.items():
                planner_data.setdefault(k, v)

    for fqn, entry in entries.items():
        if not isinstance(entry, api.TensorStorageMetadata):
            continue
        held = [(box, r) for box, r in boxes[fqn].items()
                if _volume(box[1]) > 0]
        pair = _first_overlap(held)
        if pair is not None:
            (a, ra), (b, rb) = pair
            raise errors.InvalidArgumentError(
                f"import_dcp: {root}: tensor '{fqn}': rank {ra}'s chunk at "
                f"{_box_text(a)} ({names[ra]}) and rank {rb}'s at "
                f"{_box_text(b)} ({names[rb]}) overlap")
        numel = _volume(entry.size)
        elements = sum(_volume(box[1]) for box, _ in held)
        if elements != numel:
            ranks = ("rank 0 (__0.metadata)" if world == 1 else
                     f"ranks 0 to {world - 1} (__0.metadata to "
                     f"__{world - 1}.metadata)")
            raise errors.DataLossError(
                f"import_dcp: {root}: tensor '{fqn}' of global shape "
                f"{[int(s) for s in entry.size]}: the chunks in the metadata "
                f"of {ranks} hold {elements} of its {numel} elements: the "
                f"metadata of a rank is missing (with the shards it lists), "
                f"or a rank did not save")

    # An object every rank saved: one value, so the same bytes in each.
    kept: Dict[str, bytes] = {}
    for fqn, r, info in repeated_bytes:
        r0, _, info0 = first[fqn]
        if fqn not in kept:
            kept[fqn] = _read_item(files, info0, f"bytes entry '{fqn}'")
        if _read_item(files, info, f"bytes entry '{fqn}'") != kept[fqn]:
            raise errors.InvalidArgumentError(
                f"import_dcp: {root}: bytes entry '{fqn}' holds other bytes "
                f"in {info.relative_path} (rank {r}'s) than in "
                f"{info0.relative_path} (rank {r0}'s): a merged checkpoint "
                f"holds one value per fqn")

    return api.Metadata(state_dict_metadata=entries,
                        planner_data=planner_data, storage_data=storage)


# Hugging Face safetensors directories: torch's HuggingFaceStorageWriter
# (DCP's own HF format: no .metadata; one model*.safetensors per file index,
# and model.safetensors.index.json mapping fqns to files, or with
# save_distributed one shard file per rank whose header's DCP_SHARDING_INFO
# gives each chunk's saved_offsets), and any safetensors model directory.
_HF_INDEX = "model.safetensors.index.json"
_SAFETENSORS_SUFFIX = ".safetensors"


def _safetensors_files(root: pathlib.Path) -> List[str]:
    return sorted(n for n in os.listdir(root)
                  if n.endswith(_SAFETENSORS_SUFFIX) and (root / n).is_file())


def _safetensors_metadata(root: pathlib.Path, files: "_Files") -> Any:
    """DCP Metadata of a directory of safetensors files, as torch's
    HuggingFaceStorageReader derives it: each tensor entry of each file is
    one chunk, at the saved_offsets its DCP_SHARDING_INFO gives (else at
    the origin); a tensor's global shape is its chunks' extent, and they must
    tile it, neither overlapping nor leaving elements out. With
    model.safetensors.index.json, every file it names must be there and
    hold the tensors it maps to it."""
    api = _dcp.api().metadata
    from torch.distributed.checkpoint.filesystem import _StorageInfo  # pylint: disable=import-outside-toplevel
    names = _safetensors_files(root)
    chunks: Dict[str, List[Tuple[List[int], List[int], str]]] = {}
    dtypes: Dict[str, Tuple[Any, str]] = {}
    for name in names:
        fd = files.check(name, 0, 0, "a safetensors file")
        blob = _safetensors_blob(files, name, fd, 0, "its tensors")
        if blob is None:
            raise errors.DataLossError(
                f"import_dcp: {root / name} is not a safetensors file: it does "
                f"not begin with a safetensors header")
        for fqn, entry in blob.tensors.items():
            dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
            if dtype is None:
                raise errors.InvalidArgumentError(
                    f"import_dcp: {root / name}: tensor '{fqn}' has dtype "
                    f"{entry['dtype']}, which Cairn cannot store")
            if fqn in dtypes and dtypes[fqn][0] != dtype:
                raise errors.InvalidArgumentError(
                    f"import_dcp: {root}: tensor '{fqn}' is {dtype} in {name} "
                    f"and {dtypes[fqn][0]} in {dtypes[fqn][1]}")
            dtypes.setdefault(fqn, (dtype, name))
            sizes = [int(n) for n in entry["shape"]]
            saved = blob.saved_offsets.get(fqn)
            offsets = [0] * len(sizes) if saved is None else list(saved)
            if (len(offsets) != len(sizes) or not all(
                    isinstance(o, int) and o >= 0 for o in offsets)):
                raise errors.DataLossError(
                    f"import_dcp: {root / name}: tensor '{fqn}' of shape "
                    f"{sizes} has saved_offsets {offsets} in its "
                    f"DCP_SHARDING_INFO")
            chunks.setdefault(fqn, []).append((offsets, sizes, name))
    index_path = root / _HF_INDEX
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError) as e:
            raise errors.DataLossError(
                f"import_dcp: {index_path} is damaged: not JSON with a "
                f"weight_map object ({type(e).__name__})") from None
        for fqn, name in sorted(weight_map.items()):
            if not (root / str(name)).is_file():
                raise errors.DataLossError(
                    f"import_dcp: {root / str(name)} is missing: {_HF_INDEX} "
                    f"maps tensor '{fqn}' to it")
            if not any(c[2] == name for c in chunks.get(fqn, [])):
                raise errors.DataLossError(
                    f"import_dcp: {root / str(name)} does not hold tensor "
                    f"'{fqn}', which {_HF_INDEX} maps to it")
    entries: Dict[str, Any] = {}
    storage: Dict[Any, Any] = {}
    for fqn, held in chunks.items():
        ndim = len(held[0][1])
        if any(len(c[1]) != ndim for c in held):
            raise errors.InvalidArgumentError(
                f"import_dcp: {root}: tensor '{fqn}' has chunks of "
                f"{sorted({len(c[1]) for c in held})} dimensions")
        size = [max(c[0][d] + c[1][d] for c in held) for d in range(ndim)]
        boxed = [((tuple(c[0]), tuple(c[1])), i) for i, c in enumerate(held)
                 if _volume(c[1]) > 0]
        pair = _first_overlap(boxed)
        if pair is not None:
            (a, ia), (b, ib) = pair
            raise errors.InvalidArgumentError(
                f"import_dcp: {root}: tensor '{fqn}': the chunk at "
                f"{_box_text(a)} ({held[ia][2]}) and the one at "
                f"{_box_text(b)} ({held[ib][2]}) overlap")
        elements = sum(_volume(c[1]) for c in held)
        if elements != _volume(size):
            raise errors.DataLossError(
                f"import_dcp: {root}: tensor '{fqn}' of shape {size}: its "
                f"chunks in {', '.join(sorted({c[2] for c in held}))} hold "
                f"{elements} of its {_volume(size)} elements: a shard file "
                f"is missing")
        md_chunks = []
        for i, (offsets, sizes, name) in enumerate(held):
            md_chunks.append(api.ChunkStorageMetadata(
                offsets=torch.Size(offsets), sizes=torch.Size(sizes)))
            storage[api.MetadataIndex(fqn, offsets, i)] = _StorageInfo(
                relative_path=name, offset=0, length=0)
        entries[fqn] = api.TensorStorageMetadata(
            properties=api.TensorProperties(dtype=dtypes[fqn][0]),
            size=torch.Size(size), chunks=md_chunks)
    return api.Metadata(state_dict_metadata=entries, storage_data=storage)


def _read_item(files: "_Files", info: Any, what: str) -> bytes:
    fd = files.check(info.relative_path, info.offset, info.length, what)
    return os.pread(fd, info.length, info.offset)


# ------------------------------------------------------------ files

class _FileView(io.RawIOBase):
    """Bytes [offset, offset + length) of an open file, as a seekable file
    of their own (what zipfile and torch.load read an item through)."""

    def __init__(self, fd: int, offset: int, length: int):
        super().__init__()
        self._fd, self._offset, self._length, self._pos = (fd, offset,
                                                           length, 0)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos,
                io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self._length - self._pos)
        if n <= 0:
            return 0
        data = os.pread(self._fd, n, self._offset + self._pos)
        buf[:len(data)] = data
        self._pos += len(data)
        return len(data)


class _Files:
    """The checkpoint's .distcp files: opened once, sizes known, and mapped
    (read-only, private, lazily paged) when a chunk is read from one."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self._fds: Dict[str, int] = {}
        self._sizes: Dict[str, int] = {}
        self._maps: Dict[str, Any] = {}
        # (file, offset): the safetensors blob there, None if none is.
        self.blobs: Dict[Tuple[str, int], Optional["_Blob"]] = {}

    def path(self, relative: str) -> pathlib.Path:
        return self.root / relative

    def check(self, relative: str, offset: int, length: int,
              what: str) -> int:
        """The fd of `relative`, once [offset, offset + length) is known to
        lie in it (DataLossError naming the file and `what` otherwise)."""
        fd = self._fds.get(relative)
        path = self.path(relative)
        if fd is None:
            if (os.path.isabs(relative) or ".." in pathlib.PurePath(
                    relative).parts):
                raise errors.InvalidArgumentError(
                    f"import_dcp: {self.root}: the metadata places {what} in "
                    f"{relative!r}, outside the checkpoint directory")
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise errors.DataLossError(
                    f"import_dcp: {path} is missing: the metadata places "
                    f"{what} in it") from None
            except OSError as e:
                raise errors.DataLossError(
                    f"import_dcp: {path} (holding {what}) cannot be opened: "
                    f"{e.strerror}") from None
            self._fds[relative] = fd
            self._sizes[relative] = os.fstat(fd).st_size
        size = self._sizes[relative]
        if offset < 0 or length < 0 or offset + length > size:
            raise errors.DataLossError(
                f"import_dcp: {path} is truncated: it has {size} bytes, the "
                f"metadata places {what} at bytes [{offset}, "
                f"{offset + length})")
        return fd

    def size(self, relative: str) -> int:
        """The size of `relative`, once check() opened it."""
        return self._sizes[relative]

    def address(self, relative: str, offset: int) -> int:
        """The address of byte `offset` of `relative` in its mapping."""
        storage = self._maps.get(relative)
        if storage is None:
            storage = torch.UntypedStorage.from_file(
                str(self.path(relative)), False, self._sizes[relative])
            self._maps[relative] = storage
        return storage.data_ptr() + offset

    def close(self) -> None:
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _memory_at(address: int, nbytes: int) -> Any:
    """A buffer over `nbytes` at `address` (no copy), for zlib.crc32."""
    return (ctypes.c_char * nbytes).from_address(address)


# ------------------------------------------------------------ safetensors

# FileSystemWriter(serialization_format=SerializationFormat.SAFETENSORS)
# writes each __R_N.distcp as its bytes entries (as above), then one
# safetensors blob of the file's tensor chunks keyed by fqn: an 8-byte
# little-endian header length, a JSON header ({fqn: {dtype, shape,
# data_offsets}}, and "__metadata__" whose DCP_SHARDING_INFO gives each
# chunk's saved_offsets), then the data, row-major, little-endian. Its
# .metadata (or __R.metadata) places every chunk of the file at the blob's
# first byte, with the chunk's size as length: the header says where the
# bytes are. safetensors records no checksum.
_SAFETENSORS_DTYPES = {
    name: getattr(torch, dtype) for name, dtype in (
        ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"),
        ("I16", "int16"), ("U16", "uint16"), ("I32", "int32"),
        ("U32", "uint32"), ("I64", "int64"), ("U64", "uint64"),
        ("F16", "float16"), ("BF16", "bfloat16"), ("F32", "float32"),
        ("F64", "float64"), ("F8_E4M3", "float8_e4m3fn"),
        ("F8_E5M2", "float8_e5m2"), ("C64", "complex64"),
        ("C128", "complex128")) if hasattr(torch, dtype)}
_SAFETENSORS_MAX_HEADER = 100 * 1000 * 1000  # safetensors' own bound


@dataclasses.dataclass
class _Blob:
    data_start: int                 # file offset of the data section
    tensors: Dict[str, Any]         # the header's entries
    saved_offsets: Dict[str, Any]   # DCP_SHARDING_INFO, where written


def _safetensors_blob(files: "_Files", relative: str, fd: int, offset: int,
                      what: str) -> Optional[_Blob]:
    """The safetensors blob at `offset` of `relative`, None when the bytes
    there are no safetensors header; DataLossError naming the file and
    `what` for one cut short or damaged."""
    key = (relative, offset)
    if key in files.blobs:
        return files.blobs[key]
    path = files.path(relative)
    size = files.size(relative)
    head = os.pread(fd, 9, offset)
    blob = None
    if len(head) == 9 and head[8:9] == b"{":
        n = int.from_bytes(head[:8], "little")
        if 2 <= n <= _SAFETENSORS_MAX_HEADER:
            blob = _parse_safetensors(path, fd, offset, n, size, what)
    files.blobs[key] = blob
    return blob


def _parse_safetensors(path: pathlib.Path, fd: int, offset: int, n: int,
                       size: int, what: str) -> _Blob:
    if offset + 8 + n > size:
        raise errors.DataLossError(
            f"import_dcp: {path} is truncated: it has {size} bytes, the "
            f"safetensors header holding {what} runs to byte "
            f"{offset + 8 + n}")

    def damaged(why: str) -> errors.DataLossError:
        return errors.DataLossError(
            f"import_dcp: {path}: the safetensors header at bytes "
            f"[{offset}, {offset + 8 + n}) holding {what} {why}")

    try:
        header = json.loads(os.pread(fd, n, offset + 8))
    except ValueError as e:
        raise damaged(f"is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise damaged(f"is a JSON {type(header).__name__}, not an object")
    extra = header.pop("__metadata__", None) or {}
    saved: Dict[str, Any] = {}
    try:
        info = extra.get("DCP_SHARDING_INFO") if isinstance(extra,
                                                            dict) else None
        if info is not None:
            saved = {k: v.get("saved_offsets")
                     for k, v in json.loads(info).items()}
    except (ValueError, AttributeError, TypeError):
        raise damaged("has a DCP_SHARDING_INFO that is not a JSON object "
                      "of saved_offsets") from None
    for fqn, entry in header.items():
        ok = (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
              and isinstance(entry.get("shape"), list)
              and all(isinstance(d, int) and d >= 0 for d in entry["shape"])
              and isinstance(entry.get("data_offsets"), list)
              and len(entry["data_offsets"]) == 2
              and all(isinstance(d, int) for d in entry["data_offsets"])
              and 0 <= entry["data_offsets"][0] <= entry["data_offsets"][1])
        if not ok:
            raise damaged(f"has a malformed entry for '{fqn}'")
    return _Blob(offset + 8 + n, header, saved)


def _locate_safetensors(files: "_Files", chunk: "_Chunk", fd: int,
                        blob: _Blob) -> bool:
    """Points `chunk` at its bytes in `blob` (mapped, or read when the file
    cannot be mapped): the header's entry must be the chunk the metadata
    places there."""
    info = chunk.info
    path = files.path(info.relative_path)
    entry = blob.tensors.get(chunk.fqn)
    begin = end = blob.data_start
    if entry is not None:
        begin += entry["data_offsets"][0]
        end += entry["data_offsets"][1]

    def damaged(why: str) -> errors.DataLossError:
        return errors.DataLossError(
            f"import_dcp: {path}: {_what(chunk)} at bytes [{begin}, {end}) "
            f"{why}")

    if entry is None:
        raise damaged(f"is not in the safetensors blob at byte {info.offset} "
                      f"the metadata places it in")
    saved = blob.saved_offsets.get(chunk.fqn)
    if saved is not None and list(saved) != chunk.offsets:
        raise damaged(f"is not the chunk the metadata places there: its "
                      f"safetensors header says it was saved at offsets "
                      f"{list(saved)}")
    dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
    if dtype != chunk.dtype or entry["shape"] != chunk.sizes:
        raise damaged(f"holds a {dtype or entry['dtype']} tensor of shape "
                      f"{entry['shape']}, the metadata says {chunk.dtype} "
                      f"{chunk.sizes}")
    chunk.nbytes = _volume(chunk.sizes) * torch.empty(
        0, dtype=chunk.dtype).element_size()
    if end - begin != chunk.nbytes:
        raise damaged(f"has {end - begin} bytes in its safetensors blob; a "
                      f"{chunk.dtype} tensor of shape {chunk.sizes} has "
                      f"{chunk.nbytes}")
    if chunk.nbytes == 0:
        return True
    size = files.size(info.relative_path)
    if end > size:
        raise errors.DataLossError(
            f"import_dcp: {path} is truncated: it has {size} bytes, its "
            f"safetensors header places {_what(chunk)} at bytes [{begin}, "
            f"{end})")
    if sys.byteorder != "little":
        raise errors.InvalidArgumentError(
            f"import_dcp: {path}: {_what(chunk)}: safetensors data is "
            f"little-endian, this machine is not")
    try:
        chunk.ptr = files.address(info.relative_path, begin)
    except (RuntimeError, OSError):
        # A filesystem that cannot be mapped: read it instead.
        chunk.keep = torch.empty(chunk.nbytes, dtype=torch.uint8)
        with _FileView(fd, begin, chunk.nbytes) as view:
            if view.readinto(memoryview(chunk.keep.numpy())) != chunk.nbytes:
                raise damaged("cannot be read whole") from None
        chunk.ptr = chunk.keep.data_ptr()
    return True


# ------------------------------------------------------------ items

@dataclasses.dataclass
class _Chunk:
    fqn: str
    offsets: List[int]
    sizes: List[int]
    dtype: Any                      # torch.dtype
    storage_index: Any              # MetadataIndex
    info: Any                       # _StorageInfo
    ptr: int = 0
    nbytes: int = 0
    keep: Optional[torch.Tensor] = None   # the memory of a chunk read


def _what(chunk: _Chunk) -> str:
    return f"'{chunk.fqn}' chunk at offsets {chunk.offsets} sizes {chunk.sizes}"


def _locate(files: _Files, chunk: _Chunk, verify: bool) -> bool:
    """Points `chunk` at its bytes in the mapped file and returns True, or
    returns False when it has to be read by torch (see the module doc)."""
    info = chunk.info
    if getattr(info, "transform_descriptors", None):
        return False
    fd = files.check(info.relative_path, info.offset, info.length,
                     _what(chunk))
    path = files.path(info.relative_path)
    zip_magic = os.pread(fd, 4, info.offset) == b"PK\x03\x04"
    if not zip_magic:
        blob = _safetensors_blob(files, info.relative_path, fd, info.offset,
                                 _what(chunk))
        if blob is not None:
            return _locate_safetensors(files, chunk, fd, blob)

    def damaged(why: str) -> errors.DataLossError:
        return errors.DataLossError(
            f"import_dcp: {path}: {_what(chunk)} at bytes [{info.offset}, "
            f"{info.offset + info.length}) {why}")

    try:
        archive = zipfile.ZipFile(_FileView(fd, info.offset, info.length))
        records = [r for r in archive.infolist()
                   if _DATA_RECORD.match(r.filename)]
        byteorder = next((archive.read(r).strip() for r in archive.infolist()
                          if r.filename.endswith("/byteorder")), b"little")
        meta = torch.load(_FileView(fd, info.offset, info.length),
                          map_location="meta", weights_only=True)
    except (zipfile.BadZipFile, RuntimeError, pickle.UnpicklingError,
            EOFError, ValueError, OSError) as e:
        nor = "" if zip_magic else " nor a safetensors blob"
        raise damaged(f"is not a torch.save archive of a tensor{nor} "
                      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(meta, torch.Tensor):
        raise damaged(f"holds a {type(meta).__name__}, not a tensor")
    if meta.dtype != chunk.dtype or list(meta.shape) != chunk.sizes:
        raise damaged(f"holds a {meta.dtype} tensor of shape "
                      f"{list(meta.shape)}, the metadata says {chunk.dtype} "
                      f"{chunk.sizes}")
    chunk.nbytes = meta.numel() * meta.element_size()
    if chunk.nbytes == 0:
        return True
    if (len(records) != 1 or records[0].compress_type != zipfile.ZIP_STORED
            or byteorder != sys.byteorder.encode()
            or not meta.is_contiguous()):
        return False
    record = records[0]
    begin = meta.storage_offset() * meta.element_size()
    if begin + chunk.nbytes > record.file_size:
        raise damaged(f"has a record of {record.file_size} bytes, too short "
                      f"for its tensor ({begin + chunk.nbytes} bytes)")
    with _FileView(fd, info.offset, info.length) as view:
        view.seek(record.header_offset)
        header = view.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size:
        raise damaged("ends inside a zip record header")
    signature, name_len, extra_len = _LOCAL_HEADER.unpack(header)
    if signature != b"PK\x03\x04":
        raise damaged("has a damaged zip record header")
    data = record.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    if data + record.file_size > info.length:
        raise damaged("has a zip record that runs past the item")
    at = info.offset + data  # the record's first byte in the file
    try:
        address = files.address(info.relative_path, at)
    except (RuntimeError, OSError):
        return False  # a filesystem that cannot be mapped: read it instead
    if verify and record.CRC != 0:
        crc = zlib.crc32(_memory_at(address, record.file_size))
        if crc != record.CRC:
            raise damaged(f"fails its CRC-32 (computed {crc:08x}, recorded "
                          f"{record.CRC:08x})")
    chunk.ptr = address + begin
    return True


class _Collector:
    """What torch's FileSystemReader.read_data needs of a planner: it hands
    each tensor item to the target resolve_tensor gives (a fresh contiguous
    tensor) and each bytes item to load_bytes."""

    def __init__(self):
        self.targets: Dict[Any, torch.Tensor] = {}
        self.blobs: Dict[str, bytes] = {}

    def resolve_tensor(self, item: Any) -> torch.Tensor:
        return self.targets[item.storage_index]

    def commit_tensor(self, item: Any, tensor: torch.Tensor) -> None:
        del item, tensor

    def load_bytes(self, item: Any, value: io.BytesIO) -> None:
        self.blobs[item.storage_index.fqn] = value.read()


def _read_with_torch(root: pathlib.Path, md: Any, chunks: List[_Chunk],
                     blobs: List[Tuple[str, Any]]) -> Dict[str, bytes]:
    """Reads `chunks` into memory of their own and returns `blobs`' bytes,
    through torch's FileSystemReader (its stream transforms included)."""
    if not chunks and not blobs:
        return {}
    # pylint: disable=import-outside-toplevel
    from torch.distributed.checkpoint import FileSystemReader
    planner = _dcp.api().planner
    items = []
    collector = _Collector()
    for c in chunks:
        c.keep = torch.empty(c.sizes, dtype=c.dtype)
        collector.targets[c.storage_index] = c.keep
        zeros = torch.Size([0] * len(c.sizes))
        items.append(planner.ReadItem(
            type=planner.LoadItemType.TENSOR, dest_index=c.storage_index,
            dest_offsets=zeros, storage_index=c.storage_index,
            storage_offsets=zeros, lengths=torch.Size(c.sizes)))
    for fqn, index in blobs:
        items.append(planner.ReadItem(
            type=planner.LoadItemType.BYTE_IO, dest_index=index,
            dest_offsets=torch.Size([0]), storage_index=index,
            storage_offsets=torch.Size([0]), lengths=torch.Size([0])))
    reader = FileSystemReader(str(root))
    reader.set_up_storage_reader(md, True)
    try:
        reader.read_data(planner.LoadPlan(items), collector).wait()
    except Exception as e:  # pylint: disable=broad-except
        raise errors.DataLossError(
            f"import_dcp: {root}: torch's FileSystemReader could not read "
            f"{len(chunks)} chunks and {len(blobs)} bytes entries "
            f"({type(e).__name__}: {e})") from None
    for c in chunks:
        c.ptr, c.nbytes = _tensors.buffer_of(c.keep, c.fqn)
    return collector.blobs


# ------------------------------------------------------------ arguments

def _check_args(path: Any, job: Any, step: Any,
                coordinator: Optional[str]) -> Tuple[pathlib.Path, str]:
    if not isinstance(path, (str, os.PathLike)):
        raise errors.InvalidArgumentError(
            f"import_dcp: path {path!r} ({type(path).__name__}) is not a "
            f"directory path")
    if not isinstance(job, str) or not _JOB.fullmatch(job) or job in (
            ".", ".."):
        raise errors.InvalidArgumentError(
            f"import_dcp: invalid job name {job!r}: must be 1 to 128 "
            f"characters of [A-Za-z0-9._-]")
    if isinstance(step, bool) or not isinstance(step, int) or not (
            0 <= step <= _MAX_STEP):
        raise errors.InvalidArgumentError(
            f"import_dcp into job '{job}': step {step!r} is not an int in "
            f"[0, 10^15]")
    coordinator = coordinator or os.environ.get("CAIRN_COORDINATOR") or None
    if not coordinator:
        raise errors.InvalidArgumentError(
            "import_dcp: no coordinator: pass coordinator='HOST:PORT' or set "
            "CAIRN_COORDINATOR")
    root = pathlib.Path(path)
    if not root.exists():
        raise errors.NotFoundError(f"import_dcp: {root} does not exist")
    if not root.is_dir():
        raise errors.InvalidArgumentError(
            f"import_dcp: {root} is not a DCP checkpoint: not a directory "
            f"(FileSystemWriter writes a directory of .metadata and "
            f"__R_N.distcp files)")
    if (not (root / _METADATA).is_file() and not _rank_files(root)[0]
            and not _safetensors_files(root)):
        held = sorted(p.name for p in root.iterdir())
        shown = ", ".join(held[:6]) + (", ..." if len(held) > 6 else "")
        raise errors.InvalidArgumentError(
            f"import_dcp: {root} is not a DCP checkpoint: it has no "
            f"{_METADATA} file nor *{_SAFETENSORS_SUFFIX} files (it holds "
            f"{len(held)} entries"
            f"{': ' + shown if held else ''})")
    return root, coordinator


def _check_step_is_new(ckpt: Any, root: pathlib.Path, job: str,
                       step: int) -> None:
    for info in ckpt.list(True):
        if info.step != step:
            continue
        if info.state == "COMMITTED":
            raise errors.AlreadyExistsError(
                f"import_dcp of {root}: job '{job}' step {step} is already "
                f"committed in Cairn; import into a new step (or delete it: "
                f"cairn rm {job} {step})")
        if info.state == "DELETING":
            raise errors.FailedPreconditionError(
                f"import_dcp of {root}: job '{job}' step {step} is being "
                f"deleted; finish with `cairn rm {job} {step}` first")


# ------------------------------------------------------------ import

def import_dcp(path: Union[str, "os.PathLike[str]"], job: str, step: int, *,
               coordinator: Optional[str] = None, weights_only: bool = True,
               verify: bool = True, **options: Any) -> ImportResult:
    """Saves the DCP checkpoint in directory `path` (torch's
    FileSystemWriter: .metadata and __R_N.distcp files; or the __R.metadata
    files of a ``use_collectives=False`` save, merged; chunks as torch.save
    archives or, with ``serialization_format=SAFETENSORS``, safetensors
    blobs; or, with neither metadata, a directory of *.safetensors files:
    HuggingFaceStorageWriter's, with model.safetensors.index.json or shard
    files whose DCP_SHARDING_INFO places each chunk, or any safetensors
    model) into Cairn as committed checkpoint `step` of `job`, from this one
    process (no process group needed). Returns an ImportResult (``.info``:
    cairnd's record).

    Every tensor keeps its dtype (bfloat16 included), shape and bytes; the
    chunks several ranks saved (DTensor / FSDP2 / ShardedTensor shards)
    become one Cairn tensor, loadable into any world size and layout with
    CairnStorageReader or cairn.Checkpointer. Bytes entries (the objects DCP
    saved: step counters, scheduler and param_groups values) are kept as DCP
    wrote them.

    Memory: tensor chunks are mmapped from the files, not read into the
    process (see cairn/_dcp_import.py); only items stored with DCP's stream
    transforms, or non-contiguous, are read into memory.

    coordinator: cairnd's HOST:PORT (default CAIRN_COORDINATOR).
    weights_only: unpickle .metadata, and check every object, the way
      torch.load does by default (DCP metadata, tensors, plain data and the
      classes of torch.serialization.add_safe_globals). False: trust the
      checkpoint (its objects then need weights_only=False to load, too).
    verify: check each mapped chunk's CRC-32 the archive records (one more
      read of the data) before saving (safetensors blobs record none).
    **options: for the Cairn connection (io_threads, rpc_timeout, tls_ca,
      token, ...; see cairn.Checkpointer).

    Errors (cairn.Error subclasses naming the path and the fqn):
    InvalidArgumentError (bad arguments, a path that is not a DCP
    checkpoint, an object or metadata class weights-only loading refuses, a
    dtype Cairn cannot store, ranks' metadata that disagree on a tensor's
    shape or dtype, place overlapping chunks, or hold different bytes for one
    object), NotFoundError (no such path), DataLossError (a .distcp file
    missing, truncated or damaged, a safetensors header that disagrees with
    the metadata, a rank's metadata file missing, truncated or damaged),
    AlreadyExistsError (the step is committed in Cairn already), and the
    save's own errors.
    """
    root, coordinator = _check_args(path, job, step, coordinator)
    ckpt = _cairn.Checkpointer(coordinator, job, 0, 1, **options)
    _check_step_is_new(ckpt, root, job, step)
    md_api = _dcp.api().metadata
    files = _Files(root)
    try:
        if (root / _METADATA).is_file():
            md = _read_metadata(root / _METADATA, bool(weights_only))
        elif _rank_files(root)[0]:
            md = _merge_rank_metadata(root, files, bool(weights_only))
        else:
            md = _safetensors_metadata(root, files)
        result = ImportResult(info=None)
        tensors: Dict[str, Tuple[Any, List[_Chunk]]] = {}
        blobs: List[Tuple[str, Any]] = []
        storage = md.storage_data
        for fqn, entry in md.state_dict_metadata.items():
            if fqn == _dcp.PLANNER_DATA_FQN:
                continue
            if isinstance(entry, md_api.BytesStorageMetadata):
                index = md_api.MetadataIndex(fqn)
                info = storage.get(index)
                if info is None:
                    raise errors.DataLossError(
                        f"import_dcp: {root / _METADATA} lists bytes entry "
                        f"'{fqn}' but no file holding it")
                files.check(info.relative_path, info.offset, info.length,
                            f"bytes entry '{fqn}'")
                blobs.append((fqn, index))
                continue
            if not isinstance(entry, md_api.TensorStorageMetadata):
                raise errors.InvalidArgumentError(
                    f"import_dcp: {root / _METADATA}: entry '{fqn}' is a "
                    f"{type(entry).__name__}, neither a tensor nor bytes")
            dtype = entry.properties.dtype
            try:
                _tensors.cairn_dtype(dtype, fqn)
            except errors.InvalidArgumentError as e:
                raise errors.InvalidArgumentError(
                    f"import_dcp: {root}: {e.message}") from None
            chunks = []
            for i, c in enumerate(entry.chunks):
                index = md_api.MetadataIndex(fqn, c.offsets, i)
                info = storage.get(index)
                chunk = _Chunk(fqn, [int(o) for o in c.offsets],
                               [int(s) for s in c.sizes], dtype, index, info)
                if info is None:
                    raise errors.DataLossError(
                        f"import_dcp: {root / _METADATA} lists {_what(chunk)}"
                        f" but no file holding it")
                chunks.append(chunk)
            tensors[fqn] = (entry, chunks)

        to_read = [c for _, chunks in tensors.values() for c in chunks
                   if not _locate(files, c, verify)]
        raw = {}
        plain = []
        for fqn, index in blobs:
            info = storage[index]
            if getattr(info, "transform_descriptors", None):
                plain.append((fqn, index))
                continue
            fd = files.check(info.relative_path, info.offset, info.length,
                             f"bytes entry '{fqn}'")
            raw[fqn] = os.pread(fd, info.length, info.offset)
        raw.update(_read_with_torch(root, md, to_read, plain))
        result.read_bytes = sum(c.nbytes for _, chunks in tensors.values()
                                for c in chunks if c.keep is not None)

        state = _cairn.StateDict()
        for fqn, (entry, chunks) in tensors.items():
            state.add_chunks(fqn, _tensors.cairn_dtype(entry.properties.dtype,
                                                       fqn),
                             [int(s) for s in entry.size],
                             [(c.offsets, c.sizes, c.ptr if c.nbytes else 0,
                               c.nbytes) for c in chunks])
            result.tensors += 1
            result.chunks += sum(all(n > 0 for n in c.sizes) for c in chunks)
            result.mapped_bytes += sum(c.nbytes for c in chunks
                                       if c.keep is None)
        for fqn, _ in blobs:
            data = raw[fqn]
            if weights_only:
                _check_object(root, fqn, data)
            state.add_bytes(fqn, data)
            result.bytes_entries += 1
        mapping = getattr(md, "planner_data", None)
        if isinstance(mapping, dict) and mapping:
            state.add_bytes(_dcp.PLANNER_DATA_FQN, _objects.dumps(
                {str(k): tuple(v) for k, v in mapping.items()}))
        result.info = ckpt.save(step, state)
        return result
    finally:
        files.close()


def _check_object(root: pathlib.Path, fqn: str, data: bytes) -> None:
    try:
        _objects.loads(data, True)
    except _objects.UnsafeObjectError as e:
        raise errors.InvalidArgumentError(
            f"import_dcp: {root}: entry '{fqn}': {e}") from None
    except Exception as e:  # pylint: disable=broad-except
        raise errors.DataLossError(
            f"import_dcp: {root}: bytes entry '{fqn}' does not load "
            f"({type(e).__name__}: {e})") from None


# ------------------------------------------------------------ CLI

def main(argv: Optional[Sequence[str]] = None) -> int:
    """python -m cairn.torch import-dcp PATH --job J --step S [...]: exit 0
    on success, 1 on failure (the error on stderr), 2 on a usage error."""
    parser = argparse.ArgumentParser(
        prog="python -m cairn.torch",
        description="Cairn's PyTorch DCP tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser(
        "import-dcp",
        help="save a DCP FileSystemWriter checkpoint into Cairn",
        description="Saves the DCP checkpoint directory PATH (.metadata, or "
                    "per-rank __R.metadata files, and __R_N.distcp files, as "
                    "torch's FileSystemWriter writes it, in the torch_save "
                    "or safetensors format; or a directory of *.safetensors "
                    "files, as HuggingFaceStorageWriter writes it) into "
                    "Cairn as a committed checkpoint.")
    imp.add_argument("path", metavar="PATH")
    imp.add_argument("--job", required=True)
    imp.add_argument("--step", required=True, type=int)
    imp.add_argument("-c", "--coordinator",
                     help="cairnd HOST:PORT (default: CAIRN_COORDINATOR)")
    imp.add_argument("--no-weights-only", dest="weights_only",
                     action="store_false",
                     help="unpickle the metadata and objects without "
                          "torch's weights-only rules (trusted checkpoints "
                          "only)")
    imp.add_argument("--no-verify", dest="verify", action="store_false",
                     help="skip the CRC-32 check of the stored chunks")
    args = parser.parse_args(argv)
    # Usage errors, as the cairn CLI's (exit 2).
    if not _JOB.fullmatch(args.job) or args.job in (".", ".."):
        parser.error(f"--job {args.job!r}: must be 1 to 128 characters of "
                     f"[A-Za-z0-9._-]")
    if not 0 <= args.step <= _MAX_STEP:
        parser.error(f"--step {args.step}: must be in [0, 10^15]")
    try:
        r = import_dcp(args.path, args.job, args.step,
                       coordinator=args.coordinator,
                       weights_only=args.weights_only, verify=args.verify)
    except errors.Error as e:
        print(f"cairn: {e.code}: {e.message}", file=sys.stderr)
        return 1
    print(f"imported {args.path} as job {r.info.job} step {r.info.step} "
          f"({r.info.state}): {r.tensors} tensors in {r.chunks} chunks, "
          f"{r.bytes_entries} bytes entries, {r.info.bytes} bytes")
    return 0
