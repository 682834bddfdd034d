#!/usr/bin/env python3
"""DCP of the pinned torch on a DTensor state: FileSystemWriter / FileSystemReader.

The peer scenario of peer_harness.py (save 4 rows, load 4 rows -> 2 columns,
load 4 -> 4, every element checked) through torch.distributed.checkpoint's
current entry points: dcp.save(state, storage_writer=FileSystemWriter(DIR,
sync_files=True, thread_count=N)) and dcp.load(state, storage_reader=
FileSystemReader(DIR)) (torch 2.15's reader has no thread count). Tool name
dcp_t<N>. With --async thread|process: dcp.async_save with the same writer
and async_checkpointer_type THREAD or PROCESS, staged by DCP's default for
that writer (FileSystemWriter is a BlockingAsyncStager: one copy into CPU
memory inside the call); tool dcp_async_thread / dcp_async_process.
(dcp_bench.py measures the legacy ShardedTensor entry points that
e2e_bench's DCP column and reshard shapes use.)

Run with the project environment: .venv/bin/python bench/baselines/dcp_fs_bench.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_harness  # noqa: E402

NAME = "dcp"
ASYNC_MODES = ("thread", "process")


def add_args(p):
    p.add_argument("--thread-count", type=int, default=1,
                   help="FileSystemWriter thread_count (default 1, DCP's default)")


def tool_name(args):
    if args.async_mode:
        return f"dcp_async_{args.async_mode}"
    return f"dcp_t{args.thread_count}"


def probe(args):
    try:
        import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
        from torch.distributed.tensor import DTensor  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError as e:
        return f"torch.distributed.checkpoint / DTensor do not import: {e}"
    if args.async_mode and not hasattr(dcp, "async_save"):
        return "this torch has no dcp.async_save"
    return None


def info(args):
    return {"thread_count": args.thread_count, "sync_files": True}


def _writer(ctx, step):
    import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
    return dcp.FileSystemWriter(ctx.path(step), sync_files=True,
                                thread_count=ctx.args.thread_count)


def save(ctx, step):
    import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
    dcp.save(ctx.state, storage_writer=_writer(ctx, step))


def async_save(ctx, step):
    import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType  # pylint: disable=import-outside-toplevel
    mode = {"thread": AsyncCheckpointerType.THREAD,
            "process": AsyncCheckpointerType.PROCESS}[ctx.args.async_mode]
    return dcp.async_save(ctx.state, storage_writer=_writer(ctx, step),
                          async_checkpointer_type=mode)


def load(ctx, step):
    import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
    dcp.load(ctx.state, storage_reader=dcp.FileSystemReader(ctx.path(step)))
    return ctx.locals()


if __name__ == "__main__":
    peer_harness.main(sys.modules[__name__])
