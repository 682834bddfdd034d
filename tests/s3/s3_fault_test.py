#!/usr/bin/python3
"""Cairn on S3 when the S3 server misbehaves: real cairnd, ranks
(client/examples/cairn_train_example) and CLI against a real radosgw, on a
private single-node Ceph this test starts (scripts/ceph/ceph.sh, its own
--dir and --port, so killing radosgw disturbs no other test) and stops.

Cases (each on a fresh bucket, each checking bytes, not just exit codes):
  throttled   a fault proxy (fault_proxy.py) answers every 4th part upload
              and PUT with 503 SlowDown, every 5th GET with 500
              InternalError, every 9th request of any other kind with 429,
              and resets every 13th connection mid-request: the 4-rank save
              commits and loads back resharded into 3 ranks bit-exact; the
              proxy must have injected faults of each sort.
  never-clears  the proxy answers every PUT/POST with 503 SlowDown: the save
              fails on every rank within the retry budget, naming the HTTP
              status and S3 code; the previous checkpoint stays latest and
              loads bit-exact.
  rgw-killed  radosgw SIGKILLed while the ranks are mid-upload (multipart
              uploads in progress): every rank fails cleanly, the previous
              checkpoint is still latest and loads bit-exact once radosgw is
              back, a new save succeeds, and after a cairnd restart neither
              the failed step's objects nor its multipart uploads remain.

Usage: tests/s3/s3_fault_test.py --build-dir build [--keep]
Exit status 0 when every case passed; 1 otherwise (the failing check and the
logs' directory are printed). Needs ceph-mon/ceph-osd/radosgw and
python3-boto3 (scripts/install_deps.sh); never skips.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fault_proxy  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CEPH_SH = os.path.join(ROOT, "scripts/ceph/ceph.sh")
JOB = "faults"
# ~24 MiB of tensors over 4 ranks: each rank's object is several 5 MiB parts.
MODEL = "bench:25165824"
S3_KNOBS = "part_bytes=5242880&single_put_max_bytes=5242880&upload_concurrency=2"


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


class Env:
    def __init__(self, args):
        self.args = args
        self.root = tempfile.mkdtemp(prefix="cairn-s3-faults-")
        self.port = args.port
        self.ceph_dir = os.path.join(self.root, "ceph")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        b = args.build_dir
        self.cairnd_bin = os.path.join(b, "server/coordinator/cairnd")
        self.cairn_bin = os.path.join(b, "client/cli/cairn")
        self.rank_bin = os.path.join(b, "client/examples/cairn_train_example")
        for p in (self.cairnd_bin, self.cairn_bin, self.rank_bin):
            if not os.path.exists(p):
                raise SystemExit(f"s3_fault_test: {p} is not built")
        self.env = dict(os.environ)
        self.env.update({"AWS_ACCESS_KEY_ID": "cairn",
                         "AWS_SECRET_ACCESS_KEY": "cairnsecret",
                         "AWS_REGION": "us-east-1"})
        self.env.pop("AWS_ENDPOINT_URL", None)  # every URI names its endpoint
        self.cairnd = None
        self.cairnd_port = None
        self.logs = 0

    def ceph(self, *cmd, timeout=180):
        r = subprocess.run([CEPH_SH, *cmd, "--dir", self.ceph_dir, "--port",
                            str(self.port)], capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise Failure(f"ceph.sh {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")

    def s3(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint,
                            aws_access_key_id="cairn",
                            aws_secret_access_key="cairnsecret",
                            region_name="us-east-1")

    def log(self, name):
        self.logs += 1
        return open(os.path.join(self.root, f"{self.logs:02d}-{name}.log"), "w")

    # --- cairnd -------------------------------------------------------------

    def start_cairnd(self, storage_uri, data):
        os.makedirs(data, exist_ok=True)
        port_file = os.path.join(data, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        listen = f"127.0.0.1:{self.cairnd_port or 0}"
        self.cairnd = subprocess.Popen(
            [self.cairnd_bin, "--data-dir", data, "--storage", storage_uri,
             "--listen", listen, "--port-file", port_file,
             "--begin-deadline", "30", "--log-level", "info"],
            stdout=self.log("cairnd"), stderr=subprocess.STDOUT, env=self.env)
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            if self.cairnd.poll() is not None or time.time() > deadline:
                raise Failure(f"cairnd did not start (exit {self.cairnd.poll()}); "
                              f"logs in {self.root}")
            time.sleep(0.05)
        time.sleep(0.05)
        self.cairnd_port = int(open(port_file).read().strip())

    def stop_cairnd(self):
        if self.cairnd is not None and self.cairnd.poll() is None:
            self.cairnd.terminate()
            try:
                self.cairnd.wait(60)
            except subprocess.TimeoutExpired:
                self.cairnd.kill()
                self.cairnd.wait()
        self.cairnd = None

    def address(self):
        return f"127.0.0.1:{self.cairnd_port}"

    # --- ranks and CLI ----------------------------------------------------------

    def start_ranks(self, world, layout, extra, name):
        procs = []
        for r in range(world):
            argv = [self.rank_bin, "--coordinator", self.address(), "--job",
                    JOB, "--rank", str(r), "--world-size", str(world),
                    "--model", MODEL, "--layout", layout, *extra]
            out = self.log(f"{name}-rank{r}")
            procs.append((subprocess.Popen(argv, stdout=out,
                                           stderr=subprocess.STDOUT,
                                           env=self.env), out.name))
        return procs

    def wait_ranks(self, procs, timeout=300):
        deadline = time.time() + timeout
        results = []
        for p, log in procs:
            try:
                rc = p.wait(max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                for q, _ in procs:
                    q.kill()
                raise Failure(f"a rank hung for {timeout} s (logs {self.root})")
            results.append((rc, open(log).read()))
        return results

    def ranks(self, world, layout, extra, name, timeout=300):
        return self.wait_ranks(self.start_ranks(world, layout, extra, name),
                               timeout)

    def cli_states(self):
        r = subprocess.run([self.cairn_bin, "-c", self.address(), "ls", JOB,
                            "--all"], capture_output=True, text=True,
                           timeout=120, env=self.env)
        if r.returncode != 0:
            raise Failure(f"cairn ls failed: {r.stderr}")
        states = {}
        for line in r.stdout.splitlines():
            f = line.split()
            if len(f) >= 3 and f[0] == JOB and f[1].isdigit():
                states[int(f[1])] = f[2]
        return states

    def latest(self):
        committed = [s for s, st in self.cli_states().items()
                     if st == "COMMITTED"]
        return max(committed) if committed else None


def all_ok(results, what):
    bad = [(i, rc, out[-1500:]) for i, (rc, out) in enumerate(results) if rc != 0]
    check(not bad, f"{what}: ranks failed: {bad}")


def new_bucket(env, name):
    bucket = f"cairn-faults-{name}-{os.urandom(4).hex()}"
    env.s3().create_bucket(Bucket=bucket)
    return bucket


# ------------------------------------------------------------------ cases


def case_throttled(env):
    bucket = new_bucket(env, "throttled")
    seen = {"part": 0, "put": 0, "get": 0, "other": 0, "conn": 0}
    lock = threading.Lock()

    def rule(req):
        kind = req.kind
        with lock:
            seen["conn"] += 1
            if seen["conn"] % 13 == 0:
                return ("reset",)
            if kind in ("part", "put"):
                seen["part"] += 1
                return ("status", 503, "SlowDown") if seen["part"] % 4 == 0 else None
            if kind == "get":
                seen["get"] += 1
                return ("status", 500, "InternalError") if seen["get"] % 5 == 0 else None
            seen["other"] += 1
            return ("status", 429, "TooManyRequests") if seen["other"] % 9 == 0 else None

    proxy = fault_proxy.FaultProxy(("127.0.0.1", env.port), rule)
    try:
        uri = (f"s3://{bucket}/ckpt?endpoint=http://127.0.0.1:{proxy.port}"
               f"&{S3_KNOBS}&max_attempts=8")
        env.start_cairnd(uri, os.path.join(env.root, "cairnd-throttled"))
        all_ok(env.ranks(4, "4:S0", ["--save-steps", "1", "--buffered-writes"],
                         "throttled-save"), "save through a throttling proxy")
        check(env.cli_states().get(1) == "COMMITTED",
              f"step 1 not committed: {env.cli_states()}")
        all_ok(env.ranks(3, "3:S1", ["--load", "1"], "throttled-load"),
               "resharded load through a throttling proxy")
        c = proxy.counts()
        print(f"  throttled: {c['requests']} requests, {c['injected']} faults "
              f"injected: {c['injected_by']}")
        inj = c["injected_by"]
        check(any(k.endswith("status:503") for k in inj), f"no 503 injected: {inj}")
        check(any(k.startswith("get:status:500") for k in inj), f"no GET 500: {inj}")
        check(any(k.endswith(":reset") for k in inj), f"no reset injected: {inj}")
    finally:
        env.stop_cairnd()
        proxy.close()


def case_never_clears(env):
    bucket = new_bucket(env, "never")
    mode = {"fail": False}

    def rule(req):
        if mode["fail"] and req.method in ("PUT", "POST"):
            return ("status", 503, "SlowDown")
        return None

    proxy = fault_proxy.FaultProxy(("127.0.0.1", env.port), rule)
    try:
        uri = (f"s3://{bucket}/ckpt?endpoint=http://127.0.0.1:{proxy.port}"
               f"&{S3_KNOBS}&max_attempts=3")
        env.start_cairnd(uri, os.path.join(env.root, "cairnd-never"))
        all_ok(env.ranks(4, "4:S0", ["--save-steps", "1"], "never-save1"),
               "first save")
        mode["fail"] = True
        results = env.ranks(4, "4:S0", ["--save-steps", "2"], "never-save2")
        check(all(rc != 0 for rc, _ in results),
              f"ranks succeeded against a server refusing every PUT: "
              f"{[rc for rc, _ in results]}")
        text = "\n".join(out for _, out in results)
        check("503" in text and "SlowDown" in text and bucket in text,
              f"no rank's error names HTTP 503 / SlowDown / the bucket:\n{text[-3000:]}")
        mode["fail"] = False
        states = env.cli_states()
        check(states.get(1) == "COMMITTED" and states.get(2) != "COMMITTED",
              f"after the failed save: {states}")
        check(env.latest() == 1, f"latest is {env.latest()}, not 1")
        all_ok(env.ranks(2, "2:S1", ["--load", "latest"], "never-load"),
               "load of the previous checkpoint")
        print(f"  never-clears: {proxy.counts()['injected']} PUT/POSTs refused; "
              f"save failed on every rank, step 1 loads")
    finally:
        env.stop_cairnd()
        proxy.close()


def case_rgw_killed(env):
    bucket = new_bucket(env, "killed")
    s3 = env.s3()
    uri = f"s3://{bucket}/ckpt?endpoint={env.endpoint}&{S3_KNOBS}&max_attempts=3"
    data = os.path.join(env.root, "cairnd-killed")
    env.start_cairnd(uri, data)
    try:
        all_ok(env.ranks(4, "4:S0", ["--save-steps", "1"], "killed-save1"),
               "first save")
        # A bigger save, so the kill lands mid-upload.
        procs = env.start_ranks(4, "4:S0", ["--save-steps", "2"], "killed-save2")
        deadline = time.time() + 120
        while True:
            ups = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
            if ups:
                break
            if time.time() > deadline or all(p.poll() is not None for p, _ in procs):
                raise Failure("never saw a multipart upload in progress")
            time.sleep(0.01)
        env.ceph("kill-rgw")
        results = env.wait_ranks(procs, timeout=300)
        failed = [rc for rc, _ in results if rc != 0]
        check(failed, "every rank succeeded although radosgw died mid-upload")
        env.ceph("start-rgw")
        states = env.cli_states()
        check(states.get(1) == "COMMITTED" and states.get(2) != "COMMITTED",
              f"after radosgw died: {states}")
        all_ok(env.ranks(3, "3:S1", ["--load", "latest"], "killed-load1"),
               "load of the previous checkpoint after radosgw came back")
        all_ok(env.ranks(4, "4:S0", ["--save-steps", "3"], "killed-save3"),
               "save after radosgw came back")
        check(env.latest() == 3, f"latest is {env.latest()} after saving 3")
        # A restart reconciles storage: nothing of step 2 remains.
        env.stop_cairnd()
        env.start_cairnd(uri, data)
        keys = [o["Key"] for o in s3.list_objects_v2(
            Bucket=bucket, Prefix=f"ckpt/{JOB}/0000000000000002/").get("Contents", [])]
        ups = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        check(not keys, f"objects of the failed step remain: {keys[:5]}")
        check(not ups, f"multipart uploads remain: {[u['Key'] for u in ups][:5]}")
        all_ok(env.ranks(2, "2:S1", ["--load", "latest"], "killed-load3"),
               "load of step 3 after the restart")
        print(f"  rgw-killed: {len(failed)}/4 ranks failed cleanly, step 1 "
              f"loaded, step 3 saved; no leftovers after restart")
    finally:
        env.stop_cairnd()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", required=True)
    p.add_argument("--port", type=int, default=7482,
                   help="radosgw port of the private cluster (monitor: -700)")
    p.add_argument("--keep", action="store_true", help="keep the logs")
    p.add_argument("--case", action="append",
                   choices=["throttled", "never-clears", "rgw-killed"])
    args = p.parse_args()
    env = Env(args)
    cases = {"throttled": case_throttled, "never-clears": case_never_clears,
             "rgw-killed": case_rgw_killed}
    ok = True
    try:
        env.ceph("start")
        for name in args.case or list(cases):
            t = time.time()
            try:
                cases[name](env)
                print(f"PASS {name} ({time.time() - t:.0f} s)")
            except Failure as e:
                ok = False
                print(f"FAIL {name}: {e}\n  logs: {env.root}")
    finally:
        env.stop_cairnd()
        try:
            env.ceph("stop", timeout=60)
        except Exception as e:  # noqa: BLE001
            print(f"stopping Ceph: {e}")
    if ok and not args.keep:
        shutil.rmtree(env.root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
