#!/usr/bin/env python3
"""cairn-agents on separate hosts (network namespaces, tests/netns/hosts.py):
cairnd on host 0, one agent and two ranks on each of hosts 1 and 2, every
process on its host's own address, links shaped to a stated bandwidth.

  * node loss: a save replicated across the link; host 2's agent killed and
    the stored data deleted, a replacement agent on host 2 serves its ranks'
    load of that checkpoint from host 1's replica, bit-exact, and the bytes
    did cross the link;
  * partition: host 2 cut off from host 1 and cairnd; host 1's ranks still
    load a resharded step that needs rows only host 2 holds in memory, from
    storage after the agent's peer timeouts, bit-exact; healed, the same load
    comes from memory again.

Usage: agents_across_hosts_test.py BUILD_DIR   (ctest: netns.agents_across_hosts)
Exit 77 (skipped) with the reason when namespaces cannot be made here.
"""
import glob
import os
import shutil
import signal
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hosts  # noqa: E402

BUILD = None
WORLD, LAYOUT = 4, "2x2:S0,S1"
RATE = "400mbit"


class AgentsAcrossHosts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="cairn-netns-")
        self.net = hosts.Hosts(3, rate=RATE)
        self.addCleanup(self.net.close)
        self.generation = {}
        self.agents = {}
        self.cairnd_addr = self.start_cairnd()

    def tearDown(self):
        self.net.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self, name):
        return os.path.join(self.dir, name + ".log")

    def logs(self):
        out = []
        for f in sorted(glob.glob(os.path.join(self.dir, "*.log"))):
            with open(f, errors="replace") as fh:
                out.append("== %s\n%s" % (os.path.basename(f), fh.read()[-3000:]))
        return "\n".join(out)

    def start_cairnd(self):
        port_file = os.path.join(self.dir, "cairnd.port")
        p = self.net.start(0, [os.path.join(BUILD, "server/coordinator/cairnd"),
                               "--listen", self.net.address(0) + ":0",
                               "--storage", "file://" + self.dir + "/ckpt",
                               "--catalog", self.dir + "/catalog",
                               "--port-file", port_file,
                               # Plaintext off loopback: the hosts' private subnet.
                               "--allow-insecure"], self.log("cairnd"))
        self.assertTrue(hosts.wait_for_file(port_file, 20, p), self.logs())
        with open(port_file) as f:
            return "%s:%s" % (self.net.address(0), f.read().strip())

    def socket(self, node):
        return os.path.join(self.dir, "a%d-%d.sock" % (node, self.generation[node]))

    def start_agent(self, node, replicas=1):
        """The agent of node `node` (0 or 1) on host node + 1."""
        self.generation[node] = self.generation.get(node, 0) + 1
        ready = os.path.join(self.dir, "agent-%d-%d.ready" % (node, self.generation[node]))
        p = self.net.start(node + 1, [
            os.path.join(BUILD, "server/agent/cairn-agent"),
            "--node-id", str(node), "--num-nodes", "2", "--replicas", str(replicas),
            "--listen-unix", self.socket(node),
            "--peer-listen", self.net.address(node + 1) + ":0",
            "--peer-dir", self.dir + "/peers",
            "--coordinator", self.cairnd_addr, "--staging-budget-mib", "64",
            "--ready-file", ready], self.log("agent-%d-%d" % (node, self.generation[node])))
        self.assertTrue(hosts.wait_for_file(ready, 20, p), self.logs())
        self.agents[node] = p
        return p

    def ranks(self, job, extra, tag, timeout=120):
        """Every rank (rank r on node r // 2, on that node's host) runs
        cairn_agent_rank with `extra`; returns the exit codes."""
        procs = []
        for r in range(WORLD):
            node = r // 2
            argv = [os.path.join(BUILD, "tests/cairn_agent_rank"),
                    "--agent-socket", self.socket(node), "--coordinator", self.cairnd_addr,
                    "--job", job, "--rank", str(r), "--world-size", str(WORLD),
                    "--layout", LAYOUT] + extra
            procs.append(self.net.start(node + 1, argv, self.log("%s-rank%d" % (tag, r))))
        codes = []
        deadline = time.time() + timeout
        for p in procs:
            try:
                codes.append(p.wait(max(1, deadline - time.time())))
            except Exception:
                os.killpg(p.pid, signal.SIGKILL)
                codes.append(p.wait())
        return codes

    def rank_log(self, tag, r):
        with open(self.log("%s-rank%d" % (tag, r)), errors="replace") as f:
            return f.read()

    def peer_bytes(self, tag, r):
        """The bytes rank r's load (`tag`) got from other agents."""
        line = [l for l in self.rank_log(tag, r).splitlines() if " B peers)" in l]
        self.assertTrue(line, self.rank_log(tag, r))
        return int(line[-1].split(" B local, ")[1].split(" B peers")[0])

    def delete_stored_data(self):
        n = 0
        for f in glob.glob(self.dir + "/ckpt/**/*.bin", recursive=True):
            os.remove(f)
            n += 1
        return n

    def test_lost_node_is_restored_from_the_replica_across_the_link(self):
        self.start_agent(0)
        self.start_agent(1)
        self.assertEqual(self.ranks("loss", ["--save-step", "7"], "save"), [0] * WORLD,
                         self.logs())
        self.assertGreater(self.delete_stored_data(), 0)
        self.agents[1].send_signal(signal.SIGKILL)  # host 2 loses its agent's memory
        self.agents[1].wait()
        self.start_agent(1)  # the replacement, empty
        sent_before = self.net.bytes_sent(1)  # host 1 holds node 1's replica
        codes = self.ranks("loss", ["--load", "latest", "--expect-source", "memory"], "load")
        self.assertEqual(codes, [0] * WORLD, self.logs())
        for r in range(WORLD):
            self.assertIn("rank %d: loaded step 7 from agent memory" % r,
                          self.rank_log("load", r))
        # Node 1's ranks got their bytes from host 1, over the link: at least
        # their share of the model (ranks 2 and 3 hold half of it).
        moved = self.net.bytes_sent(1) - sent_before
        peers = self.peer_bytes("load", 2) + self.peer_bytes("load", 3)
        self.assertGreater(peers, 0)
        self.assertGreaterEqual(moved, peers)

    def test_partitioned_host_leaves_the_others_loading_from_storage(self):
        # No replicas: rows saved by node 1's ranks are in host 2's memory only.
        self.start_agent(0, replicas=0)
        self.start_agent(1, replicas=0)
        self.assertEqual(self.ranks("part", ["--save-step", "3"], "save"), [0] * WORLD,
                         self.logs())
        self.net.partition(2)
        # Host 1's ranks load step 3 as column stripes (every row: half of
        # them only host 2 holds in memory) with host 2 unreachable: the agent
        # gives up on host 2 after its peer timeouts and the ranks read
        # storage, bit-exact.
        procs = []
        for r in (0, 1):
            argv = [os.path.join(BUILD, "tests/cairn_agent_rank"),
                    "--agent-socket", self.socket(0), "--coordinator", self.cairnd_addr,
                    "--job", "part", "--rank", str(r), "--world-size", str(WORLD),
                    "--layout", "4:S1", "--load", "3", "--expect-source", "storage"]
            procs.append(self.net.start(1, argv, self.log("part-rank%d" % r)))
        codes = [p.wait(120) for p in procs]
        self.assertEqual(codes, [0, 0], self.logs())
        for r in (0, 1):
            self.assertIn("rank %d: loaded step 3 from storage" % r, self.rank_log("part", r))
        # Healed, the same load comes from memory again, host 2 serving its rows.
        self.net.heal(2)
        for r in (0, 1):
            argv = [os.path.join(BUILD, "tests/cairn_agent_rank"),
                    "--agent-socket", self.socket(0), "--coordinator", self.cairnd_addr,
                    "--job", "part", "--rank", str(r), "--world-size", str(WORLD),
                    "--layout", "4:S1", "--load", "3", "--expect-source", "memory"]
            self.assertEqual(self.net.run(1, argv, self.log("healed-rank%d" % r), 120), 0,
                             self.logs())
            self.assertGreater(self.peer_bytes("healed", r), 0)


def main():
    global BUILD
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    BUILD = os.path.abspath(sys.argv.pop(1))
    why = hosts.unavailable()
    if why:
        print("SKIPPED: network-namespace hosts cannot be made here: " + why)
        return 77
    prog = unittest.main(exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
