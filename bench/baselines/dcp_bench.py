#!/usr/bin/python3
"""PyTorch 1.13 distributed-checkpoint (DCP) baseline for Cairn's save/load benchmark.

Scenario (issue 5 item 6), all ranks on this machine, gloo on CPU, spawned with
torch.multiprocessing:

  a) save:  --save-ranks (4) ranks save --tensors (8) 2-D fp32 ShardedTensors, each
            row-sharded (ChunkShardingSpec dim 0) over the ranks, with
            torch.distributed._shard.checkpoint.save_state_dict and
            FileSystemWriter(DIR/save, sync_files=True) (one file per write item, fsync'd;
            --single-file-per-rank for one file per rank).
  b) load2: drop the page cache, then --reshard-ranks (2) ranks load the checkpoint into
            ShardedTensors sharded by the OTHER dim (dim 1): a resharding load.
  c) load4: drop the page cache, then --save-ranks ranks load it back row-sharded.
Or, with --save-layout SPEC --load-layout SPEC (cairn_train_example's layout syntax,
e.g. 8:S0 -> 3:S1, or a 2-D mesh 2x2:S0,S1 -> 1x3:S0,S1; torch.chunk rules, the
ShardedTensors built from an EnumerableShardingSpec): save, then one phase "load".

Every loaded value is checked bit-exactly against the deterministic fill

    value(t, i) = float32(((i * 2654435761) + t * 40503) mod 2**24)

where t is the tensor's index in the state dict and i the element's row-major index in
the global [rows, cols] tensor (integers below 2**24 are exact in fp32). Load targets are
pre-filled with -1.0, which the fill never produces, so an unloaded element fails the check.

Timing of a phase: every rank builds its tensors, joins a barrier, then reads a
system-wide monotonic clock (t0) and runs the save/load, then reads the clock again (t1).
The phase time is max(t1) - min(t0): from the first rank starting to the last rank done,
excluding process spawn, process-group set-up, tensor allocation/fill and verification.
GB/s uses GB = 1e9 bytes of tensor payload (the "bytes" field). The *_io_bytes fields are
the sums over ranks of /proc/self/io write_bytes (save) or read_bytes (loads) across the
timed region: bytes that actually hit the block layer (reads served by the page cache do
not count). The *_syscall_bytes fields sum wchar / rchar instead: bytes passed through
write/read system calls of any kind (files, and gloo's sockets too), which shows read
amplification that the shared page cache hides from *_io_bytes.

Prints exactly one JSON line on stdout, e.g.
  {"tool":"pytorch_dcp","save_s":..,"save_GBps":..,"load2_s":..,"load2_GBps":..,
   "load4_s":..,"load4_GBps":..,"bytes":..,...}
Diagnostics go to stderr. Exit status is non-zero if any verification fails.

PyTorch 1.13's sharded_tensor/metadata.py does not import on Python 3.11
(`field(default=TensorProperties())` is a mutable dataclass default); a sys.meta_path import
hook below patches the source at import time to `field(default_factory=TensorProperties)`.
System files are never edited.

Run with the project environment: .venv/bin/python bench/baselines/dcp_bench.py --help
"""

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import shutil
import sys
import tempfile
import time

# --- Import fix for PyTorch 1.13 on Python 3.11 (must run before torch._shard imports). ---

_PATCHED_MODULE = "torch.distributed._shard.sharded_tensor.metadata"
_BAD = "field(default=TensorProperties())"
_GOOD = "field(default_factory=TensorProperties)"


class _PatchingLoader(importlib.machinery.SourceFileLoader):
    """Compiles the module from patched source (never from, or into, the .pyc cache)."""

    def get_code(self, fullname):
        source = self.get_data(self.path).decode("utf-8")
        source = source.replace(_BAD, _GOOD)
        return compile(source, self.path, "exec", dont_inherit=True)


class _MetadataFixFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _PATCHED_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        spec.loader = _PatchingLoader(fullname, spec.origin)
        return spec


if not any(isinstance(f, _MetadataFixFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MetadataFixFinder())

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed._shard import sharded_tensor  # noqa: E402
from torch.distributed._shard.checkpoint import (  # noqa: E402
    FileSystemReader,
    FileSystemWriter,
    load_state_dict,
    save_state_dict,
)
from torch.distributed._shard.sharding_spec import (  # noqa: E402
    ChunkShardingSpec,
    EnumerableShardingSpec,
    ShardMetadata,
)

_FILL_MULT = 2654435761
_FILL_TENSOR_STRIDE = 40503
_FILL_MASK = (1 << 24) - 1
_SENTINEL = -1.0
_FILL_BLOCK_ELEMS = 1 << 22  # generate/verify in blocks of ~4M elements (bounded temp memory)


def log(msg):
    print(f"[dcp_bench] {msg}", file=sys.stderr, flush=True)


def fqn(t):
    return f"layer{t}.weight"


def expected_block(t, row0, nrows, col0, ncols, global_cols):
    """Expected fp32 values of global rows [row0, row0+nrows) x cols [col0, col0+ncols)."""
    rows = torch.arange(row0, row0 + nrows, dtype=torch.int64).unsqueeze(1)
    cols = torch.arange(col0, col0 + ncols, dtype=torch.int64).unsqueeze(0)
    idx = rows * global_cols + cols
    idx.mul_(_FILL_MULT).add_(t * _FILL_TENSOR_STRIDE).bitwise_and_(_FILL_MASK)
    return idx.to(torch.float32)


def for_each_row_block(shard_meta, cols_total, fn):
    """Calls fn(local_row_start, nrows, global_row0, col0, ncols) over blocks of a shard."""
    row0, col0 = shard_meta.shard_offsets
    nrows, ncols = shard_meta.shard_sizes
    step = max(1, _FILL_BLOCK_ELEMS // max(1, ncols))
    for r in range(0, nrows, step):
        n = min(step, nrows - r)
        fn(r, n, row0 + r, col0, ncols)


def parse_layout(spec):
    """'2x2:S0,S1' -> ([2, 2], [0, 1]): the mesh shape and, per mesh dim, the
    tensor dim it shards (Cairn's cairn_train_example --layout syntax, shards
    only)."""
    mesh, _, placements = spec.partition(":")
    shape = [int(d) for d in mesh.split("x")]
    dims = []
    for p in placements.split(","):
        if len(p) < 2 or p[0] != "S" or not p[1:].isdigit():
            raise SystemExit(f"layout '{spec}': only shard placements (S0, S1) are supported")
        dims.append(int(p[1:]))
    if len(dims) != len(shape) or min(shape) < 1:
        raise SystemExit(f"layout '{spec}': one placement per mesh dim is required")
    return shape, dims


def layout_boxes(spec, sizes):
    """Per rank (row-major over the mesh) the (offsets, sizes) it holds under
    `spec`, with torch.chunk rules applied in mesh-dim order as DTensor (and
    Cairn's planner/layout.h) does."""
    shape, dims = parse_layout(spec)
    boxes = []
    for rank in range(prod(shape)):
        coords, rest = [], rank
        for n in reversed(shape):
            coords.append(rest % n)
            rest //= n
        coords.reverse()
        off, size = [0] * len(sizes), list(sizes)
        for c, n, d in zip(coords, shape, dims):
            piece = -(-size[d] // n)
            lo = min(size[d], c * piece)
            off[d] += lo
            size[d] = min(size[d], lo + piece) - lo
        boxes.append((off, size))
    return boxes


def prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


def sharding_spec(args, world, shard_dim, layout):
    if layout is None:
        return ChunkShardingSpec(
            dim=shard_dim, placements=[f"rank:{r}/cpu" for r in range(world)]
        )
    return EnumerableShardingSpec([
        ShardMetadata(shard_offsets=off, shard_sizes=size, placement=f"rank:{r}/cpu")
        for r, (off, size) in enumerate(layout_boxes(layout, [args.rows, args.cols]))
    ])


def make_state_dict(args, world, shard_dim, fill, layout=None):
    """Creates the ShardedTensors for this rank; fill=True writes the pattern, else -1.0.
    Sharded by `layout` (e.g. '2x2:S0,S1') if given, else by `shard_dim` over `world`."""
    spec = sharding_spec(args, world, shard_dim, layout)
    state = {}
    for t in range(args.tensors):
        st = sharded_tensor.empty(spec, args.rows, args.cols, dtype=torch.float32)
        for shard in st.local_shards():
            local = shard.tensor
            if not fill:
                local.fill_(_SENTINEL)
                continue

            def write(r, n, g_row0, col0, ncols, local=local, t=t):
                local[r : r + n].copy_(
                    expected_block(t, g_row0, n, col0, ncols, args.cols)
                )

            for_each_row_block(shard.metadata, args.cols, write)
        state[fqn(t)] = st
    return state


def verify_state_dict(args, state, rank):
    """Returns a list of error strings (empty if every local element is bit-exact)."""
    errors = []
    for t in range(args.tensors):
        st = state[fqn(t)]
        for shard in st.local_shards():
            local = shard.tensor
            meta = shard.metadata

            def check(r, n, g_row0, col0, ncols, local=local, t=t, meta=meta):
                got = local[r : r + n]
                want = expected_block(t, g_row0, n, col0, ncols, args.cols)
                if not torch.equal(got.view(torch.int32), want.view(torch.int32)):
                    bad = (got.view(torch.int32) != want.view(torch.int32)).nonzero()
                    lr, lc = bad[0].tolist()
                    errors.append(
                        f"rank {rank} fqn {fqn(t)} shard offsets {meta.shard_offsets} "
                        f"sizes {meta.shard_sizes}: {bad.shape[0]} mismatches in rows "
                        f"[{g_row0},{g_row0 + n}); first at global ({g_row0 + lr},"
                        f"{col0 + lc}) got {got[lr, lc].item()} want {want[lr, lc].item()}"
                    )

            for_each_row_block(meta, args.cols, check)
    return errors


def proc_io(field):
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, v = line.split(":")
                if k.strip() == field:
                    return int(v)
    except OSError:
        pass
    return -1


def rank_main(rank, world, phase, args, port, result_queue):
    try:
        torch.set_num_threads(args.threads)
        # run_phase serves the rendezvous store (rendezvous_store).
        store = dist.TCPStore("127.0.0.1", port, world, False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        ckpt = os.path.join(args.dir, "save")

        if phase == "save":
            state = make_state_dict(args, world, shard_dim=0, fill=True,
                                    layout=args.save_layout)
            io_field, call_field = "write_bytes", "wchar"
        else:
            shard_dim = 1 if phase == "load2" else 0
            state = make_state_dict(args, world, shard_dim=shard_dim, fill=False,
                                    layout=args.load_layout if phase == "load" else None)
            io_field, call_field = "read_bytes", "rchar"

        dist.barrier()
        io0, call0 = proc_io(io_field), proc_io(call_field)
        t0 = time.monotonic()
        if phase == "save":
            save_state_dict(
                state,
                FileSystemWriter(
                    ckpt, single_file_per_rank=args.single_file_per_rank, sync_files=True
                ),
            )
        else:
            load_state_dict(state, FileSystemReader(ckpt))
        t1 = time.monotonic()
        io1, call1 = proc_io(io_field), proc_io(call_field)

        errors = []
        if phase != "save" and not args.no_verify:
            errors = verify_state_dict(args, state, rank)[:10]  # small: fits the pipe
        dist.barrier()
        dist.destroy_process_group()
        result_queue.put(
            {
                "rank": rank,
                "t0": t0,
                "t1": t1,
                "io": (io1 - io0) if io0 >= 0 and io1 >= 0 else -1,
                "calls": (call1 - call0) if call0 >= 0 and call1 >= 0 else -1,
                "errors": errors,
            }
        )
    except Exception as e:  # report to the parent, then re-raise so spawn fails loudly
        result_queue.put({"rank": rank, "errors": [f"rank {rank} {phase}: {e!r}"]})
        raise


def rendezvous_store(world):
    """The ranks' rendezvous store, served here on a port the kernel picked
    and held while they run (a port found free and released could be taken
    by another process before rank 0 binds it)."""
    return dist.TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        log(f"WARNING: could not drop the page cache ({e}); the load is NOT cold")
        return False


def run_phase(phase, world, args):
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    store = rendezvous_store(world)
    port = store.port
    log(f"{phase}: spawning {world} ranks (port {port})")
    mp.spawn(rank_main, args=(world, phase, args, port, queue), nprocs=world, join=True)
    results = [queue.get() for _ in range(world)]
    errors = [e for r in results for e in r["errors"]]
    if errors:
        for e in errors[:20]:
            log(f"VERIFY FAILED: {e}")
        raise SystemExit(f"{phase}: {len(errors)} errors")
    seconds = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    io = {}
    for key in ("io", "calls"):
        io[key] = sum(r[key] for r in results) if all(r[key] >= 0 for r in results) else -1
    log(f"{phase}: {seconds:.3f} s, {args.bytes / seconds / 1e9:.3f} GB/s, io {io['io']} bytes, syscalls {io['calls']} bytes")
    return seconds, io


def choose_shape(total_bytes, tensors, world_a, world_b):
    """Rows and cols so that tensors * rows * cols * 4 ~= total_bytes, evenly shardable."""
    per_tensor = max(1, int(total_bytes) // 4 // tensors)
    cols = 4096
    while cols > 8 and per_tensor // cols < 4 * world_a * world_b:
        cols //= 2
    rows_unit = world_a * world_b
    rows = max(rows_unit, (per_tensor // cols) // rows_unit * rows_unit)
    return rows, cols


def parse_args():
    p = argparse.ArgumentParser(
        description="PyTorch 1.13 DCP save / resharded load baseline (prints one JSON line)."
    )
    p.add_argument("--total-bytes", type=float, default=1.6e9,
                   help="approximate fp32 payload of the state dict (default 1.6e9)")
    p.add_argument("--dir", default=None,
                   help="work directory; the checkpoint goes to DIR/save, which must be "
                        "absent or empty (default: a new directory under /tmp)")
    p.add_argument("--tensors", type=int, default=8, help="number of 2-D tensors (default 8)")
    p.add_argument("--cols", type=int, default=0,
                   help="columns per tensor (default: chosen from --total-bytes)")
    p.add_argument("--save-ranks", type=int, default=4,
                   help="ranks that save and that load back row-sharded (default 4)")
    p.add_argument("--reshard-ranks", type=int, default=2,
                   help="ranks of the resharded (dim 1) load (default 2)")
    p.add_argument("--save-layout", default=None,
                   help="save sharded by this layout instead of rows over --save-ranks, in "
                        "cairn_train_example's syntax: 'N:S0' (rows over N ranks), "
                        "'AxB:S0,S1' (a 2-D mesh); needs --load-layout")
    p.add_argument("--load-layout", default=None,
                   help="with --save-layout: the scenario is save, then ONE load (phase "
                        "'load', page cache dropped) into this layout, e.g. '1x3:S0,S1'")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads per rank (default: max(1, cpus // ranks))")
    p.add_argument("--single-file-per-rank", action="store_true",
                   help="FileSystemWriter(single_file_per_rank=True): one file per rank "
                        "instead of PyTorch 1.13's default of one file per tensor shard")
    p.add_argument("--no-verify", action="store_true", help="skip the bit-exact check")
    p.add_argument("--no-drop-caches", action="store_true",
                   help="do not drop the page cache before the loads (warm loads)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the whole scenario N times; each phase reports its best run")
    p.add_argument("--keep", action="store_true", help="keep DIR/save after the run")
    return p.parse_args()


def main():
    args = parse_args()
    if (args.save_layout is None) != (args.load_layout is None):
        raise SystemExit("--save-layout and --load-layout go together")
    phases = (("load2", args.reshard_ranks), ("load4", args.save_ranks))
    if args.save_layout:
        args.save_ranks = prod(parse_layout(args.save_layout)[0])
        args.reshard_ranks = prod(parse_layout(args.load_layout)[0])
        phases = (("load", args.reshard_ranks),)
    if min(args.tensors, args.save_ranks, args.reshard_ranks, args.repeat) < 1:
        raise SystemExit("--tensors, --save-ranks, --reshard-ranks and --repeat must be >= 1")
    rows, cols = choose_shape(args.total_bytes, args.tensors, args.save_ranks, args.reshard_ranks)
    if args.cols > 0:
        cols = args.cols
        unit = args.save_ranks * args.reshard_ranks
        rows = max(unit, int(args.total_bytes) // 4 // args.tensors // cols // unit * unit)
    args.rows, args.cols = rows, cols
    args.bytes = args.tensors * rows * cols * 4
    if args.threads <= 0:
        ncpu = os.cpu_count() or 1
        args.threads = max(1, ncpu // args.save_ranks)

    own_dir = args.dir is None
    if own_dir:
        args.dir = tempfile.mkdtemp(prefix="cairn-dcp-bench-", dir="/tmp")
    args.dir = os.path.abspath(args.dir)
    ckpt = os.path.join(args.dir, "save")
    if os.path.isdir(ckpt) and os.listdir(ckpt):
        raise SystemExit(f"{ckpt} exists and is not empty; pass an empty --dir")
    os.makedirs(args.dir, exist_ok=True)
    log(f"torch {torch.__version__}; {args.tensors} tensors of [{rows}, {cols}] fp32 = "
        f"{args.bytes} bytes; checkpoint in {ckpt}; {args.threads} thread(s)/rank")

    loadavg = os.getloadavg()[0]  # before we start: a hint of concurrent load
    cold = not args.no_drop_caches
    samples = {"save": [], **{phase: [] for phase, _ in phases}}
    io = {}
    try:
        for run in range(args.repeat):
            if run > 0:
                shutil.rmtree(ckpt, ignore_errors=True)
            log(f"run {run + 1}/{args.repeat}")
            seconds, io["save"] = run_phase("save", args.save_ranks, args)
            samples["save"].append(seconds)
            for phase, world in phases:
                if cold:
                    cold = drop_caches()
                seconds, io[phase] = run_phase(phase, world, args)
                samples[phase].append(seconds)
        files = os.listdir(ckpt)
        ckpt_bytes = sum(os.path.getsize(os.path.join(ckpt, f)) for f in files)
    finally:
        if not args.keep:
            shutil.rmtree(ckpt, ignore_errors=True)
            if own_dir:
                shutil.rmtree(args.dir, ignore_errors=True)

    # With --repeat N, each phase reports its best (shortest) run: the baseline's best case.
    gb = args.bytes / 1e9
    out = {"tool": "pytorch_dcp"}
    for phase in samples:
        best = min(samples[phase])
        out[f"{phase}_s"] = round(best, 4)
        out[f"{phase}_GBps"] = round(gb / best, 4)
    out.update({
        "bytes": args.bytes,
        "tensors": args.tensors,
        "shape": [rows, cols],
        "save_ranks": args.save_ranks,
        "reshard_ranks": args.reshard_ranks,
        "checkpoint_bytes": ckpt_bytes,
        "checkpoint_files": len(files),
        **{f"{phase}_io_bytes": io[phase]["io"] for phase in samples},
        **{f"{phase}_syscall_bytes": io[phase]["calls"] for phase in samples},
        "save_layout": args.save_layout,
        "load_layout": args.load_layout,
        "repeat": args.repeat,
        "samples_s": {k: [round(x, 4) for x in v] for k, v in samples.items()},
        "single_file_per_rank": args.single_file_per_rank,
        "cold": cold,
        "loadavg": round(loadavg, 2),
        "verified": not args.no_verify,
        "torch": torch.__version__,
    })
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
