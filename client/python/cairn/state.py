"""Nested training state_dicts <-> Cairn's flat StateDict.

A training job's state is a nested dict: model and optimizer state_dicts
(the optimizer's has int keys and a `param_groups` list), a scheduler's, a
step int, RNG states. Cairn stores flat entries named by fully qualified
names (fqns): the keys on the way to each leaf joined by "." ("optim.state.0
.exp_avg"). This module walks the nested dict and turns every leaf into one
entry of a `_cairn.StateDict`:

- a CPU torch.Tensor: one chunk covering the whole tensor (the same tensor
  on every rank is the replicated case: Cairn stores one copy). Contiguous
  tensors are saved from, and loaded into, their own memory (zero copy);
  a non-contiguous one is saved from a contiguous copy and loaded into a
  contiguous temporary that is copied back.
- a numpy array: the same, from its buffer.
- a ShardedTensor (torch.distributed._shard.sharded_tensor): one chunk per
  local shard, its ShardMetadata's box in the global tensor; a rank without
  a local shard adds none. Loading fills the local shards in place from
  whatever layout saved the tensor (resharding).
- a DTensor (where the installed torch has one): its local tensor as the
  chunk its placements give it.
- anything else (ints, floats, strings, lists without tensors, tuples such
  as Python's RNG state, ...): pickled into a bytes entry; loading replaces
  the value in the caller's nested dict with the unpickled one.

Dicts are walked; lists are walked when they hold a tensor (at any depth),
otherwise they are one pickled leaf; empty dicts add nothing. Non-tensor
leaves are treated as replicated: when ranks hold different values under
the same fqn, only one is kept, so per-rank values (a rank's RNG state)
need per-rank keys. Unpickling runs code from the checkpoint: load only
checkpoints your jobs wrote.
"""

import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from cairn import _cairn
from cairn import _objects
from cairn import _tensors
from cairn.errors import InvalidArgumentError

# A leaf of the nested dict: its fqn, its path of keys, the container that
# holds it and its key there (for replacing it after a load), the value.
Leaf = Tuple[str, Tuple[Any, ...], Any, Any, Any]


# ------------------------------------------------------------------ kinds

def _sharded_tensor_class() -> Optional[type]:
    module = sys.modules.get("torch.distributed._shard.sharded_tensor.api")
    return getattr(module, "ShardedTensor", None) if module else None


def _dtensor_classes() -> List[type]:
    classes = []
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        module = sys.modules.get(name)
        cls = getattr(module, "DTensor", None) if module else None
        if cls is not None and cls not in classes:
            classes.append(cls)
    return classes


def is_sharded_tensor(value: Any) -> bool:
    cls = _sharded_tensor_class()
    return cls is not None and isinstance(value, cls)


def is_dtensor(value: Any) -> bool:
    return any(isinstance(value, cls) for cls in _dtensor_classes())


def is_tensor_like(value: Any) -> bool:
    """A leaf saved as tensor data (not pickled)."""
    return _tensors.is_torch_tensor(value) or _tensors.is_numpy_array(value)


def _holds_tensor(value: Any) -> bool:
    if is_tensor_like(value):
        return True
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_tensor(v) for v in value)
    return False


# ------------------------------------------------------------------ walk

def _path_text(path: Sequence[Any]) -> str:
    return "".join(f"[{k!r}]" for k in path) or "(top level)"


def iter_leaves(state_dict: Dict[Any, Any]) -> Iterator[Leaf]:
    """Every leaf of `state_dict` as (fqn, path, container, key, value), in
    insertion order. InvalidArgumentError when two leaves flatten to the
    same fqn (naming both paths) or the top level is not a dict."""
    if not isinstance(state_dict, dict):
        raise InvalidArgumentError(
            f"a state_dict is a dict (of tensors, nested dicts and objects), "
            f"got a {type(state_dict).__name__}")
    seen: Dict[str, Tuple[Any, ...]] = {}

    def items(container: Any) -> Iterator:
        if isinstance(container, dict):
            return iter(list(container.items()))
        return iter(list(enumerate(container)))

    # Depth-first, in insertion order, with an explicit stack of iterators
    # (deep nesting does not hit the recursion limit).
    iters: List[Tuple[str, Tuple[Any, ...], Any, Iterator]] = [
        ("", (), state_dict, items(state_dict))]
    while iters:
        prefix, path, container, it = iters[-1]
        nxt = next(it, None)
        if nxt is None:
            iters.pop()
            continue
        key, value = nxt
        fqn = f"{prefix}.{key}" if prefix else str(key)
        sub = path + (key,)
        walk = (isinstance(value, dict) or
                (isinstance(value, list) and _holds_tensor(value)))
        if walk:
            iters.append((fqn, sub, value, items(value)))
            continue
        if fqn in seen:
            raise InvalidArgumentError(
                f"state_dict entries {_path_text(seen[fqn])} and "
                f"{_path_text(sub)} both flatten to the name '{fqn}': rename "
                f"one of them")
        seen[fqn] = sub
        yield fqn, sub, container, key, value


def flatten(state_dict: Dict[Any, Any]) -> Dict[str, Any]:
    """{fqn: leaf value} of a nested state_dict (see the module doc)."""
    return {fqn: value for fqn, _, _, _, value in iter_leaves(state_dict)}


def unflatten(flat: Dict[str, Any], template: Dict[Any, Any]) -> Dict[Any, Any]:
    """A new nested dict shaped like `template` whose leaves are flat[fqn]
    (the inverse of flatten for a state_dict of the same structure).
    InvalidArgumentError naming the fqn when `flat` lacks one."""
    paths = [(fqn, path) for fqn, path, _, _, _ in iter_leaves(template)]

    def copy(node: Any) -> Any:
        if isinstance(node, dict):
            items = [(k, copy(v)) for k, v in node.items()]
            try:
                return type(node)(items)
            except TypeError:  # a dict subclass with another constructor
                return dict(items)
        if isinstance(node, list) and _holds_tensor(node):
            return [copy(v) for v in node]
        return node

    out = copy(template)
    for fqn, path in paths:
        if fqn not in flat:
            raise InvalidArgumentError(f"no value for entry '{fqn}'")
        node = out
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = flat[fqn]
    return out


# ------------------------------------------------------------------ chunks

def _shape(t: Any) -> List[int]:
    return [int(s) for s in t.shape]


def _save_buffer(t: Any, fqn: str, snapshot: bool) -> Any:
    """The memory to save `t` (tensor or array) from: itself when
    contiguous, else (or for a snapshot) a contiguous copy."""
    if _tensors.is_torch_tensor(t):
        t = t.detach()
        _tensors.check_cpu(t, fqn, "saved")
        if snapshot:
            import torch  # pylint: disable=import-outside-toplevel
            return t.clone(memory_format=torch.contiguous_format)
        return t if t.is_contiguous() else t.contiguous()
    import numpy as np  # pylint: disable=import-outside-toplevel
    if snapshot:
        return np.array(t, order="C", copy=True)
    return t if t.flags["C_CONTIGUOUS"] else np.ascontiguousarray(t)


def _dtensor_box(dt: Any, fqn: str) -> Tuple[List[int], Optional[Tuple[
        List[int], List[int]]]]:
    """(global shape, (offsets, sizes) of this rank's local tensor or None
    when the rank is outside the mesh). Partial placements and torch
    versions without the helper are InvalidArgumentError naming fqn."""
    global_shape = [int(s) for s in dt.shape]
    for p in dt.placements:
        if (type(p).__name__ in ("Partial", "_Partial") or
                (hasattr(p, "is_partial") and p.is_partial())):
            raise InvalidArgumentError(
                f"DTensor '{fqn}' has a Partial placement (a pending "
                f"reduction): redistribute it to Shard/Replicate first")
    mesh = dt.device_mesh
    if mesh.get_coordinate() is None:
        return global_shape, None
    compute = None
    for name in ("torch.distributed.tensor._utils",
                 "torch.distributed._tensor._utils"):
        try:
            module = __import__(name, fromlist=["_"])
        except ImportError:
            continue
        compute = getattr(module, "compute_local_shape_and_global_offset",
                          None)
        if compute is not None:
            break
    if compute is None:
        raise InvalidArgumentError(
            f"DTensor '{fqn}': this torch has no "
            f"compute_local_shape_and_global_offset to place its local chunk")
    sizes, offsets = compute(dt.shape, mesh, dt.placements)
    return global_shape, ([int(o) for o in offsets], [int(s) for s in sizes])


class Prepared:
    """A `_cairn.StateDict` built from a nested state_dict, with everything
    its chunks borrow (kept referenced until the Cairn call returns) and,
    for a load, what to write back into the caller's dict afterwards."""

    def __init__(self) -> None:
        self.state = _cairn.StateDict()
        self.keep: List[Any] = []
        self.copies: List[Tuple[Any, Any]] = []          # (target, temporary)
        self.objects: List[Tuple[str, Any, Any]] = []    # (fqn, container, key)
        self.fqns: List[str] = []

    def _add(self, fqn: str, dtype: str, global_shape: List[int],
             chunks: List[Tuple[List[int], List[int], Any]]) -> None:
        spec = []
        for offsets, sizes, buf in chunks:
            ptr, nbytes = _tensors.buffer_of(buf, fqn)
            self.keep.append(buf)
            spec.append((offsets, sizes, ptr, nbytes))
        self.state.add_chunks(fqn, dtype, global_shape, spec)
        self.fqns.append(fqn)

    def finish_load(self, weights_only: bool = True) -> None:
        """Copies temporaries into their non-contiguous targets and puts
        every unpickled object into its container (plain data only unless
        weights_only is False: see cairn._objects); releases the buffers."""
        for target, tmp in self.copies:
            if _tensors.is_torch_tensor(target):
                target.copy_(tmp)
            else:
                import numpy as np  # pylint: disable=import-outside-toplevel
                np.copyto(target, tmp)
        for fqn, container, key in self.objects:
            data = self.state.get_bytes(fqn)
            try:
                container[key] = _objects.loads(data, weights_only)
            except _objects.UnsafeObjectError as e:
                self.release()
                raise InvalidArgumentError(f"entry '{fqn}': {e}") from None
            except Exception as e:  # pylint: disable=broad-except
                self.release()
                raise InvalidArgumentError(
                    f"entry '{fqn}' could not be unpickled ({type(e).__name__}"
                    f": {e})") from e
        self.release()

    def release(self) -> None:
        self.keep.clear()
        self.copies.clear()


def _with_where(where: str, e: InvalidArgumentError) -> InvalidArgumentError:
    return InvalidArgumentError(f"{where}: {e.message}" if where else e.message)


def prepare_save(state_dict: Dict[Any, Any], where: str = "",
                 snapshot: bool = False) -> Prepared:
    """The Cairn state to save `state_dict` from. With `snapshot`, every
    tensor and array is copied first (so the caller may modify its own at
    once); otherwise chunks borrow the caller's memory (contiguous ones).
    `where` ("save of job 'j' step 5 rank 0") prefixes error messages."""
    prep = Prepared()
    try:
        for fqn, _, _, _, value in iter_leaves(state_dict):
            _add_save_leaf(prep, fqn, value, snapshot)
    except InvalidArgumentError as e:
        raise _with_where(where, e) from None
    return prep


def _add_save_leaf(prep: Prepared, fqn: str, value: Any,
                   snapshot: bool) -> None:
    if is_sharded_tensor(value):
        md = value.metadata()
        dtype = _tensors.cairn_dtype(md.tensor_properties.dtype, fqn)
        chunks = []
        for shard in value.local_shards():
            sizes = [int(s) for s in shard.metadata.shard_sizes]
            if _shape(shard.tensor) != sizes:
                raise InvalidArgumentError(
                    f"ShardedTensor '{fqn}': a local shard has shape "
                    f"{_shape(shard.tensor)}, its ShardMetadata says {sizes}")
            chunks.append(([int(o) for o in shard.metadata.shard_offsets],
                           sizes, _save_buffer(shard.tensor, fqn, snapshot)))
        prep._add(fqn, dtype, [int(s) for s in md.size], chunks)  # pylint: disable=protected-access
    elif is_dtensor(value):
        local = value.to_local()
        global_shape, box = _dtensor_box(value, fqn)
        chunks = [] if box is None else [
            (box[0], box[1], _save_buffer(local, fqn, snapshot))]
        prep._add(fqn, _tensors.cairn_dtype(value.dtype, fqn), global_shape,  # pylint: disable=protected-access
                  chunks)
    elif is_tensor_like(value):
        buf = _save_buffer(value, fqn, snapshot)
        shape = _shape(value)
        prep._add(fqn, _tensors.cairn_dtype(value.dtype, fqn), shape,  # pylint: disable=protected-access
                  [([0] * len(shape), shape, buf)])
    else:
        try:
            data = _objects.dumps(value)
        except Exception as e:  # pylint: disable=broad-except
            raise InvalidArgumentError(
                f"entry '{fqn}' ({type(value).__name__}) is neither a tensor "
                f"nor picklable: {type(e).__name__}: {e}") from e
        prep.state.add_bytes(fqn, data)
        prep.fqns.append(fqn)


def _load_buffer(prep: Prepared, target: Any, fqn: str) -> Any:
    """The memory to load `target` into: itself when contiguous, else a
    contiguous temporary copied back by finish_load."""
    if _tensors.is_torch_tensor(target):
        target = target.detach()
        _tensors.check_cpu(target, fqn, "loaded")
        if target.is_contiguous():
            return target
        import torch  # pylint: disable=import-outside-toplevel
        tmp = torch.empty(_shape(target), dtype=target.dtype)
    else:
        if not target.flags["WRITEABLE"]:
            raise InvalidArgumentError(
                f"array '{fqn}' is read-only: it cannot be loaded into")
        if target.flags["C_CONTIGUOUS"]:
            return target
        import numpy as np  # pylint: disable=import-outside-toplevel
        tmp = np.empty(target.shape, dtype=target.dtype)
    prep.copies.append((target, tmp))
    return tmp


def prepare_load(state_dict: Dict[Any, Any], where: str = "") -> Prepared:
    """The Cairn state to load into `state_dict`: chunks backed by its
    tensors, arrays and ShardedTensor local shards (in place), a bytes
    entry per other leaf. Call finish_load() after the load."""
    prep = Prepared()
    try:
        for fqn, _, container, key, value in iter_leaves(state_dict):
            if is_sharded_tensor(value):
                md = value.metadata()
                chunks = [([int(o) for o in s.metadata.shard_offsets],
                           [int(n) for n in s.metadata.shard_sizes],
                           _load_buffer(prep, s.tensor, fqn))
                          for s in value.local_shards()]
                prep._add(fqn, _tensors.cairn_dtype(md.tensor_properties.dtype,  # pylint: disable=protected-access
                                                    fqn),
                          [int(s) for s in md.size], chunks)
            elif is_dtensor(value):
                global_shape, box = _dtensor_box(value, fqn)
                local = value.to_local()
                chunks = [] if box is None else [
                    (box[0], box[1], _load_buffer(prep, local, fqn))]
                prep._add(fqn, _tensors.cairn_dtype(value.dtype, fqn),  # pylint: disable=protected-access
                          global_shape, chunks)
            elif is_tensor_like(value):
                shape = _shape(value)
                prep._add(fqn, _tensors.cairn_dtype(value.dtype, fqn), shape,  # pylint: disable=protected-access
                          [([0] * len(shape), shape,
                            _load_buffer(prep, value, fqn))])
            else:
                prep.state.add_bytes(fqn)
                prep.objects.append((fqn, container, key))
                prep.fqns.append(fqn)
    except InvalidArgumentError as e:
        raise _with_where(where, e) from None
    return prep

