"""Makes torch 1.13's sharding modules importable on Python 3.11.

Debian bookworm ships PyTorch 1.13 with Python 3.11. Python 3.11's dataclasses
refuse an unhashable default value, and torch 1.13 declares

    tensor_properties: TensorProperties = field(default=TensorProperties())

in ``torch/distributed/_shard/sharded_tensor/metadata.py``, so importing
``torch.distributed._shard.sharded_tensor`` (and with it DCP,
``torch.distributed._shard.checkpoint``) raises ValueError. ``install()`` puts
an import hook in ``sys.meta_path`` that loads that one module from its source
with the default turned into ``default_factory=TensorProperties`` (the fix
later torch releases made). It changes nothing on disk, nothing when the
module is already importable (a newer torch, or Python < 3.11), and nothing
for any other module.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys

_MODULE = "torch.distributed._shard.sharded_tensor.metadata"
_BROKEN = "field(default=TensorProperties())"
_FIXED = "field(default_factory=TensorProperties)"


class _FixingLoader(importlib.machinery.SourceFileLoader):
    """Loads the module's source with the dataclass default fixed."""

    def get_code(self, fullname):
        source = self.get_data(self.path).decode("utf-8")
        return compile(source.replace(_BROKEN, _FIXED), self.path, "exec",
                       dont_inherit=True)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds `_MODULE` with the path finder and swaps in `_FixingLoader`."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(
                spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        try:
            needs_fix = _BROKEN in spec.loader.get_data(
                spec.origin).decode("utf-8")
        except OSError:
            return spec
        if needs_fix:
            spec.loader = _FixingLoader(fullname, spec.origin)
        return spec


def install() -> None:
    """Installs the hook once. Call before torch's sharding modules are first
    imported (``import cairn`` does)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
