#!/usr/bin/env python3
"""e2e_bench's limit checks without running anything: which results of a round
are above its limit (over_limit), and the limit raised by a wide sweep (widen).
Run by ctest (bench_unit.e2e_limits)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_bench  # noqa: E402

NAN = float("nan")
SHAPES = [("8to3", "8:S0", "3:S1")]


def cairn(gbps):
    """A Cairn result with every phase of table_rows(SHAPES) at `gbps`."""
    return {key + "_GBps": gbps for _, key, _, _ in e2e_bench.table_rows(SHAPES)}


def limit(write, read):
    return {"tool": "limit", "write_GBps": write, "read_GBps": read,
            "write_point": "w", "read_point": "r"}


class OverLimitTest(unittest.TestCase):
    def test_nothing_above_the_limit(self):
        rd = (limit(2.0, 3.0), {}, cairn(1.5), None, {})
        self.assertEqual(e2e_bench.over_limit(rd, SHAPES, []), [])

    def test_each_tool_and_direction_is_checked(self):
        c = cairn(1.0)
        c["load4_GBps"] = 4.46  # a read above the read limit
        base = cairn(1.0)
        base["save_GBps"] = 2.5  # a write above the write limit
        dcp = {None: {"load2_GBps": 3.5, "save_GBps": 1.0},
               "8to3": {"load_GBps": 0.5, "save_GBps": 0.5}}
        peers = {"dcp_t4": {"load4_GBps": 3.1, "save_GBps": 0.1},
                 "dcp_async_process": {"save_GBps": 99.0}}  # blocked time: not a rate
        rd = (limit(2.0, 3.0), dcp, c, base, peers)
        got = {(t, label, kind) for t, label, _, kind, _ in
               e2e_bench.over_limit(rd, SHAPES, ["dcp_t4", "dcp_async_process"])}
        self.assertEqual(got, {("Cairn", "load 4:S0 -> 4:S0", "read"),
                               ("baseline", "save 4:S0", "write"),
                               ("DCP", "load 4:S0 -> 2:S1", "read"),
                               ("DCP", "load 4:S0 -> 2:S1, partly read chunks read whole",
                                "read"),
                               ("dcp_t4", "load 4:S0 -> 4:S0", "read")})

    def test_no_limit_means_nothing_to_beat(self):
        rd = (limit(NAN, NAN), {}, cairn(9.0), None, {})
        self.assertEqual(e2e_bench.over_limit(rd, SHAPES, []), [])

    def test_widen_raises_only_the_directions_the_wide_sweep_beat(self):
        old = limit(2.0, 3.25)
        wide = limit(1.9, 4.6)
        wide["read_point"] = "fio O_DIRECT libaio, 8 jobs, iodepth 32, bs 16M"
        over = [("Cairn", "load 4:S0 -> 4:S0", 4.46, "read", 3.25)]
        got = e2e_bench.widen(old, wide, over)
        self.assertEqual(got["write_GBps"], 2.0)
        self.assertEqual(got["write_point"], "w")
        self.assertEqual(got["read_GBps"], 4.6)
        self.assertIn("8 jobs, iodepth 32", got["read_point"])
        self.assertIn("Cairn load 4:S0 -> 4:S0 4.46 GB/s > read limit 3.25",
                      got["widened_by"])
        # Still above: the round is reported.
        c = cairn(1.0)
        c["load4_GBps"] = 4.7
        rd = (got, {}, c, None, {})
        self.assertEqual([o[1] for o in e2e_bench.over_limit(rd, SHAPES, [])],
                         ["load 4:S0 -> 4:S0"])


if __name__ == "__main__":
    unittest.main()
