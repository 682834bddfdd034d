"""Real processes for the Python tests: cairnd, cairn-agent and rank groups.

Nothing here is mocked: `Cairnd` and `Agent` run the built binaries on
loopback / a Unix socket, and `run_ranks` runs each rank in its own process
(torch.multiprocessing's spawn context) with a real gloo process group, the
way a training job's ranks run.
"""

import faulthandler
import gc
import os
import pathlib
import signal
import subprocess
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# How long a server may take to come up before the test fails naming it.
_START_TIMEOUT_S = 60.0


class Binaries:
    """Paths of the built binaries, from CAIRN_BUILD_DIR (set by ctest)."""

    def __init__(self, build_dir: pathlib.Path):
        self.build_dir = build_dir
        self.cairnd = build_dir / "server/coordinator/cairnd"
        self.agent = build_dir / "server/agent/cairn-agent"
        self.cli = build_dir / "client/cli/cairn"
        missing = [str(p) for p in (self.cairnd, self.agent, self.cli)
                   if not os.access(p, os.X_OK)]
        if missing:
            raise RuntimeError(
                f"binaries not built: {', '.join(missing)} (build the tree "
                f"with CMake and set CAIRN_BUILD_DIR to the build directory)")

    @staticmethod
    def from_env() -> "Binaries":
        build_dir = os.environ.get("CAIRN_BUILD_DIR")
        if not build_dir:
            raise RuntimeError(
                "CAIRN_BUILD_DIR is not set: run these tests through ctest, or "
                "set it to the CMake build directory")
        return Binaries(pathlib.Path(build_dir).resolve())


def rendezvous_store(world_size: int) -> Any:
    """The gloo group's rendezvous store, served from this process on a port
    the kernel picked: bound here and held until the ranks are done, so no
    other process can take it between choosing a free port and a rank
    binding it (a race that can fail runs under load)."""
    import datetime  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    return dist.TCPStore("127.0.0.1", 0, world_size, True,
                         timeout=datetime.timedelta(seconds=120),
                         wait_for_workers=False)


def _wait_for_file(path: pathlib.Path, proc: subprocess.Popen, what: str,
                   log: pathlib.Path) -> str:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before "
                               f"serving:\n{tail(log)}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{what} did not serve within {_START_TIMEOUT_S} s:\n"
                       f"{tail(log)}")


def tail(path: pathlib.Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


class _Server:
    """A child process with a log file; stopped by `stop` or `kill`."""

    proc: Optional[subprocess.Popen] = None
    log: pathlib.Path

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then waits; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"{self.log.stem} ignored SIGTERM for "
                               f"{timeout} s:\n{tail(self.log)}")

    def kill(self) -> None:
        """SIGKILL (a crash), then reaps it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self) -> str:
        return tail(self.log)


class S3Bucket:
    """A fresh bucket cairn-pytest-<random> on the S3 server the AWS_*
    environment names (what `scripts/ceph/ceph.sh env` prints; ctest's ceph
    fixture sets it), deleted with everything in it by `delete`."""

    def __init__(self):
        import boto3  # python3-boto3; only the S3 runs need it
        if not os.environ.get("AWS_ENDPOINT_URL"):
            raise RuntimeError(
                "CAIRN_TEST_STORAGE=s3 needs an S3 server: run "
                "scripts/ceph/ceph.sh start and eval \"$(scripts/ceph/ceph.sh "
                "env)\" (ctest -L s3 does it)")
        self.s3 = boto3.client("s3",
                               endpoint_url=os.environ["AWS_ENDPOINT_URL"])
        self.name = "cairn-pytest-" + os.urandom(8).hex()
        self.s3.create_bucket(Bucket=self.name)

    def keys(self, prefix: str = "") -> List[str]:
        out = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.name, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return out

    def delete(self) -> None:
        for u in self.s3.list_multipart_uploads(Bucket=self.name).get(
                "Uploads", []):
            self.s3.abort_multipart_upload(Bucket=self.name, Key=u["Key"],
                                           UploadId=u["UploadId"])
        keys = self.keys()
        for i in range(0, len(keys), 1000):
            self.s3.delete_objects(Bucket=self.name, Delete={
                "Objects": [{"Key": k} for k in keys[i:i + 1000]]})
        self.s3.delete_bucket(Bucket=self.name)


def storage_kind() -> str:
    """The storage CAIRN_TEST_STORAGE selects: "file" (unset) or "s3"."""
    kind = os.environ.get("CAIRN_TEST_STORAGE", "") or "file"
    if kind not in ("file", "s3"):
        raise RuntimeError(f"CAIRN_TEST_STORAGE={kind!r}: expected file or s3")
    return kind


class Cairnd(_Server):
    """cairnd on 127.0.0.1 with its data directory (catalog, and storage
    under it), or with its storage in a fresh S3 bucket when
    CAIRN_TEST_STORAGE=s3 (ranks inherit the AWS_* environment)."""

    def __init__(self, binaries: Binaries, workdir: pathlib.Path,
                 flags: Sequence[str] = ()):
        self.binaries = binaries
        self.data_dir = pathlib.Path(workdir) / "cairnd-data"
        self.storage_dir = self.data_dir / "checkpoints"
        self.bucket = S3Bucket() if storage_kind() == "s3" else None
        self.flags = list(flags)
        if self.bucket is not None:
            self.flags += ["--storage", f"s3://{self.bucket.name}/ckpt"]
        self.port = 0
        self.address = ""
        self.log = pathlib.Path(workdir) / "cairnd.log"

    def stored_keys(self) -> List[str]:
        """Every checkpoint object's key under the storage root, relative to
        it (cairnd's storage lease, cairn-lease.N at the root, is not one)."""
        if self.bucket is not None:
            keys = [k[len("ckpt/"):] for k in self.bucket.keys("ckpt/")]
        else:
            root = self.storage_dir
            keys = [str(p.relative_to(root)) for p in root.rglob("*")
                    if p.is_file()]
        return [k for k in keys if not k.startswith("cairn-lease.")]

    def delete_storage(self) -> None:
        """Deletes the S3 bucket (nothing for file storage, which lives in
        the test's temp dir)."""
        if self.bucket is not None:
            self.bucket.delete()
            self.bucket = None

    @staticmethod
    def start(binaries: Binaries, workdir: pathlib.Path,
              flags: Sequence[str] = ()) -> "Cairnd":
        c = Cairnd(binaries, workdir, flags)
        c._launch()
        return c

    def _launch(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        port_file = self.data_dir.parent / "cairnd.port"
        port_file.unlink(missing_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.binaries.cairnd), "--listen",
                 f"127.0.0.1:{self.port}", "--data-dir", str(self.data_dir),
                 "--port-file", str(port_file), *self.flags],
                stdout=log, stderr=subprocess.STDOUT)
        self.port = int(_wait_for_file(port_file, self.proc, "cairnd",
                                       self.log))
        self.address = f"127.0.0.1:{self.port}"

    def restart(self, kill: bool = False) -> None:
        """Stops (or kills) cairnd and starts it again on the same port and
        data directory."""
        if kill:
            self.kill()
        else:
            self.stop()
        self._launch()

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Runs `cairn --coordinator ADDRESS args...`."""
        r = subprocess.run([str(self.binaries.cli), "--coordinator",
                            self.address, *args],
                           capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise RuntimeError(f"cairn {' '.join(args)} failed "
                               f"({r.returncode}):\n{r.stdout}{r.stderr}")
        return r


class Agent(_Server):
    """cairn-agent serving ranks on a Unix socket."""

    def __init__(self, binaries: Binaries, workdir: pathlib.Path,
                 coordinator: str, node_id: int, num_nodes: int,
                 flags: Sequence[str]):
        self.binaries = binaries
        self.workdir = pathlib.Path(workdir) / f"agent-{node_id}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.socket = str(self.workdir / "agent.sock")
        self.coordinator = coordinator
        self.node_id = node_id
        self.num_nodes = num_nodes
        self.flags = list(flags)
        self.log = self.workdir / "agent.log"

    @staticmethod
    def start(binaries: Binaries, workdir: pathlib.Path, coordinator: str,
              node_id: int = 0, num_nodes: int = 1,
              flags: Sequence[str] = ()) -> "Agent":
        a = Agent(binaries, workdir, coordinator, node_id, num_nodes, flags)
        ready = a.workdir / "ready"
        ready.unlink(missing_ok=True)
        peer_dir = pathlib.Path(workdir) / "agent-peers"
        peer_dir.mkdir(exist_ok=True)
        with open(a.log, "ab") as log:
            a.proc = subprocess.Popen(
                [str(binaries.agent), "--node-id", str(node_id),
                 "--num-nodes", str(num_nodes), "--listen-unix", a.socket,
                 "--peer-dir", str(peer_dir), "--coordinator", coordinator,
                 "--ready-file", str(ready), *a.flags],
                stdout=log, stderr=subprocess.STDOUT)
        _wait_for_file(ready, a.proc, f"cairn-agent {node_id}", a.log)
        return a


# ---------------------------------------------------------------- ranks

def _rank_main(fn: Callable, rank: int, world_size: int, port: int,
               queue: Any, args: Tuple) -> None:
    """Body of one rank process: gloo group up, fn, result to the parent."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    # A rank that aborts (SIGABRT) or crashes prints every thread's Python
    # stack to its stderr, which pytest shows with the failure.
    faulthandler.enable()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        import datetime  # pylint: disable=import-outside-toplevel
        timeout = datetime.timedelta(seconds=120)
        # The parent holds the rendezvous store's port (rendezvous_store).
        store = dist.TCPStore("127.0.0.1", port, world_size, False,
                              timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank,
                                world_size=world_size, timeout=timeout)
        result = fn(rank, world_size, *args)
        queue.put((rank, True, result))
    except BaseException:  # report everything, KeyboardInterrupt included
        queue.put((rank, False, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        # destroy_process_group drops only the registry's reference to the
        # group. An exception's traceback frames (a rank that failed, as the
        # DCP coordinator does in the error tests) are a reference cycle that
        # can hold it, and the tensors gloo's worker threads used, until the
        # interpreter is finalizing; gloo's threads freeing those tensors
        # then cannot take the GIL and the process aborts ("terminate called
        # without an active exception", once in CI, in rank 0 after it had
        # reported its result). Free them now, while the interpreter runs.
        gc.collect()


def run_ranks_raw(fn: Callable, world_size: int, *args: Any,
                  timeout: float = 300.0,
                  rank_env: Optional[Dict[int, Dict[str, str]]] = None
                  ) -> List[Tuple[Optional[int], bool, Any]]:
    """Runs fn(rank, world_size, *args) in `world_size` spawned processes
    with a gloo group. Returns per rank (exitcode, ok, result-or-traceback);
    a rank that died without reporting has ok False and result None. Ranks
    still running after `timeout` are killed (exitcode -9). `rank_env`:
    extra environment of some ranks' processes (set before they start, so
    it is seen by what reads the environment at load, e.g.
    CAIRN_CRASH_POINTS)."""
    import torch.multiprocessing as mp  # pylint: disable=import-outside-toplevel
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    store = rendezvous_store(world_size)
    port = store.port
    procs = [ctx.Process(target=_rank_main,
                         args=(fn, r, world_size, port, queue, args),
                         daemon=False)
             for r in range(world_size)]
    for r, p in enumerate(procs):
        extra = (rank_env or {}).get(r, {})
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            p.start()  # a spawned child takes the environment of now
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    reports = {}
    while not queue.empty():
        rank, ok, value = queue.get()
        reports[rank] = (ok, value)
    return [(procs[r].exitcode,) + reports.get(r, (False, None))
            for r in range(world_size)]


def run_ranks(fn: Callable, world_size: int, *args: Any,
              timeout: float = 300.0) -> List[Any]:
    """Like run_ranks_raw, but returns each rank's result and raises
    AssertionError with every failed rank's traceback if any rank failed."""
    results = run_ranks_raw(fn, world_size, *args, timeout=timeout)
    failures = []
    for rank, (exitcode, ok, value) in enumerate(results):
        if not ok or exitcode != 0:
            failures.append(f"--- rank {rank} (exit code {exitcode}):\n"
                            f"{value if value else '(no report: it died)'}")
    if failures:
        raise AssertionError(f"{len(failures)} of {world_size} ranks of "
                             f"{getattr(fn, '__name__', fn)} failed:\n" +
                             "\n".join(failures))
    return [value for _, _, value in results]
