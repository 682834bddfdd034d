#!/usr/bin/python3
"""Python benchmark: Cairn from Python vs Cairn from C++ vs PyTorch DCP vs the machine.

One run, same machine, same state in every path: 8 fp32 matrices
"model.layers.<t>.weight" of [rows, 4096] (rows = bytes / 8 / 4096 / 4, the C++
example's `bench:<bytes>` model; ~1.6 GB by default), held in Python as
DTensors on a 1-D DeviceMesh of the ranks (gloo, CPU; torch.chunk rules, as
the C++ example's layouts):
  save   4 ranks, rows sharded (Shard(0); layout 4:S0 in C++), every byte
         durable and committed (step 1)
  async  the same 4 ranks, right after: async_save of step 2; its tensors are
         overwritten as soon as the call returns (training goes on), so the
         async_load below checks the snapshot was whole when the call
         returned
  load2  page cache dropped, 2 ranks sharded by columns (Shard(1) / 2:S1): a
         resharding load of step 1, "4 rows -> 2 columns"
  load4  page cache dropped, 4 ranks by rows (Shard(0) / 4:S0): the same
         layout, of step 1 (as the C++ path loads its step 1: the same
         bytes, written the same way, read once before)
  async_load  page cache dropped, 4 ranks by rows: step 2, the async save,
         every byte checked (its time is in the JSON, not the tables)
Every loaded byte is checked bit-exactly afterwards, outside the timed part.
Paths:
  direct    cairn.Checkpointer(...).save(1, state) / .load(state, step=1) /
            .async_save(2, state) (no agent: a host snapshot, saved on a
            background thread): the Python direct API with a dict of DTensors
  dcp_cairn torch.distributed.checkpoint's dcp.save / dcp.load /
            dcp.async_save with cairn.torch.CairnStorageWriter /
            CairnStorageReader and checkpoint_id "cairn://HOST:PORT/JOB/STEP"
            (async: the writer is DCP's AsyncStager; without an agent its
            stage() makes one host copy; THREAD mode)
  cpp       the C++ example (cairn_train_example, one process per rank), run
            by bench/e2e_bench.py's own cairn_run (imported, not copied); it
            also runs load2_whole, reported in the JSON only; no async row
  dcp_fs    DCP with its own FileSystemWriter(path, sync_files=True,
            thread_count=N) / FileSystemReader(path) (torch 2.15's reader has
            no thread count), once per --dcp-threads N (default 1 and 8:
            tools dcp_fs_t1, dcp_fs_t8); async: dcp.async_save, THREAD mode,
            with the DefaultStager dcp.async_save builds for a writer that
            is not a stager (StagingOptions all off: synchronous staging into
            plain host memory; pinned memory and non-blocking copies need an
            accelerator)
"vs DCP" compares with the better of the dcp_fs thread counts, phase by
phase (in the per-round ratios: the better one of that round).

Every Python path's ranks are spawned processes (torch.multiprocessing, gloo);
a phase is timed from a barrier to the last rank done: max(t1) - min(t0),
excluding process start, tensor fill and verification. The C++ path's times
are e2e_bench's (from libcairn's stats: first plan to last commit / last byte
in place), which leaves out the process's own set-up, so the Python / C++
ratios are, if anything, pessimistic for Python. The Python paths' JSON also
carries libcairn's own stats time (save_cairn_s, load*_cairn_s: plan + io +
commit of the slowest rank) where the path exposes it.

async_save, per rank, after a barrier: "blocked" is the call to its return
(the time training is held; the max over ranks is reported), "to committed"
the call to its future's result (max(done) - min(call)). For reference each
rank also times, after a barrier and just before, one copy of its own bytes:
copy_ into tensors allocated and touched beforehand (memory bandwidth alone)
and clone() (allocation and page faults too, as a snapshot into fresh memory
pays); max over ranks. 4 ranks share the machine's cores exactly as they do
during the async_save.

Rounds are interleaved because this VM's disk drifts by 2x within minutes:
each of --repeat rounds measures the limit (bench/baselines/limits.sh, as
e2e_bench does; --limit-sweep picks its sweep) and then runs every path once,
in a rotating order. Each path's figure is its best round (times: the
smallest); the tables also give per-round ratios.

Python overhead of a save of 1,000 small tensors (--small-tensors, 256 fp32
each), one rank, against one cairnd. Two saves of the same tensors alternate,
each to its own job (so both get cached plans alike; one warm-up pair is not
counted), --small-repeat pairs:
  A  wall time of cairn.Checkpointer.save(step, {1,000 tensors})
  B  wall time of cairn._cairn.Checkpointer.save(step, sd), sd a
     _cairn.StateDict of the same tensors built once beforehand: libcairn's
     C++ Save behind the extension, no Python work per tensor
  a, b  libcairn's own plan + io + commit time of that save (last_stats)
Python overhead = median of (A - a) - (B - b): what the Python layer adds
outside libcairn's measured work, with the disk's time (which differs
between any two saves by more than the overhead) taken out of both. A - B is
reported too.

The fixed cost of one load, 4 ranks (after the small save): 8 DTensors of
[256, 64] fp32, Shard(0), saved once per path, then loaded --small-repeat
times per path in a rotating order (one warm-up round not counted), a
barrier before each, every byte checked after each: direct
(cairn.Checkpointer.load), dcp_cairn (dcp.load with CairnStorageReader) and
dcp_fs (dcp.load with FileSystemReader); median of max(t1) - min(t0). The
difference dcp_cairn - direct is what the DCP adapter adds to every load
whatever its size (DCP's own planning collectives, which FileSystemReader
pays too), also shown as a share of this run's direct loads.

Paired loads (--pairs N, default 6): the DCP adapter against the direct API
where the disk's drift cannot tell them apart by minutes: 4 ranks save step
1 (the run's size, Shard(0)), then load it N times by each path (direct
first in even pairs, the adapter first in odd ones), the page cache dropped
before each load, every byte checked after each; then 2 ranks (Shard(1))
load it the same way, 4 rows -> 2 columns. Reported: each pair's times and
the median of direct / adapter, per layout.

Usage: bench/python_bench.py [--build build] [--dir /tmp/cairn-py-bench]
       [--bytes 1.6e9] [--repeat 3] [--no-drop-caches] [--skip-limits]
       [--limit-sweep full|quick] [--paths direct,dcp_cairn,cpp,dcp_fs]
       [--dcp-threads 1,8] [--timeout S]
       bench/python_bench.py --smoke [--build build] [--dir DIR]
Run it with an interpreter that has torch with DTensor and
torch.distributed.checkpoint's dcp.save (the project's .venv), as root for
cold loads; without root the loads are warm (a warning says so). Prints one
JSON line per path and round, then markdown tables. Exits non-zero when any
path fails or a loaded byte differs.

--smoke (ctest label bench-smoke): 32 MiB, one round, no page-cache drop,
the smoke limit sweep, every path, the small-tensor save and the small loads
twice; numbers are meaningless.

One run per --dir at a time: a second one fails at once naming the first's
pid.

Benchmarks never assert times.
"""

import argparse
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "bench", "baselines"))

import e2e_bench  # noqa: E402  (the C++ path, the page-cache drop, run_json)

PATHS = ("direct", "dcp_cairn", "cpp", "dcp_fs")
PHASES = ("save", "load2", "load4", "async_load")
COLS = 4096
TENSORS = 8
SENTINEL = -1.0
# Phase -> (ranks, sharded dim, step loaded); the save phase saves step 1 and
# async-saves step 2.
PHASE_LAYOUT = {"save": (4, 0, None), "load2": (2, 1, 1), "load4": (4, 0, 1),
                "async_load": (4, 0, 2)}


def fqn(t):
    return f"model.layers.{t}.weight"


# ------------------------------------------------------------- rank side

def expected_block(torch, t, row0, nrows, col0, ncols):
    """The fill: float32(((i * 2654435761) + t * 40503) mod 2**24) of global
    element i (exact in fp32), for rows [row0, +nrows) x cols [col0, +ncols);
    the load targets hold -1.0, which the fill never produces."""
    rows = torch.arange(row0, row0 + nrows, dtype=torch.int64).unsqueeze(1)
    cols = torch.arange(col0, col0 + ncols, dtype=torch.int64).unsqueeze(0)
    idx = rows * COLS + cols
    idx.mul_(2654435761).add_(t * 40503).bitwise_and_((1 << 24) - 1)
    return idx.to(torch.float32)


def chunk_range(n, world, rank):
    """[begin, end) of `rank`'s part of n under torch.chunk rules (what
    DTensor's Shard gives; the last ranks may get less, or nothing)."""
    size = -(-n // world)
    return min(rank * size, n), min((rank + 1) * size, n)


def local_box(rows, world, dim, rank):
    """(row0, nrows, col0, ncols) of this rank's local tensor."""
    extent = (rows, COLS)
    begin, end = chunk_range(extent[dim], world, rank)
    box = [[0, rows], [0, COLS]]
    box[dim] = [begin, end - begin]
    return box[0][0], box[0][1], box[1][0], box[1][1]


def _row_blocks(box, fn):
    row0, nrows, col0, ncols = box
    step = max(1, (1 << 22) // max(1, ncols))
    for r in range(0, nrows, step):
        fn(r, min(step, nrows - r), row0 + r, col0, ncols)


def make_state(torch, mesh, rows, world, dim, rank, fill):
    """This rank's dict of DTensors [rows, COLS] on `mesh`, Shard(dim), filled
    with the expected values or with SENTINEL; and this rank's box."""
    from torch.distributed.tensor import DTensor, Shard  # pylint: disable=import-outside-toplevel
    box = local_box(rows, world, dim, rank)
    state = {}
    for t in range(TENSORS):
        local = torch.empty(box[1], box[3], dtype=torch.float32)
        if fill:
            def write(r, n, g_row0, col0, ncols, local=local, t=t):
                local[r:r + n].copy_(expected_block(torch, t, g_row0, n, col0, ncols))

            _row_blocks(box, write)
        else:
            local.fill_(SENTINEL)
        state[fqn(t)] = DTensor.from_local(local, mesh, [Shard(dim)], run_check=False,
                                           shape=torch.Size([rows, COLS]),
                                           stride=(COLS, 1))
    return state, box


def verify_state(torch, state, box, rank):
    """Error strings naming rank, fqn and the first differing element."""
    errors = []
    for t in range(TENSORS):
        local = state[fqn(t)].to_local()

        def check(r, n, g_row0, col0, ncols, local=local, t=t):
            got = local[r:r + n].view(torch.int32)
            want = expected_block(torch, t, g_row0, n, col0, ncols).view(torch.int32)
            if not torch.equal(got, want):
                bad = (got != want).nonzero()
                lr, lc = bad[0].tolist()
                errors.append(
                    f"rank {rank} fqn {fqn(t)} box rows {box[0]}+{box[1]} cols "
                    f"{box[2]}+{box[3]}: {bad.shape[0]} elements differ, first at "
                    f"({g_row0 + lr}, {col0 + lc}): got "
                    f"{local[r + lr, lc].item()} want {float(want[lr, lc].view(torch.float32))}")

        _row_blocks(box, check)
    return errors


def cairn_id(cfg, step):
    return f"cairn://{cfg['coordinator']}/{cfg['job']}/{step}"


def fs_path(cfg, step):
    return os.path.join(cfg["fs_dir"], str(step))


def sync_save(path, cfg, dcp, ckpt, state):
    """Saves `state` as step 1; returns libcairn's stats (or {})."""
    if path == "direct":
        ckpt.save(1, state)
        return dict(ckpt.last_stats)
    if path == "dcp_cairn":
        from cairn.torch import CairnStorageWriter  # pylint: disable=import-outside-toplevel
        w = CairnStorageWriter()
        dcp.save(state, storage_writer=w, checkpoint_id=cairn_id(cfg, 1))
        return dict(w.last_stats)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(
        fs_path(cfg, 1), sync_files=True, thread_count=cfg["threads"]))
    return {}


def load(path, cfg, dcp, ckpt, state, step):
    """Loads `step` into `state` in place; returns libcairn's stats (or {})."""
    if path == "direct":
        ckpt.load(state, step=step)
        return dict(ckpt.last_stats)
    if path == "dcp_cairn":
        from cairn.torch import CairnStorageReader  # pylint: disable=import-outside-toplevel
        dcp.load(state, storage_reader=CairnStorageReader(),
                 checkpoint_id=cairn_id(cfg, step))
        return {}
    dcp.load(state, storage_reader=dcp.FileSystemReader(fs_path(cfg, step)))
    return {}


def memcpy_reference(torch, dist, locals_):
    """(copy_ seconds, clone seconds) of this rank's bytes, each after a
    barrier (every rank copies at once, as during async_save)."""
    dst = [torch.empty_like(x) for x in locals_]
    for d in dst:
        d.fill_(0.0)  # fault the pages in: copy_ then measures the copy alone
    dist.barrier()
    t0 = time.monotonic()
    for d, x in zip(dst, locals_):
        d.copy_(x)
    copy_s = time.monotonic() - t0
    del dst
    dist.barrier()
    t0 = time.monotonic()
    clones = [x.clone() for x in locals_]
    clone_s = time.monotonic() - t0
    del clones
    return copy_s, clone_s


def timed_async_save(path, cfg, dcp, ckpt, state):
    """async_save of step 2 after a barrier, then the tensors overwritten
    (training goes on) and the future waited for; returns (call, return,
    done) monotonic times."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    stager = None
    dist.barrier()
    t_call = time.monotonic()
    if path == "direct":
        fut = ckpt.async_save(2, state)
    elif path == "dcp_cairn":
        from cairn.torch import CairnStorageWriter  # pylint: disable=import-outside-toplevel
        fut = dcp.async_save(state, storage_writer=CairnStorageWriter(),
                             checkpoint_id=cairn_id(cfg, 2))
    else:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # pylint: disable=import-outside-toplevel
        stager = DefaultStager(StagingOptions(use_pinned_memory=False,
                                              use_shared_memory=False,
                                              use_async_staging=False,
                                              use_non_blocking_copy=False))
        fut = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(
            fs_path(cfg, 2), sync_files=True, thread_count=cfg["threads"]),
            async_stager=stager)
    t_ret = time.monotonic()
    for value in state.values():
        value.to_local().fill_(SENTINEL)
    result = fut.result()
    t_done = time.monotonic()
    if stager is not None:
        stager.close()
    if path == "direct" and result.state != "COMMITTED":
        raise RuntimeError(f"async_save of step 2 ended {result.state}")
    return t_call, t_ret, t_done


def join_ranks(rank, world, port):
    """This spawned rank's process group (gloo, the parent's rendezvous
    store: rendezvous_store) and 1-D DeviceMesh; one torch thread."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    from torch.distributed.device_mesh import init_device_mesh  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    return init_device_mesh("cpu", (world,))


def leave_ranks(queue, out):
    """Waits for every rank, leaves the process group and reports `out`."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    dist.barrier()
    dist.destroy_process_group()
    queue.put(out)


def rank_main(rank, world, path, phase, cfg, port, queue):
    """One rank of one phase of one path; reports timing and errors to `queue`."""
    try:
        import cairn  # pylint: disable=import-outside-toplevel
        import torch  # pylint: disable=import-outside-toplevel
        import torch.distributed as dist  # pylint: disable=import-outside-toplevel
        import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
        mesh = join_ranks(rank, world, port)
        _, dim, step = PHASE_LAYOUT[phase]
        save = phase == "save"
        state, box = make_state(torch, mesh, cfg["rows"], world, dim, rank, fill=save)
        ckpt = None
        if path == "direct":
            ckpt = cairn.Checkpointer(coordinator=cfg["coordinator"], job=cfg["job"],
                                      rank=rank, world_size=world)
        out = {"rank": rank, "errors": []}
        dist.barrier()
        out["t0"] = time.monotonic()
        if save:
            stats = sync_save(path, cfg, dcp, ckpt, state)
        else:
            stats = load(path, cfg, dcp, ckpt, state, step)
        out["t1"] = time.monotonic()
        out["cairn_s"] = sum(float(stats.get(k, 0.0)) for k in ("plan_time", "io_time",
                                                                "commit_time"))
        if save:
            locals_ = [v.to_local() for v in state.values()]
            out["rank_bytes"] = sum(x.numel() * x.element_size() for x in locals_)
            out["copy_s"], out["clone_s"] = memcpy_reference(torch, dist, locals_)
            del locals_
            out["call"], out["ret"], out["done"] = timed_async_save(path, cfg, dcp,
                                                                    ckpt, state)
        else:
            out["errors"] = verify_state(torch, state, box, rank)[:10]
        if ckpt is not None:
            ckpt.close()
        leave_ranks(queue, out)
    except BaseException as e:  # pylint: disable=broad-except
        queue.put({"rank": rank,
                   "errors": [f"rank {rank} {path} {phase}: {repr(e)[:1000]}"]})
        raise


def run_phase(path, phase, cfg, timeout):
    """Spawns the phase's ranks; returns their reports."""
    world = PHASE_LAYOUT[phase][0]
    return spawn_ranks(rank_main, world, (path, phase, cfg), timeout,
                       f"{path} {phase} ({world} ranks)")


def spawn_ranks(target, world, args, timeout, what):
    """Runs target(rank, world, *args, port, queue) in `world` spawned
    processes; returns the reports they put on the queue, or raises naming
    `what` with every rank's error, a hang or an exit status."""
    import torch.multiprocessing as mp  # pylint: disable=import-outside-toplevel
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    store = rendezvous_store(world)
    port = store.port
    procs = [ctx.Process(target=target, args=(r, world) + tuple(args) + (port, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for p in procs:
        p.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    results = []
    while not queue.empty():
        results.append(queue.get())
    errors = [e for r in results for e in r["errors"]]
    if hung:
        errors.append(f"ranks {hung} still running after {timeout} s: killed")
    failed = [r for r, p in enumerate(procs) if p.exitcode != 0 and r not in hung]
    if failed:
        errors.append(f"ranks {failed} exited {[procs[r].exitcode for r in failed]}")
    if errors or len(results) != world:
        raise RuntimeError(f"{what} failed:\n  " +
                           "\n  ".join(errors or ["a rank reported nothing"]))
    return results


# Small loads: what one load costs besides its bytes (see top).
SMALL_LOAD_PATHS = ("direct", "dcp_cairn", "dcp_fs")
SMALL_LOAD_ROWS = 64  # per rank, of [rows, 64] fp32 per tensor


def small_load_rank(rank, world, cfg, port, queue):
    """One rank of the small-load measurement: saves a tiny state once per
    path, then loads it cfg["repeat"] times per path (rotating order, a
    barrier before each); reports (path, t0, t1) per load."""
    try:
        import cairn  # pylint: disable=import-outside-toplevel
        import torch  # pylint: disable=import-outside-toplevel
        import torch.distributed as dist  # pylint: disable=import-outside-toplevel
        import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
        from cairn.torch import CairnStorageReader  # pylint: disable=import-outside-toplevel
        from torch.distributed.tensor import DTensor, Shard  # pylint: disable=import-outside-toplevel
        mesh = join_ranks(rank, world, port)
        rows = SMALL_LOAD_ROWS
        locals_ = [torch.arange(rows * 64, dtype=torch.float32).reshape(rows, 64) +
                   1e6 * (rank + world * t) for t in range(TENSORS)]
        state = {fqn(t): DTensor.from_local(x.clone(), mesh, [Shard(0)], run_check=False,
                                            shape=torch.Size([rows * world, 64]),
                                            stride=(64, 1))
                 for t, x in enumerate(locals_)}
        ckpt = cairn.Checkpointer(coordinator=cfg["coordinator"], job="small-load",
                                  rank=rank, world_size=world)
        ckpt.save(1, state)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(cfg["fs_dir"], sync_files=True))
        loads = {
            "direct": lambda: ckpt.load(state, step=1),
            "dcp_cairn": lambda: dcp.load(state, storage_reader=CairnStorageReader(
                cfg["coordinator"], "small-load", 1)),
            "dcp_fs": lambda: dcp.load(state, storage_reader=dcp.FileSystemReader(
                cfg["fs_dir"])),
        }
        out = {"rank": rank, "errors": [], "loads": []}
        for i in range(cfg["repeat"] + 1):  # round 0: warm-up, not reported
            k = i % len(SMALL_LOAD_PATHS)
            for path in SMALL_LOAD_PATHS[k:] + SMALL_LOAD_PATHS[:k]:
                for value in state.values():
                    value.to_local().fill_(SENTINEL)
                dist.barrier()
                t0 = time.monotonic()
                loads[path]()
                t1 = time.monotonic()
                for t, x in enumerate(locals_):
                    if not torch.equal(state[fqn(t)].to_local(), x):
                        out["errors"].append(f"rank {rank} small load {path}: "
                                             f"{fqn(t)} differs")
                if i > 0:
                    out["loads"].append((path, i, t0, t1))
        ckpt.close()
        leave_ranks(queue, out)
    except BaseException as e:  # pylint: disable=broad-except
        queue.put({"rank": rank, "errors": [f"rank {rank} small load: {repr(e)[:1000]}"]})
        raise


def small_load_overhead(args):
    """The fixed cost of one load on 4 ranks, per path (see top)."""
    cairnd = Cairnd(args.build, os.path.join(args.dir, "cairn-small-load"))
    fs_dir = os.path.join(args.dir, "dcp-small-load")
    shutil.rmtree(fs_dir, ignore_errors=True)
    try:
        cfg = {"coordinator": cairnd.address, "fs_dir": fs_dir,
               "repeat": args.small_repeat}
        got = spawn_ranks(small_load_rank, 4, (cfg,), args.timeout, "small load (4 ranks)")
    finally:
        cairnd.close()
        shutil.rmtree(fs_dir, ignore_errors=True)
    spans = {}  # (path, i) -> [min t0, max t1]
    for r in got:
        for path, i, t0, t1 in r["loads"]:
            span = spans.setdefault((path, i), [t0, t1])
            span[0], span[1] = min(span[0], t0), max(span[1], t1)
    res = {"tool": "small_load", "ranks": 4, "tensors": TENSORS,
           "rows": SMALL_LOAD_ROWS * 4, "loads": args.small_repeat}
    for path in SMALL_LOAD_PATHS:
        res[path + "_ms"] = 1e3 * statistics.median(
            t1 - t0 for (p, _), (t0, t1) in spans.items() if p == path)
    return res


# Paired loads: the DCP adapter against the direct API in the same ranks.
def paired_load_rank(rank, world, cfg, port, queue):
    """One rank of the paired loads: with cfg["save"], saves step 1
    (Shard(0)) first; then loads step 1 into Shard(cfg["dim"]) cfg["pairs"]
    times by each path, alternating which goes first, the page cache
    dropped (rank 0) before each load; reports (path, i, t0, t1)."""
    try:
        import cairn  # pylint: disable=import-outside-toplevel
        import torch  # pylint: disable=import-outside-toplevel
        import torch.distributed as dist  # pylint: disable=import-outside-toplevel
        import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
        mesh = join_ranks(rank, world, port)
        state, box = make_state(torch, mesh, cfg["rows"], world, cfg["dim"], rank,
                                fill=cfg["save"])
        ckpt = cairn.Checkpointer(coordinator=cfg["coordinator"], job="paired",
                                  rank=rank, world_size=world)
        if cfg["save"]:
            ckpt.save(1, state)
        out = {"rank": rank, "errors": [], "loads": []}
        drop = types.SimpleNamespace(no_drop_caches=cfg["no_drop_caches"])
        for i in range(cfg["pairs"]):
            for path in ("direct", "dcp_cairn")[::1 if i % 2 == 0 else -1]:
                for value in state.values():
                    value.to_local().fill_(SENTINEL)
                if rank == 0:
                    e2e_bench.drop_caches(drop)
                dist.barrier()
                t0 = time.monotonic()
                load(path, cfg, dcp, ckpt, state, 1)
                t1 = time.monotonic()
                out["loads"].append((path, i, t0, t1))
                out["errors"] += verify_state(torch, state, box, rank)[:10]
        ckpt.close()
        leave_ranks(queue, out)
    except BaseException as e:  # pylint: disable=broad-except
        queue.put({"rank": rank, "errors": [f"rank {rank} paired load: {repr(e)[:1000]}"]})
        raise


def paired_loads(args, rows):
    """The DCP adapter's loads against the direct API's, paired (see top):
    4 ranks saving then loading 4 -> 4, then 2 ranks loading 4 rows -> 2
    columns."""
    cairnd = Cairnd(args.build, os.path.join(args.dir, "cairn-paired"))
    spans = {}  # (phase, path, i) -> [min t0, max t1]
    try:
        for phase, world, dim in (("load4", 4, 0), ("load2", 2, 1)):
            cfg = {"coordinator": cairnd.address, "job": "paired", "rows": rows,
                   "pairs": args.pairs, "no_drop_caches": args.no_drop_caches,
                   "dim": dim, "save": phase == "load4"}
            got = spawn_ranks(paired_load_rank, world, (cfg,), args.timeout,
                              f"paired {phase} ({world} ranks)")
            for r in got:
                for path, i, t0, t1 in r["loads"]:
                    span = spans.setdefault((phase, path, i), [t0, t1])
                    span[0], span[1] = min(span[0], t0), max(span[1], t1)
    finally:
        cairnd.close()

    def secs(phase, path, i):
        return spans[(phase, path, i)][1] - spans[(phase, path, i)][0]

    res = {"tool": "paired_load", "pairs": args.pairs}
    for phase in ("load4", "load2"):
        pairs = range(args.pairs)
        res[phase + "_direct_s"] = [secs(phase, "direct", i) for i in pairs]
        res[phase + "_dcp_cairn_s"] = [secs(phase, "dcp_cairn", i) for i in pairs]
        res[phase + "_ratio_median"] = statistics.median(
            secs(phase, "direct", i) / secs(phase, "dcp_cairn", i) for i in pairs)
    return res


# ------------------------------------------------------------- parent side

def rendezvous_store(world):
    """The ranks' rendezvous store, served here on a port the kernel picked
    and held while they run (a port found free and released could be taken
    by another process before rank 0 binds it)."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    return dist.TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)


class Cairnd:
    """A cairnd with a fresh data directory, removed on close."""

    def __init__(self, build, data):
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data)
        self.data = data
        port_file = os.path.join(data, "port")
        self.log = os.path.join(data, "cairnd.log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [os.path.join(build, "server/coordinator/cairnd"), "--listen",
                 "127.0.0.1:0", "--data-dir", os.path.join(data, "d"), "--port-file",
                 port_file, "--log-level", "warn"], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file) and self.proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not os.path.exists(port_file):
            self.close()
            raise RuntimeError(f"cairnd did not start (exit {self.proc.poll()}); "
                               f"see {self.log}")
        self.address = "127.0.0.1:" + open(port_file).read().strip()

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def python_path_run(args, tool, rows, total):
    """One round of a Python path: save and async_save with 4 ranks, then
    each load (load2, load4, async_load) after a page-cache drop."""
    path, threads = tool, None
    if tool.startswith("dcp_fs_t"):
        path, threads = "dcp_fs", int(tool[len("dcp_fs_t"):])
    res = {"tool": tool, "bytes": total}
    if threads is not None:
        res["thread_count"] = threads
    cairnd = None
    fs_dir = os.path.join(args.dir, "dcp_fs")
    shutil.rmtree(fs_dir, ignore_errors=True)
    try:
        cfg = {"rows": rows, "job": "bench-" + path, "fs_dir": fs_dir, "threads": threads}
        if path != "dcp_fs":
            cairnd = Cairnd(args.build, os.path.join(args.dir, "cairn-py"))
            cfg["coordinator"] = cairnd.address
        cold = True
        for phase in PHASES:
            if phase != "save":
                cold = e2e_bench.drop_caches(args) and cold
            got = run_phase(path, phase, cfg, args.timeout)
            res[phase + "_s"] = max(r["t1"] for r in got) - min(r["t0"] for r in got)
            res[phase + "_cairn_s"] = max(r["cairn_s"] for r in got)
            if phase == "save":
                res["rank_bytes"] = max(r["rank_bytes"] for r in got)
                res["memcpy_copy_s"] = max(r["copy_s"] for r in got)
                res["memcpy_clone_s"] = max(r["clone_s"] for r in got)
                res["async_blocked_s"] = max(r["ret"] - r["call"] for r in got)
                res["async_commit_s"] = (max(r["done"] for r in got) -
                                         min(r["call"] for r in got))
        res["cold"] = cold
    finally:
        if cairnd is not None:
            cairnd.close()
        shutil.rmtree(fs_dir, ignore_errors=True)
    for name in PHASES:
        res[name + "_GBps"] = total / res[name + "_s"] / 1e9
    return res


def _stats_s(ckpt):
    st = ckpt.last_stats
    return sum(float(st[k]) for k in ("plan_time", "io_time", "commit_time"))


def small_save_overhead(args):
    """The Python overhead of a save of --small-tensors small tensors (see top)."""
    import cairn  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel
    from cairn import _cairn  # pylint: disable=import-outside-toplevel
    torch.manual_seed(0)
    tensors = {f"model.block{i // 10}.p{i % 10}": torch.randn(256)
               for i in range(args.small_tensors)}
    sd = _cairn.StateDict()
    for name, t in tensors.items():
        sd.add_chunks(name, "float32", [256], [([0], [256], t.data_ptr(), 1024)])
    cairnd = Cairnd(args.build, os.path.join(args.dir, "cairn-small"))
    samples = []  # per pair: (py wall, py stats, raw wall, raw stats)
    try:
        py = cairn.Checkpointer(coordinator=cairnd.address, job="small-py", rank=0,
                                world_size=1)
        raw = _cairn.Checkpointer(cairnd.address, "small-raw", 0, 1)
        for step in range(0, args.small_repeat + 1):  # step 0: warm-up, not counted
            t0 = time.perf_counter()
            py.save(step, tensors)
            py_wall = time.perf_counter() - t0
            py_stats = _stats_s(py)
            t0 = time.perf_counter()
            raw.save(step, sd)
            raw_wall = time.perf_counter() - t0
            if step > 0:
                samples.append((py_wall, py_stats, raw_wall, _stats_s(raw)))
    finally:
        cairnd.close()

    def med(fn):
        return 1e3 * statistics.median(fn(*x) for x in samples)

    return {"tool": "small_save", "tensors": args.small_tensors, "saves": len(samples),
            "py_save_ms": med(lambda pw, ps, rw, rs: pw),
            "py_cairn_ms": med(lambda pw, ps, rw, rs: ps),
            "raw_save_ms": med(lambda pw, ps, rw, rs: rw),
            "raw_cairn_ms": med(lambda pw, ps, rw, rs: rs),
            "overhead_ms": med(lambda pw, ps, rw, rs: (pw - ps) - (rw - rs)),
            "overhead_wall_ms": med(lambda pw, ps, rw, rs: pw - rw)}


def lock_dir(path):
    """An exclusive lock on `path` for this run: two runs on one directory
    would remove each other's data (SystemExit naming the holder)."""
    f = open(os.path.join(path, ".lock"), "a+")  # pylint: disable=consider-using-with
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        sys.exit(f"python_bench: another run (pid {f.read().strip() or '?'}) is "
                 f"using {path}: wait for it, or pass another --dir")
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    return f


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--dir", default="/tmp/cairn-py-bench")
    p.add_argument("--bytes", type=float, default=None, help="default 1.6e9")
    p.add_argument("--repeat", type=int, default=None, help="rounds (default 3)")
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--dcp-threads", default="1,8",
                   help="FileSystemWriter thread_count values, one dcp_fs run each")
    p.add_argument("--skip-limits", action="store_true")
    p.add_argument("--limit-sweep", choices=("full", "quick"), default="full",
                   help="limits.sh's sweep (default full; smoke runs the smoke sweep)")
    p.add_argument("--no-drop-caches", action="store_true")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds each phase's processes may run (default none; 240 smoke)")
    p.add_argument("--small-tensors", type=int, default=1000)
    p.add_argument("--small-repeat", type=int, default=None, help="default 20")
    p.add_argument("--pairs", type=int, default=None,
                   help="paired loads, direct vs DCP adapter (default 6; 0: none)")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.bytes = args.bytes or 2 ** 25
        args.repeat = args.repeat or 1
        args.no_drop_caches = True
        args.timeout = args.timeout or 240
        args.small_repeat = args.small_repeat or 2
        args.pairs = 1 if args.pairs is None else args.pairs
    args.bytes = args.bytes or 1.6e9
    args.repeat = args.repeat or 3
    args.small_repeat = args.small_repeat or 20
    args.pairs = 6 if args.pairs is None else args.pairs
    paths = [x for x in args.paths.split(",") if x]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        p.error(f"unknown paths {unknown} (known: {', '.join(PATHS)})")
    threads = [int(x) for x in args.dcp_threads.split(",") if x]
    if "dcp_fs" in paths and (not threads or min(threads) < 1):
        p.error("--dcp-threads needs thread counts >= 1")
    tools = []
    for path in paths:
        tools += [f"dcp_fs_t{n}" for n in threads] if path == "dcp_fs" else [path]
    fs_tools = [t for t in tools if t.startswith("dcp_fs_t")]
    py_tools = [t for t in tools if t != "cpp"]
    args.build = os.path.abspath(args.build)
    # The staged cairn package (spawned ranks inherit sys.path).
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.makedirs(args.dir, exist_ok=True)
    lock = lock_dir(args.dir)  # noqa: F841  (held until exit)
    # The C++ example's bench:<bytes> model: 8 x rows x 4096 fp32.
    rows = max(int(args.bytes / TENSORS / COLS / 4), 4)
    total = TENSORS * rows * COLS * 4
    model = "bench:%d" % int(args.bytes)
    e2e_args = types.SimpleNamespace(build=args.build, dir=args.dir, timeout=args.timeout,
                                     no_drop_caches=args.no_drop_caches)
    import torch  # pylint: disable=import-outside-toplevel
    loadavg = os.getloadavg()
    print(f"python_bench: {TENSORS} x [{rows}, {COLS}] fp32 = {total} bytes, "
          f"{args.repeat} round(s), torch {torch.__version__}, load average "
          f"{loadavg[0]:.1f}", file=sys.stderr, flush=True)

    nan = float("nan")
    rounds = []
    for i in range(args.repeat):
        print(f"round {i + 1}/{args.repeat}, load average {os.getloadavg()[0]:.1f}",
              file=sys.stderr, flush=True)
        if args.skip_limits:
            limit = {"tool": "limit", "write_GBps": nan, "read_GBps": nan}
        else:
            limit = e2e_bench.run_json(
                [os.path.join(ROOT, "bench/baselines/limits.sh"), args.dir, str(total)],
                timeout=args.timeout,
                env=dict(os.environ, LIMITS_REPEAT="1",
                         LIMITS_SWEEP="smoke" if args.smoke else args.limit_sweep,
                         LIMITS_DROP_CACHES="0" if args.no_drop_caches else "1"))
        print(json.dumps(limit), flush=True)
        got = {"limit": limit}
        order = tools[i % len(tools):] + tools[:i % len(tools)]
        for tool in order:
            if tool == "cpp":
                res = dict(e2e_bench.cairn_run(e2e_args, model, total), tool="cpp")
            else:
                res = python_path_run(args, tool, rows, total)
            res["round"] = i + 1
            res["loadavg"] = os.getloadavg()[0]
            print(json.dumps(res), flush=True)
            got[tool] = res
        rounds.append(got)
    small = small_save_overhead(args)
    print(json.dumps(small), flush=True)
    small_load = small_load_overhead(args)
    print(json.dumps(small_load), flush=True)
    paired = paired_loads(args, rows) if args.pairs > 0 else None
    if paired:
        print(json.dumps(paired), flush=True)
    print_tables(args, rows, total, rounds, tools, fs_tools, py_tools, small,
                 small_load, torch.__version__)
    if paired:
        print()
        print("| paired loads, %.2f GB, the same ranks, %d pairs | direct s | "
              "dcp_cairn s | direct / dcp_cairn time |" % (total / 1e9, paired["pairs"]))
        print("|---|---|---|---|")
        for phase, name in (("load4", "load 4 -> 4"), ("load2", "load 4 rows -> 2 cols")):
            for i in range(paired["pairs"]):
                d = paired[phase + "_direct_s"][i]
                c = paired[phase + "_dcp_cairn_s"][i]
                print("| %s, pair %d | %.3f | %.3f | %.2f |" % (name, i + 1, d, c, d / c))
            print("| **%s: median, the adapter's speed as a share of direct's** | | | "
                  "**%.0f%%** |" % (name, 100 * paired[phase + "_ratio_median"]))


def print_tables(args, rows, total, rounds, tools, fs_tools, py_tools, small,
                 small_load, torch_version):
    """The markdown tables of the run."""
    nan = float("nan")

    def best(tool, key, pick=max):
        vals = [r[tool][key] for r in rounds if tool in r]
        return pick(vals) if vals else nan

    def dcp_best(key):
        return max((best(t, key) for t in fs_tools), default=nan)

    def per_round(fn):
        return ", ".join("%.2f" % fn(r) for r in rounds)

    def dcp_of(r, key):
        return max(r[t][key] for t in fs_tools)

    print()
    print(f"{TENSORS} x [{rows}, {COLS}] fp32 = {total / 1e9:.2f} GB; torch "
          f"{torch_version}; best of {args.repeat} round(s); GB/s = 1e9 bytes/s; "
          f"vs DCP = vs the better of {', '.join(fs_tools) or 'no dcp_fs'}")
    print()
    print("| phase | path | GB/s | vs C++ | per round | vs direct | vs DCP | per round "
          "| vs limit |")
    print("|---|---|---|---|---|---|---|---|---|")
    names = {"save": "save 4 rows", "load2": "load 4 rows -> 2 cols",
             "load4": "load 4 -> 4"}
    for phase, lim_key in (("save", "write_GBps"), ("load2", "read_GBps"),
                           ("load4", "read_GBps")):
        key = phase + "_GBps"
        lim = best("limit", lim_key)
        for tool in tools:
            v = best(tool, key)
            cells = [names[phase], tool, "%.2f" % v]
            if "cpp" in tools:
                cells += ["%.0f%%" % (100 * v / best("cpp", key)),
                          per_round(lambda r, t=tool: r[t][key] / r["cpp"][key])]
            else:
                cells += ["", ""]
            cells.append("%.2f" % (v / best("direct", key)) if "direct" in tools else "")
            if fs_tools:
                cells += ["%.2fx" % (v / dcp_best(key)),
                          per_round(lambda r, t=tool: r[t][key] / dcp_of(r, key))]
            else:
                cells += ["", ""]
            cells.append("%.0f%%" % (100 * v / lim))
            print("| " + " | ".join(cells) + " |")
    if py_tools:
        print()
        print(f"async_save, 4 ranks of {best(py_tools[0], 'rank_bytes') / 1e6:.0f} MB "
              f"each; seconds, best of rounds (the smallest); blocked = call to "
              f"return, max over ranks")
        print()
        print("| path | blocked | per round | copy_ of the rank's bytes | clone | "
              "blocked / copy_ | per round | to committed | per round |")
        print("|---|---|---|---|---|---|---|---|---|")
        for tool in py_tools:
            def ratio(r, t=tool):
                return r[t]["async_blocked_s"] / r[t]["memcpy_copy_s"]
            print("| %s | %.3f | %s | %.3f | %.3f | %.2f | %s | %.2f | %s |" % (
                tool, best(tool, "async_blocked_s", min),
                per_round(lambda r, t=tool: r[t]["async_blocked_s"]),
                best(tool, "memcpy_copy_s", min), best(tool, "memcpy_clone_s", min),
                min(ratio(r) for r in rounds), per_round(ratio),
                best(tool, "async_commit_s", min),
                per_round(lambda r, t=tool: r[t]["async_commit_s"])))
    print()
    print("| small save: %d x 256 fp32, 1 rank, median of %d pairs | ms |" %
          (small["tensors"], small["saves"]))
    print("|---|---|")
    print("| A: cairn.Checkpointer.save(step, dict of tensors), wall | %.2f |" %
          small["py_save_ms"])
    print("| a: of which libcairn's plan + io + commit (last_stats) | %.2f |" %
          small["py_cairn_ms"])
    print("| B: _cairn.Checkpointer.save(step, prebuilt StateDict), wall | %.2f |" %
          small["raw_save_ms"])
    print("| b: of which libcairn's plan + io + commit (last_stats) | %.2f |" %
          small["raw_cairn_ms"])
    print("| **Python overhead** = (A - a) - (B - b) | **%.2f** |" % small["overhead_ms"])
    print("| A - B (includes the two saves' disk time difference) | %.2f |" %
          small["overhead_wall_ms"])
    print()
    print("| small load: %d ranks, %d x [%d, 64] fp32, median of %d | ms |" %
          (small_load["ranks"], small_load["tensors"], small_load["rows"],
           small_load["loads"]))
    print("|---|---|")
    for path in SMALL_LOAD_PATHS:
        print("| %s | %.1f |" % (path, small_load[path + "_ms"]))
    extra = small_load["dcp_cairn_ms"] - small_load["direct_ms"]
    print("| dcp_cairn - direct: the adapter's fixed cost per load | %.1f |" % extra)
    if "direct" in tools:
        for phase in ("load2", "load4"):
            print("| that, as a share of direct's %s (best round) | %.1f%% |" % (
                phase, 100 * extra / 1e3 / best("direct", phase + "_s", min)))


if __name__ == "__main__":
    main()
