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

This VM's disk is shared and its speed drifts by 2x within minutes, so the
tools are interleaved: each of --repeat rounds runs the limit (fio/dd), then
DCP, then Cairn, every phase once. Each tool's figure is its best round; the
table also gives the per-round Cairn / DCP ratios (same minutes, same disk).

Usage: bench/e2e_bench.py [--build build] [--dir /tmp/cairn-bench] [--bytes 1.6e9]
       [--repeat 2] [--skip-dcp] [--skip-limits] [--no-drop-caches] [--timeout S]
       [--baseline-build OTHER_BUILD] [--tls]
       bench/e2e_bench.py --smoke [--tls] [--build build] [--dir DIR]
Prints one JSON line per tool and a markdown table of ratios.

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
other test on the machine), each process killed after --timeout (default 120
s in smoke mode) so a hang fails instead of blocking; DCP runs only if
/usr/bin/python3 can import torch (python3-torch), and is skipped with a
notice otherwise. Cairn's part (cairnd, 4 saving ranks, the three loads with
their bit-exact checks) and the limits always run. Numbers are meaningless.
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


def cairn_run(args, model, total_bytes, build=None, certs=None):
    """One round: fresh cairnd and data directory, one save and the three loads.
    With `certs` (make_certs), cairnd serves mutual TLS and the ranks use it."""
    build = build or args.build
    cairnd = os.path.join(build, "server/coordinator/cairnd")
    rank_bin = os.path.join(build, "client/examples/cairn_train_example")
    data = os.path.join(args.dir, "cairn")
    flags, env = [], None
    if certs:
        flags = ["--tls-cert", os.path.join(certs, "server.crt"),
                 "--tls-key", os.path.join(certs, "server.key"),
                 "--tls-client-ca", os.path.join(certs, "ca.crt")]
        env = dict(os.environ, CAIRN_TLS_CA=os.path.join(certs, "ca.crt"),
                   CAIRN_TLS_CERT=os.path.join(certs, "client.crt"),
                   CAIRN_TLS_KEY=os.path.join(certs, "client.key"))
    d, addr = start_cairnd(cairnd, data, flags)
    try:
        res = {"tool": "cairn_tls" if certs else "cairn", "bytes": total_bytes}
        s = run_ranks(rank_bin, addr, "bench", 4, model, "4:S0", ["--save-steps", "1"],
                      args.timeout, env)
        # Collective save time: barrier release -> commit acknowledged.
        res["save_s"] = (min(x[0]["plan_s"] for x in s) +
                         max(x[0]["io_s"] + x[0]["commit_s"] for x in s))
        for name, world, layout, extra in (
                ("load2", 2, "2:S1", []),
                ("load2_whole", 2, "2:S1", ["--partial-check", "whole"]),
                ("load4", 4, "4:S0", [])):
            res["cold"] = drop_caches(args)
            l = run_ranks(rank_bin, addr, "bench", world, model, layout,
                          ["--load", "1"] + extra, args.timeout, env)
            res[name + "_s"] = max(x[0]["plan_s"] + x[0]["io_s"] for x in l)
            for key in ("storage_bytes", "block_read_bytes", "syscall_read_bytes",
                        "chunks_verified_by_cairnd"):
                res[name + "_" + key] = sum(x[0][key] for x in l)
            res[name + "_needed_bytes"] = sum(x[0]["bytes"] for x in l)
        for name in ("save", "load2", "load2_whole", "load4"):
            res[name + "_GBps"] = total_bytes / res[name + "_s"] / 1e9
        return res
    finally:
        stop_cairnd(d)
        shutil.rmtree(data, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--dir", default="/tmp/cairn-e2e-bench")
    p.add_argument("--bytes", type=float, default=None, help="default 1.6e9")
    p.add_argument("--repeat", type=int, default=None, help="default 2")
    p.add_argument("--skip-dcp", action="store_true")
    p.add_argument("--skip-limits", action="store_true",
                   help="for quick iterations: no fio run, ratios are nan")
    p.add_argument("--no-drop-caches", action="store_true",
                   help="never drop the page cache (loads are warm)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds each tool's processes may run (default: none; 120 with --smoke)")
    p.add_argument("--baseline-build", default=None,
                   help="another build tree whose Cairn runs in every round too (see the top)")
    p.add_argument("--tls", action="store_true",
                   help="also run Cairn over mutual TLS in every round (see the top)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny and quick: check that every part still runs (see the top)")
    args = p.parse_args()
    if args.smoke:
        args.bytes = args.bytes or 2 ** 25
        args.repeat = args.repeat or 1
        args.no_drop_caches = True
        args.timeout = args.timeout or 120
        if not args.skip_dcp and subprocess.run(
                ["/usr/bin/python3", "-c", "import torch"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL).returncode != 0:
            print("e2e_bench --smoke: torch is not importable (apt-get install "
                  "python3-torch): DCP skipped", file=sys.stderr)
            args.skip_dcp = True
    elif not args.skip_dcp and subprocess.run(
            ["/usr/bin/python3", "-c", "import torch"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL).returncode != 0:
        sys.exit("e2e_bench: PyTorch DCP is the peer this benchmark compares against, but "
                 "/usr/bin/python3 cannot import torch: run bench/baselines/install.sh "
                 "(Debian's python3-torch), or pass --skip-dcp")
    args.bytes = args.bytes or 1.6e9
    args.repeat = args.repeat or 2
    os.makedirs(args.dir, exist_ok=True)
    model = "bench:%d" % int(args.bytes)
    # The bytes the synthetic model really holds: 8 x rows x 4096 fp32.
    rows = max(int(args.bytes / 8 / 4096 / 4), 4)
    total = 8 * rows * 4096 * 4

    nan = float("nan")
    certs = make_certs(os.path.join(args.dir, "certs")) if args.tls else None
    tls_rounds = []
    rounds = []
    for i in range(args.repeat):
        print("round %d/%d" % (i + 1, args.repeat), file=sys.stderr, flush=True)
        if args.skip_limits:
            limit = {"tool": "limit", "write_GBps": nan, "read_GBps": nan}
        else:
            limit = run_json([os.path.join(ROOT, "bench/baselines/limits.sh"), args.dir,
                              str(int(total))], timeout=args.timeout,
                             env=dict(os.environ, LIMITS_REPEAT="1",
                                      LIMITS_DROP_CACHES="0" if args.no_drop_caches else "1"))
        print(json.dumps(limit), flush=True)
        dcp = None
        if not args.skip_dcp:
            dcp_dir = os.path.join(args.dir, "dcp")
            shutil.rmtree(dcp_dir, ignore_errors=True)  # a killed run's leftovers
            dcp = run_json(["/usr/bin/python3",
                            os.path.join(ROOT, "bench/baselines/dcp_bench.py"),
                            "--dir", dcp_dir, "--total-bytes", str(total), "--repeat", "1"] +
                           (["--no-drop-caches"] if args.no_drop_caches else []),
                           timeout=args.timeout)
            print(json.dumps(dcp), flush=True)
        base = None
        if args.baseline_build and i % 2 == 1:
            base = dict(cairn_run(args, model, total, args.baseline_build), tool="baseline")
            print(json.dumps(base), flush=True)
        tls = None
        if certs and i % 2 == 1:
            tls = cairn_run(args, model, total, certs=certs)
            print(json.dumps(tls), flush=True)
        cairn = cairn_run(args, model, total)
        print(json.dumps(cairn), flush=True)
        if certs and i % 2 == 0:
            tls = cairn_run(args, model, total, certs=certs)
            print(json.dumps(tls), flush=True)
        if tls:
            tls_rounds.append((cairn, tls))
        if args.baseline_build and i % 2 == 0:
            base = dict(cairn_run(args, model, total, args.baseline_build), tool="baseline")
            print(json.dumps(base), flush=True)
        rounds.append((limit, dcp, cairn, base))

    def best(key, tool):
        vals = [r[tool][key] for r in rounds if r[tool] is not None]
        return max(vals) if vals else nan

    # Best round of each tool; the bytes fields are the same every round (the
    # table shows the last round's).
    limit = {k: best(k, 0) for k in ("write_GBps", "read_GBps")}
    dcp = None if args.skip_dcp else {k: best(k, 1) for k in ("save_GBps", "load2_GBps",
                                                               "load4_GBps")}
    cairn = dict(rounds[-1][2])
    for name in ("save", "load2", "load2_whole", "load4"):
        cairn[name + "_GBps"] = best(name + "_GBps", 2)

    w, r = limit["write_GBps"], limit["read_GBps"]
    print()
    print("| phase | Cairn GB/s | DCP GB/s | Cairn / DCP | per round "
          "| limit GB/s | Cairn / limit | per round | bytes read / needed: requested, "
          "syscalls, block device |")
    print("|---|---|---|---|---|---|---|---|---|")
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
        lim_key = "write_GBps" if name == "save" else "read_GBps"
        vs_dcp = ", ".join("%.2fx" % (rd[2][name + "_GBps"] / rd[1][dcp_key + "_GBps"])
                           for rd in rounds if rd[1] is not None)
        vs_lim = ", ".join("%.0f%%" % (100 * rd[2][name + "_GBps"] / rd[0][lim_key])
                           for rd in rounds)
        print("| %s | %.2f | %.2f | %.2fx | %s | %.2f | %.0f%% | %s | %s |" %
              (name, c, d, c / d if dcp else nan, vs_dcp, lim, 100 * c / lim, vs_lim,
               ratio))

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


if __name__ == "__main__":
    main()
