#!/usr/bin/python3
"""Python benchmark: Cairn from Python vs Cairn from C++ vs PyTorch DCP vs the machine.

One run, same machine, same state in every path: 8 fp32 matrices
"model.layers.<t>.weight" of [rows, 4096] (rows = bytes / 8 / 4096 / 4, the C++
example's `bench:<bytes>` model; ~1.6 GB by default),
  save   4 ranks, rows sharded (torch.chunk rules, ShardedTensor
         ChunkShardingSpec(dim=0) in Python, layout 4:S0 in C++), every byte
         durable and committed
  load2  page cache dropped, 2 ranks sharded by columns (dim 1 / 2:S1): a
         resharding load; every loaded byte is checked bit-exactly afterwards
through four paths:
  direct    cairn.Checkpointer(...).save(1, state) / .load(state, step=1): the
            Python direct API with a dict of ShardedTensors
  dcp_cairn torch 1.13 DCP save_state_dict / load_state_dict with
            cairn.torch.CairnStorageWriter / CairnStorageReader
  cpp       the C++ example (cairn_train_example, one process per rank), run
            by bench/e2e_bench.py's own cairn_run (imported, not copied); it
            also runs its load2_whole and load4, reported in the JSON only
  dcp_fs    torch 1.13 DCP with its own FileSystemWriter(sync_files=True) /
            FileSystemReader
Every Python path's ranks are spawned processes (torch.multiprocessing, gloo);
a phase is timed from a barrier to the last rank done: max(t1) - min(t0),
excluding process start, tensor fill and verification. The C++ path's times
are e2e_bench's (from libcairn's stats: first plan to last commit / last byte
in place), which leaves out the process's own set-up, so the Python / C++
ratios are, if anything, pessimistic for Python. The Python paths' JSON also
carries libcairn's own stats time (direct_save_cairn_s: plan + io + commit of
the slowest rank) for comparison.

Rounds are interleaved because this VM's disk drifts by 2x within minutes:
each of --repeat rounds measures the limit (bench/baselines/limits.sh, as
e2e_bench does) and then runs every path once, the four paths in a rotating
order. Each path's figure is its best round; the table also gives the
per-round ratios.

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

Usage: bench/python_bench.py [--build build] [--dir /tmp/cairn-py-bench]
       [--bytes 1.6e9] [--repeat 3] [--no-drop-caches] [--skip-limits]
       [--paths direct,dcp_cairn,cpp,dcp_fs] [--timeout S]
       bench/python_bench.py --smoke [--build build] [--dir DIR]
Run as root (sudo) for cold loads; without root the loads are warm (a
warning says so). Prints one JSON line per path and round, then markdown
tables. Exits non-zero when any path fails or a loaded byte differs.

--smoke (ctest label bench-smoke): 32 MiB, one round, no page-cache drop,
every path and the small-tensor save once; numbers are meaningless.

Benchmarks never assert times.
"""

import argparse
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
COLS = 4096
TENSORS = 8
SENTINEL = -1.0


def fqn(t):
    return f"model.layers.{t}.weight"


# ------------------------------------------------------------- rank side

def _rank_imports():
    """torch, cairn and DCP, imported in the rank processes only (cairn first:
    it makes torch 1.13's sharded tensors importable on Python 3.11)."""
    import cairn  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    import torch  # pylint: disable=import-outside-toplevel
    return torch


def expected_block(torch, t, row0, nrows, col0, ncols):
    """The fill: float32(((i * 2654435761) + t * 40503) mod 2**24) of global
    element i (exact in fp32), for rows [row0, +nrows) x cols [col0, +ncols);
    the load targets hold -1.0, which the fill never produces."""
    rows = torch.arange(row0, row0 + nrows, dtype=torch.int64).unsqueeze(1)
    cols = torch.arange(col0, col0 + ncols, dtype=torch.int64).unsqueeze(0)
    idx = rows * COLS + cols
    idx.mul_(2654435761).add_(t * 40503).bitwise_and_((1 << 24) - 1)
    return idx.to(torch.float32)


def _row_blocks(meta, fn):
    row0, col0 = meta.shard_offsets
    nrows, ncols = meta.shard_sizes
    step = max(1, (1 << 22) // max(1, ncols))
    for r in range(0, nrows, step):
        fn(r, min(step, nrows - r), row0 + r, col0, ncols)


def make_state(torch, rows, world, dim, fill):
    """This rank's dict of ShardedTensors, sharded over `world` ranks by `dim`."""
    from torch.distributed._shard import sharded_tensor  # pylint: disable=import-outside-toplevel
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec  # pylint: disable=import-outside-toplevel
    spec = ChunkShardingSpec(dim=dim, placements=[f"rank:{r}/cpu" for r in range(world)])
    state = {}
    for t in range(TENSORS):
        st = sharded_tensor.empty(spec, rows, COLS, dtype=torch.float32)
        for shard in st.local_shards():
            local = shard.tensor
            if not fill:
                local.fill_(SENTINEL)
                continue

            def write(r, n, g_row0, col0, ncols, local=local, t=t):
                local[r:r + n].copy_(expected_block(torch, t, g_row0, n, col0, ncols))

            _row_blocks(shard.metadata, write)
        state[fqn(t)] = st
    return state


def verify_state(torch, state, rank):
    """Error strings naming rank, fqn and the first differing element."""
    errors = []
    for t in range(TENSORS):
        for shard in state[fqn(t)].local_shards():
            local, meta = shard.tensor, shard.metadata

            def check(r, n, g_row0, col0, ncols, local=local, t=t, meta=meta):
                got = local[r:r + n].view(torch.int32)
                want = expected_block(torch, t, g_row0, n, col0, ncols).view(torch.int32)
                if not torch.equal(got, want):
                    bad = (got != want).nonzero()
                    lr, lc = bad[0].tolist()
                    errors.append(
                        f"rank {rank} fqn {fqn(t)} shard {meta.shard_offsets}+"
                        f"{meta.shard_sizes}: {bad.shape[0]} elements differ, first at "
                        f"({g_row0 + lr}, {col0 + lc}): got "
                        f"{local[r + lr, lc].item()} want {float(want[lr, lc].view(torch.float32))}")

            _row_blocks(meta, check)
    return errors


def rank_main(rank, world, path, phase, cfg, port, queue):
    """One rank of one phase of one path; reports timing and errors to `queue`."""
    try:
        torch = _rank_imports()
        import cairn  # pylint: disable=import-outside-toplevel
        import torch.distributed as dist  # pylint: disable=import-outside-toplevel
        from torch.distributed._shard import checkpoint as dcp  # pylint: disable=import-outside-toplevel
        torch.set_num_threads(1)
        # run_phase serves the rendezvous store (rendezvous_store).
        store = dist.TCPStore("127.0.0.1", port, world, False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        save = phase == "save"
        state = make_state(torch, cfg["rows"], world, 0 if save else 1, fill=save)
        ckpt = None
        if path == "direct":
            ckpt = cairn.Checkpointer(coordinator=cfg["coordinator"], job=cfg["job"],
                                      rank=rank, world_size=world)
        dist.barrier()
        t0 = time.monotonic()
        stats = {}
        if path == "direct":
            if save:
                ckpt.save(1, state)
            else:
                ckpt.load(state, step=1)
            stats = dict(ckpt.last_stats)
        elif path == "dcp_cairn":
            from cairn.torch import CairnStorageReader, CairnStorageWriter  # pylint: disable=import-outside-toplevel
            if save:
                w = CairnStorageWriter(cfg["coordinator"], cfg["job"], step=1)
                dcp.save_state_dict(state, w)
                stats = dict(w.last_stats)
            else:
                dcp.load_state_dict(state, CairnStorageReader(cfg["coordinator"],
                                                              cfg["job"], step=1))
        else:  # dcp_fs
            if save:
                dcp.save_state_dict(state, dcp.FileSystemWriter(cfg["fs_dir"],
                                                                sync_files=True))
            else:
                dcp.load_state_dict(state, dcp.FileSystemReader(cfg["fs_dir"]))
        t1 = time.monotonic()
        errors = [] if save else verify_state(torch, state, rank)[:10]
        dist.barrier()
        dist.destroy_process_group()
        cairn_s = sum(float(stats.get(k, 0.0)) for k in ("plan_time", "io_time",
                                                         "commit_time"))
        queue.put({"rank": rank, "t0": t0, "t1": t1, "cairn_s": cairn_s,
                   "errors": errors})
    except BaseException as e:  # pylint: disable=broad-except
        queue.put({"rank": rank,
                   "errors": [f"rank {rank} {path} {phase}: {repr(e)[:1000]}"]})
        raise


def run_phase(path, phase, world, cfg, timeout):
    """Spawns `world` ranks; returns (seconds, slowest libcairn time)."""
    import torch.multiprocessing as mp  # pylint: disable=import-outside-toplevel
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    store = rendezvous_store(world)
    port = store.port
    procs = [ctx.Process(target=rank_main, args=(r, world, path, phase, cfg, port, queue))
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
        raise RuntimeError(f"{path} {phase} ({world} ranks) failed:\n  " +
                           "\n  ".join(errors or ["a rank reported nothing"]))
    seconds = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    return seconds, max(r["cairn_s"] for r in results)


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


def python_path_run(args, path, rows, total):
    """One round of a Python path: save with 4 ranks, drop caches, load2."""
    res = {"tool": path, "bytes": total}
    cairnd = None
    fs_dir = os.path.join(args.dir, "dcp_fs")
    shutil.rmtree(fs_dir, ignore_errors=True)
    try:
        cfg = {"rows": rows, "job": "bench-" + path, "fs_dir": fs_dir}
        if path != "dcp_fs":
            cairnd = Cairnd(args.build, os.path.join(args.dir, "cairn-py"))
            cfg["coordinator"] = cairnd.address
        res["save_s"], res["save_cairn_s"] = run_phase(path, "save", 4, cfg, args.timeout)
        res["cold"] = e2e_bench.drop_caches(args)
        res["load2_s"], res["load2_cairn_s"] = run_phase(path, "load2", 2, cfg, args.timeout)
    finally:
        if cairnd is not None:
            cairnd.close()
        shutil.rmtree(fs_dir, ignore_errors=True)
    for name in ("save", "load2"):
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--dir", default="/tmp/cairn-py-bench")
    p.add_argument("--bytes", type=float, default=None, help="default 1.6e9")
    p.add_argument("--repeat", type=int, default=None, help="rounds (default 3)")
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--skip-limits", action="store_true")
    p.add_argument("--no-drop-caches", action="store_true")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds each phase's processes may run (default none; 240 smoke)")
    p.add_argument("--small-tensors", type=int, default=1000)
    p.add_argument("--small-repeat", type=int, default=None, help="default 20")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.bytes = args.bytes or 2 ** 25
        args.repeat = args.repeat or 1
        args.no_drop_caches = True
        args.timeout = args.timeout or 240
        args.small_repeat = args.small_repeat or 2
    args.bytes = args.bytes or 1.6e9
    args.repeat = args.repeat or 3
    args.small_repeat = args.small_repeat or 20
    paths = [x for x in args.paths.split(",") if x]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        p.error(f"unknown paths {unknown} (known: {', '.join(PATHS)})")
    args.build = os.path.abspath(args.build)
    # The staged cairn package (spawned ranks inherit sys.path).
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.makedirs(args.dir, exist_ok=True)
    # The C++ example's bench:<bytes> model: 8 x rows x 4096 fp32.
    rows = max(int(args.bytes / TENSORS / COLS / 4), 4)
    total = TENSORS * rows * COLS * 4
    model = "bench:%d" % int(args.bytes)
    e2e_args = types.SimpleNamespace(build=args.build, dir=args.dir, timeout=args.timeout,
                                     no_drop_caches=args.no_drop_caches)
    loadavg = os.getloadavg()
    print(f"python_bench: {TENSORS} x [{rows}, {COLS}] fp32 = {total} bytes, "
          f"{args.repeat} round(s), load average {loadavg[0]:.1f}", file=sys.stderr,
          flush=True)

    nan = float("nan")
    rounds = []
    for i in range(args.repeat):
        print(f"round {i + 1}/{args.repeat}", file=sys.stderr, flush=True)
        if args.skip_limits:
            limit = {"tool": "limit", "write_GBps": nan, "read_GBps": nan}
        else:
            limit = e2e_bench.run_json(
                [os.path.join(ROOT, "bench/baselines/limits.sh"), args.dir, str(total)],
                timeout=args.timeout,
                env=dict(os.environ, LIMITS_REPEAT="1",
                         LIMITS_SWEEP="smoke" if args.smoke else "full",
                         LIMITS_DROP_CACHES="0" if args.no_drop_caches else "1"))
        print(json.dumps(limit), flush=True)
        got = {"limit": limit}
        order = paths[i % len(paths):] + paths[:i % len(paths)]
        for path in order:
            if path == "cpp":
                res = dict(e2e_bench.cairn_run(e2e_args, model, total), tool="cpp")
            else:
                res = python_path_run(args, path, rows, total)
            print(json.dumps(res), flush=True)
            got[path] = res
        rounds.append(got)
    small = small_save_overhead(args)
    print(json.dumps(small), flush=True)

    def best(path, key):
        vals = [r[path][key] for r in rounds if path in r]
        return max(vals) if vals else nan

    def ratios(a, b, key):
        return ", ".join("%.2f" % (r[a][key] / r[b][key]) for r in rounds
                         if a in r and b in r)

    print()
    print(f"{TENSORS} x [{rows}, {COLS}] fp32 = {total / 1e9:.2f} GB; best of "
          f"{args.repeat} round(s); GB/s = 1e9 bytes/s")
    print()
    print("| phase | path | GB/s | vs C++ | per round | vs DCP FileSystem | per round "
          "| vs limit |")
    print("|---|---|---|---|---|---|---|---|")
    for phase, lim_key in (("save", "write_GBps"), ("load2", "read_GBps")):
        key = phase + "_GBps"
        lim = best("limit", lim_key)
        for path in paths:
            v = best(path, key)
            vs_cpp = v / best("cpp", key) if "cpp" in paths else nan
            vs_fs = v / best("dcp_fs", key) if "dcp_fs" in paths else nan
            print("| %s | %s | %.2f | %.0f%% | %s | %.2fx | %s | %.0f%% |" % (
                phase, path, v, 100 * vs_cpp,
                ratios(path, "cpp", key) if "cpp" in paths else "",
                vs_fs, ratios(path, "dcp_fs", key) if "dcp_fs" in paths else "",
                100 * v / lim))
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


if __name__ == "__main__":
    main()
