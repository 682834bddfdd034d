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
import os
import shutil
import signal
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
import hosts  # noqa: E402

BUILD = None
WORLD = 4


class AgentsAcrossHosts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="cairn-netns-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.c = cluster.Cluster(BUILD, self.dir, nodes=2, ranks_per_node=2,
                                 layout="2x2:S0,S1", rate="400mbit")
        self.addCleanup(self.c.close)

    def test_lost_node_is_restored_from_the_replica_across_the_link(self):
        c = self.c
        c.start_agent(0)
        c.start_agent(1)
        self.assertEqual(c.ranks("loss", ["--save-step", "7"], "save"), [0] * WORLD,
                         c.logs())
        self.assertGreater(c.delete_stored_data(), 0)
        c.agents[1].send_signal(signal.SIGKILL)  # host 2 loses its agent's memory
        c.agents[1].wait()
        c.start_agent(1)  # the replacement, empty
        sent_before = c.net.bytes_sent(1)  # host 1 holds node 1's replica
        codes = c.ranks("loss", ["--load", "latest", "--expect-source", "memory"], "load")
        self.assertEqual(codes, [0] * WORLD, c.logs())
        for r in range(WORLD):
            self.assertIn("rank %d: loaded step 7 from agent memory" % r,
                          c.rank_log("load", r))
        # Node 1's ranks got their bytes from host 1, over the link.
        moved = c.net.bytes_sent(1) - sent_before
        peers = c.peer_bytes("load", 2) + c.peer_bytes("load", 3)
        self.assertGreater(peers, 0)
        self.assertGreaterEqual(moved, peers)

    def test_partitioned_host_leaves_the_others_loading_from_storage(self):
        c = self.c
        # No replicas: rows saved by node 1's ranks are in host 2's memory only.
        c.start_agent(0, replicas=0)
        c.start_agent(1, replicas=0)
        self.assertEqual(c.ranks("part", ["--save-step", "3"], "save"), [0] * WORLD,
                         c.logs())
        c.net.partition(2)
        # Host 1's ranks load step 3 as column stripes (every row: half of
        # them only host 2 holds in memory) with host 2 unreachable: the agent
        # gives up on host 2 after its peer timeouts and the ranks read
        # storage, bit-exact.
        codes = c.ranks("part", ["--load", "3", "--expect-source", "storage"], "part",
                        ranks=(0, 1), layout="4:S1")
        self.assertEqual(codes, [0, 0], c.logs())
        for r in (0, 1):
            self.assertIn("rank %d: loaded step 3 from storage" % r, c.rank_log("part", r))
        # Healed, the same load comes from memory again, host 2 serving its rows.
        c.net.heal(2)
        codes = c.ranks("part", ["--load", "3", "--expect-source", "memory"], "healed",
                        ranks=(0, 1), layout="4:S1")
        self.assertEqual(codes, [0, 0], c.logs())
        for r in (0, 1):
            self.assertGreater(c.peer_bytes("healed", r), 0)


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
