#!/usr/bin/env python3
"""Faults across host boundaries: a campaign on network-namespace hosts
(cluster.py: cairnd on host 0, one cairn-agent with two ranks on each of
hosts 1 and 2, replicas 1, links shaped to --rate, a --model of 200 MB so
that a save and its replication take seconds).

Every trial commits a checkpoint, then starts the next save through the
agents and, after a random delay (mid-stage, mid-persist or
mid-replication), does one of:
  kill_agent      SIGKILL a random agent (then a replacement starts)
  freeze_agent    SIGSTOP a random agent for --hold seconds, then SIGCONT
  partition_host  take a random agent host's link down for --hold seconds
  kill_rank       SIGKILL a random rank mid-save
Then the cluster is healed (dead agents replaced) and every rank loads
`latest` through its agent, into another layout every other trial, each
rank verifying every element. Invariants (any break is a violation):
  * the load succeeds and restores a committed step bit-exact;
  * that step is the new one when every rank's save reported it committed
    (nothing acknowledged disappears), and never older than the one committed
    before the trial (latest never goes backwards);
  * nothing partial is visible: a step is loaded only whole and verified.

Usage: campaign.py BUILD_DIR [--mode short|long] [--trials N] [--seed S]
                   [--rate R] [--hold S]
Prints one JSON summary line (trials, faults by kind, loads from memory and
storage, violations) and exits 1 on any violation, 77 (skipped) when
namespaces cannot be made here. short: 4 trials (ctest netns.campaign_short);
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

KINDS = ("kill_agent", "freeze_agent", "partition_host", "kill_rank")


def trial(c, t, rng, hold, committed, stats):
    """One trial; returns the list of violations (strings)."""
    job = "campaign"
    step = committed + 1
    save = c.start_ranks(job, ["--save-step", str(step)], "t%d-save" % t)
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
    for n, p in c.agents.items():
        if p.poll() is not None:
            c.start_agent(n)
    acked = all(code == 0 for code in codes)
    layout = "4:S1" if t % 2 else c.layout
    loads = c.ranks(job, ["--load", "latest"], "t%d-load" % t, layout=layout, timeout=120)
    violations = []
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
    trials = args.trials or (4 if args.mode == "short" else 40)
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="cairn-netns-campaign-")
    stats = {"faults": {}, "loads_memory": 0, "loads_storage": 0, "acked": 0}
    violations = []
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
            v, committed = trial(c, t, rng, args.hold, committed, stats)
            violations += v
            print("trial %d: %s" % (t, "; ".join(v) or "ok, latest step %d" % committed),
                  file=sys.stderr, flush=True)
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
