#!/usr/bin/env python3
"""Megatron-Core's dist_checkpointing on the peer scenario (peer_harness.py).

Each rank's local tensors are wrapped as megatron.core.dist_checkpointing
ShardedTensor.from_rank_offsets(fqn, local, (dim, rank, world)) (replica 0:
every shard is the main replica), saved with dist_checkpointing.save(sd, DIR)
and loaded with dist_checkpointing.load(sd, DIR) into targets of the load
layout (the columns layout reshards). Strategies are Megatron's defaults for
this version: torch_dist (DCP underneath, Megatron's FileSystemWriterAsync,
fsync'd) for saves, whatever the checkpoint's metadata.json names for loads.
What load returns is checked element by element.

On a machine without a GPU, torch_dist's save fails as released
(megatron-core 0.16.1): FileSystemWriterAsync.preload_tensors copies with
non_blocking=True and then calls torch.cuda.synchronize() unconditionally,
and save_state_dict_async_finalize all-reduces a flag it allocates on
torch.cuda.current_device() ("RuntimeError: Found no NVIDIA driver on your
system"). Without a GPU there is nothing to synchronize and the flag can
live on the CPU (gloo reduces it), so when torch.cuda.is_available() is
false the ranks make torch.cuda.synchronize a no-op and
torch.cuda.current_device() answer "cpu" (the JSON line says so in
"cpu_shim"); --no-cpu-shim shows the failure.

Run in its own environment: bench/baselines/install.sh makes
.venv-peers/megatron-core (bench/baselines/requirements-megatron-core.txt).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_harness  # noqa: E402

NAME = "megatron"
SHIM = ("no GPU: torch.cuda.synchronize made a no-op and torch.cuda.current_device "
        "answers 'cpu' (megatron-core's torch_dist save calls both unconditionally)")


def add_args(p):
    p.add_argument("--no-cpu-shim", action="store_true",
                   help="leave torch.cuda.synchronize alone (the save fails without a GPU)")


def probe(args):
    try:
        from megatron.core import dist_checkpointing  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except Exception as e:  # pylint: disable=broad-except
        return f"megatron.core.dist_checkpointing does not import: {e!r}"
    return None


def info(args):
    from importlib.metadata import version  # pylint: disable=import-outside-toplevel
    from megatron.core.dist_checkpointing.serialization import (  # pylint: disable=import-outside-toplevel
        get_default_save_sharded_strategy)
    s = get_default_save_sharded_strategy()
    import torch  # pylint: disable=import-outside-toplevel
    shim = not args.no_cpu_shim and not torch.cuda.is_available()
    return {"megatron_core": version("megatron-core"), "cpu_shim": SHIM if shim else None,
            "save_strategy": f"{s.backend} {s.version}",
            "save_thread_count": getattr(s, "thread_count", None)}


def _sharded(ctx):
    from megatron.core.dist_checkpointing import ShardedTensor  # pylint: disable=import-outside-toplevel
    return {name: ShardedTensor.from_rank_offsets(name, local, (ctx.dim, ctx.rank, ctx.world),
                                                  replica_id=0)
            for name, local in ctx.locals().items()}


def prepare(ctx):
    import torch  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    if not ctx.args.no_cpu_shim and not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.current_device = lambda: "cpu"
    ctx.peer["sd"] = _sharded(ctx)
    if ctx.rank == 0:
        os.makedirs(ctx.path(1), exist_ok=True)  # save wants an existing directory
    dist.barrier()


def save(ctx, step):
    from megatron.core import dist_checkpointing  # pylint: disable=import-outside-toplevel
    dist_checkpointing.save(ctx.peer["sd"], ctx.path(step))


def load(ctx, step):
    from megatron.core import dist_checkpointing  # pylint: disable=import-outside-toplevel
    got = dist_checkpointing.load(ctx.peer["sd"], ctx.path(step))
    return dict(got)


if __name__ == "__main__":
    peer_harness.main(sys.modules[__name__])
