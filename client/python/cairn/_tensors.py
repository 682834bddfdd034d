"""Tensor and array memory as Cairn sees it: dtype names and raw buffers.

Cairn saves from, and loads into, the caller's memory: a contiguous CPU
tensor (or numpy array) is handed to libcairn as its address and length, so
no byte is copied on the way to storage. Everything here is about getting
those two numbers safely and naming the tensor when that is not possible.
"""

from typing import Any, Tuple

from cairn.errors import InvalidArgumentError

# Cairn's dtype names (libcairn's DTypeName) by torch dtype attribute name.
# Resolved lazily so that importing cairn does not import torch.
_TORCH_TO_CAIRN = {
    "float32": "float32",
    "float64": "float64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "bool": "bool",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
}

# numpy dtype names (numpy has no bfloat16 or float8).
_NUMPY_TO_CAIRN = {
    "float32": "float32",
    "float64": "float64",
    "float16": "float16",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "bool": "bool",
}


def _torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


def is_torch_tensor(value: Any) -> bool:
    """True for a torch.Tensor (without importing torch if it is not)."""
    import sys  # pylint: disable=import-outside-toplevel
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_numpy_array(value: Any) -> bool:
    """True for a numpy.ndarray (without importing numpy if it is not)."""
    import sys  # pylint: disable=import-outside-toplevel
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def cairn_dtype(dtype: Any, fqn: str = "") -> str:
    """Cairn's name of a torch or numpy dtype ("float32", "bfloat16", ...).

    Raises InvalidArgumentError naming `fqn` for a dtype Cairn cannot store
    (complex, quantized, uint16/32/64, ...).
    """
    torch = _torch() if "torch" in str(type(dtype)) else None
    if torch is not None and isinstance(dtype, torch.dtype):
        name = str(dtype).rsplit(".", 1)[-1]
        table = _TORCH_TO_CAIRN
    else:
        name = str(getattr(dtype, "name", dtype))
        table = _NUMPY_TO_CAIRN
    if name not in table:
        raise InvalidArgumentError(
            f"tensor '{fqn}': dtype {dtype} cannot be checkpointed by Cairn "
            f"(supported: {', '.join(sorted(set(table.values())))})")
    return table[name]


def torch_dtype(name: str):
    """The torch dtype of a Cairn dtype name (inverse of cairn_dtype)."""
    torch = _torch()
    for torch_name, cairn_name in _TORCH_TO_CAIRN.items():
        if cairn_name == name and hasattr(torch, torch_name):
            return getattr(torch, torch_name)
    raise InvalidArgumentError(
        f"dtype '{name}' has no torch equivalent in torch {torch.__version__}")


def check_cpu(tensor: Any, fqn: str, what: str = "saved") -> None:
    """Raises InvalidArgumentError naming `fqn` and the device unless `tensor`
    lives in host memory (CUDA tensors go through cairn-agent's device path in
    CUDA builds; this host path never reads device memory)."""
    if is_torch_tensor(tensor) and tensor.device.type != "cpu":
        raise InvalidArgumentError(
            f"tensor '{fqn}' is on device {tensor.device}: only CPU tensors "
            f"can be {what} by this Cairn build (move it with .cpu(), or use "
            f"cairn-agent's device path in a CUDA build)")


def buffer_of(value: Any, fqn: str = "") -> Tuple[int, int]:
    """(address, length in bytes) of a contiguous CPU tensor or numpy array.

    The caller keeps `value` alive while the address is in use. An empty
    tensor gives (0, 0). Raises InvalidArgumentError naming `fqn` for a
    non-contiguous or non-CPU value.
    """
    if is_torch_tensor(value):
        check_cpu(value, fqn)
        if not value.is_contiguous():
            raise InvalidArgumentError(
                f"tensor '{fqn}' is not contiguous (strides {value.stride()} "
                f"for shape {tuple(value.shape)})")
        nbytes = value.numel() * value.element_size()
        return (value.data_ptr() if nbytes else 0), nbytes
    if is_numpy_array(value):
        if not value.flags["C_CONTIGUOUS"]:
            raise InvalidArgumentError(
                f"array '{fqn}' is not C-contiguous (strides {value.strides})")
        nbytes = int(value.nbytes)
        return (int(value.ctypes.data) if nbytes else 0), nbytes
    raise InvalidArgumentError(
        f"'{fqn}' is a {type(value).__name__}, not a tensor or numpy array")
