#!/usr/bin/env python3
"""TLS cost per save inside long-lived rank processes, as in training.

  bench/tls_bench.py [--build build] [--bytes 2e8] [--steps 8] [--repeat 3]
  bench/tls_bench.py --smoke [--build build]

e2e_bench.py --tls starts a new process for every save and load, so each one
pays a connection and a TLS handshake. A training job opens its Checkpointer
once and saves every K steps over the same channel. This benchmark runs 4
example ranks that save steps 1..N in one process each, against a plaintext
cairnd and a mutual-TLS cairnd (certificates from
tests/testing/make_test_certs.sh), alternating which goes first each round,
and reports per step the control path (BeginSave as the last rank to arrive
saw it + CommitSave as the slowest rank saw it) and the whole save. Step 1
includes the handshake; steps 2..N are the steady state.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_bench as e2e  # noqa: E402  (start_cairnd, run_ranks, make_certs, TLS)


def run(args, certs):
    """One cairnd and one 4-rank job saving steps 1..N: per step (control s, save s)."""
    flags, env = e2e.tls_flags_and_env(certs)
    d, addr = e2e.start_cairnd(os.path.join(args.build, "server/coordinator/cairnd"),
                               os.path.join(args.dir, "data"), flags)
    try:
        steps = ",".join(str(s) for s in range(1, args.steps + 1))
        ranks = e2e.run_ranks(os.path.join(args.build, "client/examples/cairn_train_example"),
                              addr, "tls", 4, "bench:%d" % int(args.bytes), "4:S0",
                              ["--save-steps", steps], args.timeout, env)
    finally:
        e2e.stop_cairnd(d)
    out = []
    for i in range(args.steps):
        if any(r[i]["step"] != i + 1 for r in ranks):
            sys.exit("tls_bench: FAILED: a rank's stats are not in step order")
        plan = min(r[i]["plan_s"] for r in ranks)
        commit = max(r[i]["commit_s"] for r in ranks)
        save = plan + max(r[i]["io_s"] + r[i]["commit_s"] for r in ranks)
        out.append((plan + commit, save))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(e2e.ROOT, "build"))
    p.add_argument("--dir", default="/tmp/cairn-tls-bench")
    p.add_argument("--bytes", type=float, default=2e8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--smoke", action="store_true", help="1 round, 3 steps, 8 MB")
    args = p.parse_args()
    if args.smoke:
        args.bytes, args.steps, args.repeat, args.timeout = 8e6, 3, 1, 120
    os.makedirs(args.dir, exist_ok=True)
    certs = e2e.make_certs(os.path.join(args.dir, "certs"))
    rounds = {"plaintext": [], "mutual TLS": []}
    for i in range(args.repeat):
        order = ("plaintext", "mutual TLS") if i % 2 == 0 else ("mutual TLS", "plaintext")
        for mode in order:
            rounds[mode].append(run(args, certs if mode == "mutual TLS" else None))
    print("| mode | step 1: control ms per round | steps 2-%d: control ms (median) "
          "| steps 2-%d: save s (median) | control / save |" % (args.steps, args.steps))
    print("|---|---|---|---|---|")
    medians = {}
    for mode, rs in rounds.items():
        first = ", ".join("%.1f" % (r[0][0] * 1e3) for r in rs)
        ctl = statistics.median(x[0] for r in rs for x in r[1:])
        save = statistics.median(x[1] for r in rs for x in r[1:])
        medians[mode] = (ctl, save)
        print("| %s | %s | %.1f | %.3f | %.2f%% |" % (mode, first, ctl * 1e3, save,
                                                      100 * ctl / save))
    (pc, ps), (tc, ts) = medians["plaintext"], medians["mutual TLS"]
    print("TLS steady state: control path %+.1f ms per save = %.2f%% of a plaintext save "
          "(saves %.3fx)" % ((tc - pc) * 1e3, 100 * (tc - pc) / ps, ts / ps))


if __name__ == "__main__":
    main()
