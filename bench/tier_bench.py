#!/usr/bin/env python3
"""Memory checkpoints on network-namespace hosts (tests/netns): cairnd on
host 0, one cairn-agent and one rank on each of hosts 1..N, links shaped to
--rate (tbf), the bench model split by rows over the ranks, replicas 1.

For each N in --hosts, one run of:
  blocked     a rank's time inside AsyncSave of a memory save (the copy into
              its agent's staging memory), against one memcpy of the rank's
              bytes in this process;
  replicate   each node pushes its rank's shards to the next node before the
              rank commits: bytes pushed over the host's link / the commit
              wait, as a fraction of --rate (every link carries one push);
  recovery    node 1's agent is killed and a replacement started empty; every
              rank loads latest (the memory checkpoint) through its agent, the
              lost shards from node 2's replica over the link: the slowest
              rank's load time, and the peer bytes it moved against --rate.
              The same state saved persistent, every agent restarted empty,
              the page cache dropped, every rank loading it from storage
              (posix): the same measure.
Prints one JSON line per N and a table. The storage here is this machine's
disk, not behind the shaped links: a lower bound of a remote filesystem's
recovery time. S3 is not measured here: the namespaces reach no radosgw.

Usage: tier_bench.py BUILD_DIR [--hosts 2,4,8] [--bytes B] [--rate R]
                     [--smoke]
--smoke: 2 hosts, 20 MB (ctest bench_smoke.tier_bench); exits 77 (skipped)
where namespaces cannot be made (not root, no `ip netns`).
"""
import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "netns"))
import cluster  # noqa: E402
import hosts  # noqa: E402


def rate_bytes_per_s(rate):
    units = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[:-len(u)]) * f
    raise ValueError("rate must end in kbit, mbit or gbit: %r" % rate)


def memcpy_seconds(nbytes, repeat=3):
    """One memcpy of `nbytes` (buffers touched first; never cache-sized:
    at least 64 MiB, scaled back)."""
    n = max(nbytes, 64 << 20)
    src = bytearray(os.urandom(1 << 20)) * (n >> 20)
    dst = bytearray(len(src))
    dst[:] = src
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        dst[:] = src
        best = min(best, time.perf_counter() - t0)
    return best * nbytes / len(src)


def drop_page_cache():
    """Cold storage reads: True when the page cache could be dropped."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def json_lines(c, tag, world):
    out = []
    for r in range(world):
        for line in c.rank_log(tag, r).splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def run(build, work, nodes, nbytes, rate):
    c = cluster.Cluster(build, work, nodes=nodes, ranks_per_node=1,
                        layout="%d:S0" % nodes, rate=rate, model="bench:%d" % nbytes,
                        budget_mib=max(256, 8 * (nbytes >> 20) // nodes + 64))
    try:
        for n in range(nodes):
            c.start_agent(n)
        world = c.world
        # Warm-up: plans cached, and staging segments mapped: a memory
        # checkpoint pins its segment until retention (2 kept) drops it, so
        # the third save on reuses the segment of the one dropped.
        for step in (1, 2, 3):
            if c.ranks("tier", ["--save-step", str(step), "--tier", "memory"],
                       "warm%d" % step) != [0] * world:
                raise RuntimeError("warm-up save failed:\n" + c.logs())
            time.sleep(1.5)  # the agents' next reports free the dropped
        sent0 = [c.net.bytes_sent(n + 1) for n in range(nodes)]
        codes = c.ranks("tier", ["--save-step", "4", "--tier", "memory", "--json"], "save")
        if codes != [0] * world:
            raise RuntimeError("memory save failed:\n" + c.logs())
        sent = [c.net.bytes_sent(n + 1) - sent0[n] for n in range(nodes)]
        ops = json_lines(c, "save", world)
        saves = [o for o in ops if o["op"] == "async_save"]
        commits = [o for o in ops if o["op"] == "committed"]
        rank_bytes = max(o["bytes"] for o in saves)
        blocked = max(o["blocked_s"] for o in saves)
        wait = max(o["wait_s"] for o in commits)
        memcpy = memcpy_seconds(rank_bytes)
        link = rate_bytes_per_s(rate)
        # Each node's link carries its rank's push (and the control traffic).
        replicate_bps = min(sent) / wait if wait > 0 else 0.0

        # Node 1 lost: a replacement agent starts empty; every rank loads.
        c.agents[1].send_signal(signal.SIGKILL)
        c.agents[1].wait()
        c.start_agent(1)
        codes = c.ranks("tier", ["--load", "latest", "--json"], "mem-load")
        loads = [o for o in json_lines(c, "mem-load", world) if o["op"] == "load"]
        if codes != [0] * world or any(o["source"] != "memory" for o in loads):
            raise RuntimeError("load from memory failed:\n" + c.logs())
        memory_load = max(o["load_s"] for o in loads)
        peer_bytes = max(o["bytes_peers"] for o in loads)

        # The same state persistent, every agent's memory lost: from storage.
        if c.ranks("tier", ["--save-step", "5", "--tier", "persistent"], "persist") != \
                [0] * world:
            raise RuntimeError("persistent save failed:\n" + c.logs())
        for n in range(nodes):
            c.agents[n].send_signal(signal.SIGKILL)
            c.agents[n].wait()
        for n in range(nodes):
            c.start_agent(n)
        cold = drop_page_cache()
        codes = c.ranks("tier", ["--load", "latest", "--json"], "disk-load")
        loads = [o for o in json_lines(c, "disk-load", world) if o["op"] == "load"]
        if codes != [0] * world or any(o["source"] != "storage" for o in loads):
            raise RuntimeError("load from storage failed:\n" + c.logs())
        storage_load = max(o["load_s"] for o in loads)
        return {
            "hosts": nodes, "bytes": nbytes, "rank_bytes": rank_bytes, "rate": rate,
            "blocked_s": round(blocked, 4), "memcpy_s": round(memcpy, 4),
            "blocked_x_memcpy": round(blocked / memcpy, 2) if memcpy > 0 else None,
            "commit_wait_s": round(wait, 3),
            "replication_MBps": round(replicate_bps / 1e6, 1),
            "replication_x_link": round(replicate_bps / link, 3),
            "recovery_memory_s": round(memory_load, 3),
            "recovery_peer_bytes": peer_bytes,
            "recovery_peer_x_link": round(peer_bytes / memory_load / link, 3)
            if memory_load else None,
            "recovery_storage_s": round(storage_load, 3),
            "storage_cold": cold,
            "storage_x_memory": round(storage_load / memory_load, 2) if memory_load else None,
        }
    finally:
        c.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build")
    p.add_argument("--hosts", default="2,4,8")
    p.add_argument("--bytes", type=int, default=400_000_000)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    why = hosts.unavailable()
    if why:
        print("SKIPPED: network-namespace hosts cannot be made here: " + why)
        return 77
    if args.smoke:
        args.hosts, args.bytes, args.rate = "2", 20_000_000, "400mbit"
    rows = []
    for nodes in [int(h) for h in args.hosts.split(",")]:
        work = tempfile.mkdtemp(prefix="cairn-tier-bench-")
        try:
            row = run(os.path.abspath(args.build), work, nodes, args.bytes, args.rate)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(json.dumps({"bench": "tier", **row}), flush=True)
        rows.append(row)
    print("%5s %9s %8s %8s %10s %10s %10s %10s" % (
        "hosts", "blocked", "x memcpy", "repl x", "repl MB/s", "mem rec s",
        "disk rec s", "disk/mem"))
    for r in rows:
        print("%5d %8.3fs %8.2f %8.2f %10.1f %10.3f %10.3f %10.2f" % (
            r["hosts"], r["blocked_s"], r["blocked_x_memcpy"], r["replication_x_link"],
            r["replication_MBps"], r["recovery_memory_s"], r["recovery_storage_s"],
            r["storage_x_memory"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
