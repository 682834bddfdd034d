#!/usr/bin/python3
"""S3 benchmark: Cairn through cairnd on radosgw vs reference S3 clients on the same server.

One run, one radosgw (a private single-node Ceph started with
scripts/ceph/ceph.sh unless --endpoint is given), the same bytes:
  save   4 ranks (client/examples/cairn_train_example), rows sharded, through
         cairnd --storage s3://...: every byte uploaded, committed (MANIFEST)
  load2  resharded load into 2 ranks by columns: each rank fetches only its
         byte ranges (coalesced GETs), every byte checked
  load4  load back into 4 ranks by rows
References, each as 4 processes moving the same total bytes in 4 objects:
  boto3  Debian's python3-boto3 TransferManager (upload_fileobj /
         download_fileobj from memory), swept over part size x concurrency;
         its best configuration counts
  s3cmd  Debian's s3cmd put/get of files in /dev/shm (multipart, 16 MiB chunks)
  curl   the curl tool (the libcurl Cairn uses, SigV4 by --aws-sigv4): one PUT
         of the object from /dev/shm; GET as 8 parallel ranged GETs into
         /dev/null (no copy, no check: a C client's ceiling)
The "limit" of a phase is the best reference throughput measured in the same
round (PUT for save, GET for loads); Cairn is reported as a percentage of it.
Tools are interleaved: each of --repeat rounds runs every reference and then
Cairn; each tool's figure is its best round, and per-round ratios are shown.

Requests and bytes are counted on the server, the same way for every tool:
radosgw's perf counters (admin socket `perf dump`: req, put_b, get_b) before
and after each phase, giving HTTP requests per GB and bytes fetched from S3 /
bytes the ranks needed.

CPU is counted per phase too (radosgw and the OSD share the machine's cores
with the clients): the machine's busy time (/proc/stat), the Ceph daemons'
(/proc/PID/stat), the clients' own while moving the bytes (reference
workers between the start signal and their end, after reading or generating
their data; Cairn's ranks inside Save or Load, each rank's own getrusage
count, plus cairnd), what Cairn's ranks used outside that ("untimed":
starting, generating the tensors before a save as a training job already has
them, checking every byte after a load), the rest being other load on the
machine. The CPU table gives CPU seconds per GB for each and says whether the
run was CPU-bound.

Times are collective: references from the first worker's start to the last
one's end (every worker has generated its data before the start); Cairn's save from the plan
barrier to the commit acknowledged, loads from PlanLoad to the last byte
checked, as bench/e2e_bench.py.

Peer (--peers, default s3torchconnector; none with --smoke unless given):
  s3torchconnector  its DCP S3StorageWriter / S3StorageReader on the same
         radosgw and bytes (bench/baselines/s3torchconnector_bench.py, from
         .venv-peers/s3torchconnector that bench/baselines/install.sh makes):
         save 4 rows, load 4 rows -> 2 columns, load 4 -> 4, every element
         checked, in every round after the references; its own table row
         against Cairn. A save its client cannot do on this server is
         reported as not measured, with the reason (the loads then read the
         same DCP layout uploaded with boto3).
The tensors are 8 x [rows, 4096] fp32, rows rounded down to a multiple of 8
(as bench/e2e_bench.py does), so the peer holds the same tensors as Cairn.

Usage: bench/s3_bench.py [--build build] [--bytes 1e9] [--repeat 2]
       [--refs boto3,s3cmd,curl] [--boto3 8:4,16:8,64:4] [--s3-query K=V&...]
       [--peers s3torchconnector|none]
       [--compare-build OTHER_BUILD_DIR]
       [--endpoint http://HOST:PORT --ceph-dir DIR] [--timeout S]
       bench/s3_bench.py --smoke [--build build]
--smoke (ctest bench_smoke.s3_bench, on the ceph fixture's server when
AWS_ENDPOINT_URL is set): 32 MiB, one round, one boto3 configuration, every
process killed after --timeout (120 s). Numbers are meaningless there.
Prints one JSON line per tool and round, then a markdown table.
"""
import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import e2e_bench  # noqa: E402  (run_ranks)

CEPH_SH = os.path.join(ROOT, "scripts/ceph/ceph.sh")
WORKERS = 4
KEYS = {"AWS_ACCESS_KEY_ID": "cairn", "AWS_SECRET_ACCESS_KEY": "cairnsecret",
        "AWS_REGION": "us-east-1"}


# ----------------------------------------------------------------- workers
# `s3_bench.py _worker TOOL OP ENDPOINT BUCKET KEY NBYTES GO_FILE [CHUNK CONC]`:
# one reference process. Prepares its data, prints "ready", waits for GO_FILE,
# moves the bytes, prints {"start": t0, "end": t1, "cpu": CPU seconds it and its
# children (curl, s3cmd) used between the two} (wall clock).

def own_cpu():
    """CPU seconds used by this process and its waited-for children."""
    return sum(r.ru_utime + r.ru_stime for r in (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN)))


def worker(argv):
    tool, op, endpoint, bucket, key, nbytes, go = argv[:7]
    nbytes = int(nbytes)
    shm = f"/dev/shm/cairn-s3bench-{os.getpid()}"
    if tool == "boto3":
        import boto3
        from boto3.s3.transfer import TransferConfig
        chunk, conc = int(argv[7]), int(argv[8])
        s3 = boto3.client("s3", endpoint_url=endpoint)
        cfg = TransferConfig(multipart_threshold=chunk, multipart_chunksize=chunk,
                             max_concurrency=conc, use_threads=True)
        data = os.urandom(nbytes) if op == "put" else None
    elif tool == "curl":
        if op == "put":
            with open(shm, "wb") as f:
                f.write(os.urandom(nbytes))
        base = ["curl", "-sS", "-f", "--aws-sigv4", "aws:amz:us-east-1:s3",
                "--user", "%s:%s" % (KEYS["AWS_ACCESS_KEY_ID"],
                                     KEYS["AWS_SECRET_ACCESS_KEY"]),
                "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
        url = f"{endpoint}/{bucket}/{key}"
        if op == "put":
            cmd = base + ["-T", shm, url, "-o", "/dev/null"]
        else:
            # 8 ranged GETs of the object at once, bodies discarded.
            parts = 8
            cmd = ["curl", "--no-progress-meter", "--parallel", "--parallel-max", "8"]
            step = -(-nbytes // parts)
            for i in range(parts):
                lo, hi = i * step, min(nbytes, (i + 1) * step) - 1
                if i:
                    cmd.append("--next")
                cmd += base[1:] + ["-r", f"{lo}-{hi}", url, "-o", "/dev/null"]
    else:
        if op == "put":
            with open(shm, "wb") as f:
                f.write(os.urandom(nbytes))
        host = endpoint.split("://", 1)[1]
        s3cmd = ["s3cmd", "--access_key", KEYS["AWS_ACCESS_KEY_ID"],
                 "--secret_key", KEYS["AWS_SECRET_ACCESS_KEY"], "--host", host,
                 "--host-bucket", host, "--no-ssl", "--region", "us-east-1",
                 "--multipart-chunk-size-mb", "16", "--no-progress", "-q",
                 "--config", "/dev/null", "--no-check-md5"]
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    t0, cpu0 = time.time(), own_cpu()
    if tool == "boto3":
        if op == "put":
            s3.upload_fileobj(io.BytesIO(data), bucket, key, Config=cfg)
        else:
            buf = io.BytesIO()
            s3.download_fileobj(bucket, key, buf, Config=cfg)
            assert buf.getbuffer().nbytes == nbytes, "short download"
    elif tool == "curl":
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    else:
        if op == "put":
            cmd = s3cmd + ["put", shm, f"s3://{bucket}/{key}"]
        else:
            cmd = s3cmd + ["get", "--force", f"s3://{bucket}/{key}", shm]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        if op == "get":
            assert os.path.getsize(shm) == nbytes, "short download"
    t1, cpu1 = time.time(), own_cpu()
    if os.path.exists(shm):
        os.unlink(shm)
    print(json.dumps({"start": t0, "end": t1, "cpu": cpu1 - cpu0}), flush=True)


# ----------------------------------------------------------------- helpers

class Rgw:
    """radosgw's request and byte counters (admin socket), when reachable."""

    def __init__(self, ceph_dir):
        self.asok = os.path.join(ceph_dir, "run/client.rgw.asok") if ceph_dir else None

    def counters(self):
        if not self.asok or not os.path.exists(self.asok):
            return None
        out = subprocess.run(["ceph", "--admin-daemon", self.asok, "perf", "dump"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            return None
        rgw = json.loads(out.stdout).get("rgw", {})
        return {k: rgw.get(k, 0) for k in ("req", "put", "put_b", "get", "get_b")}

    @staticmethod
    def delta(before, after):
        if before is None or after is None:
            return None
        return {k: after[k] - before[k] for k in before}


class Cpu:
    """CPU seconds used during a phase: the whole machine's busy time
    (/proc/stat); when the server is our Ceph, radosgw's, the OSD's and the
    monitor's own (/proc/PID/stat of the daemons in CEPH_DIR/run/*.pid); the
    clients' (the reference workers' own count while moving bytes, or the
    Cairn ranks' rusage); the rest ("other") is whatever else ran on the
    machine meanwhile (other jobs: noise)."""

    DAEMONS = (("rgw", "client.rgw"), ("osd", "osd.0"), ("mon", "mon.a"))

    def __init__(self, ceph_dir):
        self.pids = {}  # name -> pid; "cairnd" is added while it runs
        for name, f in self.DAEMONS if ceph_dir else ():
            try:
                with open(os.path.join(ceph_dir, "run", f + ".pid")) as fh:
                    self.pids[name] = int(fh.read().strip())
            except (OSError, ValueError):
                pass
        self.tick = os.sysconf("SC_CLK_TCK")

    def sample(self):
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal ...
        snap = {"t": time.monotonic(), "busy": (sum(v[:8]) - v[3] - v[4]) / self.tick}
        for name, pid in list(self.pids.items()):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                snap[name] = (int(fields[11]) + int(fields[12])) / self.tick
            except (OSError, IndexError, ValueError):
                snap[name] = float("nan")
        return snap

    @staticmethod
    def delta(before, after, clients, untimed=0.0):
        """`clients`: the clients' CPU while moving the bytes; `untimed`:
        what they used outside that (Cairn's ranks: start, making the
        tensors before the save, checking them after a load, exit)."""
        d = {k: after[k] - before[k] for k in before}
        d["wall"] = d.pop("t")
        d["clients"] = clients
        d["untimed"] = untimed
        # Clock ticks of 10 ms: a tiny phase can come out a little negative.
        d["other"] = max(0.0, d["busy"] - clients - untimed - d.get("cairnd", 0) -
                         sum(d.get(n, 0) for n, _ in Cpu.DAEMONS))
        return {k: round(x, 3) for k, x in d.items()}


def rank_cpu(before, after, whole, stats):
    """Cpu.delta of a Cairn phase: the ranks' CPU inside Save/Load (each
    rank's own count, "cpu_s") as the clients', the rest of their run
    (`whole` minus that) as untimed."""
    if any("cpu_s" not in x[0] for x in stats):  # an older rank program
        return Cpu.delta(before, after, whole)
    timed = sum(x[0]["cpu_s"] for x in stats)
    return Cpu.delta(before, after, timed, max(0.0, whole - timed))


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def s3_client(endpoint):
    import boto3
    return boto3.client("s3", endpoint_url=endpoint)


def empty_bucket(s3, bucket):
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if objs:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": objs})
    for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        s3.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])


def reference(args, env, rgw, cpu, tool, op, bucket, per_worker, extra):
    """One reference phase: WORKERS processes; GB/s, server counters, CPU."""
    go = os.path.join(args.dir, f"go-{os.getpid()}-{time.time_ns()}")
    procs = [subprocess.Popen(
        ["/usr/bin/python3", os.path.abspath(__file__), "_worker", tool, op,
         args.endpoint, bucket, f"obj-{w}", str(per_worker), go] + extra,
        stdout=subprocess.PIPE, text=True, env=env) for w in range(WORKERS)]
    for p in procs:  # every worker has its data (the go file is not there yet)
        if p.stdout.readline().strip() != "ready":
            p.wait()
            for q in procs:
                q.kill()
            raise RuntimeError(f"{tool} {op} worker exited {p.returncode} before starting")
    before = rgw.counters()
    cpu0 = cpu.sample()
    open(go, "w").close()
    times = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=args.timeout)
            if p.returncode != 0:
                raise RuntimeError(f"{tool} {op} worker exited {p.returncode}")
            times.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        os.unlink(go)
    used = Cpu.delta(cpu0, cpu.sample(), sum(t["cpu"] for t in times))
    after = rgw.counters()
    secs = max(t["end"] for t in times) - min(t["start"] for t in times)
    return per_worker * WORKERS / secs / 1e9, Rgw.delta(before, after), used


def cairn_round(args, env, rgw, cpu, bucket, model, total, build=None):
    """cairnd on s3://bucket/ckpt, a 4-rank save, load2, load4, with the
    binaries of `build` (default --build)."""
    build = build or args.build
    cairnd = os.path.join(build, "server/coordinator/cairnd")
    rank = os.path.join(build, "client/examples/cairn_train_example")
    uri = f"s3://{bucket}/ckpt?endpoint={args.endpoint}"
    if args.s3_query:
        uri += "&" + args.s3_query
    d, addr = e2e_bench.start_cairnd(cairnd, os.path.join(args.dir, "cairnd"),
                                     ["--storage", uri], env)
    cpu.pids["cairnd"] = d.pid
    old_env = dict(os.environ)
    os.environ.update(env)  # e2e_bench.run_ranks passes our environment on
    try:
        res = {"tool": "cairn", "bytes": total}
        before, cpu0, ranks0 = rgw.counters(), cpu.sample(), children_cpu()
        s = e2e_bench.run_ranks(rank, addr, "bench", 4, model, "4:S0",
                                ["--save-steps", "1"], args.timeout)
        res["save_cpu"] = rank_cpu(cpu0, cpu.sample(), children_cpu() - ranks0, s)
        res["save_s"] = (min(x[0]["plan_s"] for x in s) +
                         max(x[0]["io_s"] + x[0]["commit_s"] for x in s))
        res["save_rgw"] = Rgw.delta(before, rgw.counters())
        res["save_phases_s"] = {"plan": min(x[0]["plan_s"] for x in s),
                                "io": max(x[0]["io_s"] for x in s),
                                "commit": max(x[0]["commit_s"] for x in s)}
        for name, world, layout in (("load2", 2, "2:S1"), ("load4", 4, "4:S0")):
            before, cpu0, ranks0 = rgw.counters(), cpu.sample(), children_cpu()
            l = e2e_bench.run_ranks(rank, addr, "bench", world, model, layout,
                                    ["--load", "1"], args.timeout)
            res[name + "_cpu"] = rank_cpu(cpu0, cpu.sample(),
                                          children_cpu() - ranks0, l)
            res[name + "_s"] = max(x[0]["plan_s"] + x[0]["io_s"] for x in l)
            res[name + "_needed_bytes"] = sum(x[0]["bytes"] for x in l)
            # Stored chunks re-read whole to check them (cairnd could not
            # combine the ranks' pieces): each adds its bytes again.
            res[name + "_chunks_verified_locally"] = sum(
                x[0].get("chunks_verified_locally", 0) for x in l)
            res[name + "_rgw"] = Rgw.delta(before, rgw.counters())
        for name in ("save", "load2", "load4"):
            res[name + "_GBps"] = total / res[name + "_s"] / 1e9
        return res
    finally:
        os.environ.clear()
        os.environ.update(old_env)
        cpu.pids.pop("cairnd", None)
        e2e_bench.stop_cairnd(d)


def run_s3_peer(args, env, bucket, total):
    """One run of the s3torchconnector peer: its JSON line, or {"tool",
    "skipped"|"error"} with a one-line reason (stderr: DIR/peer-s3.log)."""
    py = os.path.join(ROOT, ".venv-peers/s3torchconnector/bin/python")
    if not os.access(py, os.X_OK):
        return {"tool": "s3torchconnector", "skipped": ".venv-peers/s3torchconnector is not "
                "installed: run bench/baselines/install.sh --peers s3torchconnector"}
    cmd = [py, os.path.join(ROOT, "bench/baselines/s3torchconnector_bench.py"),
           "--endpoint", args.endpoint, "--bucket", bucket, "--prefix", "peer-s3torchconnector",
           "--dir", os.path.join(args.dir, "peer"), "--total-bytes", str(total),
           "--no-drop-caches", "--allow-skip"]
    if args.timeout:
        cmd += ["--timeout", str(args.timeout)]
    log_path = os.path.join(args.dir, "peer-s3.log")
    with open(log_path, "w") as log:
        try:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                 timeout=None if not args.timeout else 4 * args.timeout)
        except subprocess.TimeoutExpired:
            return {"tool": "s3torchconnector", "error": "still running after %s s: killed "
                    "(see %s)" % (4 * args.timeout, log_path)}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    res = json.loads(lines[-1]) if lines else {}
    res["tool"] = "s3torchconnector"
    if out.returncode != 0 and "error" not in res and "skipped" not in res:
        res["error"] = "exited %d, no result (see %s)" % (out.returncode, log_path)
    return res


def per_gb(delta, key, nbytes):
    return float("nan") if delta is None else delta[key] / (nbytes / 1e9)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--dir", default=None, help="scratch (default: a temp dir)")
    p.add_argument("--bytes", type=float, default=None, help="default 1e9")
    p.add_argument("--repeat", type=int, default=None, help="default 2")
    p.add_argument("--endpoint", default=None,
                   help="an S3 endpoint to use (default: AWS_ENDPOINT_URL in --smoke, "
                        "else a private Ceph started on --port)")
    p.add_argument("--ceph-dir", default=None,
                   help="that server's ceph.sh --dir, for radosgw's counters")
    p.add_argument("--port", type=int, default=7483)
    p.add_argument("--s3-query", default="",
                   help="extra query parameters of Cairn's s3:// URI (e.g. part_bytes=...)")
    p.add_argument("--boto3", default=None,
                   help="boto3 configurations CHUNK_MiB:CONCURRENCY,... "
                        "(default 8:4,16:8,64:4; smoke 16:8)")
    p.add_argument("--compare-build", default=None,
                   help="another build dir (e.g. of an older commit) whose Cairn "
                        "runs right after --build's in every round: an interleaved A/B")
    p.add_argument("--refs", default="boto3,s3cmd,curl",
                   help="reference tools to run, of boto3,s3cmd,curl (default all)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds each tool's processes may run (default none; smoke 120)")
    p.add_argument("--peers", default=None, choices=("s3torchconnector", "none"),
                   help="the peer to run in every round (default s3torchconnector; "
                        "none with --smoke)")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.peers is None:
        args.peers = "none" if args.smoke else "s3torchconnector"
    if args.smoke:
        args.bytes = args.bytes or 2 ** 25
        args.repeat = args.repeat or 1
        args.timeout = args.timeout or 120
        args.boto3 = args.boto3 or "16:8"
        if not args.endpoint and os.environ.get("AWS_ENDPOINT_URL"):
            args.endpoint = os.environ["AWS_ENDPOINT_URL"]
            args.ceph_dir = args.ceph_dir or os.environ.get("CAIRN_CEPH_DIR")
    args.bytes = args.bytes or 1e9
    args.repeat = args.repeat or 2
    args.boto3 = args.boto3 or "8:4,16:8,64:4"
    boto3_cfgs = [tuple(int(x) for x in c.split(":")) for c in args.boto3.split(",")]
    tmp = tempfile.mkdtemp(prefix="cairn-s3-bench-")
    args.dir = args.dir or tmp
    os.makedirs(args.dir, exist_ok=True)

    own_ceph = None
    if not args.endpoint:
        own_ceph = os.path.join(tmp, "ceph")
        subprocess.run([CEPH_SH, "start", "--dir", own_ceph, "--port", str(args.port)],
                       check=True, stdout=sys.stderr)
        args.endpoint = f"http://127.0.0.1:{args.port}"
        args.ceph_dir = own_ceph
    env = dict(os.environ, AWS_ENDPOINT_URL=args.endpoint, **KEYS)
    os.environ.update(env)
    rgw = Rgw(args.ceph_dir)
    cpu = Cpu(args.ceph_dir)
    s3 = s3_client(args.endpoint)
    bucket = "cairn-bench-" + os.urandom(4).hex()
    s3.create_bucket(Bucket=bucket)

    # What the synthetic model holds: 8 x rows x 4096 fp32, rows a multiple of
    # 8 (the peer's layouts split evenly, as in e2e_bench).
    rows = max(int(args.bytes / 8 / 4096 / 4) // 8 * 8, 8)
    total = 8 * rows * 4096 * 4
    model = "bench:%d" % total
    per_worker = total // WORKERS

    rounds = []
    try:
        for i in range(args.repeat):
            print(f"round {i + 1}/{args.repeat}", file=sys.stderr, flush=True)
            rnd = {"refs": {}, "cairn": None}
            refs = [("boto3 %d MiB x %d" % c, "boto3",
                     [str(c[0] << 20), str(c[1])]) for c in boto3_cfgs]
            refs.append(("s3cmd", "s3cmd", []))
            refs.append(("curl", "curl", []))
            wanted = args.refs.split(",")
            refs = [r for r in refs if r[1] in wanted]
            for name, tool, extra in refs:
                put, put_rgw, put_cpu = reference(args, env, rgw, cpu, tool, "put",
                                                  bucket, per_worker, extra)
                get, get_rgw, get_cpu = reference(args, env, rgw, cpu, tool, "get",
                                                  bucket, per_worker, extra)
                r = {"tool": name, "put_GBps": put, "get_GBps": get,
                     "put_req_per_GB": per_gb(put_rgw, "req", total),
                     "get_req_per_GB": per_gb(get_rgw, "req", total),
                     "put_cpu": put_cpu, "get_cpu": get_cpu}
                print(json.dumps(r), flush=True)
                rnd["refs"][name] = r
                empty_bucket(s3, bucket)
            if args.peers == "s3torchconnector":
                rnd["peer"] = run_s3_peer(args, env, bucket, total)
                print(json.dumps(rnd["peer"]), flush=True)
                empty_bucket(s3, bucket)
            c = cairn_round(args, env, rgw, cpu, bucket, model, total)
            print(json.dumps(c), flush=True)
            rnd["cairn"] = c
            empty_bucket(s3, bucket)
            if args.compare_build:
                c = cairn_round(args, env, rgw, cpu, bucket, model, total,
                                args.compare_build)
                c["build"] = args.compare_build
                print(json.dumps(c), flush=True)
                rnd["compare"] = c
                empty_bucket(s3, bucket)
            rounds.append(rnd)
    finally:
        try:
            empty_bucket(s3, bucket)
            s3.delete_bucket(Bucket=bucket)
        except Exception as e:  # noqa: BLE001
            print(f"cleanup: {e}", file=sys.stderr)
        if own_ceph:
            subprocess.run([CEPH_SH, "stop", "--dir", own_ceph, "--port", str(args.port)],
                           stdout=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)

    nan = float("nan")

    def best_ref(key, rnd):
        return max(r[key] for r in rnd["refs"].values())

    print()
    print(f"{total / 1e9:.2f} GB, {WORKERS} writers, {args.repeat} round(s), "
          f"server {args.endpoint}")
    print()
    print("| reference | PUT GB/s (best round) | GET GB/s | PUT requests/GB | GET requests/GB |")
    print("|---|---|---|---|---|")
    for name in rounds[0]["refs"]:
        rs = [rnd["refs"][name] for rnd in rounds]
        print("| %s | %.3f | %.3f | %.0f | %.0f |" % (
            name, max(r["put_GBps"] for r in rs), max(r["get_GBps"] for r in rs),
            rs[-1]["put_req_per_GB"], rs[-1]["get_req_per_GB"]))
    print()
    print("| phase | Cairn GB/s | best reference GB/s | Cairn / best reference | per round "
          "| requests/GB | bytes fetched / needed | GB/s fetched from S3 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, key in (("save", "put_GBps"), ("load2", "get_GBps"), ("load4", "get_GBps")):
        c = max(rnd["cairn"][name + "_GBps"] for rnd in rounds)
        ref = max(best_ref(key, rnd) for rnd in rounds)
        per = ", ".join("%.0f%%" % (100 * rnd["cairn"][name + "_GBps"] / best_ref(key, rnd))
                        for rnd in rounds)
        last = rounds[-1]["cairn"]
        delta = last.get(name + "_rgw")
        reqs = per_gb(delta, "req", total)
        if name == "save" or delta is None:
            ratio = fetched = "-" if name == "save" else "n/a"
        else:
            ratio = "%.2f" % (delta["get_b"] / last[name + "_needed_bytes"])
            fetched = "%.3f" % (delta["get_b"] / last[name + "_s"] / 1e9)
        print("| %s | %.3f | %.3f | %.0f%% | %s | %.0f | %s | %s |" % (
            name, c, ref, 100 * c / ref if ref else nan, per, reqs, ratio, fetched))

    if args.peers != "none":
        print()
        print("Peer s3torchconnector (its DCP writer and reader, same server, bytes and "
              "layouts, same rounds), GB/s best of rounds:")
        print()
        print("| phase | Cairn GB/s | s3torchconnector GB/s | Cairn / s3torchconnector "
              "| per round |")
        print("|---|---|---|---|---|")
        for name in ("save", "load2", "load4"):
            key = name + "_GBps"
            c = max(rnd["cairn"][key] for rnd in rounds)
            vals = [rnd["peer"][key] for rnd in rounds if key in rnd["peer"]]
            per = ", ".join("%.2fx" % (rnd["cairn"][key] / rnd["peer"][key])
                            for rnd in rounds if key in rnd["peer"])
            unmeasured = any(rnd["peer"].get("save_unmeasured") for rnd in rounds)
            v = max(vals) if vals else nan
            print("| %s | %.3f | %s | %s | %s |" % (
                name, c, "%.3f" % v if vals else
                ("not measured" if name == "save" and unmeasured else "-"),
                "**%.2fx**" % (c / v) if vals else "-", per or "-"))
        for why in ("skipped", "error", "save_unmeasured"):
            for r in sorted({rnd["peer"].get(why) for rnd in rounds} - {None}):
                print("peer s3torchconnector: %s: %s" % (
                    {"skipped": "skipped", "error": "FAILED",
                     "save_unmeasured": "save not measured"}[why], r))

    if args.compare_build:
        print()
        print(f"A/B per round: --build {args.build} against --compare-build "
              f"{args.compare_build} (ranks' CPU inside Save/Load per GB):")
        print()
        print("| phase | round | --build / best reference | --compare-build / best reference "
              "| --build / --compare-build | ranks' CPU s/GB, --build / --compare-build |")
        print("|---|---|---|---|---|---|")
        for name, key in (("save", "put_GBps"), ("load2", "get_GBps"),
                          ("load4", "get_GBps")):
            for i, rnd in enumerate(rounds):
                a, b, ref = rnd["cairn"], rnd["compare"], best_ref(key, rnd)
                print("| %s | %d | %.0f%% | %.0f%% | %.2fx | %.2f / %.2f |" % (
                    name, i + 1, 100 * a[name + "_GBps"] / ref,
                    100 * b[name + "_GBps"] / ref, a[name + "_GBps"] / b[name + "_GBps"],
                    a[name + "_cpu"]["clients"] / (total / 1e9),
                    b[name + "_cpu"]["clients"] / (total / 1e9)))

    # Where the CPU went (last round): the server's daemons and the clients,
    # per GB moved, and how many of the machine's cores the server kept busy
    # while the phase was timed.
    cores = os.cpu_count()
    last = rounds[-1]
    rows_cpu = []
    for name, r in last["refs"].items():
        rows_cpu.append((name, "PUT", r["put_GBps"], r["put_cpu"]))
        rows_cpu.append((name, "GET", r["get_GBps"], r["get_cpu"]))
    for name in ("save", "load2", "load4"):
        rows_cpu.append(("cairn", name, last["cairn"][name + "_GBps"],
                         last["cairn"][name + "_cpu"]))
    print()
    print(f"CPU ({cores} cores shared by the server and the clients; last round; "
          "clients = while moving the bytes (Cairn: the ranks inside Save/Load, "
          "and cairnd); untimed = Cairn's ranks outside it (start, generating "
          "the tensors, checking every loaded byte); other = anything else on "
          "the machine):")
    print()
    print("| tool | phase | GB/s | radosgw CPU s/GB | OSD CPU s/GB | clients CPU s/GB "
          "| untimed CPU s/GB | other CPU s/GB | server cores busy | all cores busy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    busy, share = [], []
    for tool, phase, gbps, u in rows_cpu:
        gb, secs = total / 1e9, total / gbps / 1e9
        server = u.get("rgw", nan) + u.get("osd", nan) + u.get("mon", 0)
        busy.append(u["busy"] / u["wall"])
        share.append(server / (server + u["clients"] + u.get("cairnd", 0)))
        print("| %s | %s | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
            tool, phase, gbps, u.get("rgw", nan) / gb, u.get("osd", nan) / gb,
            (u["clients"] + u.get("cairnd", 0)) / gb, u.get("untimed", 0) / gb,
            u["other"] / gb, server / secs, busy[-1]))
    print()
    print("The %d cores were %.1f-%.1f busy during the phases; %s" % (
        cores, min(busy), max(busy),
        "the server's share of the CPU is unknown (not our Ceph)" if share[0] != share[0]
        else "radosgw + OSD used %.0f-%.0f%% of what server and clients spent%s" % (
            100 * min(share), 100 * max(share),
            ": CPU-bound, the server the larger part" if min(busy) > 0.85 * cores
            and min(share) > 0.5 else "")))

if __name__ == "__main__":
    main()
