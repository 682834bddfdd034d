#!/usr/bin/python3
"""Cairn's crash test, in the spirit of RocksDB's db_crashtest.

Real processes: cairnd, training ranks (client/examples/cairn_train_example),
cairn-agent and agent-mode ranks (tests/agent_rank.cc), the `cairn` CLI.
Every trial runs a save job (and sometimes a `cairn rm` / `cairn gc`, or
retention through cairnd --keep-last) and SIGKILLs one process, either at a
random moment or at a named crash point (common/crash_point.h:
CAIRN_CRASH_POINTS=NAME[@N] in that process's environment). A dead cairnd is
restarted (sometimes armed to die again during its recovery); a dead rank
takes its job down, and the job is relaunched as a launcher would, re-saving
the steps that were not acknowledged, with a different layout (so a restarted
rank that wrongly rejoined the old attempt would write different bytes).

After every trial, with every process of the trial gone and cairnd restarted
clean, the invariants are checked:
  * committed: every COMMITTED checkpoint of `cairn ls` (online) passes
    `cairn verify` and loads bit-exact into a different world size and layout
    (the example rank checks every value against the synthetic model);
    `--load latest` loads the newest committed step;
  * agree: the online catalog (cairn -c) and the storage read offline
    (cairn -s file://...) list the same committed steps, and no record is
    left WRITING or DELETING with nothing running;
  * durable: a step a rank was told is committed (Save returned, or the agent
    future) is still committed, unless the harness deleted it or retention
    could have (keep-last newer committed steps exist);
  * monotonic: `latest` never goes backwards across trials, except when the
    harness itself deleted the latest step (then it is the previous one);
  * no garbage after recovery + `cairn gc --keep 1000000` (which deletes
    nothing): no `.cairn-tmp.*` file, no step directory that is not a
    committed checkpoint, no file in a committed step that its MANIFEST does
    not name (attempt directories of aborted saves), no empty directory.

Usage:
  tests/crash/crash_test.py --build-dir build --mode short   # ctest, 32 trials
  tests/crash/crash_test.py --build-dir build --mode long    # 300 trials
  tests/crash/crash_test.py --build-dir build --seed 7 --trials 40

Exit status 0 when every invariant held in every trial; 1 on a violation
(the trial, its seed, what was killed where, the logs' directory and a
command that replays the run are printed); 2 on a usage or setup error.
Python 3 standard library only.
"""

import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

JOB = "crash"
AGENT_JOB = "crashagent"
KEEP_LAST = 3
GC_KEEP_ALL = 1000000

# Crash points (see the CAIRN_CRASH_POINT calls in the sources).
CAIRND_COMMIT_POINTS = [
    # Reached only by a MANIFEST written through a writer (streamed or held
    # in pieces): start_cairnd passes --manifest-held-mib 0 when it is armed.
    "storage.publish_manifest.before_close",
    "coordinator.commit.after_manifest_publish",
    "coordinator.commit.after_catalog_commit",
]
CAIRND_DELETE_POINTS = [
    # storage::DeleteStep, under `cairn rm`, `cairn gc`, retention and
    # recovery: before anything is removed, between the MANIFEST and the
    # data, after the data (before the catalog record goes).
    "storage.delete_step.begin",
    "storage.delete_step.after_manifest",
    "storage.delete_step.end",
]
CAIRND_ABORT_POINTS = ["coordinator.abort.before_cleanup"]
CAIRND_RECOVERY_POINTS = "coordinator.recover.*,storage.delete_step.*"
RANK_POINTS = ["client.write.mid_object", "client.before_commit"]
AGENT_POINTS = ["agent.persist.begin", "client.write.mid_object",
                "client.before_commit"]
AGENT_STREAM_POINTS = ["agent.stream.mid_write"]

# Layouts per world size: a relaunched job uses another one than the job it
# replaces, and loads use yet another world size.
LAYOUTS = {
    1: ["1:R"],
    2: ["2:S0", "2:S1", "2:R"],
    3: ["3:S0", "3:S1"],
    4: ["2x2:S0,S1", "4:S0", "4:S1", "2x2:S1,S0"],
}

# The example ranks' synthetic models the jobs save ("small" is ~0.8 MB).
BENCH_MODELS = ["bench:2000000", "bench:4194304"]

MODES = {
    # trials, model choices
    "short": dict(trials=32),
    "long": dict(trials=300),
}


class Violation(Exception):
    pass


class SetupError(Exception):
    pass


def now():
    return time.monotonic()


class Proc:
    """A child process with its output in a log file."""

    def __init__(self, name, argv, log_path, env=None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.log = open(log_path, "wb")
        full_env = dict(os.environ)
        full_env.pop("CAIRN_CRASH_POINTS", None)
        if env:
            full_env.update(env)
        self.p = subprocess.Popen(argv, stdout=self.log,
                                  stderr=subprocess.STDOUT, env=full_env,
                                  stdin=subprocess.DEVNULL)
        self.pid = self.p.pid

    def poll(self):
        return self.p.poll()

    def alive(self):
        return self.p.poll() is None

    def wait(self, timeout):
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait()
        self.log.close()

    def term(self, timeout):
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
        rc = self.wait(timeout)
        if rc is None:
            self.kill()
        self.log.close()
        return rc

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def crash_point(self):
        """The crash point that killed this process, or None."""
        m = re.search(r"cairn: crash point '([^']+)' hit \d+: SIGKILL",
                      self.output())
        return m.group(1) if m else None


class Harness:

    def __init__(self, args):
        self.args = args
        def binary(flag, rel):
            if flag:
                return os.path.abspath(flag)
            if not args.build_dir:
                raise SetupError(f"give --build-dir or the path of {rel}")
            return os.path.join(os.path.abspath(args.build_dir), rel)

        self.cairnd_bin = binary(args.cairnd, "server/coordinator/cairnd")
        self.cairn_bin = binary(args.cairn, "client/cli/cairn")
        self.rank_bin = binary(args.rank,
                               "client/examples/cairn_train_example")
        self.agent_bin = binary(args.agent, "server/agent/cairn-agent")
        self.agent_rank_bin = binary(args.agent_rank, "tests/cairn_agent_rank")
        for p in [self.cairnd_bin, self.cairn_bin, self.rank_bin]:
            if not os.access(p, os.X_OK):
                raise SetupError(f"missing binary {p} (build it first)")
        self.agents_enabled = (os.access(self.agent_bin, os.X_OK) and
                               os.access(self.agent_rank_bin, os.X_OK) and
                               not args.no_agents)
        base = args.work_dir or os.environ.get("TEST_TMPDIR") or None
        self.root = tempfile.mkdtemp(prefix="cairn-crash-", dir=base)
        self.data = os.path.join(self.root, "data")
        os.makedirs(self.data)
        self.storage = os.path.join(self.data, "checkpoints")
        self.logs = os.path.join(self.root, "logs")
        os.makedirs(self.logs)
        self.port = 0
        self.min_keep_last = KEEP_LAST  # smallest --keep-last > 0 used
        self.cairnd = None
        self.cairnd_gen = 0
        self.cairnd_deaths = 0
        self.proc_seq = 0
        self.kills = collections.Counter()
        self.stats = collections.Counter()
        self.violations = []
        # Per job: next step to save, newest committed seen, acknowledged
        # steps, steps the harness deleted (or tried to).
        self.next_step = {JOB: 100, AGENT_JOB: 100}
        self.latest = {JOB: None, AGENT_JOB: None}
        self.acked = {JOB: set(), AGENT_JOB: set()}
        self.deleted = {JOB: set(), AGENT_JOB: set()}
        self.must_be_gone = {JOB: set(), AGENT_JOB: set()}  # deletes that
        # answered OK
        self.trial = 0
        self.trial_log = []  # what happened in the current trial
        self.job_seconds = 1.0  # running estimate of a save job's length
        self.tick_hook = None  # called while a job runs

    # ------------------------------------------------------------------
    # processes

    def log_path(self, name):
        self.proc_seq += 1
        return os.path.join(self.logs, f"t{self.trial:04d}-{self.proc_seq:03d}"
                            f"-{name}.log")

    def note(self, text):
        self.trial_log.append(text)
        if self.args.verbose:
            print(f"  [{self.trial}] {text}", flush=True)

    def address(self):
        return f"127.0.0.1:{self.port}"

    def start_cairnd(self, points=None, keep_last=KEEP_LAST,
                     commit_deadline=30, expect_start=True):
        """Starts cairnd on the run's port; returns True once it serves,
        False if it died first (a crash point during recovery)."""
        assert self.cairnd is None or not self.cairnd.alive()
        if keep_last > 0:
            self.min_keep_last = min(self.min_keep_last, keep_last)
        self.cairnd_gen += 1
        port_file = os.path.join(self.root, f"port.{self.cairnd_gen}")
        argv = [self.cairnd_bin, "--data-dir", self.data,
                "--listen", f"127.0.0.1:{self.port}", "--port-file", port_file,
                "--keep-last", str(keep_last), "--begin-deadline", "20",
                "--commit-deadline", str(commit_deadline),
                "--shutdown-grace", "5", "--log-level", "info"]
        # Half the time every MANIFEST is streamed through an ObjectWriter
        # (the path of a manifest over 64 MiB), not put in one write.
        if (points and "publish_manifest" in points) or \
                self.rng.random() < 0.5:
            argv += ["--manifest-held-mib", "0"]
        env = {"CAIRN_CRASH_POINTS": points} if points else None
        self.cairnd = Proc("cairnd", argv, self.log_path("cairnd"), env)
        self.cairnd.points = points
        deadline = now() + 60
        while now() < deadline:
            if os.path.exists(port_file):
                with open(port_file) as f:
                    text = f.read().strip()
                if text:
                    self.port = int(text)
                    self.note(f"cairnd started on {self.port}"
                              + (f" armed {points}" if points else ""))
                    return True
            rc = self.cairnd.poll()
            if rc is not None:
                point = self.cairnd.crash_point()
                if point is not None:
                    self.kills[f"cairnd@{point}"] += 1
                    self.note(f"cairnd died starting up at {point}")
                    return False
                out = self.cairnd.output()
                if self.port != 0 and "ddress already in use" in out:
                    # Someone took the port meanwhile: pick a new one.
                    self.port = 0
                    return self.start_cairnd(points, keep_last,
                                             commit_deadline, expect_start)
                raise Violation(f"cairnd exited {rc} on start:\n{out[-3000:]}")
            time.sleep(0.02)
        raise Violation("cairnd did not start within 60 s:\n" +
                        self.cairnd.output()[-3000:])

    def ensure_cairnd(self, recovery_crash_prob=0.0):
        """Restarts a dead cairnd, sometimes armed to die in its recovery."""
        if self.cairnd is not None and self.cairnd.alive():
            return
        if self.cairnd is not None:
            self.cairnd.kill()
            self.record_cairnd_death()
        for _ in range(3):
            if self.rng.random() < recovery_crash_prob:
                if self.start_cairnd(points=CAIRND_RECOVERY_POINTS):
                    return  # survived its recovery (armed for later)
                continue
            break
        self.start_cairnd()

    def record_cairnd_death(self):
        c = self.cairnd
        if getattr(c, "counted", False):
            return
        c.counted = True
        self.cairnd_deaths += 1
        point = c.crash_point()
        if point is not None:
            self.kills[f"cairnd@{point}"] += 1
            self.note(f"cairnd died at crash point {point}")

    def kill_cairnd(self, kind):
        if self.cairnd is not None and self.cairnd.alive():
            self.cairnd.kill()
            self.cairnd.counted = True
            self.cairnd_deaths += 1
            self.kills[f"cairnd:{kind}"] += 1
            self.note(f"cairnd SIGKILLed ({kind})")

    def stop_cairnd_clean(self):
        """SIGTERM: cairnd must drain and exit 0."""
        if self.cairnd is None:
            return
        if not self.cairnd.alive():
            self.cairnd.kill()
            self.record_cairnd_death()
            return
        rc = self.cairnd.term(30)
        if rc == -signal.SIGKILL and self.cairnd.crash_point() is not None:
            self.record_cairnd_death()  # an armed point hit while draining
            return
        if rc != 0:
            raise Violation(f"cairnd exited {rc} on SIGTERM (expected 0 after "
                            f"draining):\n{self.cairnd.output()[-3000:]}")

    def cli(self, *args, offline=False, timeout=120, points=None):
        target = (["-s", "file://" + self.storage] if offline else
                  ["-c", self.address()])
        argv = [self.cairn_bin] + target + list(args)
        env = dict(os.environ)
        env.pop("CAIRN_CRASH_POINTS", None)
        if points:
            env["CAIRN_CRASH_POINTS"] = points
        try:
            r = subprocess.run(argv, capture_output=True, timeout=timeout,
                               stdin=subprocess.DEVNULL, env=env)
        except subprocess.TimeoutExpired:
            raise Violation(f"`{' '.join(argv)}` hung for {timeout} s")
        return (r.returncode, r.stdout.decode("utf-8", "replace"),
                r.stderr.decode("utf-8", "replace"))

    def list_states(self, job, offline=False):
        """{step: state} from `cairn ls JOB --all`."""
        if offline and not os.path.isdir(os.path.join(self.storage, job)):
            return {}  # the job never wrote anything
        rc, out, err = self.cli("ls", job, "--all", offline=offline)
        if rc != 0:
            raise Violation(f"`cairn {'-s' if offline else '-c'} ls {job} "
                            f"--all` failed ({rc}): {err.strip()}")
        states = {}
        for line in out.splitlines():
            f = line.split()
            if len(f) >= 3 and f[0] == job and f[1].isdigit():
                states[int(f[1])] = f[2]
        return states

    # ------------------------------------------------------------------
    # jobs

    def rank_argv(self, job_kind, rank, world, layout, model):
        return [self.rank_bin, "--coordinator", self.address(), "--job", JOB,
                "--rank", str(rank), "--world-size", str(world), "--model",
                model, "--layout", layout]

    def run_group(self, argvs, names, envs, kill_at=None, timeout=120,
                  on_tick=None, kill_group=True):
        """Runs one process per argv, as a launcher does: when one fails the
        others are killed (unless not `kill_group`). `kill_at` = (seconds,
        index): SIGKILL that process then. Returns (procs, exit codes, killed
        index or None)."""
        procs = [Proc(n, a, self.log_path(n), e)
                 for a, n, e in zip(argvs, names, envs)]
        t0 = now()
        killed = None
        failed = False
        while True:
            if on_tick is not None:
                on_tick()
            if (kill_at is not None and killed is None and
                    now() - t0 >= kill_at[0]):
                i = kill_at[1]
                if procs[i].alive():
                    procs[i].kill()
                    killed = i
                else:
                    kill_at = None  # it was already done
            codes = [p.poll() for p in procs]
            if (kill_group and not failed and
                    any(c not in (None, 0) for c in codes)):
                failed = True
                for p in procs:
                    if p.alive():
                        p.kill()
                codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if now() - t0 > timeout:
                for p in procs:
                    p.kill()
                raise Violation(
                    f"{names} still running after {timeout} s (hang); "
                    f"logs: {[p.log_path for p in procs]}")
            time.sleep(0.01)
        for p in procs:
            p.kill()  # closes the log
        return procs, [p.poll() for p in procs], killed

    def acked_from(self, procs, regex):
        steps = set()
        for p in procs:
            for m in re.finditer(regex, p.output()):
                steps.add(int(m.group(1)))
        return steps

    def save_steps(self, job, n):
        steps = []
        s = self.next_step[job]
        for _ in range(n):
            steps.append(s)
            s += self.rng.randint(1, 3)
        self.next_step[job] = s
        return steps

    def direct_job(self, steps, world, model, rank_points=None, kill_at=None,
                   relaunches=2):
        """A training job saving `steps`; relaunched (other layout) after a
        failure for the steps not yet committed. Returns acked steps."""
        layouts = list(LAYOUTS[world])
        self.rng.shuffle(layouts)
        acked = set()
        remaining = list(steps)
        attempt = 0
        while remaining:
            layout = layouts[attempt % len(layouts)]
            argvs, names, envs = [], [], []
            for r in range(world):
                a = self.rank_argv("direct", r, world, layout, model)
                a += ["--save-steps", ",".join(map(str, remaining))]
                if self.rng.random() < 0.5:
                    a.append("--buffered-writes")
                argvs.append(a)
                names.append(f"rank{r}")
                env = None
                if rank_points and r in rank_points:
                    env = {"CAIRN_CRASH_POINTS": rank_points[r]}
                envs.append(env)
            self.note(f"job {JOB} world {world} layout {layout} model {model} "
                      f"saves {remaining}"
                      + (f" armed {rank_points}" if rank_points else "")
                      + (f" kill rank {kill_at[1]} at {kill_at[0]:.2f}s"
                         if kill_at else ""))
            t0 = now()
            deaths = self.cairnd_deaths
            procs, codes, killed = self.run_group(
                argvs, names, envs, kill_at=kill_at, on_tick=self.on_tick)
            took = now() - t0
            got = self.acked_from(procs, r"rank \d+: save step (\d+):")
            acked |= got
            self.acked[JOB] |= got
            self.note(f"job exit codes {codes}, acked {sorted(got)}")
            if killed is not None:
                self.kills["rank:random"] += 1
            for p in procs:
                point = p.crash_point()
                if point is not None:
                    self.kills[f"rank@{point}"] += 1
                    self.note(f"{p.name} died at crash point {point}")
            if all(c == 0 for c in codes):
                if self.cairnd_deaths == deaths and killed is None:
                    # Nothing died: the job's length sets when random kills
                    # land.
                    self.job_seconds = 0.7 * self.job_seconds + 0.3 * took
                break
            attempt += 1
            if attempt > relaunches:
                self.stats["jobs given up"] += 1
                break
            # A launcher relaunches the job: steps already committed are
            # skipped (a save of a committed step is refused).
            self.ensure_cairnd()
            committed = {s for s, st in self.list_states(JOB).items()
                         if st == "COMMITTED"}
            remaining = [s for s in remaining
                         if s not in acked and s not in committed]
            rank_points, kill_at = None, None
            self.stats["job relaunches"] += 1
        return acked

    def on_tick(self):
        if self.tick_hook is not None:
            self.tick_hook()
        self.watch_cairnd()

    def watch_cairnd(self):
        """During a job: a cairnd that died is restarted on the same port
        (sometimes armed to die again in its recovery)."""
        if self.cairnd is not None and not self.cairnd.alive():
            self.record_cairnd_death()
            self.ensure_cairnd(recovery_crash_prob=self.args.recovery_crash)

    # ------------------------------------------------------------------
    # agent mode

    def agent_job(self, steps, world, points, kill_agent_at, kill_ranks_after):
        sock = f"/tmp/cairn-crash-{os.getpid()}-{self.trial}.sock"
        ready = os.path.join(self.root, f"agent-{self.trial}.ready")
        stream = points and points[0].startswith("agent.stream")
        argv = [self.agent_bin, "--node-id", "0", "--listen-unix", sock,
                "--peer-listen", "127.0.0.1:0", "--peer-dir",
                os.path.join(self.root, "peers"), "--num-nodes", "1",
                "--coordinator", self.address(), "--replicas", "0",
                "--ready-file", ready]
        model = "small"
        if stream:
            argv += ["--staging-budget-mib", "1", "--stream-bucket-kib", "128",
                     "--stream-idle-timeout-ms", "3000"]
            model = "bench:4194304"
        else:
            argv += ["--staging-budget-mib", "64"]
        env = {"CAIRN_CRASH_POINTS": ",".join(points)} if points else None
        agent = Proc("agent", argv, self.log_path("agent"), env)
        deadline = now() + 30
        while not os.path.exists(ready):
            if not agent.alive() or now() > deadline:
                agent.kill()
                raise Violation("cairn-agent did not start:\n" +
                                agent.output()[-2000:])
            time.sleep(0.02)
        layout = self.rng.choice(LAYOUTS[world])
        argvs, names = [], []
        for r in range(world):
            a = [self.agent_rank_bin, "--agent-socket", sock, "--coordinator",
                 self.address(), "--job", AGENT_JOB, "--rank", str(r),
                 "--world-size", str(world), "--layout", layout, "--model",
                 model, "--save-step", str(steps[0]), "--repeat",
                 str(len(steps)), "--json"]
            if kill_ranks_after:
                a.append("--kill-after-async-save")
            argvs.append(a)
            names.append(f"agentrank{r}")
        self.note(f"agent job world {world} layout {layout} model {model} "
                  f"steps {steps}" + (f" agent armed {points}" if points else "")
                  + (f" kill agent at {kill_agent_at:.2f}s"
                     if kill_agent_at is not None else "")
                  + (" ranks die after AsyncSave" if kill_ranks_after else ""))
        t0 = now()
        agent_killed = False

        def tick():
            nonlocal agent_killed
            self.watch_cairnd()
            if (kill_agent_at is not None and not agent_killed and
                    now() - t0 >= kill_agent_at and agent.alive()):
                agent.kill()
                agent_killed = True
                self.kills["agent:random"] += 1
                self.note("agent SIGKILLed (random)")

        # Ranks that kill themselves after AsyncSave must not take the
        # others down before their AsyncSave returned.
        procs, codes, _ = self.run_group(argvs, names, [None] * world,
                                         on_tick=tick,
                                         kill_group=not kill_ranks_after)
        got = set()
        for p in procs:
            for line in p.output().splitlines():
                if line.startswith("{"):
                    try:
                        j = json.loads(line)
                    except ValueError:
                        continue
                    if j.get("op") == "committed":
                        got.add(int(j["step"]))
        handed = all(
            re.search(rf"async_save.*\"step\":{steps[0]}\b", p.output())
            for p in procs)
        if kill_ranks_after and handed and agent.alive():
            # Every rank died right after AsyncSave of the first step
            # returned: the agent owns the shards and must commit them.
            deadline = now() + 60
            st = {}
            while now() < deadline and agent.alive():
                st = self.list_states(AGENT_JOB)
                if st.get(steps[0]) in ("COMMITTED", "ABORTED"):
                    break
                self.watch_cairnd()
                time.sleep(0.05)
            if agent.alive() and st.get(steps[0]) != "COMMITTED":
                agent.kill()
                raise Violation(
                    f"durable: {AGENT_JOB} step {steps[0]}: the ranks died "
                    f"after AsyncSave returned and the agent, alive, did not "
                    f"commit it within 60 s (state {st.get(steps[0])}); "
                    f"agent log {agent.log_path}")
            if st.get(steps[0]) == "COMMITTED":
                got.add(steps[0])
        point = agent.crash_point() if not agent.alive() else None
        if point is not None:
            self.kills[f"agent@{point}"] += 1
            self.note(f"agent died at crash point {point}")
        agent.kill()
        for p in procs:
            if kill_ranks_after and p.poll() == -signal.SIGKILL:
                self.kills["agentrank:after_async_save"] += 1
        try:
            os.unlink(sock)
        except OSError:
            pass
        self.acked[AGENT_JOB] |= got
        self.note(f"agent job exit codes {codes}, acked {sorted(got)}")
        return got

    # ------------------------------------------------------------------
    # trials

    def committed(self, job):
        return sorted(s for s, st in self.list_states(job).items()
                      if st == "COMMITTED")

    def run_trial(self):
        rng = self.rng
        kinds = ["cairnd_point", "cairnd_random", "rank_point", "rank_random",
                 "all_random", "delete", "abort", "none"]
        weights = [5, 4, 4, 3, 2, 3, 1, 1]
        if self.agents_enabled:
            kinds.append("agent")
            weights.append(3)
        kind = rng.choices(kinds, weights)[0]
        if self.args.only:
            kind = rng.choice(self.args.only.split(","))
        self.stats[f"trial {kind}"] += 1
        self.note(f"trial kind {kind}")
        world = rng.choice([2, 2, 3, 4])
        model = rng.choice(["small", "small", "small", "bench:2000000"])

        if kind == "cairnd_point":
            if rng.random() < 0.3:
                # Every cairnd point armed with a small probability.
                spec = ",".join(f"{p}%{rng.choice([0.05, 0.1, 0.2])}"
                                for p in CAIRND_COMMIT_POINTS +
                                CAIRND_DELETE_POINTS + CAIRND_ABORT_POINTS)
            else:
                point = rng.choice(CAIRND_COMMIT_POINTS + CAIRND_DELETE_POINTS)
                spec = f"{point}@{rng.randint(1, 3)}"
            self.start_cairnd(points=spec,
                              keep_last=rng.choice([1, 2, KEEP_LAST]))
            self.direct_job(self.save_steps(JOB, 3), world, model)
        elif kind == "cairnd_random":
            self.start_cairnd()
            steps = self.save_steps(JOB, 3)
            at = rng.uniform(0, self.job_seconds)
            t0 = now()
            fired = False

            def killer():
                nonlocal fired
                if not fired and now() - t0 >= at:
                    fired = True
                    self.kill_cairnd("random")

            self.note(f"cairnd will be killed at {at:.2f}s")
            self.tick_hook = killer
            try:
                self.direct_job(steps, world, model)
            finally:
                self.tick_hook = None
        elif kind == "rank_point":
            cairnd_points = None
            if rng.random() < 0.5:
                # The relaunch aborts the old attempt: die in that cleanup.
                cairnd_points = rng.choice(CAIRND_ABORT_POINTS)
            self.start_cairnd(points=cairnd_points)
            r = rng.randrange(world)
            point = rng.choice(RANK_POINTS)
            n = rng.randint(1, 3) if point == "client.write.mid_object" else \
                rng.randint(1, 2)
            self.direct_job(self.save_steps(JOB, 2), world, model,
                            rank_points={r: f"{point}@{n}"})
        elif kind == "rank_random":
            self.start_cairnd()
            at = rng.uniform(0, self.job_seconds)
            self.direct_job(self.save_steps(JOB, 3), world, model,
                            kill_at=(at, rng.randrange(world)))
        elif kind == "all_random":
            # The node dies: cairnd and every rank at the same moment.
            self.start_cairnd()
            at = rng.uniform(0, self.job_seconds)
            t0 = now()
            fired = False

            def node_dies():
                nonlocal fired
                if not fired and now() - t0 >= at:
                    fired = True
                    self.kill_cairnd("node")

            self.tick_hook = node_dies
            try:
                self.direct_job(self.save_steps(JOB, 3), world, model,
                                kill_at=(at, rng.randrange(world)))
            finally:
                self.tick_hook = None
        elif kind == "delete":
            self.delete_trial(world, model)
        elif kind == "abort":
            # A rank dies after writing, before CommitSave; the others wait
            # for the commit deadline, cairnd aborts and cleans up (and may
            # die doing so).
            self.start_cairnd(
                points=rng.choice([None] + CAIRND_ABORT_POINTS),
                commit_deadline=3)
            r = rng.randrange(world)
            self.direct_job(self.save_steps(JOB, 1), world, model,
                            rank_points={r: "client.before_commit"},
                            relaunches=1)
        elif kind == "agent":
            self.start_cairnd()
            sub = rng.choice(["point", "point", "random", "ranks_die",
                              "stream"])
            steps = self.save_steps(AGENT_JOB, rng.randint(1, 3))
            w = rng.choice([1, 2])
            if sub == "point":
                pts = [f"{rng.choice(AGENT_POINTS)}@{rng.randint(1, 2)}"]
                self.agent_job(steps, w, pts, None, False)
            elif sub == "stream":
                pts = [f"{rng.choice(AGENT_STREAM_POINTS)}@"
                       f"{rng.randint(1, 20)}"]
                self.agent_job(steps, w, pts, None, False)
            elif sub == "random":
                self.agent_job(steps, w, None,
                               rng.uniform(0, self.job_seconds), False)
            else:
                self.agent_job(steps, w, None, None, True)
        else:
            self.start_cairnd()
            self.direct_job(self.save_steps(JOB, 2), world, model)

        # Everything of the trial is gone; cairnd restarts clean.
        if self.cairnd.alive() and rng.random() < 0.5:
            self.kill_cairnd("idle")
        else:
            self.stop_cairnd_clean()
        self.ensure_cairnd(recovery_crash_prob=self.args.recovery_crash)
        if self.cairnd.points:
            # It survived its recovery armed: restart it unarmed.
            self.stop_cairnd_clean()
            self.start_cairnd()
        self.check_invariants()
        self.stop_cairnd_clean()

    def delete_trial(self, world, model):
        rng = self.rng
        # Make sure there is something to delete.
        self.start_cairnd(keep_last=0)
        if len(self.committed(JOB)) < 2:
            self.direct_job(self.save_steps(JOB, 2), world, model)
        self.stop_cairnd_clean()
        point = rng.choice(CAIRND_DELETE_POINTS)
        self.start_cairnd(points=f"{point}@{rng.randint(1, 2)}", keep_last=0)
        committed = self.committed(JOB)
        how = rng.choice(["rm", "rm", "rm_latest", "gc", "gc", "retention",
                          "offline_rm"])
        if how == "offline_rm" and committed:
            # `cairn -s ... rm` with cairnd down, the CLI dying mid-delete:
            # cairnd's recovery must reconcile its catalog with storage.
            self.cairnd.term(30)
            step = rng.choice(committed)
            self.deleted[JOB].add(step)
            rc, out, err = self.cli("rm", JOB, str(step), "-y", offline=True,
                                    points=f"{point}@1")
            died = re.search(r"crash point '([^']+)'", err)
            if died:
                self.kills[f"cli@{died.group(1)}"] += 1
            elif rc == 0:
                self.must_be_gone[JOB].add(step)
            self.note(f"cairn -s rm {step} over {committed} (cairnd down): "
                      f"rc {rc} {err.strip()[:200]}")
            return
        if how == "retention" or not committed:
            # Retention on commit deletes the older steps.
            self.cairnd.term(30)
            self.start_cairnd(points=f"{point}@{rng.randint(1, 2)}",
                              keep_last=1)
            self.deleted[JOB] |= set(committed)
            self.note(f"retention keep-last 1 over {committed}")
            self.direct_job(self.save_steps(JOB, 1), world, model)
            return
        if how == "gc":
            keep = rng.randint(1, max(1, len(committed) - 1))
            gone = committed[:len(committed) - keep]
            self.deleted[JOB] |= set(gone)
            rc, out, err = self.cli("gc", JOB, "--keep", str(keep))
            if rc == 0:
                self.must_be_gone[JOB] |= set(gone)
            self.note(f"cairn gc --keep {keep} over {committed}: rc {rc} "
                      f"{err.strip()[:200]}")
        else:
            step = committed[-1] if how == "rm_latest" else rng.choice(
                committed)
            self.deleted[JOB].add(step)
            rc, out, err = self.cli("rm", JOB, str(step), "-y")
            if rc == 0:
                self.must_be_gone[JOB].add(step)
            self.note(f"cairn rm {step} over {committed}: rc {rc} "
                      f"{err.strip()[:200]}")
        self.watch_cairnd()

    # ------------------------------------------------------------------
    # invariants

    def check_invariants(self):
        for job in (JOB, AGENT_JOB):
            self.check_job(job)
        self.check_garbage()

    def check_job(self, job):
        online = self.list_states(job)
        offline = self.list_states(job, offline=True)
        on_c = sorted(s for s, st in online.items() if st == "COMMITTED")
        off_c = sorted(s for s, st in offline.items() if st == "COMMITTED")
        if on_c != off_c:
            raise Violation(
                f"agree: job {job}: catalog (cairn -c ls) lists committed "
                f"{on_c}, storage (cairn -s ls) has MANIFESTs for {off_c}; "
                f"online states {online}")
        stuck = {s: st for s, st in online.items()
                 if st not in ("COMMITTED", "ABORTED")}
        if stuck:
            raise Violation(f"agree: job {job}: records {stuck} after "
                            f"recovery with nothing running")
        for s in on_c:
            rc, out, err = self.cli("verify", job, str(s), timeout=300)
            if rc != 0:
                raise Violation(f"committed: `cairn verify {job} {s}` failed "
                                f"({rc}): {err.strip()[-1500:]}")
            self.stats["verifies"] += 1
        # Loads, bit-exact, into another world size (direct-mode ranks).
        if on_c:
            self.load_check(job, "latest", on_c[-1])
            for s in on_c[:-1]:
                self.load_check(job, str(s), s)
        back = sorted(self.must_be_gone[job] & set(on_c))
        if back:
            raise Violation(f"durable: job {job}: steps {back} were deleted "
                            f"(rm/gc answered OK) but are committed again")
        # latest never goes backwards.
        prev = self.latest[job]
        cur = on_c[-1] if on_c else None
        if prev is not None and (cur is None or cur < prev):
            if prev not in self.deleted[job]:
                raise Violation(f"monotonic: job {job}: latest went back from "
                                f"{prev} to {cur}")
        # Acknowledged saves are durable.
        later = set(on_c) | self.deleted[job]
        for s in sorted(self.acked[job]):
            if s in on_c or s in self.deleted[job]:
                continue
            if sum(1 for c in later if c > s) >= self.min_keep_last:
                # Retention may have removed it: that many newer steps were
                # committed, and cairnd ran with --keep-last that small.
                continue
            raise Violation(f"durable: job {job}: step {s} was acknowledged "
                            f"as committed but is not (committed: {on_c})")
        self.latest[job] = cur if cur is not None else prev

    def load_check(self, job, ref, want):
        world = self.rng.choice([1, 2, 3])
        layout = self.rng.choice(LAYOUTS[world])
        # The model saved under this step: the agent job and direct jobs
        # may use either model; read it from the manifest size instead of
        # guessing: try "small" first, then the bench model.
        model = self.model_of(job, want)
        argvs, names = [], []
        for r in range(world):
            a = [self.rank_bin, "--coordinator", self.address(), "--job", job,
                 "--rank", str(r), "--world-size", str(world), "--model",
                 model, "--layout", layout, "--load", ref]
            argvs.append(a)
            names.append(f"load{r}")
        procs, codes, _ = self.run_group(argvs, names, [None] * world,
                                         timeout=180)
        if any(c != 0 for c in codes):
            logs = "\n".join(p.output()[-800:] for p in procs)
            raise Violation(f"committed: load of {job} {ref} (step {want}) "
                            f"into {world} ranks {layout} failed {codes}:\n"
                            f"{logs}")
        got = self.acked_from(procs, r"rank \d+: load step (\d+):")
        if got != {want}:
            raise Violation(f"committed: load of {job} {ref} returned steps "
                            f"{sorted(got)}, expected {want}")
        self.stats["loads"] += 1

    def manifest(self, job, step):
        """The manifest of a committed step as JSON, read offline."""
        rc, out, err = self.cli("show", job, str(step), "--json", "--chunks",
                                offline=True)
        if rc != 0:
            raise Violation(f"committed: `cairn -s show {job} {step} --json` "
                            f"failed ({rc}): {err.strip()}")
        return json.loads(out)

    def model_of(self, job, step):
        """Which synthetic model a committed step holds."""
        m = self.manifest(job, step)
        shapes = {t["fqn"]: t["global_shape"] for t in m["tensors"]}
        if "model.embed.weight" in shapes:
            return "small"
        for model in BENCH_MODELS:
            rows = max(int(float(model.split(":")[1]) / 8 / 4096 / 4), 4)
            if shapes.get("model.layers.0.weight") == [rows, 4096]:
                return model
        raise Violation(f"committed: {job} step {step}: no known model has "
                        f"tensors {shapes}")

    def manifest_objects(self, job, step):
        m = self.manifest(job, step)
        objs = set(m["objects"])
        for t in m["tensors"]:
            for c in t.get("chunks", []):
                objs.add(c["location"]["object_key"])
        for b in m["bytes_entries"]:
            objs.add(b["location"]["object_key"])
        return objs

    def check_garbage(self):
        for job in (JOB, AGENT_JOB):
            rc, out, err = self.cli("gc", job, "--keep", str(GC_KEEP_ALL))
            if rc != 0:
                raise Violation(f"`cairn gc {job} --keep {GC_KEEP_ALL}` "
                                f"failed ({rc}): {err.strip()}")
        garbage = []
        for job in (JOB, AGENT_JOB):
            jdir = os.path.join(self.storage, job)
            if not os.path.isdir(jdir):
                continue
            committed = {s for s, st in self.list_states(job).items()
                         if st == "COMMITTED"}
            for name in sorted(os.listdir(jdir)):
                path = os.path.join(jdir, name)
                if not name.isdigit() or not os.path.isdir(path):
                    garbage.append(f"{path} (not a step directory)")
                    continue
                step = int(name)
                if step not in committed:
                    inside = []
                    for dirpath, dirnames, filenames in os.walk(path):
                        inside += [os.path.relpath(os.path.join(dirpath, f),
                                                   path)
                                   for f in dirnames + filenames]
                    garbage.append(f"{path} (step {step} is not committed; "
                                   f"holds {sorted(inside)[:6] or 'nothing'})")
                    continue
                keep = {"MANIFEST"} | self.manifest_objects(job, step)
                for dirpath, dirnames, filenames in os.walk(path):
                    rel_dir = os.path.relpath(dirpath, path)
                    if not dirnames and not filenames:
                        garbage.append(f"{dirpath} (empty directory)")
                    for f in filenames:
                        rel = os.path.normpath(os.path.join(rel_dir, f))
                        if f.startswith(".cairn-tmp"):
                            garbage.append(f"{os.path.join(dirpath, f)} "
                                           f"(temp file)")
                        elif rel not in keep:
                            garbage.append(f"{os.path.join(dirpath, f)} "
                                           f"(not in the MANIFEST)")
        if garbage:
            raise Violation("garbage after recovery + gc:\n  " +
                            "\n  ".join(garbage[:20]) +
                            (f"\n  ... {len(garbage)} in all"
                             if len(garbage) > 20 else ""))

    # ------------------------------------------------------------------

    def cleanup_processes(self):
        if self.cairnd is not None:
            self.cairnd.kill()

    def run(self):
        args = self.args
        trials = args.trials or MODES[args.mode]["trials"]
        t_start = now()
        print(f"cairn crash test: mode {args.mode}, {trials} trials, seed "
              f"{args.seed}, work dir {self.root}", flush=True)
        for i in range(trials):
            self.trial = i
            self.trial_log = []
            trial_seed = args.seed * 1000003 + i
            self.rng = random.Random(trial_seed)
            t0 = now()
            try:
                self.run_trial()
                self.stats["trials"] += 1
            except Violation as v:
                self.stats["trials"] += 1
                self.violations.append((i, trial_seed, str(v),
                                        list(self.trial_log)))
                print(f"\nVIOLATION in trial {i} (trial seed {trial_seed}):\n"
                      f"{v}\n  trial steps:\n    " +
                      "\n    ".join(self.trial_log), flush=True)
                self.cleanup_processes()
                if not args.keep_going:
                    break
                # Start over from a clean directory: the state is suspect.
                self.reset_data()
            if args.verbose or (i + 1) % 10 == 0 or i + 1 == trials:
                print(f"trial {i + 1}/{trials} done ({now() - t0:.1f} s; "
                      f"{now() - t_start:.0f} s total)", flush=True)
        self.cleanup_processes()
        self.summary(trials, now() - t_start)
        return 1 if self.violations else 0

    def reset_data(self):
        shutil.rmtree(self.data, ignore_errors=True)
        os.makedirs(self.data)
        self.latest = {JOB: None, AGENT_JOB: None}
        self.acked = {JOB: set(), AGENT_JOB: set()}
        self.deleted = {JOB: set(), AGENT_JOB: set()}
        self.must_be_gone = {JOB: set(), AGENT_JOB: set()}

    def summary(self, trials, wall):
        a = self.args
        print("\n== cairn crash test summary")
        print(f"mode {a.mode}, seed {a.seed}, trials run {self.stats['trials']}"
              f" of {trials}, wall time {wall:.0f} s")
        total = sum(self.kills.values())
        print(f"kills: {total}")
        for k, v in sorted(self.kills.items()):
            print(f"  {k:55s} {v}")
        for k, v in sorted(self.stats.items()):
            if k != "trials":
                print(f"  {k:55s} {v}")
        print(f"violations: {len(self.violations)}")
        if self.violations:
            for i, seed, text, _ in self.violations:
                first = text.splitlines()[0]
                print(f"  trial {i} (seed {seed}): {first}")
            print(f"logs and data kept in {self.root}")
            print("reproduce: /usr/bin/python3 " + os.path.abspath(__file__) +
                  f" --cairnd {self.cairnd_bin} --cairn {self.cairn_bin}"
                  f" --rank {self.rank_bin} --agent {self.agent_bin}"
                  f" --agent-rank {self.agent_rank_bin} --mode {a.mode}"
                  f" --seed {a.seed} --trials {self.violations[0][0] + 1}" +
                  (f" --only {a.only}" if a.only else "") +
                  (" --no-agents" if a.no_agents else "") +
                  (f" --recovery-crash {a.recovery_crash}"
                   if a.recovery_crash != 0.25 else ""))
        elif not a.keep_dir:
            shutil.rmtree(self.root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build-dir", default="",
                    help="CMake build directory with cairnd, cairn, the "
                    "example ranks and the agent (or give each path below)")
    ap.add_argument("--cairnd", default="", help="path of cairnd")
    ap.add_argument("--cairn", default="", help="path of the cairn CLI")
    ap.add_argument("--rank", default="",
                    help="path of cairn_train_example")
    ap.add_argument("--agent", default="", help="path of cairn-agent")
    ap.add_argument("--agent-rank", default="",
                    help="path of cairn_agent_rank")
    ap.add_argument("--mode", choices=sorted(MODES), default="short")
    ap.add_argument("--trials", type=int, default=0,
                    help="number of trials (default: 32 short, 300 long)")
    ap.add_argument("--seed", type=int, default=None,
                    help="run seed (default: random, printed)")
    ap.add_argument("--only", default="",
                    help="comma-separated trial kinds to run (cairnd_point, "
                    "cairnd_random, rank_point, rank_random, all_random, "
                    "delete, abort, "
                    "agent, none)")
    ap.add_argument("--recovery-crash", type=float, default=0.25,
                    help="probability that a restarted cairnd is armed to die "
                    "during its recovery")
    ap.add_argument("--no-agents", action="store_true",
                    help="skip agent-mode trials")
    ap.add_argument("--keep-going", action="store_true",
                    help="continue after a violation (fresh data directory)")
    ap.add_argument("--keep-dir", action="store_true",
                    help="keep the work directory even when all passed")
    ap.add_argument("--work-dir", default="",
                    help="parent of the temporary work directory")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 1 << 31)
    try:
        h = Harness(args)
    except SetupError as e:
        print(f"crash_test: {e}", file=sys.stderr)
        return 2
    try:
        return h.run()
    except KeyboardInterrupt:
        h.cleanup_processes()
        raise


if __name__ == "__main__":
    sys.exit(main())
