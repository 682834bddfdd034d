#!/usr/bin/env python3
"""The machine's storage limit: the best of a sweep of fio and dd configurations.

One limit for every benchmark that compares against the disk (e2e_bench.py,
python_bench.py, storage_bench.sh, through limits.sh or by import): a single
fio configuration is not the disk's limit (Cairn came out at up to 142% of
one), so this tries many ways of moving the same bytes and keeps the fastest.

Each sweep point writes BYTES as fresh files in a fresh directory under DIR
(the directory the benchmark itself uses), durably (fio --end_fsync=1 or dd
conv=fsync, inside the timed part), then drops the page cache (sync; echo 3 >
/proc/sys/vm/drop_caches; needs root) and reads the same files back cold with
the same configuration. Points:

  direct    fio O_DIRECT, libaio: numjobs x iodepth x block size
            full: jobs 1/2/4 x iodepth 1/8/32 x bs 1M/4M/16M (27 points)
  buffered  fio psync through the page cache, fsync at the end; reads use
            fio's default POSIX_FADV_SEQUENTIAL (as Cairn does):
            full: jobs 1/2/4 x bs 1M/4M
  dd        dd bs=1M conv=fsync from /dev/zero, then a cold dd to /dev/null,
            timed around the dd process

Each job of a point writes BYTES / jobs to its own file (the shape of a rank
writing its own object). A point may run at most --runtime seconds per
direction (fio --runtime; dd is not capped): then it moves fewer bytes, and
its read reads only what its write wrote, so that no read is served from
unwritten (zero) extents. For each read the block device's sectors read
(/sys/block/<dev>/stat) are recorded too: a cold read must fetch its bytes
from the device (dev_read / bytes ~= 1), which shows whether a fast read was
really cold.

Sweeps: full (above, ~35 points), quick (11 points: the corners that won on
this VM, the shapes of 1 and 4 ranks, and 8 readers buffered and O_DIRECT
with deep queues), wide (full plus many readers and deeper queues, ~41
points: what a benchmark reruns when some tool beat the limit it had),
smoke (3 tiny points).

The limit is the best point per direction; the winning points are named in
write_point / read_point. GB = 1e9 bytes.

Usage: limit_sweep.py DIR BYTES [--sweep wide|full|quick|smoke] [--runtime S]
                      [--repeat N] [--no-drop-caches]
Prints one JSON line on stdout (diagnostics on stderr):
  {"tool":"limit","write_GBps":..,"read_GBps":..,"write_point":"..","read_point":"..",
   "dd_write_GBps":..,"dd_read_GBps":..,"buffered_write_GBps":..,"buffered_read_GBps":..,
   "direct_write_GBps":..,"direct_read_GBps":..,"points":[{"point":..,"write_GBps":..,
   "read_GBps":..,"write_bytes":..,"read_bytes":..,"read_dev_bytes":..},...],
   "bytes":..,"cold":true|false,"sweep":"..","repeat":N,"seconds":..,"loadavg":L}
As a module: sweep(directory, total_bytes, level="quick", ...) returns that dict.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20

# (kind, jobs, iodepth, block bytes)
FULL = ([("direct", j, q, b * MIB) for j in (1, 2, 4) for q in (1, 8, 32) for b in (1, 4, 16)] +
        [("buffered", j, 1, b * MIB) for j in (1, 2, 4) for b in (1, 4)] +
        [("dd", 1, 1, MIB)])
QUICK = [("direct", 1, 8, 4 * MIB), ("direct", 1, 32, 16 * MIB), ("direct", 2, 8, 16 * MIB),
         ("direct", 4, 8, 4 * MIB), ("direct", 4, 32, 16 * MIB), ("direct", 4, 1, 16 * MIB),
         ("buffered", 1, 1, MIB), ("buffered", 4, 1, MIB), ("dd", 1, 1, MIB)]
# What the fastest tools do beyond both: many readers through the page cache
# (readahead per file) and O_DIRECT with deep queues over many files.
# Included in quick; "wide" is full plus these, the sweep e2e_bench reruns
# in a round where some tool beat its limit.
DEEP = [("direct", 8, 32, 16 * MIB), ("buffered", 8, 1, 4 * MIB)]
WIDE = FULL + DEEP + [("direct", 16, 32, 16 * MIB), ("direct", 8, 64, 4 * MIB),
                      ("buffered", 16, 1, 4 * MIB), ("buffered", 4, 1, 16 * MIB)]
QUICK = QUICK + DEEP
SMOKE = [("direct", 2, 8, MIB), ("buffered", 1, 1, MIB), ("dd", 1, 1, MIB)]
LEVELS = {"wide": WIDE, "full": FULL, "quick": QUICK, "smoke": SMOKE}
# Seconds per point and direction.
RUNTIME = {"wide": 4.0, "full": 4.0, "quick": 3.0, "smoke": 2.0}


def log(msg):
    print("[limit_sweep] " + msg, file=sys.stderr, flush=True)


def point_name(kind, jobs, iodepth, block):
    if kind == "dd":
        return "dd bs=%dM" % (block // MIB)
    if kind == "buffered":
        return "fio buffered psync, %d job%s, bs %dM" % (jobs, "s" if jobs > 1 else "",
                                                        block // MIB)
    return "fio O_DIRECT libaio, %d job%s, iodepth %d, bs %dM" % (
        jobs, "s" if jobs > 1 else "", iodepth, block // MIB)


def block_device(path):
    """The /sys/block name of the disk holding `path` (its whole disk, not a
    partition), or None."""
    dev = os.stat(path).st_dev
    sys_dev = "/sys/dev/block/%d:%d" % (os.major(dev), os.minor(dev))
    try:
        real = os.path.realpath(sys_dev)
    except OSError:
        return None
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    name = os.path.basename(real)
    return name if os.path.exists("/sys/block/%s/stat" % name) else None


def device_read_bytes(dev):
    """Bytes read from block device `dev` so far (sectors of 512 bytes), or -1."""
    if dev is None:
        return -1
    with open("/sys/block/%s/stat" % dev) as f:
        return int(f.read().split()[2]) * 512


def drop_caches(enabled):
    """sync, then drop the page cache; False when that was not done."""
    os.sync()
    if not enabled:
        return False
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        log("WARNING: cannot drop the page cache (not root?): reads are NOT cold")
        return False


def run_fio(work, rw, kind, jobs, iodepth, block, per_job, runtime):
    """One fio run; returns (bytes moved, GB/s) summed over its jobs."""
    cmd = ["fio", "--name=sweep", "--directory=" + work, "--filename_format=pt.$jobnum",
           "--rw=" + rw, "--numjobs=%d" % jobs, "--size=%d" % per_job, "--bs=%d" % block,
           "--runtime=%g" % runtime, "--output-format=json"]
    if kind == "direct":
        cmd += ["--direct=1", "--ioengine=libaio", "--iodepth=%d" % iodepth]
    else:
        cmd += ["--direct=0", "--ioengine=psync"]
    if rw == "write":
        cmd += ["--end_fsync=1"]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    res = json.loads(out[out.index("{"):])["jobs"]
    moved = sum(j[rw]["io_bytes"] for j in res)
    # fio's job runtime includes the end fsync; the jobs run together, so the
    # slowest job's runtime is the time the whole point took.
    ms = max(j[rw]["runtime"] for j in res)
    if moved <= 0 or ms <= 0:
        raise RuntimeError("fio moved no bytes: " + " ".join(cmd))
    return moved, moved / (ms / 1e3) / 1e9, [j[rw]["io_bytes"] for j in res]


def run_point(work, point, total, runtime, drop, dev):
    """Write then cold-read one sweep point in the empty directory `work`."""
    kind, jobs, iodepth, block = point
    per_job = max(block, total // jobs // block * block)
    res = {"point": point_name(*point)}
    cold = True
    if kind == "dd":
        path = os.path.join(work, "dd.dat")
        count = max(1, total // block)
        t0 = time.monotonic()
        subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=%d" % block,
                        "count=%d" % count, "conv=fsync", "status=none"], check=True)
        t1 = time.monotonic()
        res["write_bytes"] = count * block
        res["write_GBps"] = count * block / (t1 - t0) / 1e9
        cold = drop_caches(drop)
        d0 = device_read_bytes(dev)
        t0 = time.monotonic()
        subprocess.run(["dd", "if=" + path, "of=/dev/null", "bs=%d" % block, "status=none"],
                       check=True)
        t1 = time.monotonic()
        res["read_bytes"] = count * block
        res["read_GBps"] = count * block / (t1 - t0) / 1e9
    else:
        moved, gbps, per = run_fio(work, "write", kind, jobs, iodepth, block, per_job, runtime)
        res["write_bytes"], res["write_GBps"] = moved, gbps
        # Read only what every job wrote (a capped write leaves fallocated,
        # unwritten extents, which read as zeros without touching the disk).
        read_per_job = max(block, min(per) // block * block)
        cold = drop_caches(drop)
        d0 = device_read_bytes(dev)
        moved, gbps, _ = run_fio(work, "read", kind, jobs, iodepth, block, read_per_job,
                                 runtime)
        res["read_bytes"], res["read_GBps"] = moved, gbps
    d1 = device_read_bytes(dev)
    res["read_dev_bytes"] = d1 - d0 if d0 >= 0 else -1
    return res, cold


def sweep(directory, total_bytes, level="quick", runtime=None, repeat=1, drop=True):
    """Runs the sweep in a fresh subdirectory of `directory`; returns the JSON dict."""
    points = LEVELS[level]
    runtime = runtime or RUNTIME[level]
    total = max(MIB, int(total_bytes) // MIB * MIB)
    loadavg = os.getloadavg()[0]
    parent = tempfile.mkdtemp(prefix="cairn-limit-sweep.", dir=directory)
    dev = block_device(parent)
    start = time.monotonic()
    results, cold = [], True
    try:
        for r in range(repeat):
            for p in points:
                work = os.path.join(parent, "p")
                shutil.rmtree(work, ignore_errors=True)
                os.makedirs(work)
                res, c = run_point(work, p, total, runtime, drop, dev)
                cold = cold and c
                shutil.rmtree(work, ignore_errors=True)
                log("%d/%d %-52s write %.3f read %.3f GB/s (device read %.2fx)" % (
                    r + 1, repeat, res["point"], res["write_GBps"], res["read_GBps"],
                    res["read_dev_bytes"] / res["read_bytes"]))
                results.append(dict(res, kind=p[0]))
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    out = {"tool": "limit"}
    for d in ("write", "read"):
        top = max(results, key=lambda x: x[d + "_GBps"])
        out[d + "_GBps"] = round(top[d + "_GBps"], 4)
        out[d + "_point"] = top["point"]
        for kind in ("direct", "buffered", "dd"):
            vals = [x[d + "_GBps"] for x in results if x["kind"] == kind]
            out["%s_%s_GBps" % (kind, d)] = round(max(vals), 4) if vals else None
    for x in results:
        del x["kind"]
        for d in ("write", "read"):
            x[d + "_GBps"] = round(x[d + "_GBps"], 4)
    out.update(points=results, bytes=total, cold=cold, sweep=level, runtime_s=runtime,
               repeat=repeat, seconds=round(time.monotonic() - start, 1),
               loadavg=round(loadavg, 2), device=dev)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir")
    p.add_argument("bytes", type=float)
    p.add_argument("--sweep", choices=sorted(LEVELS), default="quick")
    p.add_argument("--runtime", type=float, default=None,
                   help="seconds per point and direction (default: full 4, quick 3, smoke 2)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--no-drop-caches", action="store_true")
    args = p.parse_args()
    for tool in ("fio", "dd"):
        if shutil.which(tool) is None:
            sys.exit("%s not found: run bench/baselines/install.sh" % tool)
    if not os.path.isdir(args.dir):
        sys.exit("DIR %s is not a directory" % args.dir)
    print(json.dumps(sweep(args.dir, args.bytes, args.sweep, args.runtime, args.repeat,
                           not args.no_drop_caches)), flush=True)


if __name__ == "__main__":
    main()
