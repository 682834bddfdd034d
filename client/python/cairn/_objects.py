"""How non-tensor objects are stored: one bytes entry per object.

Two serialisations meet in a Cairn checkpoint. The direct API
(cairn.Checkpointer, cairn.state) pickles an object (fast, needs no torch);
PyTorch DCP's planners hand the storage layer ``torch.save`` output (a zip
archive) and read entries back with ``torch.load``. Either API loads what the
other saved: ``loads`` takes both forms, and ``as_torch_save`` turns a pickled
entry into the form DCP's planner reads.

Loading is safe by default, the way ``torch.load`` is since torch 2.6
(``weights_only=True``): a torch.save entry is read by torch's weights-only
unpickler, a pickled entry by an unpickler that builds only plain data
(numbers, strings, bytes, lists, tuples, dicts, sets, OrderedDicts, torch's
dtypes, sizes and tensors, and whatever the user allowed with
``torch.serialization.add_safe_globals``). Any other class or function in
an entry is refused with UnsafeObjectError naming it; ``weights_only=False``
(for checkpoints one trusts) unpickles anything.
"""

import io
import pickle
from typing import Any, Optional

# Every torch.save archive (the zip format, torch >= 1.6) starts with this.
_ZIP_MAGIC = b"PK\x03\x04"

# What a pickled entry may name without weights_only=False: plain data
# types of the standard library. torch's own safe globals (dtypes, Size,
# tensor rebuilds) and the user's add_safe_globals come from torch.
_SAFE_GLOBALS = {
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"),
    ("builtins", "slice"), ("builtins", "range"), ("builtins", "bytearray"),
    ("collections", "OrderedDict"),
}


class UnsafeObjectError(pickle.UnpicklingError):
    """An entry names a class or function that weights-only loading does
    not build."""


def dumps(value: Any) -> bytes:
    """The bytes entry of `value` (a pickle)."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def is_torch_save(data: bytes) -> bool:
    """True when `data` is torch.save output (DCP's form)."""
    return data[:4] == _ZIP_MAGIC


def _torch() -> Optional[Any]:
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return torch


def _torch_safe_globals(torch: Any) -> dict:
    """{(module, name): object} torch's weights-only unpickler allows."""
    allowed = {}
    try:
        from torch import _weights_only_unpickler as wou  # pylint: disable=import-outside-toplevel
        allowed.update({tuple(k.rsplit(".", 1)): v
                        for k, v in wou._get_allowed_globals().items()})  # pylint: disable=protected-access
    except (ImportError, AttributeError):
        pass
    get_user = getattr(torch.serialization, "get_safe_globals", None)
    for g in (get_user() if get_user else []):
        obj = g[0] if isinstance(g, tuple) else g
        allowed[(obj.__module__, obj.__qualname__)] = obj
    return allowed


class _SafeUnpickler(pickle.Unpickler):
    """Builds plain data only (see the module doc)."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        torch = _torch()
        self._torch_allowed = _torch_safe_globals(torch) if torch else {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        allowed = self._torch_allowed.get((module, name))
        if allowed is not None:
            return allowed
        raise UnsafeObjectError(
            f"it holds a {module}.{name}, which weights-only loading does not "
            f"build: load with weights_only=False if you trust this "
            f"checkpoint, or allow the class with "
            f"torch.serialization.add_safe_globals([{name}])")


def _weights_only_reason(message: str) -> str:
    """The line of torch's weights-only refusal that names what it refused
    ("Unsupported global: GLOBAL mod.Class was not an allowed global ...";
    the first line only says that it failed), else its first line."""
    lines = message.splitlines()
    for line in lines:
        _, found, reason = line.partition("WeightsUnpickler error: ")
        if found:
            return reason.strip()
    return lines[0] if lines else message


def loads(data: bytes, weights_only: bool = True) -> Any:
    """The object of a bytes entry written by either API. weights_only (the
    default): plain data only, UnsafeObjectError for anything else."""
    if is_torch_save(data):
        torch = _torch()
        if torch is None:
            raise UnsafeObjectError(
                "it was written by torch.save and torch is not importable")
        try:
            return torch.load(io.BytesIO(data), weights_only=weights_only)
        except pickle.UnpicklingError as e:
            if not weights_only:
                raise
            raise UnsafeObjectError(
                f"{_weights_only_reason(str(e))} (load with weights_only="
                f"False if you trust this checkpoint)") from None
    if not weights_only:
        return pickle.loads(data)
    return _SafeUnpickler(data).load()


def as_torch_save(data: bytes, weights_only: bool = True) -> bytes:
    """`data` in the form DCP's planners torch.load: unchanged when it already
    is, else the pickled object (loaded as ``loads`` does) re-serialised
    with torch.save."""
    if is_torch_save(data):
        return data
    import torch  # pylint: disable=import-outside-toplevel
    buf = io.BytesIO()
    torch.save(loads(data, weights_only), buf)
    return buf.getvalue()
