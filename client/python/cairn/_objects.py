"""How non-tensor objects are stored: one bytes entry per object.

Two serialisations meet in a Cairn checkpoint. The direct API
(cairn.Checkpointer, cairn.state) pickles an object (fast, needs no torch);
PyTorch DCP's planners hand the storage layer ``torch.save`` output (a zip
archive) and read entries back with ``torch.load``. Either API loads what the
other saved: ``loads`` takes both forms, and ``as_torch_save`` turns a pickled
entry into the form DCP's planner reads.
"""

import io
import pickle
from typing import Any

# Every torch.save archive (the zip format, torch >= 1.6) starts with this.
_ZIP_MAGIC = b"PK\x03\x04"


def dumps(value: Any) -> bytes:
    """The bytes entry of `value` (a pickle)."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def is_torch_save(data: bytes) -> bool:
    """True when `data` is torch.save output (DCP's form)."""
    return data[:4] == _ZIP_MAGIC


def loads(data: bytes) -> Any:
    """The object of a bytes entry written by either API."""
    if is_torch_save(data):
        import torch  # pylint: disable=import-outside-toplevel
        return torch.load(io.BytesIO(data))
    return pickle.loads(data)


def as_torch_save(data: bytes) -> bytes:
    """`data` in the form DCP's planners torch.load: unchanged when it already
    is, else the pickled object re-serialised with torch.save."""
    if is_torch_save(data):
        return data
    import torch  # pylint: disable=import-outside-toplevel
    buf = io.BytesIO()
    torch.save(pickle.loads(data), buf)
    return buf.getvalue()
