#!/usr/bin/env python3
"""End-to-end save/load benchmark: Cairn vs PyTorch DCP vs the machine's limit.

One run, same machine, same data (~1.6 GB fp32 in 8 matrices of 4096 columns):
  save   4 ranks, rows sharded (dim 0), every byte durable (fsync) and committed
  load2  page cache dropped, load into 2 ranks sharded by columns (resharding),
         every partly read chunk verified collectively (cairnd combines the
         ranks' crc32c terms): each rank reads only the bytes it needs
  load2_whole  the same, each partly read chunk read whole and checked locally
  load4  page cache dropped, load back into 4 ranks by rows
and the reshard shapes of SHAPES (--shapes), each its own save and load:
  rows 2 -> columns 4, rows 8 -> columns 3, 2-D mesh 2x2 (S0,S1) -> 4x1 and -> 1x3
Layouts are cairn_train_example's --layout MESH:PLACEMENTS (DTensor rules,
planner/layout.h); dcp_bench.py builds the same ones as ShardedTensors.
Cairn runs real processes: cairnd plus one cairn_train_example per rank, which
checks every loaded byte bit-exactly. Times are collective: a save runs from
the plan barrier (BeginSave answered) to the commit being acknowledged; a load
from PlanLoad to the last byte in place; the slowest rank counts. Every load
row reports bytes read / bytes needed summed over ranks: requested from
storage (Cairn's stats), through read syscalls (/proc/<pid>/io rchar) and from
the block device (/proc/<pid>/io read_bytes); for DCP the last two.

The limit is the best point of bench/baselines/limit_sweep.py (fio O_DIRECT
over jobs x iodepth x block size, fio buffered + fsync, dd; durable writes of
the same total bytes to fresh files in --dir, cold reads of them), run every
round (--limit-sweep quick|full|wide, default full); the tables name the
winning points. A limit some tool beats (Cairn, the baseline build, DCP or a
peer, in either direction) is not the machine's: that round reruns the wide
sweep (full plus many readers and deeper queues) at once and keeps the higher
limit per direction, saying what beat the first one; a result above even the
wide sweep's limit is printed as a WARNING naming the round, tool and phase.

This VM's disk is shared and its speed drifts by 2x within minutes, so the
tools are interleaved: each of --repeat rounds runs the limit sweep, then
DCP, then Cairn, every phase once. Each tool's figure is its best round; the
table also gives the per-round ratios (same minutes, same disk). The run
fails if a ratio it should print is missing.

The peers (bench/baselines/<peer>_bench.py, one JSON line each, the same
bytes and layouts, every loaded element checked) run in the same rounds,
after DCP and before Cairn: DCP of the pinned torch through dcp.save /
dcp.load with FileSystemWriter(sync_files=True) at thread_count 1, 4 and 8
(dcp_t1, dcp_t4, dcp_t8), dcp.async_save in THREAD and PROCESS modes
(dcp_async_thread, dcp_async_process: blocked and durable time), Megatron-
Core's dist_checkpointing (megatron) and ByteCheckpoint (bytecheckpoint),
the last two from their own environments .venv-peers/<peer> that
bench/baselines/install.sh makes. A second table gives Cairn against the
best peer of each phase and every peer's own figure; a peer that cannot run
(not installed, or failing) is listed with its one-line reason.
s3torchconnector is an S3 client: bench/s3_bench.py runs it on radosgw.
The tensors are 8 x [rows, 4096] fp32 with rows rounded down to a multiple
of 8, so that every tool's layouts split evenly (--bytes is rounded so).

Usage: bench/e2e_bench.py [--build build] [--dir /tmp/cairn-bench] [--bytes 1.6e9]
       [--repeat 2] [--skip-dcp] [--skip-limits] [--limit-sweep quick|full]
       [--shapes NAME,...] [--no-drop-caches] [--timeout S]
       [--peers all|none|smoke|NAME,...]
       [--baseline-build OTHER_BUILD] [--tls]
       bench/e2e_bench.py --smoke [--tls] [--build build] [--dir DIR]
Prints one JSON line per tool and markdown tables of ratios.

--baseline-build DIR also runs Cairn from another build tree (e.g. the commit before a
refactor) in every round, alternating which of the two goes first, and prints a second
table: this build / baseline, best of rounds and per round. That is how a change is shown
to cost nothing beyond noise: same run, same minutes, same disk.

--tls also runs Cairn with cairnd serving mutual TLS (certificates made by
tests/testing/make_test_certs.sh; the ranks get them through CAIRN_TLS_CA,
CAIRN_TLS_CERT, CAIRN_TLS_KEY) in every round, alternating which of plaintext
and TLS goes first, and prints a table TLS / plaintext. Only the control path
(ranks <-> cairnd) is encrypted: data goes from the ranks to storage directly.

--smoke checks in seconds that everything still runs end to end (ctest label
bench-smoke): 32 MiB, one round, no page-cache drop (it would disturb every
other test on the machine), the tiny "smoke" limit sweep, each process killed
after --timeout (default 120 s in smoke mode) so a hang fails instead of
blocking; no peers unless --peers is given (--peers smoke: dcp_t1,
dcp_async_thread, megatron and bytecheckpoint, at whatever --bytes says;
ctest's bench_smoke.e2e_peers runs that at 1 MiB); DCP runs (only the 2x2 -> 1x3 shape, for time) only if
the interpreter running this script can import torch (the project
environment .venv has it), and is skipped with a notice otherwise. Cairn's part (cairnd, the saves, every load with its
bit-exact checks, every shape) and the limit always run. Numbers are
meaningless.
Dropping the page cache needs root; without it the loads are warm (a warning
says so).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "baselines"))
import limit_sweep  # noqa: E402  (the shared limit sweep)


def drop_caches(args):
    if args.no_drop_caches:
        return False
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        print("warning: cannot drop the page cache; loads are warm", file=sys.stderr)
        return False


def run_json(cmd, timeout=None, **kw):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True,
                         timeout=timeout, **kw).stdout
    lines = [l for l in out.splitlines() if l.startswith("{")]
    return json.loads(lines[-1])


def run_ranks(rank_bin, addr, job, world, model, layout, extra, timeout=None,
              env=None):
    procs = []
    for r in range(world):
        cmd = [rank_bin, "--coordinator", addr, "--job", job, "--rank", str(r),
               "--world-size", str(world), "--model", model, "--layout", layout,
               "--json"] + extra
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                                      env=env))
    stats = []
    deadline = None if timeout is None else time.monotonic() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(
                timeout=None if deadline is None else max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
                q.wait()
            raise RuntimeError(f"ranks of job {job} ({layout}, {extra}) still running "
                               f"after {timeout} s: killed")
        if p.returncode != 0:
            raise RuntimeError(f"rank exited {p.returncode}: {out}")
        stats.append([json.loads(l) for l in out.splitlines() if l.startswith("{")])
    return stats


def start_cairnd(cairnd, data, flags=(), env=None):
    """cairnd on 127.0.0.1 (a free port) with --data-dir `data` (emptied
    first) and `flags`; returns (process, "127.0.0.1:PORT"). Its log is
    data/cairnd.log."""
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)
    port_file = os.path.join(data, "port")
    log = open(os.path.join(data, "cairnd.log"), "w")
    d = subprocess.Popen([cairnd, "--listen", "127.0.0.1:0", "--data-dir", data,
                          "--port-file", port_file, "--log-level", "warn", *flags],
                         stdout=log, stderr=log, env=env)
    for _ in range(1200):
        if os.path.exists(port_file) or d.poll() is not None:
            break
        time.sleep(0.05)
    if not os.path.exists(port_file):
        stop_cairnd(d)
        raise RuntimeError("cairnd did not start (exit %s); see %s" %
                           (d.poll(), os.path.join(data, "cairnd.log")))
    time.sleep(0.05)  # the port file is written whole, but be safe
    return d, "127.0.0.1:" + open(port_file).read().strip()


def stop_cairnd(d):
    d.terminate()
    try:
        d.wait(timeout=30)
    except subprocess.TimeoutExpired:
        d.kill()
        d.wait()


def make_certs(directory):
    """Certificates for --tls (a CA, a server and a client certificate)."""
    shutil.rmtree(directory, ignore_errors=True)
    subprocess.run(["sh", os.path.join(ROOT, "tests/testing/make_test_certs.sh"),
                    directory], check=True)
    return directory


# Reshard shapes beyond the default scenario: (name, save layout, load layout),
# in cairn_train_example's --layout syntax (MESH:PLACEMENTS, torch.chunk rules,
# planner/layout.h); dcp_bench.py builds the same layouts as ShardedTensors.
SHAPES = (
    ("rows2_cols4", "2:S0", "4:S1"),            # rows over 2 -> columns over 4
    ("rows8_cols3", "8:S0", "3:S1"),            # rows over 8 -> columns over 3
    ("mesh2x2_4x1", "2x2:S0,S1", "4x1:S0,S1"),  # 2-D blocks -> row stripes
    ("mesh2x2_1x3", "2x2:S0,S1", "1x3:S0,S1"),  # 2-D blocks -> column stripes
)
LOAD_STATS = ("storage_bytes", "block_read_bytes", "syscall_read_bytes",
              "chunks_verified_by_cairnd")


def world_of(layout):
    n = 1
    for d in layout.split(":")[0].split("x"):
        n *= int(d)
    return n


def cairn_load(args, rank_bin, addr, job, layout, extra, env):
    """Drops the page cache, loads step 1 of `job` into `layout`; returns the
    collective time (PlanLoad to the last byte in place, slowest rank) and
    the read statistics summed over ranks."""
    cold = drop_caches(args)
    l = run_ranks(rank_bin, addr, job, world_of(layout), args.model, layout,
                  ["--load", "1"] + extra, args.timeout, env)
    out = {"s": max(x[0]["plan_s"] + x[0]["io_s"] for x in l), "cold": cold,
           "needed_bytes": sum(x[0]["bytes"] for x in l),
           # The control path's share: PlanLoad as the slowest rank saw it
           # (connecting, the TLS handshake, waiting for the last rank to
           # arrive, cairnd's plan), next to the reads and VerifyLoad.
           "plan_s": max(x[0]["plan_s"] for x in l),
           "io_s": max(x[0]["io_s"] for x in l)}
    for key in LOAD_STATS:
        out[key] = sum(x[0][key] for x in l)
    return out


def cairn_save(args, rank_bin, addr, job, layout, env):
    """Saves step 1 of `job` from `layout`; returns the collective time
    ("s": barrier release -> commit acknowledged) and its control-path parts."""
    s = run_ranks(rank_bin, addr, job, world_of(layout), args.model, layout,
                  ["--save-steps", "1"], args.timeout, env)
    return {"s": (min(x[0]["plan_s"] for x in s) +
                  max(x[0]["io_s"] + x[0]["commit_s"] for x in s)),
            # The control path's share: BeginSave as the last rank to arrive
            # saw it, CommitSave as the slowest rank saw it.
            "plan_s": min(x[0]["plan_s"] for x in s),
            "commit_s": max(x[0]["commit_s"] for x in s)}


def tls_flags_and_env(certs):
    """cairnd's flags and the ranks' environment for mutual TLS with the
    certificates of make_certs; ([], None) for plaintext (certs None)."""
    if not certs:
        return [], None
    flags = ["--tls-cert", os.path.join(certs, "server.crt"),
             "--tls-key", os.path.join(certs, "server.key"),
             "--tls-client-ca", os.path.join(certs, "ca.crt")]
    env = dict(os.environ, CAIRN_TLS_CA=os.path.join(certs, "ca.crt"),
               CAIRN_TLS_CERT=os.path.join(certs, "client.crt"),
               CAIRN_TLS_KEY=os.path.join(certs, "client.key"))
    return flags, env


def cairn_run(args, model, total_bytes, build=None, certs=None, shapes=()):
    """One round: fresh cairnd and data directory, one save and the three loads,
    then for each of `shapes` (SHAPES entries) a save and a load of its own job.
    With `certs` (make_certs), cairnd serves mutual TLS and the ranks use it."""
    build = build or args.build
    cairnd = os.path.join(build, "server/coordinator/cairnd")
    rank_bin = os.path.join(build, "client/examples/cairn_train_example")
    data = os.path.join(args.dir, "cairn")
    flags, env = tls_flags_and_env(certs)
    d, addr = start_cairnd(cairnd, data, flags)
    try:
        args.model = model
        res = {"tool": "cairn_tls" if certs else "cairn", "bytes": total_bytes}
        phases = ["save"]
        res.update({"save_" + k: v for k, v in
                    cairn_save(args, rank_bin, addr, "bench", "4:S0", env).items()})
        for name, layout, extra in (("load2", "2:S1", []),
                                    ("load2_whole", "2:S1", ["--partial-check", "whole"]),
                                    ("load4", "4:S0", [])):
            l = cairn_load(args, rank_bin, addr, "bench", layout, extra, env)
            res["cold"] = l.pop("cold")
            res.update({name + "_" + k: v for k, v in l.items()})
            phases.append(name)
        for name, save_layout, load_layout in shapes:
            res[name + "_save_s"] = cairn_save(args, rank_bin, addr, name, save_layout,
                                               env)["s"]
            l = cairn_load(args, rank_bin, addr, name, load_layout, [], env)
            res["cold"] = res["cold"] and l.pop("cold")
            res.update({name + "_load_" + k: v for k, v in l.items()})
            phases += [name + "_save", name + "_load"]
        for name in phases:
            res[name + "_GBps"] = total_bytes / res[name + "_s"] / 1e9
        return res
    finally:
        stop_cairnd(d)
        shutil.rmtree(data, ignore_errors=True)


def run_dcp(args, total, shape=None):
    """One dcp_bench.py run: the default scenario (save, load2, load4), or
    for a SHAPES entry its save and one load (keys save_*, load_*)."""
    dcp_dir = os.path.join(args.dir, "dcp")
    shutil.rmtree(dcp_dir, ignore_errors=True)  # a killed run's leftovers
    cmd = [sys.executable, os.path.join(ROOT, "bench/baselines/dcp_bench.py"),
           "--dir", dcp_dir, "--total-bytes", str(total), "--repeat", "1"]
    if shape:
        cmd += ["--save-layout", shape[1], "--load-layout", shape[2]]
    if args.no_drop_caches:
        cmd.append("--no-drop-caches")
    return run_json(cmd, timeout=args.timeout)


# Peer name -> (environment under .venv-peers, or None for the project
# environment running this script; runner; its arguments).
PEERS = {
    "dcp_t1": (None, "dcp_fs_bench.py", ["--thread-count", "1"]),
    "dcp_t4": (None, "dcp_fs_bench.py", ["--thread-count", "4"]),
    "dcp_t8": (None, "dcp_fs_bench.py", ["--thread-count", "8"]),
    "dcp_async_thread": (None, "dcp_fs_bench.py", ["--async", "thread"]),
    "dcp_async_process": (None, "dcp_fs_bench.py", ["--async", "process"]),
    "megatron": ("megatron-core", "megatron_bench.py", []),
    "bytecheckpoint": ("bytecheckpoint", "bytecheckpoint_bench.py", []),
}
SMOKE_PEERS = ("dcp_t1", "dcp_async_thread", "megatron", "bytecheckpoint")
PEER_PHASES = (("save 4:S0", "save", "write"), ("load 4:S0 -> 2:S1", "load2", "read"),
               ("load 4:S0 -> 4:S0", "load4", "read"))


def peer_python(venv):
    """The interpreter of a peer environment (None: this one)."""
    if venv is None:
        return sys.executable
    return os.path.join(ROOT, ".venv-peers", venv, "bin", "python")


def run_peer(args, name, total):
    """One run of peer `name`: its JSON line, or {"tool", "skipped"|"error"}
    with a one-line reason (the peer's stderr goes to DIR/peer-NAME.log)."""
    venv, script, extra = PEERS[name]
    py = peer_python(venv)
    if not os.access(py, os.X_OK):
        return {"tool": name, "skipped": "%s is not installed: run bench/baselines/"
                "install.sh --peers %s" % (os.path.relpath(os.path.dirname(
                    os.path.dirname(py)), ROOT), venv)}
    work = os.path.join(args.dir, "peer")
    cmd = [py, os.path.join(ROOT, "bench/baselines", script), "--dir", work,
           "--total-bytes", str(total), "--allow-skip"] + extra
    if args.no_drop_caches:
        cmd.append("--no-drop-caches")
    if args.timeout:
        cmd += ["--timeout", str(args.timeout)]
    log_path = os.path.join(args.dir, "peer-%s.log" % name)
    with open(log_path, "w") as log:
        try:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                 timeout=None if not args.timeout else 4 * args.timeout)
        except subprocess.TimeoutExpired:
            return {"tool": name, "error": "still running after %s s: killed (see %s)" %
                    (4 * args.timeout, log_path)}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    res = json.loads(lines[-1]) if lines else {}
    res["tool"] = name
    if out.returncode != 0 and "error" not in res and "skipped" not in res:
        res["error"] = "exited %d, no result (see %s)" % (out.returncode, log_path)
    return res


def peer_table(rounds, cairn_key, peers):
    """Cairn against the best peer of each phase, and every peer's own row."""
    ok = [n for n in peers if any("save_GBps" in rd[4].get(n, {}) or
                                  "load4_GBps" in rd[4].get(n, {}) for rd in rounds)]
    sync = [n for n in ok if not n.startswith("dcp_async")]
    print()
    print("Peers (bench/baselines/<peer>_bench.py), same bytes and layouts, same rounds; "
          "GB/s best of rounds; best peer = the fastest peer of that round and phase")
    print()
    print("| phase | Cairn GB/s | best peer GB/s | best peer | Cairn / best peer | per round | " +
          " | ".join("%s GB/s" % n for n in sync) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(sync))
    for label, key, _ in PEER_PHASES:
        gk = key + "_GBps"
        c = max(rd[2][gk] for rd in rounds)
        per, best, best_name = [], float("nan"), "-"
        for rd in rounds:
            vals = [(rd[4][n][gk], n) for n in sync if gk in rd[4].get(n, {})]
            if vals:
                v, n = max(vals)
                per.append("%.2fx" % (rd[2][gk] / v))
                if not best >= v:
                    best, best_name = v, n
        own = []
        for n in sync:
            vals = [rd[4][n][gk] for rd in rounds if gk in rd[4].get(n, {})]
            note = [rd[4][n].get("save_unmeasured") for rd in rounds if n in rd[4]]
            own.append("%.2f" % max(vals) if vals else ("not measured" if any(note) else "-"))
        print("| %s | %.2f | %s | %s | %s | %s | %s |" % (
            label, c, "%.2f" % best if best == best else "-", best_name,
            "**%.2fx**" % (c / best) if best == best else "-", ", ".join(per) or "-",
            " | ".join(own)))
    asyncs = [n for n in ok if n.startswith("dcp_async")]
    if asyncs:
        print()
        print("| async peer | blocked s (first call) | durable s (first call) | blocked s "
              "| durable s | load 4:S0 -> 4:S0 of it GB/s |")
        print("|---|---|---|---|---|---|")
        for n in asyncs:
            rs = [rd[4][n] for rd in rounds if "async_blocked_s" in rd[4].get(n, {})]
            print("| %s | %.3f | %.3f | %.3f | %.3f | %.2f |" % (
                n, min(r["async_first_blocked_s"] for r in rs),
                min(r["async_first_durable_s"] for r in rs),
                min(r["async_blocked_s"] for r in rs), min(r["async_durable_s"] for r in rs),
                max(r["load4_GBps"] for r in rs)))
    for n in peers:
        reasons = sorted({rd[4][n].get("skipped") or rd[4][n].get("error")
                          for rd in rounds if n in rd[4]} - {None})
        for r in reasons:
            print("peer %s: %s: %s" % (n, "skipped" if any(
                rd[4].get(n, {}).get("skipped") for rd in rounds) else "FAILED", r))
        unmeasured = {rd[4][n].get("save_unmeasured") for rd in rounds if n in rd[4]} - {None}
        for r in unmeasured:
            print("peer %s: save not measured: %s" % (n, r))
        shims = {rd[4][n].get("cpu_shim") for rd in rounds if n in rd[4]} - {None}
        for r in shims:
            print("peer %s: runs with a CPU shim: %s" % (n, r))
        torches = {rd[4][n].get("torch") for rd in rounds if n in rd[4]} - {None}
        if n == "bytecheckpoint" and torches:
            print("peer %s: on its own torch %s" % (n, ", ".join(sorted(torches))))


def over_limit(rd, shapes, peers):
    """(tool, phase label, GB/s, direction, limit GB/s) of every result of
    round `rd` (limit, dcp, cairn, baseline, peers) above that round's limit:
    a limit some tool beats is not the machine's."""
    limit, dcp, cairn, base, peer_res = rd
    out = []

    def check(tool, label, value, kind):
        lim = limit.get(kind + "_GBps", float("nan"))
        if value is not None and value == value and lim == lim and value > lim:
            out.append((tool, label, value, kind, lim))

    for label, key, (scenario, dkey), kind in table_rows(shapes):
        check("Cairn", label, cairn.get(key + "_GBps"), kind)
        if base is not None:
            check("baseline", label, base.get(key + "_GBps"), kind)
        if scenario in dcp:
            check("DCP", label, dcp[scenario].get(dkey + "_GBps"), kind)
    for name in peers:
        if name.startswith("dcp_async"):  # their save figure is not a disk rate
            continue
        for label, key, kind in PEER_PHASES:
            check(name, label, peer_res.get(name, {}).get(key + "_GBps"), kind)
    return out


def widen(limit, wide, over):
    """`limit` with each direction raised to the wide sweep's where that is
    higher, noting what beat the old one."""
    merged = dict(limit)
    for kind in ("write", "read"):
        if wide[kind + "_GBps"] > limit[kind + "_GBps"]:
            merged[kind + "_GBps"] = wide[kind + "_GBps"]
            merged[kind + "_point"] = wide[kind + "_point"] + " (wide sweep)"
    merged["widened_by"] = "; ".join("%s %s %.2f GB/s > %s limit %.2f" % o for o in over)
    merged["wide"] = {k: wide[k] for k in ("write_GBps", "read_GBps", "write_point",
                                           "read_point")}
    return merged


def table_rows(shapes):
    """(label, Cairn key, DCP (scenario, key), limit key) per table row."""
    rows = [("save 4:S0", "save", (None, "save"), "write"),
            ("load 4:S0 -> 2:S1", "load2", (None, "load2"), "read"),
            ("load 4:S0 -> 2:S1, partly read chunks read whole", "load2_whole",
             (None, "load2"), "read"),
            ("load 4:S0 -> 4:S0", "load4", (None, "load4"), "read")]
    for name, save_layout, load_layout in shapes:
        # Two shapes may save the same layout: the label names the load too.
        rows.append(("save %s (for -> %s)" % (save_layout, load_layout), name + "_save",
                     (name, "save"), "write"))
        rows.append(("load %s -> %s" % (save_layout, load_layout), name + "_load",
                     (name, "load"), "read"))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--dir", default="/tmp/cairn-e2e-bench")
    p.add_argument("--bytes", type=float, default=None, help="default 1.6e9")
    p.add_argument("--repeat", type=int, default=None, help="default 2")
    p.add_argument("--skip-dcp", action="store_true")
    p.add_argument("--skip-limits", action="store_true",
                   help="for quick iterations: no limit sweep, ratios are nan")
    p.add_argument("--limit-sweep", choices=("quick", "full", "wide"), default="full",
                   help="the limit sweep (bench/baselines/limit_sweep.py) run every round "
                        "(default full; --smoke runs a tiny one)")
    p.add_argument("--shapes", default=",".join(s[0] for s in SHAPES),
                   help="reshard shapes to run besides the default scenario, by name "
                        "(default all: %(default)s; '' for none)")
    p.add_argument("--no-drop-caches", action="store_true",
                   help="never drop the page cache (loads are warm)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds each tool's processes may run (default: none; 120 with --smoke)")
    p.add_argument("--peers", default=None,
                   help="peers to run in every round: all (default), none, smoke (%s), "
                        "or names of %s (default with --smoke: none)" % (
                            ",".join(SMOKE_PEERS), ",".join(PEERS)))
    p.add_argument("--baseline-build", default=None,
                   help="another build tree whose Cairn runs in every round too (see the top)")
    p.add_argument("--tls", action="store_true",
                   help="also run Cairn over mutual TLS in every round (see the top)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny and quick: check that every part still runs (see the top)")
    args = p.parse_args()
    shapes = [s for s in SHAPES if s[0] in args.shapes.split(",")]
    unknown = set(filter(None, args.shapes.split(","))) - {s[0] for s in SHAPES}
    if unknown:
        sys.exit("e2e_bench: unknown --shapes %s (known: %s)" % (
            ",".join(sorted(unknown)), ",".join(s[0] for s in SHAPES)))
    sel = args.peers if args.peers is not None else ("none" if args.smoke else "all")
    peers = {"all": list(PEERS), "none": [], "smoke": list(SMOKE_PEERS)}.get(
        sel, [x for x in sel.split(",") if x])
    unknown = set(peers) - set(PEERS)
    if unknown:
        sys.exit("e2e_bench: unknown --peers %s (known: %s)" % (
            ",".join(sorted(unknown)), ",".join(PEERS)))
    sweep_level = args.limit_sweep
    dcp_shapes = shapes
    if args.smoke:
        args.bytes = args.bytes or 2 ** 25
        args.repeat = args.repeat or 1
        args.no_drop_caches = True
        args.timeout = args.timeout or 120
        sweep_level = "smoke"
        # Spawning torch ranks costs seconds each (~85% of a smoke run with
        # the default scenario too): DCP runs one 2-D reshard (a save and a
        # load); Cairn runs every shape.
        dcp_shapes = [s for s in shapes if s[0] == "mesh2x2_1x3"]
        if not args.skip_dcp and subprocess.run(
                [sys.executable, "-c", "import torch"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL).returncode != 0:
            print(f"e2e_bench --smoke: {sys.executable} cannot import torch (run "
                  "with .venv/bin/python, which scripts/install_deps.sh makes): "
                  "DCP skipped", file=sys.stderr)
            args.skip_dcp = True
    elif not args.skip_dcp and subprocess.run(
            [sys.executable, "-c", "import torch"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL).returncode != 0:
        sys.exit(f"e2e_bench: PyTorch DCP is the peer this benchmark compares against, but "
                 f"{sys.executable} cannot import torch: run it with .venv/bin/python "
                 "(scripts/install_deps.sh makes it), or pass --skip-dcp")
    if args.skip_dcp:
        dcp_shapes = []
    args.bytes = args.bytes or 1.6e9
    args.repeat = args.repeat or 2
    os.makedirs(args.dir, exist_ok=True)
    # The bytes the synthetic model holds: 8 x rows x 4096 fp32, rows a
    # multiple of 8 (every tool's layouts split evenly; Megatron needs it).
    rows = max(int(args.bytes / 8 / 4096 / 4) // 8 * 8, 8)
    total = 8 * rows * 4096 * 4
    model = "bench:%d" % total
    load0 = os.getloadavg()
    print("e2e_bench: %d bytes, %d round(s), limit sweep %s, load average %.2f %.2f %.2f" %
          ((total, args.repeat, sweep_level) + load0), file=sys.stderr, flush=True)

    nan = float("nan")
    certs = make_certs(os.path.join(args.dir, "certs")) if args.tls else None
    tls_rounds = []
    rounds = []
    beaten = []  # (round, tool, phase, GB/s, direction, limit) left above the limit
    for i in range(args.repeat):
        print("round %d/%d (load average %.2f)" % (i + 1, args.repeat, os.getloadavg()[0]),
              file=sys.stderr, flush=True)
        if args.skip_limits:
            limit = {"tool": "limit", "write_GBps": nan, "read_GBps": nan,
                     "write_point": "-", "read_point": "-"}
        else:
            limit = limit_sweep.sweep(args.dir, total, sweep_level,
                                      drop=not args.no_drop_caches)
        print(json.dumps(limit), flush=True)
        dcp = {}
        if not args.skip_dcp and not args.smoke:
            dcp[None] = run_dcp(args, total)
            print(json.dumps(dcp[None]), flush=True)
        if not args.skip_dcp:
            for shape in dcp_shapes:
                dcp[shape[0]] = dict(run_dcp(args, total, shape), shape=shape[0])
                print(json.dumps(dcp[shape[0]]), flush=True)
        peer_res = {}
        for name in peers:
            peer_res[name] = run_peer(args, name, total)
            print(json.dumps(peer_res[name]), flush=True)
        base = None
        if args.baseline_build and i % 2 == 1:
            base = dict(cairn_run(args, model, total, args.baseline_build), tool="baseline")
            print(json.dumps(base), flush=True)
        tls = None
        if certs and i % 2 == 1:
            tls = cairn_run(args, model, total, certs=certs)
            print(json.dumps(tls), flush=True)
        cairn = cairn_run(args, model, total, shapes=shapes)
        print(json.dumps(cairn), flush=True)
        if certs and i % 2 == 0:
            tls = cairn_run(args, model, total, certs=certs)
            print(json.dumps(tls), flush=True)
        if tls:
            tls_rounds.append((cairn, tls))
        if args.baseline_build and i % 2 == 0:
            base = dict(cairn_run(args, model, total, args.baseline_build), tool="baseline")
            print(json.dumps(base), flush=True)
        rounds.append((limit, dcp, cairn, base, peer_res))
        # A limit some tool beats is wrong: widen it in this round (the same
        # minutes), then say so if even the wide sweep is beaten.
        # (Not in smoke mode, nor without the page-cache drop: those limits are
        # not the disk's anyway.)
        check_limit = not (args.skip_limits or args.smoke or args.no_drop_caches)
        if check_limit and sweep_level != "wide":
            over = over_limit(rounds[-1], shapes, peers)
            if over:
                print("round %d: %s: rerunning the wide limit sweep" % (
                    i + 1, "; ".join("%s %s %.2f GB/s above the %s limit %.2f" % o
                                     for o in over)), file=sys.stderr, flush=True)
                wide = limit_sweep.sweep(args.dir, total, "wide",
                                         drop=not args.no_drop_caches)
                limit = widen(limit, wide, over)
                print(json.dumps(limit), flush=True)
                rounds[-1] = (limit,) + rounds[-1][1:]
        beyond = over_limit(rounds[-1], shapes, peers) if check_limit else []
        for o in beyond:
            beaten.append((i + 1,) + o)

    def best(key, tool):
        vals = [r[tool][key] for r in rounds if r[tool] is not None]
        return max(vals) if vals else nan

    def dcp_val(rd, scenario, key):
        d = rd[1].get(scenario)
        return d[key] if d else nan

    def pct(x):
        return "-" if x != x else "%.0f%%" % (100 * x)

    def ratio(num, den):
        return "-" if den != den or num != num or den <= 0 else "%.2f" % (num / den)

    missing = []  # ratios that should exist but do not: the run fails
    cairn = rounds[-1][2]  # bytes fields are the same every round: the last round's
    print()
    print("%d bytes (%.2f GB) per phase; GB/s = 1e9 bytes/s; best of %d interleaved "
          "round(s); load average %.2f at the start, %.2f at the end; limit = best point of "
          "the %s limit sweep in each round" % (total, total / 1e9, args.repeat, load0[0],
                                                os.getloadavg()[0], sweep_level))
    print()
    print("| phase | Cairn GB/s | DCP GB/s | Cairn / DCP | per round | limit GB/s "
          "| Cairn / limit | per round | DCP / limit | read / needed, Cairn: requested, "
          "syscalls, block device | DCP: syscalls, block device |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, key, (scenario, dkey), lim_kind in table_rows(shapes):
        gk, lk = key + "_GBps", lim_kind + "_GBps"
        c = max(rd[2][gk] for rd in rounds)
        d = max((dcp_val(rd, scenario, dkey + "_GBps") for rd in rounds), default=nan)
        lim = best(lk, 0)
        has_dcp = any(scenario in rd[1] for rd in rounds)
        vs_dcp = ", ".join("%.2fx" % (rd[2][gk] / dcp_val(rd, scenario, dkey + "_GBps"))
                           for rd in rounds if scenario in rd[1])
        vs_lim = ", ".join(pct(rd[2][gk] / rd[0][lk]) for rd in rounds)
        bytes_c = bytes_d = ""
        if lim_kind == "read":
            need = cairn[key + "_needed_bytes"]
            bytes_c = "%s, %s, %s" % tuple(ratio(cairn[key + "_" + k], need) for k in
                                           ("storage_bytes", "syscall_read_bytes",
                                            "block_read_bytes"))
            if has_dcp:
                dl = [rd[1][scenario] for rd in rounds if scenario in rd[1]][-1]
                bytes_d = "%s, %s" % (ratio(dl[dkey + "_syscall_bytes"], dl["bytes"]),
                                      ratio(dl[dkey + "_io_bytes"], dl["bytes"]))
        cells = [label, "%.2f" % c, "%.2f" % d if has_dcp else "-",
                 "**%.2fx**" % (c / d) if has_dcp else "-", vs_dcp or "-", "%.2f" % lim,
                 "**%s**" % pct(c / lim), vs_lim, pct(d / lim) if has_dcp else "-",
                 bytes_c, bytes_d]
        print("| " + " | ".join(cells) + " |")
        if has_dcp and not (c / d == c / d):
            missing.append("%s: Cairn / DCP" % label)
        if not args.skip_limits and not (c / lim == c / lim):
            missing.append("%s: Cairn / limit" % label)
        if lim_kind == "read" and "-" in bytes_c.split(", "):
            missing.append("%s: bytes read / needed" % label)
    if not args.skip_limits:
        print()
        print("| round | write limit GB/s | winning write point | read limit GB/s "
              "| winning read point | cold | dd write / read GB/s | load average |")
        print("|---|---|---|---|---|---|---|---|")
        for n, rd in enumerate(rounds):
            lim = rd[0]
            print("| %d | %.2f | %s | %.2f | %s | %s | %.2f / %.2f | %.2f |" % (
                n + 1, lim["write_GBps"], lim["write_point"], lim["read_GBps"],
                lim["read_point"], lim["cold"], lim["dd_write_GBps"], lim["dd_read_GBps"],
                lim["loadavg"]))
        for n, rd in enumerate(rounds):
            if "widened_by" in rd[0]:
                print()
                print("round %d: the %s sweep's limit was beaten (%s); the wide sweep "
                      "measured write %.2f (%s), read %.2f (%s) and the limit above is the "
                      "higher of the two per direction" % (
                          n + 1, sweep_level, rd[0]["widened_by"], rd[0]["wide"]["write_GBps"],
                          rd[0]["wide"]["write_point"], rd[0]["wide"]["read_GBps"],
                          rd[0]["wide"]["read_point"]))
        for b in beaten:
            print()
            print("WARNING: round %d: %s %s at %.2f GB/s is above even the wide sweep's "
                  "%s limit %.2f GB/s: this limit is not the machine's; the ratios to it "
                  "of that round overstate" % b)

    if peers:
        peer_table(rounds, None, peers)

    if args.baseline_build:
        print()
        print("| phase | this build GB/s | baseline GB/s | this / baseline | per round |")
        print("|---|---|---|---|---|")
        for name in ("save", "load2", "load2_whole", "load4"):
            c, b = best(name + "_GBps", 2), best(name + "_GBps", 3)
            per = ", ".join("%.2fx" % (rd[2][name + "_GBps"] / rd[3][name + "_GBps"])
                            for rd in rounds)
            print("| %s | %.2f | %.2f | %.2fx | %s |" % (name, c, b, c / b, per))

    if tls_rounds:
        # Best round of each; the per-round ratios compare the same minutes.
        print()
        print("| phase | plaintext GB/s | mutual TLS GB/s | TLS / plaintext | per round |")
        print("|---|---|---|---|---|")
        for name in ("save", "load2", "load2_whole", "load4"):
            c = max(rd[0][name + "_GBps"] for rd in tls_rounds)
            t = max(rd[1][name + "_GBps"] for rd in tls_rounds)
            per = ", ".join("%.3fx" % (rd[1][name + "_GBps"] / rd[0][name + "_GBps"])
                            for rd in tls_rounds)
            print("| %s | %.2f | %.2f | %.3fx | %s |" % (name, c, t, t / c, per))
        # Where a difference comes from: the control path (plan: BeginSave or
        # PlanLoad as the slowest rank saw it, commit: CommitSave) against the
        # data path (io: reads + VerifyLoad), seconds per round.
        print()
        print("| phase | part | plaintext s per round | mutual TLS s per round |")
        print("|---|---|---|---|")
        for name, parts in (("save", ("plan", "commit")), ("load2", ("plan", "io")),
                            ("load2_whole", ("plan", "io")), ("load4", ("plan", "io"))):
            for part in parts:
                key = "%s_%s_s" % (name, part)
                print("| %s | %s | %s | %s |" % (
                    name, part, ", ".join("%.3f" % rd[0][key] for rd in tls_rounds),
                    ", ".join("%.3f" % rd[1][key] for rd in tls_rounds)))
    if missing:
        sys.exit("e2e_bench: FAILED: missing ratios: " + "; ".join(missing))


if __name__ == "__main__":
    main()
