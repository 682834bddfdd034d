#!/usr/bin/env python3
"""Memory checkpoints on network-namespace hosts (tests/netns): cairnd on
host 0, one cairn-agent and one rank on each of hosts 1..N, links shaped to
--rate (tbf), the bench model split by rows over the ranks, replicas 1.

For each N in --hosts, one run of:
  blocked     a rank's time inside AsyncSave of a memory save (the copy into
              its agent's staging memory), against one memcpy of the rank's
              bytes in this process;
  replicate   each node pushes its rank's shards to the next node before the
              rank commits: the slowest push (bytes / the agent's push time),
              as a fraction of the link limit measured in the same run (one
              TCP stream from host 1 to host 2 through the shaped links);
  recovery    node 1's agent is killed and a replacement started empty; every
              rank loads latest (the memory checkpoint) through its agent, the
              lost shards from node 2's replica over the link: the slowest
              rank's load time, and the peer bytes it moved against the link
              limit.
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
import glob
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


LINK_PROBE = r"""
import socket, sys, time
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(1); c, _ = s.accept(); got = 0
    buf = bytearray(1 << 20); t0 = None
    while got < n:
        k = c.recv_into(buf)
        if k == 0: break
        if t0 is None: t0 = time.time()
        got += k
    print("recv %d %.6f" % (got, time.time() - t0), flush=True)
else:
    for _ in range(200):
        try:
            s = socket.create_connection((host, port)); break
        except OSError:
            time.sleep(0.05)
    chunk = b"x" * (1 << 20); sent = 0
    while sent < n:
        s.sendall(chunk); sent += len(chunk)
    s.close()
"""


def link_limit(c, nbytes):
    """What one TCP stream moves from host 1 to host 2 (bytes/s): the
    links' limit in this run, shaping and veth included."""
    probe = os.path.join(c.dir, "link_probe.py")
    with open(probe, "w") as f:
        f.write(LINK_PROBE)
    port = "17777"
    recv = c.net.start(2, ["/usr/bin/python3", probe, "recv", c.net.address(2), port,
                           str(nbytes)], os.path.join(c.dir, "probe-recv.log"))
    send = c.net.start(1, ["/usr/bin/python3", probe, "send", c.net.address(2), port,
                           str(nbytes)], os.path.join(c.dir, "probe-send.log"))
    send.wait(120)
    recv.wait(120)
    with open(os.path.join(c.dir, "probe-recv.log")) as f:
        got, secs = f.read().split()[1:3]
    return int(got) / float(secs)


def push_rates(c, step):
    """(bytes, seconds) of every replica push of `step` in the agents' logs."""
    out = []
    for path in sorted(glob.glob(os.path.join(c.dir, "agent-*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                if " bytes of " in line and (" step %d " % step) in line + " " \
                        and " pushed " in line:
                    words = line.split()
                    n = int(words[words.index("pushed") + 1])
                    secs = float(words[words.index("in") + 1])
                    out.append((n, secs))
    return out


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
        pushes = push_rates(c, 4)
        ops = json_lines(c, "save", world)
        saves = [o for o in ops if o["op"] == "async_save"]
        commits = [o for o in ops if o["op"] == "committed"]
        rank_bytes = max(o["bytes"] for o in saves)
        blocked = max(o["blocked_s"] for o in saves)
        wait = max(o["wait_s"] for o in commits)
        memcpy = memcpy_seconds(rank_bytes)
        link = link_limit(c, min(nbytes, 200_000_000))
        # Each node's push of its rank's shards, timed by the agent.
        replicate_bps = min(n / t for n, t in pushes) if pushes else 0.0

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
            "link_MBps": round(link / 1e6, 1),
            "replication_MBps": round(replicate_bps / 1e6, 1),
            "replication_x_link": round(replicate_bps / link, 3),
            "bytes_on_links": sum(sent),
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
