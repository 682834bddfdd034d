#!/usr/bin/env python3
"""End-to-end save/load benchmark: Cairn vs PyTorch DCP vs the machine's limit.

One run, same machine, same data (~1.6 GB fp32 in 8 matrices of 4096 columns):
  save   4 ranks, rows sharded (dim 0), every byte durable (fsync) and committed
  load2  page cache dropped, load into 2 ranks sharded by columns (resharding),
         every partly read chunk verified collectively (cairnd combines the
         ranks' crc32c terms): each rank reads only the bytes it needs
  load2_whole  the same, each partly read chunk read whole and checked locally
  load4  page cache dropped, load back into 4 ranks by rows
Cairn runs real processes: cairnd plus one cairn_train_example per rank, which
checks every loaded byte bit-exactly. Times are collective: a save runs from
the plan barrier (BeginSave answered) to the commit being acknowledged; a load
from PlanLoad to the last byte in place; the slowest rank counts.

Usage: bench/e2e_bench.py [--build build] [--dir /tmp/cairn-bench] [--bytes 1.6e9]
       [--repeat 2] [--skip-dcp] [--skip-limits]
Prints one JSON line per tool and a markdown table of ratios.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        print("warning: cannot drop the page cache; loads are warm", file=sys.stderr)
        return False


def run_json(cmd, **kw):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, **kw).stdout
    lines = [l for l in out.splitlines() if l.startswith("{")]
    return json.loads(lines[-1])


def run_ranks(rank_bin, addr, job, world, model, layout, extra):
    procs = []
    for r in range(world):
        cmd = [rank_bin, "--coordinator", addr, "--job", job, "--rank", str(r),
               "--world-size", str(world), "--model", model, "--layout", layout,
               "--json"] + extra
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    stats = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"rank exited {p.returncode}: {out}")
        stats.append([json.loads(l) for l in out.splitlines() if l.startswith("{")])
    return stats


def cairn_run(args, model, total_bytes):
    cairnd = os.path.join(args.build, "server/coordinator/cairnd")
    rank_bin = os.path.join(args.build, "client/examples/cairn_train_example")
    data = os.path.join(args.dir, "cairn")
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)
    port_file = os.path.join(data, "port")
    log = open(os.path.join(data, "cairnd.log"), "w")
    d = subprocess.Popen([cairnd, "--listen", "127.0.0.1:0", "--data-dir", data,
                          "--port-file", port_file, "--log-level", "warn"],
                         stdout=log, stderr=log)
    try:
        for _ in range(200):
            if os.path.exists(port_file):
                break
            time.sleep(0.05)
        addr = "127.0.0.1:" + open(port_file).read().strip()
        res = {"tool": "cairn", "bytes": total_bytes}
        samples = {"save": [], "load2": [], "load2_whole": [], "load4": []}
        storage_bytes, block_bytes, syscall_bytes, by_cairnd = {}, {}, {}, {}
        for i in range(args.repeat):
            step = str(i + 1)
            s = run_ranks(rank_bin, addr, "bench", 4, model, "4:S0",
                          ["--save-steps", step])
            # Collective save time: barrier release -> commit acknowledged.
            samples["save"].append(min(x[0]["plan_s"] for x in s) +
                                   max(x[0]["io_s"] + x[0]["commit_s"] for x in s))
            for name, world, layout, extra in (
                    ("load2", 2, "2:S1", []),
                    ("load2_whole", 2, "2:S1", ["--partial-check", "whole"]),
                    ("load4", 4, "4:S0", [])):
                res["cold"] = drop_caches()
                l = run_ranks(rank_bin, addr, "bench", world, model, layout,
                              ["--load", step] + extra)
                samples[name].append(max(x[0]["plan_s"] + x[0]["io_s"] for x in l))
                storage_bytes[name] = sum(x[0]["storage_bytes"] for x in l)
                block_bytes[name] = sum(x[0]["block_read_bytes"] for x in l)
                syscall_bytes[name] = sum(x[0]["syscall_read_bytes"] for x in l)
                by_cairnd[name] = sum(x[0]["chunks_verified_by_cairnd"] for x in l)
                res[name + "_needed_bytes"] = sum(x[0]["bytes"] for x in l)
        for k, v in samples.items():
            res[k + "_s"] = min(v)
            res[k + "_GBps"] = total_bytes / min(v) / 1e9
            res[k + "_samples_s"] = v
        for k, v in storage_bytes.items():
            res[k + "_storage_bytes"] = v
            res[k + "_block_read_bytes"] = block_bytes[k]
            res[k + "_syscall_read_bytes"] = syscall_bytes[k]
            res[k + "_chunks_verified_by_cairnd"] = by_cairnd[k]
        return res
    finally:
        d.terminate()
        d.wait()
        shutil.rmtree(data, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--dir", default="/tmp/cairn-e2e-bench")
    p.add_argument("--bytes", type=float, default=1.6e9)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--skip-dcp", action="store_true")
    p.add_argument("--skip-limits", action="store_true",
                   help="for quick iterations: no fio run, ratios are nan")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    model = "bench:%d" % int(args.bytes)
    # The bytes the synthetic model really holds: 8 x rows x 4096 fp32.
    rows = max(int(args.bytes / 8 / 4096 / 4), 4)
    total = 8 * rows * 4096 * 4

    if args.skip_limits:
        limit = {"tool": "limit", "write_GBps": float("nan"), "read_GBps": float("nan")}
    else:
        limit = run_json([os.path.join(ROOT, "bench/baselines/limits.sh"), args.dir,
                          str(int(total))],
                         env=dict(os.environ, LIMITS_REPEAT=str(args.repeat)))
    print(json.dumps(limit), flush=True)
    dcp = None
    if not args.skip_dcp:
        dcp = run_json(["/usr/bin/python3", os.path.join(ROOT, "bench/baselines/dcp_bench.py"),
                        "--dir", os.path.join(args.dir, "dcp"), "--total-bytes",
                        str(total), "--repeat", str(args.repeat)])
        print(json.dumps(dcp), flush=True)
    cairn = cairn_run(args, model, total)
    print(json.dumps(cairn), flush=True)

    w, r = limit["write_GBps"], limit["read_GBps"]
    print()
    print("| phase | Cairn GB/s | DCP GB/s | Cairn / DCP | limit GB/s | Cairn / limit "
          "| bytes read / needed: requested, syscalls, block device |")
    print("|---|---|---|---|---|---|---|")
    for name, lim, dcp_key in (("save", w, "save"), ("load2", r, "load2"),
                               ("load2_whole", r, "load2"), ("load4", r, "load4")):
        c = cairn[name + "_GBps"]
        d = dcp[dcp_key + "_GBps"] if dcp else float("nan")
        ratio = ""
        if name != "save":
            need = cairn[name + "_needed_bytes"]
            ratio = "%.2f, %.2f, %.2f" % (cairn[name + "_storage_bytes"] / need,
                                          cairn[name + "_syscall_read_bytes"] / need,
                                          cairn[name + "_block_read_bytes"] / need)
        print("| %s | %.2f | %.2f | %.2fx | %.2f | %.0f%% | %s |" %
              (name, c, d, c / d if dcp else float("nan"), lim, 100 * c / lim, ratio))


if __name__ == "__main__":
    main()
