"""A Cairn cluster on network-namespace hosts (hosts.py): cairnd on host 0,
the agent of node n and its ranks on host n + 1, every process on its host's
own address; ranks are cairn_agent_rank processes (tests/agent_rank.cc),
rank r on node r // ranks_per_node.
"""
import glob
import json
import os
import signal
import time

import hosts


class Cluster:
    def __init__(self, build, work, nodes=2, ranks_per_node=2, layout="2x2:S0,S1",
                 rate="400mbit", model=None, budget_mib=64):
        self.build, self.dir = build, work
        self.model, self.budget_mib = model, budget_mib
        self.nodes, self.ranks_per_node = nodes, ranks_per_node
        self.world, self.layout = nodes * ranks_per_node, layout
        self.net = hosts.Hosts(nodes + 1, rate=rate)
        self.generation = {}
        self.agents = {}
        try:
            self.cairnd_addr = self._start_cairnd()
        except BaseException:
            self.net.close()
            raise

    def close(self):
        self.net.close()

    def log(self, name):
        return os.path.join(self.dir, name + ".log")

    def logs(self, tail=3000):
        out = []
        for f in sorted(glob.glob(os.path.join(self.dir, "*.log"))):
            with open(f, errors="replace") as fh:
                out.append("== %s\n%s" % (os.path.basename(f), fh.read()[-tail:]))
        return "\n".join(out)

    def restart_cairnd(self):
        """kill -9 cairnd, then start it again on the same address (its
        catalog and storage as they are)."""
        self.cairnd.send_signal(signal.SIGKILL)
        self.cairnd.wait()
        self._start_cairnd(self.cairnd_addr.rsplit(":", 1)[1])

    def _start_cairnd(self, port="0"):
        port_file = os.path.join(self.dir, "cairnd.port")
        if os.path.exists(port_file):
            os.remove(port_file)
        p = self.net.start(0, [os.path.join(self.build, "server/coordinator/cairnd"),
                               "--listen", "%s:%s" % (self.net.address(0), port),
                               "--storage", "file://" + self.dir + "/ckpt",
                               "--catalog", self.dir + "/catalog",
                               "--port-file", port_file,
                               # Plaintext off loopback: the hosts' private subnet.
                               "--allow-insecure"], self.log("cairnd"))
        if not hosts.wait_for_file(port_file, 20, p):
            raise RuntimeError("cairnd did not start:\n" + self.logs())
        self.cairnd = p
        with open(port_file) as f:
            return "%s:%s" % (self.net.address(0), f.read().strip())

    def socket(self, node):
        return os.path.join(self.dir, "a%d-%d.sock" % (node, self.generation[node]))

    def start_agent(self, node, replicas=1):
        """(Re)starts the agent of node `node` on host node + 1; waits until
        it is ready (RuntimeError with the logs if it is not in 20 s)."""
        self.generation[node] = self.generation.get(node, 0) + 1
        name = "agent-%d-%d" % (node, self.generation[node])
        ready = os.path.join(self.dir, name + ".ready")
        p = self.net.start(node + 1, [
            os.path.join(self.build, "server/agent/cairn-agent"),
            "--node-id", str(node), "--num-nodes", str(self.nodes),
            "--replicas", str(replicas), "--listen-unix", self.socket(node),
            "--peer-listen", self.net.address(node + 1) + ":0",
            "--peer-dir", self.dir + "/peers",
            "--coordinator", self.cairnd_addr, "--staging-budget-mib", str(self.budget_mib),
            "--ready-file", ready], self.log(name))
        if not hosts.wait_for_file(ready, 20, p):
            raise RuntimeError("agent %d did not start:\n%s" % (node, self.logs()))
        self.agents[node] = p
        return p

    def rank_argv(self, r, job, extra, node=None, layout=None):
        node = r // self.ranks_per_node if node is None else node
        return [os.path.join(self.build, "tests/cairn_agent_rank"),
                "--agent-socket", self.socket(node), "--coordinator", self.cairnd_addr,
                "--job", job, "--rank", str(r), "--world-size", str(self.world),
                "--layout", layout or self.layout] + (
                    ["--model", self.model] if self.model else []) + list(extra)

    def start_ranks(self, job, extra, tag, ranks=None, layout=None):
        """Starts rank r (every rank, or `ranks`) on its node's host."""
        ranks = range(self.world) if ranks is None else ranks
        return [self.net.start(r // self.ranks_per_node + 1,
                               self.rank_argv(r, job, extra, layout=layout),
                               self.log("%s-rank%d" % (tag, r))) for r in ranks]

    @staticmethod
    def wait(procs, timeout):
        """Exit codes of `procs`; one still running after `timeout` is killed
        (None)."""
        codes, deadline = [], time.time() + timeout
        for p in procs:
            try:
                codes.append(p.wait(max(0.1, deadline - time.time())))
            except Exception:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                codes.append(None)
        return codes

    def ranks(self, job, extra, tag, ranks=None, layout=None, timeout=120):
        return self.wait(self.start_ranks(job, extra, tag, ranks, layout), timeout)

    def rank_log(self, tag, r):
        with open(self.log("%s-rank%d" % (tag, r)), errors="replace") as f:
            return f.read()

    def peer_bytes(self, tag, r):
        """The bytes rank r's load (`tag`) got from other agents (None: no
        load line)."""
        line = [l for l in self.rank_log(tag, r).splitlines() if " B peers)" in l]
        if not line:
            return None
        return int(line[-1].split(" B local, ")[1].split(" B peers")[0])

    def loaded_step(self, tag, r):
        """The step rank r's load (`tag`) loaded and verified (None: none)."""
        for l in self.rank_log(tag, r).splitlines():
            if l.startswith("rank %d: loaded step " % r):
                return int(l.split("loaded step ")[1].split()[0])
        return None

    def cli(self, *args, timeout=30):
        """Runs the cairn CLI against cairnd from host 0; its stdout."""
        out = os.path.join(self.dir, "cli.out")
        p = self.net.start(0, [os.path.join(self.build, "client/cli/cairn"),
                               "-c", self.cairnd_addr] + list(args), out + ".log")
        p.wait(timeout)
        with open(out + ".log", errors="replace") as f:
            text = f.read()
        os.remove(out + ".log")
        return p.returncode, text

    def checkpoints(self, job):
        """`cairn ls JOB --json`: the job's checkpoints (dicts), by step."""
        code, text = self.cli("ls", job, "--json")
        if code != 0:
            return []
        jobs = json.JSONDecoder().raw_decode(text[text.index("{"):])[0]["jobs"]
        return jobs[0]["checkpoints"] if jobs else []

    @staticmethod
    def rss_bytes(p):
        """Resident memory of process `p` as (anonymous, shared memory) bytes:
        its heap, and the staging segments it maps (None once it exited)."""
        got = {}
        try:
            with open("/proc/%d/status" % p.pid) as f:
                for line in f:
                    key = line.split(":")[0]
                    if key in ("RssAnon", "RssShmem"):
                        got[key] = int(line.split()[1]) * 1024
        except OSError:
            return None
        if len(got) < 2:
            return None
        return got["RssAnon"], got["RssShmem"]

    def delete_stored_data(self):
        n = 0
        for f in glob.glob(self.dir + "/ckpt/**/*.bin", recursive=True):
            os.remove(f)
            n += 1
        return n
