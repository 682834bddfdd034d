"""The scenario every peer benchmark (bench/baselines/<peer>_bench.py) runs.

A peer is another checkpoint library measured on the same bytes, layouts and
disk as Cairn (bench/e2e_bench.py runs them in its interleaved rounds). Each
peer module defines a few functions (below) and calls `main(sys.modules[
__name__])`; this module does the rest: the ranks, the state, the timing,
the page-cache drops, the element-by-element check and the one JSON line.

State: 8 fp32 matrices "model.layers.<t>.weight" of [rows, 4096] (the C++
example's `bench:<bytes>` model, python_bench's DTensor state, built by
python_bench.make_state: DTensors on a 1-D gloo DeviceMesh, torch.chunk
rules), rows = --total-bytes / 8 / 4096 / 4 rounded down to a multiple of 8
(so every layout splits evenly; bench/e2e_bench.py rounds its bytes the same
way, so Cairn, DCP and the peers hold the same tensors). Values are
python_bench's fill, float32(((i * 2654435761) + t * 40503) mod 2**24) of
the global row-major element index i; load targets start at -1.0.

Phases (ranks spawned per phase with torch.multiprocessing, gloo on CPU):
  save   4 ranks, rows sharded (Shard(0)), step 1
  load2  page cache dropped, 2 ranks by columns (Shard(1)): resharded load
  load4  page cache dropped, 4 ranks by rows (Shard(0))
With --async MODE (for peers with an async save): instead of save, phase
"async": 4 ranks async-save step 2 and then step 3 (the first call pays any
one-time set-up, such as DCP's checkpoint process in PROCESS mode; the
second is the steady state), each time overwriting the tensors as soon as
the call returns, as training does; then load4 loads step 3, which shows the
snapshot was whole when the call returned. Reported per call: blocked (call
to return, max over ranks) and durable (call to the future's result on the
last rank, max(done) - min(call)).
A phase's time runs from the first rank leaving a barrier (after spawn,
process-group set-up, tensor fill and the peer's untimed prepare) to the
last rank returning from save/load: max(t1) - min(t0). Every loaded element
is compared bit-exactly afterwards (not timed); the run fails otherwise.

Output: one JSON line on stdout, tool = the peer's name, fields as
dcp_bench.py's: save_s save_GBps load2_s load2_GBps load4_s load4_GBps bytes
shape tensors cold verified torch samples_s loadavg, *_io_bytes and
*_syscall_bytes (sums over ranks of /proc/self/io write_bytes/read_bytes and
wchar/rchar during the timed part), plus the peer's own fields (version,
settings). A peer that cannot run prints {"tool": NAME, "skipped": REASON}
with a one-line reason and exits 0 with --allow-skip (e2e_bench passes it),
else 2.

Peer module interface (rank side unless noted; ctx is a RankCtx):
  NAME                       the tool name's prefix
  add_args(parser)           peer options (parent side; optional)
  probe(args) -> str | None  why the peer cannot run here, one line (parent)
  tool_name(args) -> str     e.g. "dcp_t4" (optional; default NAME)
  info(args) -> dict         fields for the JSON line (parent; optional)
  prepare(ctx)               untimed, before the barrier (optional)
  save(ctx, step)            durable save of ctx.state
  save_unmeasured(args) -> str | None   why the save phase only stages the
                             checkpoint for the loads by other means (its
                             time is then not reported; parent; optional)
  load(ctx, step) -> dict    fqn -> local tensor holding what was loaded
  async_save(ctx, step)      -> object with .result() (optional)
  finish(ctx)                after the timed part, before exit (optional)
  cleanup(args)              remove what the run stored (parent; optional)
"""

import argparse
import importlib
import json
import os
import shutil
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import python_bench  # noqa: E402  (the state, the fill; stdlib imports only)

TENSORS = python_bench.TENSORS
COLS = python_bench.COLS
SENTINEL = python_bench.SENTINEL
fqn = python_bench.fqn
# Phase -> (ranks, sharded dim).
LAYOUT = {"save": (4, 0), "async": (4, 0), "load2": (2, 1), "load4": (4, 0)}


def rows_for(total_bytes):
    """Rows of each [rows, 4096] fp32 matrix: a multiple of 8, at least 8."""
    return max(int(total_bytes / TENSORS / COLS / 4) // 8 * 8, 8)


def log(msg):
    print(f"[peer_harness] {msg}", file=sys.stderr, flush=True)


class RankCtx:
    """What a peer's rank-side functions get."""

    def __init__(self, args, rank, world, dim, rows, mesh, state, box):
        self.args = args          # the parsed options (a Namespace)
        self.rank = rank
        self.world = world
        self.dim = dim            # the sharded tensor dim of this phase
        self.rows = rows
        self.cols = COLS
        self.mesh = mesh          # the 1-D gloo DeviceMesh of the ranks
        self.state = state        # fqn -> DTensor [rows, cols], Shard(dim)
        self.box = box            # (row0, nrows, col0, ncols) of this rank
        self.peer = {}            # the peer's own scratch (prepare -> save/load)

    def locals(self):
        return {name: t.to_local() for name, t in self.state.items()}

    def path(self, step):
        """A fresh directory per step under --dir for file-system peers."""
        return os.path.join(self.args.dir, "ckpt", str(step))


def fill(torch, tensors, box):
    """Writes the expected values into fqn -> local tensor `tensors`."""
    for t in range(TENSORS):
        local = tensors[fqn(t)]

        def write(r, n, g_row0, col0, ncols, local=local, t=t):
            local[r:r + n].copy_(python_bench.expected_block(torch, t, g_row0, n, col0,
                                                             ncols))

        python_bench._row_blocks(box, write)  # pylint: disable=protected-access


def verify(torch, tensors, box, rank):
    """Error strings naming rank, fqn and the first differing element."""
    errors = []
    for t in range(TENSORS):
        local = tensors.get(fqn(t))
        if local is None:
            errors.append(f"rank {rank} fqn {fqn(t)}: not loaded")
            continue
        if tuple(local.shape) != (box[1], box[3]):
            errors.append(f"rank {rank} fqn {fqn(t)}: loaded shape {tuple(local.shape)}, "
                          f"want {(box[1], box[3])}")
            continue

        def check(r, n, g_row0, col0, ncols, local=local, t=t):
            got = local[r:r + n].contiguous().view(torch.int32)
            want = python_bench.expected_block(torch, t, g_row0, n, col0, ncols)
            want = want.view(torch.int32)
            if not torch.equal(got, want):
                bad = (got != want).nonzero()
                lr, lc = bad[0].tolist()
                errors.append(
                    f"rank {rank} fqn {fqn(t)} box rows {box[0]}+{box[1]} cols "
                    f"{box[2]}+{box[3]}: {bad.shape[0]} elements differ, first at "
                    f"({g_row0 + lr}, {col0 + lc}): got "
                    f"{local[r + lr, lc].item()} want "
                    f"{float(want[lr, lc].view(torch.float32))}")

        python_bench._row_blocks(box, check)  # pylint: disable=protected-access
    return errors


def proc_io():
    out = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, v = line.split(":")
                out[k.strip()] = int(v)
    except OSError:
        pass
    return out


def rank_main(module, phase, rank, world, args, port, queue):
    """One rank of one phase; reports timing and errors to `queue`."""
    try:
        # Its own process group: a rank killed on timeout takes the
        # processes it started (a peer's writer processes) with it.
        os.setpgrp()
        peer = importlib.import_module(module)
        import torch  # pylint: disable=import-outside-toplevel
        import torch.distributed as dist  # pylint: disable=import-outside-toplevel
        from torch.distributed.device_mesh import init_device_mesh  # pylint: disable=import-outside-toplevel
        torch.set_num_threads(args.threads)
        # DCP's PROCESS-mode checkpointer and others rendezvous on MASTER_ADDR.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        store = dist.TCPStore("127.0.0.1", port, world, False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        mesh = init_device_mesh("cpu", (world,))
        _, dim = LAYOUT[phase]
        writes = phase in ("save", "async")
        state, box = python_bench.make_state(torch, mesh, args.rows, world, dim, rank,
                                             fill=writes)
        ctx = RankCtx(args, rank, world, dim, args.rows, mesh, state, box)
        if hasattr(peer, "prepare"):
            peer.prepare(ctx)
        out = {"rank": rank, "errors": []}
        dist.barrier()
        io0 = proc_io()
        out["t0"] = time.monotonic()
        loaded = None
        if phase == "save":
            peer.save(ctx, 1)
        elif phase == "async":
            calls = []
            for step in (2, 3):
                if step == 3:
                    fill(torch, ctx.locals(), box)  # training wrote new values back
                dist.barrier()
                t_call = time.monotonic()
                fut = peer.async_save(ctx, step)
                t_ret = time.monotonic()
                for value in ctx.locals().values():
                    value.fill_(SENTINEL)  # training goes on
                fut.result()
                calls.append((t_call, t_ret, time.monotonic()))
            out["calls"] = calls
        else:
            loaded = peer.load(ctx, 3 if args.async_mode else 1)
        out["t1"] = time.monotonic()
        io1 = proc_io()
        if writes:
            out["io"] = io1.get("write_bytes", -1) - io0.get("write_bytes", 0)
            out["sys"] = io1.get("wchar", -1) - io0.get("wchar", 0)
        else:
            out["io"] = io1.get("read_bytes", -1) - io0.get("read_bytes", 0)
            out["sys"] = io1.get("rchar", -1) - io0.get("rchar", 0)
        if loaded is not None and not args.no_verify:
            out["errors"] = verify(torch, loaded, box, rank)[:10]
        if hasattr(peer, "finish"):
            peer.finish(ctx)
        dist.barrier()
        dist.destroy_process_group()
        queue.put(out)
    except BaseException as e:  # pylint: disable=broad-except
        queue.put({"rank": rank, "errors": [f"rank {rank} {phase}: {repr(e)[:1000]}"]})
        raise


def run_phase(module, phase, args):
    """Spawns the phase's ranks; returns their reports."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    import torch.multiprocessing as mp  # pylint: disable=import-outside-toplevel
    world = LAYOUT[phase][0]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    # Served here on a port the kernel picked, held while the ranks run.
    store = dist.TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)
    procs = [ctx.Process(target=rank_main,
                         args=(module, phase, r, world, args, store.port, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    for p in procs:
        p.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                p.kill()
            p.join()
    results = []
    while not queue.empty():
        results.append(queue.get())
    errors = [e for r in results for e in r["errors"]]
    if hung:
        errors.append(f"ranks {hung} still running after {args.timeout} s: killed")
    failed = [r for r, p in enumerate(procs) if p.exitcode != 0 and r not in hung]
    if failed:
        errors.append(f"ranks {failed} exited {[procs[r].exitcode for r in failed]}")
    if errors or len(results) != world:
        raise RuntimeError(f"{phase} ({world} ranks) failed: " +
                           " | ".join(errors or ["a rank reported nothing"]))
    return results


def drop_caches(args):
    if args.no_drop_caches:
        return False
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        log(f"warning: cannot drop the page cache ({e}); the load is warm")
        return False


def one_line(text):
    return " ".join(str(text).split())[:400]


def main(peer):
    p = argparse.ArgumentParser(description=(peer.__doc__ or "").split("\n")[0])
    p.add_argument("--dir", default="/tmp/cairn-peer-bench",
                   help="scratch and file-system checkpoints (emptied at the end)")
    p.add_argument("--total-bytes", type=float, default=1.6e9)
    p.add_argument("--repeat", type=int, default=1,
                   help="run the scenario N times; each phase reports its best")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads per rank (default max(1, cpus // 4))")
    p.add_argument("--no-drop-caches", action="store_true")
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds a phase's ranks may run (default none)")
    p.add_argument("--allow-skip", action="store_true",
                   help="exit 0 when the peer cannot run here (the JSON line says why)")
    if hasattr(peer, "ASYNC_MODES"):
        p.add_argument("--async", dest="async_mode", choices=peer.ASYNC_MODES,
                       default=None, help="measure async_save in this mode instead of save")
    if hasattr(peer, "add_args"):
        peer.add_args(p)
    args = p.parse_args()
    if not hasattr(args, "async_mode"):
        args.async_mode = None
    tool = peer.tool_name(args) if hasattr(peer, "tool_name") else peer.NAME
    reason = peer.probe(args) if hasattr(peer, "probe") else None
    if reason:
        print(json.dumps({"tool": tool, "skipped": one_line(reason)}), flush=True)
        sys.exit(0 if args.allow_skip else 2)
    args.save_unmeasured = None
    if hasattr(peer, "save_unmeasured") and not args.async_mode:
        args.save_unmeasured = peer.save_unmeasured(args)
        if args.save_unmeasured:
            args.save_unmeasured = one_line(args.save_unmeasured)
            log(f"{tool}: save not measured: {args.save_unmeasured}")
    args.dir = os.path.abspath(args.dir)
    args.rows = rows_for(args.total_bytes)
    total = TENSORS * args.rows * COLS * 4
    if args.threads <= 0:
        args.threads = max(1, (os.cpu_count() or 1) // 4)
    import torch  # pylint: disable=import-outside-toplevel
    module = peer.__name__
    if module == "__main__":  # the ranks import the peer by its file's name
        module = os.path.splitext(os.path.basename(peer.__file__))[0]
        sys.path.insert(0, os.path.dirname(os.path.abspath(peer.__file__)))
    phases = ("async", "load4") if args.async_mode else ("save", "load2", "load4")
    log(f"{tool}: torch {torch.__version__}, {TENSORS} x [{args.rows}, {COLS}] fp32 = "
        f"{total} bytes, phases {', '.join(phases)}")
    loadavg = os.getloadavg()[0]
    samples = {ph: [] for ph in phases}
    io, calls = {}, []
    cold = not args.no_drop_caches
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    try:
        for run in range(args.repeat):
            for phase in phases:
                if phase.startswith("load") and cold:
                    cold = drop_caches(args)
                got = run_phase(module, phase, args)
                samples[phase].append(max(r["t1"] for r in got) - min(r["t0"] for r in got))
                io[phase] = (sum(r["io"] for r in got), sum(r["sys"] for r in got))
                if phase == "async":
                    calls.append([(max(r["calls"][i][1] - r["calls"][i][0] for r in got),
                                   max(r["calls"][i][2] for r in got) -
                                   min(r["calls"][i][0] for r in got)) for i in range(2)])
                log(f"{tool} run {run + 1} {phase}: {samples[phase][-1]:.3f} s")
            if hasattr(peer, "cleanup"):
                peer.cleanup(args)
            if run + 1 < args.repeat:
                shutil.rmtree(args.dir, ignore_errors=True)
                os.makedirs(args.dir)
    except Exception as e:  # pylint: disable=broad-except
        if hasattr(peer, "cleanup"):
            peer.cleanup(args)
        print(json.dumps({"tool": tool, "error": one_line(e)}), flush=True)
        sys.exit(1)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    out = {"tool": tool}
    for phase in phases:
        out[phase + "_io_bytes"], out[phase + "_syscall_bytes"] = io[phase]
        if phase == "async":  # two calls: their own fields below
            continue
        if phase == "save" and args.save_unmeasured:
            out["save_unmeasured"] = args.save_unmeasured
            continue
        best = min(samples[phase])
        out[phase + "_s"] = round(best, 4)
        out[phase + "_GBps"] = round(total / best / 1e9, 4)
    if calls:
        # Best (smallest) of the runs, per call.
        for i, name in ((0, "async_first"), (1, "async")):
            out[name + "_blocked_s"] = round(min(c[i][0] for c in calls), 4)
            out[name + "_durable_s"] = round(min(c[i][1] for c in calls), 4)
        out["async_mode"] = args.async_mode
    out.update({"bytes": total, "tensors": TENSORS, "shape": [args.rows, COLS],
                "repeat": args.repeat, "cold": cold, "verified": not args.no_verify,
                "torch": torch.__version__, "threads": args.threads,
                "samples_s": {k: [round(x, 4) for x in v] for k, v in samples.items()},
                "loadavg": round(loadavg, 2)})
    if hasattr(peer, "info"):
        out.update(peer.info(args))
    print(json.dumps(out), flush=True)
