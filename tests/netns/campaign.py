#!/usr/bin/env python3
"""Faults across host boundaries: a campaign on network-namespace hosts
(cluster.py: cairnd on host 0, one cairn-agent with two ranks on each of
hosts 1 and 2, replicas 1, links shaped to --rate, a --model of 200 MB so
that a save and its replication take seconds).

Every trial commits a checkpoint, then starts the next save through the
agents — every other one a memory checkpoint (kept in the agents' memory
only, one replica on the other node), the others persistent — and, after a
random delay (mid-stage, mid-persist or mid-replication), does one of:
  kill_agent      SIGKILL a random agent (then a replacement starts)
  freeze_agent    SIGSTOP a random agent for --hold seconds, then SIGCONT
  partition_host  take a random agent host's link down for --hold seconds
  kill_rank       SIGKILL a random rank mid-save
  restart_cairnd  SIGKILL cairnd mid-save and start it again (the memory
                  checkpoints it knew must stay restorable)
and in about a third of the trials an agent is also killed mid-load (the
ranks that loaded anyway must have loaded a committed step; then every rank
loads again).
Then the cluster is healed (dead agents replaced, and cairnd has given the
newest checkpoint its two copies back or written it to storage) and every
rank loads `latest` through its agent, into another layout every other
trial, each rank verifying every element. Invariants (any break is a
violation):
  * the load succeeds and restores a committed step bit-exact;
  * that step is the new one when every rank's save reported it committed
    (nothing acknowledged disappears), and never older than the one committed
    before the trial (latest never goes backwards);
  * nothing partial is visible: a step is loaded only whole and verified;
  * `cairn ls` agrees: the loaded step is listed COMMITTED and restorable;
  * no memory leak: an agent never maps more staging memory than its
    budget, nor has a heap above its peer mailbox's bound (twice the budget)
    + 256 MiB, and one that lives through 10 trials or more ends with its
    heap within 256 MiB of what it was once warm.

Usage: campaign.py BUILD_DIR [--mode short|long] [--trials N] [--seed S]
                   [--rate R] [--hold S]
Prints one JSON summary line (trials, faults by kind, loads from memory and
storage, violations) and exits 1 on any violation, 77 (skipped) when
namespaces cannot be made here. short: 5 trials, one per fault kind (ctest
netns.campaign_short);
long: 40.
"""
import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
import hosts  # noqa: E402

KINDS = ("kill_agent", "freeze_agent", "restart_cairnd", "partition_host", "kill_rank")


def rss_growth(rss_seen):
    """Violations: an agent that lived through 10 trials or more whose heap at
    the end is more than 256 MiB above what it held once warm (the most of
    its 3rd to 6th trials)."""
    out = []
    for pid, samples in rss_seen.items():
        if len(samples) < 10:
            continue
        warm, last = max(samples[2:6]), max(samples[-3:])
        if last > warm + (256 << 20):
            out.append("agent pid %d: its heap grew from %d MiB (warm) to %d MiB over %d "
                       "trials" % (pid, warm >> 20, last >> 20, len(samples)))
    return out


def heal(c, job):
    """Dead agents replaced; then the newest checkpoint has its two copies
    back (or is on storage) before the next fault, which may take the other
    node: one replica survives one loss at a time."""
    for n, p in c.agents.items():
        if p.poll() is not None:
            c.start_agent(n)
    deadline = time.time() + 60
    while time.time() < deadline:
        listed = c.checkpoints(job)
        newest = listed[-1] if listed else {}
        if newest.get("tier") != "memory" or newest.get("live_copies", 0) >= 2:
            return
        time.sleep(0.5)


def trial(c, t, rng, hold, committed, stats, rss_seen):
    """One trial; returns the list of violations (strings)."""
    job = "campaign"
    step = committed + 1
    tier = "memory" if t % 2 else "persistent"
    stats["tiers"][tier] = stats["tiers"].get(tier, 0) + 1
    save = c.start_ranks(job, ["--save-step", str(step), "--tier", tier],
                         "t%d-save" % t)
    time.sleep(rng.uniform(0.0, 2.0))
    kind = KINDS[t % len(KINDS)] if t < len(KINDS) else rng.choice(KINDS)
    stats["faults"][kind] = stats["faults"].get(kind, 0) + 1
    node = rng.randrange(c.nodes)
    if kind == "kill_agent":
        c.agents[node].send_signal(signal.SIGKILL)
        c.agents[node].wait()
    elif kind == "freeze_agent":
        c.agents[node].send_signal(signal.SIGSTOP)
        time.sleep(hold)
        c.agents[node].send_signal(signal.SIGCONT)
    elif kind == "restart_cairnd":
        c.restart_cairnd()
    elif kind == "partition_host":
        c.net.partition(node + 1)
        time.sleep(hold)
        c.net.heal(node + 1)
    else:
        victim = rng.choice(save)
        try:
            os.killpg(victim.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    codes = c.wait(save, 90)
    acked = all(code == 0 for code in codes)
    heal(c, job)
    layout = "4:S1" if t % 2 else c.layout
    violations = []
    if rng.random() < 0.3:
        # Mid-load: an agent killed while the ranks load through it. A rank
        # whose load succeeded anyway verified every element; then the job
        # restarts and every rank loads again.
        stats["faults"]["kill_agent_mid_load"] = \
            stats["faults"].get("kill_agent_mid_load", 0) + 1
        first = c.start_ranks(job, ["--load", "latest"], "t%d-load0" % t, layout=layout)
        time.sleep(rng.uniform(0.0, 1.0))
        n = rng.randrange(c.nodes)
        c.agents[n].send_signal(signal.SIGKILL)
        c.agents[n].wait()
        for r, code in enumerate(c.wait(first, 120)):
            got = c.loaded_step("t%d-load0" % t, r) if code == 0 else None
            if got is not None and got < committed:
                violations.append("trial %d (mid-load): rank %d loaded step %d, older "
                                  "than the committed %d" % (t, r, got, committed))
        heal(c, job)
    loads = c.ranks(job, ["--load", "latest"], "t%d-load" % t, layout=layout, timeout=120)
    for r, code in enumerate(loads):
        got = c.loaded_step("t%d-load" % t, r) if code == 0 else None
        if got is None:
            violations.append("trial %d (%s): rank %d could not load latest (exit %s)" %
                              (t, kind, r, code))
            continue
        if "from agent memory" in c.rank_log("t%d-load" % t, r):
            stats["loads_memory"] += 1
        else:
            stats["loads_storage"] += 1
        if got < committed:
            violations.append("trial %d (%s): rank %d loaded step %d, older than the "
                              "committed %d" % (t, kind, r, got, committed))
        if acked and got != step:
            violations.append("trial %d (%s): every rank's save of step %d was "
                              "acknowledged, rank %d loaded step %d" % (t, kind, step, r, got))
    steps = {c.loaded_step("t%d-load" % t, r) for r in range(c.world)}
    if len(steps) > 1:
        violations.append("trial %d (%s): ranks loaded different steps %s" % (t, kind, steps))
    listed = {int(x["step"]): x for x in c.checkpoints(job)}
    for s in steps - {None}:
        x = listed.get(s)
        if x is None or x.get("state") != "COMMITTED" or not x.get("restorable"):
            violations.append("trial %d (%s): loaded step %d, which cairn ls shows as %s" %
                              (t, kind, s, x))
    # An agent's memory: its staging segments (shared memory, at most the
    # budget) and its heap, which holds its peer mailbox (at most twice the
    # budget of replica and fetch data waiting for their readers): bounded,
    # and the heap flat once warm.
    for n, p in c.agents.items():
        rss = c.rss_bytes(p)
        if rss is None:
            continue
        anon, shmem = rss
        stats["agent_heap_max_mib"] = max(stats["agent_heap_max_mib"], anon >> 20)
        stats["agent_shm_max_mib"] = max(stats["agent_shm_max_mib"], shmem >> 20)
        rss_seen.setdefault(p.pid, []).append(anon)
        if shmem > (c.budget_mib + 16) << 20:
            violations.append("trial %d: agent %d maps %d MiB of staging, above its %d MiB "
                              "budget" % (t, n, shmem >> 20, c.budget_mib))
        if anon > (2 * c.budget_mib + 256) << 20:
            violations.append("trial %d: agent %d has a %d MiB heap, above twice its %d MiB "
                              "budget + 256 MiB" % (t, n, anon >> 20, c.budget_mib))
    stats["acked"] += acked
    return violations, max(s for s in steps if s is not None) if steps - {None} else committed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build")
    p.add_argument("--mode", choices=("short", "long"), default="short")
    p.add_argument("--trials", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--rate", default="400mbit")
    p.add_argument("--model", default="bench:200000000",
                   help="cairn_agent_rank --model: bytes of the whole model (default "
                        "200 MB: a save and its replication take seconds on the links)")
    p.add_argument("--hold", type=float, default=2.0,
                   help="seconds a frozen agent or a partitioned host stays so")
    args = p.parse_args()
    why = hosts.unavailable()
    if why:
        print("SKIPPED: network-namespace hosts cannot be made here: " + why)
        return 77
    trials = args.trials or (len(KINDS) if args.mode == "short" else 40)
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="cairn-netns-campaign-")
    stats = {"faults": {}, "tiers": {}, "loads_memory": 0, "loads_storage": 0, "acked": 0,
             "agent_heap_max_mib": 0, "agent_shm_max_mib": 0}
    violations = []
    rss_seen = {}
    t0 = time.time()
    c = cluster.Cluster(os.path.abspath(args.build), work, rate=args.rate,
                        model=args.model, budget_mib=512)
    try:
        c.start_agent(0)
        c.start_agent(1)
        codes = c.ranks("campaign", ["--save-step", "1"], "base")
        if codes != [0] * c.world:
            print(c.logs())
            raise RuntimeError("the first save failed: %s" % codes)
        committed = 1
        for t in range(trials):
            v, committed = trial(c, t, rng, args.hold, committed, stats, rss_seen)
            violations += v
            print("trial %d: %s" % (t, "; ".join(v) or "ok, latest step %d" % committed),
                  file=sys.stderr, flush=True)
        violations += rss_growth(rss_seen)
    finally:
        if violations:
            print(c.logs(tail=2000), file=sys.stderr)
        c.close()
        if not violations:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"campaign": "netns", "mode": args.mode, "seed": seed, "trials": trials,
                      "seconds": round(time.time() - t0, 1), "rate": args.rate, **stats,
                      "violations": violations}))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
