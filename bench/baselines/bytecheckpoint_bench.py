#!/usr/bin/env python3
"""ByteCheckpoint (bytecheckpoint on PyPI) on the peer scenario (peer_harness.py).

bytecheckpoint.save(DIR, {"model": m}, framework="fsdp2") and
bytecheckpoint.load(DIR, {"model": m}, framework="fsdp2"), where m is a
stand-in module whose state_dict() is the scenario's dict of DTensors (what
an FSDP2 model's state_dict() is) and whose load_state_dict() keeps what it
is given; ByteCheckpoint's own planners and store/load engines (files
fsync'd, its default) do the rest. Save 4 rows, load 4 rows -> 2 columns,
load 4 -> 4; what load hands to load_state_dict is checked element by element.
No GPU: pinned-memory host copies are turned off
(BYTECHECKPOINT_ENABLE_PINNED_MEM_D2H=0, pin_memory needs CUDA).

ByteCheckpoint 0.0.2 asserts torch >= 2.1 and < 2.6 in save and load
("ByteCheckpoint now only support torch version from 2.1 to 2.5") and pins
torch<=2.5.0, so it cannot run on the project's torch: bench/baselines/
install.sh gives it its own environment, .venv-peers/bytecheckpoint, with
the torch 2.5.0 it asks for (bench/baselines/requirements-bytecheckpoint.txt);
the JSON line names that torch.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_harness  # noqa: E402

NAME = "bytecheckpoint"
os.environ.setdefault("BYTECHECKPOINT_ENABLE_PINNED_MEM_D2H", "0")


def probe(args):
    try:
        import torch  # pylint: disable=import-outside-toplevel
        import bytecheckpoint  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except Exception as e:  # pylint: disable=broad-except
        return f"bytecheckpoint does not import: {e!r}"
    v = torch.__version__.split("+")[0]
    if not ("2.1.0" <= v < "2.6.0"):  # its own check, as it writes it
        return (f"bytecheckpoint 0.0.2 asserts torch from 2.1 to 2.5 in save/load; this is "
                f"torch {torch.__version__}")
    return None


def info(args):
    from importlib.metadata import version  # pylint: disable=import-outside-toplevel
    return {"bytecheckpoint": version("bytecheckpoint"), "framework": "fsdp2"}


class _Model:
    """What ByteCheckpoint's FSDP2 checkpointer asks of a model."""

    def __init__(self, state):
        self.state = state
        self.loaded = None

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, sd):
        self.loaded = sd


def save(ctx, step):
    import bytecheckpoint  # pylint: disable=import-outside-toplevel
    bytecheckpoint.save(ctx.path(step), {"model": _Model(ctx.state)}, framework="fsdp2")


def load(ctx, step):
    import bytecheckpoint  # pylint: disable=import-outside-toplevel
    m = _Model(ctx.state)
    bytecheckpoint.load(ctx.path(step), {"model": m}, framework="fsdp2")
    return {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in m.loaded.items()}


if __name__ == "__main__":
    peer_harness.main(sys.modules[__name__])
