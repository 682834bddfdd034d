"""cairn.Checkpointer.async_save: through a real cairn-agent (snapshot into
its shared memory, loads from its memory tier) and through the background
thread of the direct path. Tensors modified right after async_save returns
do not change what was saved; one save is in flight at a time."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import cairn
import harness


def _state():
    torch.manual_seed(11)
    return {"model": {"w": torch.randn(64, 32),
                      "b": torch.randn(32).to(torch.bfloat16)},
            "arr": np.arange(10, dtype=np.int64),
            "step": 1}


def _blank():
    return {"model": {"w": torch.zeros(64, 32),
                      "b": torch.zeros(32, dtype=torch.bfloat16)},
            "arr": np.zeros(10, dtype=np.int64),
            "step": None}


def _check(got, want):
    assert torch.equal(got["model"]["w"], want["model"]["w"])
    assert torch.equal(got["model"]["b"], want["model"]["b"])
    assert (got["arr"] == want["arr"]).all()
    assert got["step"] == want["step"]


def _modify(sd):
    sd["model"]["w"].add_(1.0)
    sd["model"]["b"].zero_()
    sd["arr"][:] = -1
    sd["step"] = 2


def test_background_thread_saves_the_snapshot(cairnd):
    ckpt = cairn.Checkpointer(cairnd.address, "bg", 0, 1)
    sd = _state()
    want = {"model": {k: v.clone() for k, v in sd["model"].items()},
            "arr": sd["arr"].copy(), "step": 1}
    fut = ckpt.async_save(4, sd)
    _modify(sd)  # at once: the save holds a snapshot
    assert isinstance(fut, cairn.SaveFuture) and fut.step == 4
    info = fut.result(timeout=120)
    assert (info.job, info.step, info.state) == ("bg", 4, "COMMITTED")
    assert fut.done() and fut.wait().step == 4 and fut.exception() is None
    got = _blank()
    assert ckpt.load(got) == 4
    _check(got, want)
    # One save in flight: a second async_save waits for the first; both
    # commit, in order.
    f5 = ckpt.async_save(5, sd)
    f6 = ckpt.async_save(6, sd)
    assert f5.done()
    assert f6.result(timeout=120).step == 6
    assert [i.step for i in ckpt.list()] == [4, 5, 6]
    got = _blank()
    assert ckpt.load(got, step=6) == 6
    _check(got, sd)


def test_background_save_timeout_then_cancel(cairnd):
    """A save that cannot commit (rank 1 of 2 never comes): result(timeout)
    raises DeadlineExceededError naming job, step and rank, the save goes
    on; cancel() ends it with CancelledError."""
    ckpt = cairn.Checkpointer(cairnd.address, "alone", 0, 2)
    fut = ckpt.async_save(3, {"x": torch.ones(4)})
    with pytest.raises(cairn.DeadlineExceededError) as e:
        fut.result(timeout=0.5)
    assert all(s in e.value.message
               for s in ("job 'alone'", "step 3", "rank 0")), e.value.message
    assert not fut.done()
    # Catalog calls do not wait for the save in flight.
    assert ckpt.list() == []
    ckpt.cancel()
    with pytest.raises(cairn.CancelledError):
        fut.result(timeout=120)
    assert fut.done()
    assert isinstance(fut.exception(), cairn.CancelledError)
    with pytest.raises(cairn.CancelledError):
        ckpt.close()


def test_async_save_through_the_agent(cairnd, start_agent):
    agent = start_agent(cairnd.address)
    ckpt = cairn.Checkpointer(cairnd.address, "agentjob", 0, 1,
                              agent_socket=agent.socket)
    sd = _state()
    want = {"model": {k: v.clone() for k, v in sd["model"].items()},
            "arr": sd["arr"].copy(), "step": 1}
    fut = ckpt.async_save(8, sd)
    _modify(sd)  # the agent already holds its copy
    assert ckpt.last_stats["bytes"] >= 64 * 32 * 4
    info = fut.result(timeout=120)
    assert (info.step, info.state) == (8, "COMMITTED")
    got = _blank()
    assert ckpt.load(got) == 8
    assert ckpt.last_load_source == "agent_memory"
    _check(got, want)
    # save() with an agent is async_save + result.
    assert ckpt.save(9, sd).state == "COMMITTED"
    assert ckpt.latest_step() == 9
    # A direct Checkpointer reads the same checkpoint from storage.
    direct = cairn.Checkpointer(cairnd.address, "agentjob", 0, 1)
    got = _blank()
    assert direct.load(got, step=8) == 8
    assert direct.last_load_source == "storage"
    _check(got, want)
    # A step the agent never held: its load falls back to storage.
    direct.save(10, want)
    got = _blank()
    assert ckpt.load(got) == 10
    assert ckpt.last_load_source == "storage"
    _check(got, want)


def test_memory_tier_through_two_agents(cairnd, start_agent):
    """tier="memory": kept in the agents' memory only (node 0's copy and
    node 1's replica); it loads from there, and a rank reading storage
    itself is told why it cannot."""
    agents = [start_agent(cairnd.address, node, 2, ["--replicas", "1"])
              for node in (0, 1)]
    ckpt = cairn.Checkpointer(cairnd.address, "memjob", 0, 1,
                              agent_socket=agents[0].socket)
    sd = _state()
    want = {"model": {k: v.clone() for k, v in sd["model"].items()},
            "arr": sd["arr"].copy(), "step": 1}
    info = ckpt.save(4, sd, tier="memory")
    assert (info.step, info.state) == (4, "COMMITTED")
    got = _blank()
    assert ckpt.load(got) == 4
    assert ckpt.last_load_source == "agent_memory"
    _check(got, want)
    direct = cairn.Checkpointer(cairnd.address, "memjob", 0, 1)
    with pytest.raises(cairn.errors.FailedPreconditionError,
                       match="memory checkpoint"):
        direct.load(_blank(), step=4)
    # async_save to the persistent tier: a direct rank reads it.
    assert ckpt.async_save(5, sd, tier="persistent").result(
        timeout=120).state == "COMMITTED"
    assert direct.load(_blank(), step=5) == 5
    with pytest.raises(cairn.errors.InvalidArgumentError,
                       match="tier 'disk' is not one of"):
        ckpt.save(6, sd, tier="disk")
    with pytest.raises(cairn.errors.InvalidArgumentError,
                       match="no agent socket"):
        direct.save(6, sd, tier="memory")
    from cairn.torch import CairnStorageWriter
    with pytest.raises(cairn.errors.InvalidArgumentError,
                       match="needs an agent_socket"):
        CairnStorageWriter(cairnd.address, "memjob", 6, tier="memory")


def test_agent_socket_from_env(cairnd, start_agent, monkeypatch):
    agent = start_agent(cairnd.address)
    monkeypatch.setenv("CAIRN_AGENT_SOCKET", agent.socket)
    with cairn.Checkpointer(cairnd.address, "envagent", 0, 1,
                            copy_threads=2) as ckpt:
        assert ckpt.agent_socket == agent.socket
        fut = ckpt.async_save(1, {"x": torch.arange(5)})
    assert fut.done() and fut.result().state == "COMMITTED"


def agent_ranks(rank, world, address, socket):
    ckpt = cairn.Checkpointer(address, "agent2", agent_socket=socket)
    torch.manual_seed(rank)
    full = torch.arange(40, dtype=torch.float32).reshape(8, 5)
    sd = {"w": full.clone(), f"rank{rank}": torch.randn(3), "step": 7}
    fut = ckpt.async_save(7, sd)
    sd["w"].zero_()
    info = fut.result(timeout=120)
    got = {"w": torch.zeros(8, 5), f"rank{rank}": torch.zeros(3),
           "step": None}
    assert ckpt.load(got) == 7
    torch.manual_seed(rank)
    assert torch.equal(got["w"], full)
    assert torch.equal(got[f"rank{rank}"], torch.randn(3))
    return info.state, got["step"], ckpt.last_load_source


def test_two_ranks_async_save_through_one_agent(cairnd, start_agent):
    agent = start_agent(cairnd.address)
    got = harness.run_ranks(agent_ranks, 2, cairnd.address, agent.socket)
    assert [g[:2] for g in got] == [("COMMITTED", 7)] * 2
    assert {g[2] for g in got} == {"agent_memory"}


def _wait_for_log(server, text, proc=None):
    """Waits until cairnd's log holds `text` (a rank joined a save, say)."""
    deadline = time.monotonic() + 120
    while text not in server.log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in cairnd's log"
        if proc is not None:
            assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)


def _record(ckpt, step):
    return {i.step: i for i in ckpt.list(include_uncommitted=True)}[step]


def test_cancel_through_the_agent(cairn_bin, tmp_path, start_agent):
    """Agent mode: rank 0 of 3 saves through cairn-agent, ranks 1 and 2
    directly. cancel() before a call cancels just that call (CancelledError
    naming job, step and rank). cancel() from another thread while rank 0
    waits for its save to commit (ranks 0 and 1 joined it at cairnd, rank 2
    never comes): the agent aborts the save at cairnd, so rank 1 fails
    AbortedError naming rank 0 at once (nothing else ends its save: the
    begin deadline is an hour away), rank 0's future raises CancelledError,
    the previous checkpoint stays the latest and loads, and the next step
    commits with the same Checkpointer."""
    server = harness.Cairnd.start(
        cairn_bin, tmp_path, flags=["--log-level", "debug",
                                    "--begin-deadline", "3600"])
    try:
        agent = start_agent(server.address)
        job = "agentcancel"
        ckpt = cairn.Checkpointer(server.address, job, 0, 3,
                                  agent_socket=agent.socket)
        others = {r: cairn.Checkpointer(server.address, job, r, 3)
                  for r in (1, 2)}

        def part(r, step):
            return {f"part{r}": torch.full((4,), float(10 * step + r)),
                    "step": step}

        def save_others(step, ranks=(1, 2)):
            results = {}

            def run(r):
                try:
                    results[r] = others[r].save(step, part(r, step))
                except cairn.Error as e:
                    results[r] = e
            threads = [threading.Thread(target=run, args=(r,))
                       for r in ranks]
            for t in threads:
                t.start()
            return threads, results

        # Step 2 by every rank (rank 0's save is async_save + its wait).
        threads, results = save_others(2)
        assert ckpt.save(2, part(0, 2)).state == "COMMITTED"
        for t in threads:
            t.join()
        assert {r: i.state for r, i in results.items()} == {
            1: "COMMITTED", 2: "COMMITTED"}

        # cancel() with nothing running cancels the next call, once.
        ckpt.cancel()
        with pytest.raises(cairn.CancelledError) as e:
            ckpt.async_save(3, part(0, 3))
        assert all(s in e.value.message for s in (
            f"job '{job}'", "step 3", "rank 0", "cancel")), e.value.message
        ckpt.cancel()
        got = {"part0": torch.zeros(4), "step": None}
        with pytest.raises(cairn.CancelledError):
            ckpt.load(got)
        assert torch.equal(got["part0"], torch.zeros(4))
        assert ckpt.load(got) == 2 and got["step"] == 2

        # Step 3: rank 1 and rank 0's agent join; rank 2 never comes.
        threads, results = save_others(3, ranks=(1,))
        _wait_for_log(server, f"rank 1 of job '{job}' step 3 joined")
        fut = ckpt.async_save(3, part(0, 3))
        _wait_for_log(server, f"rank 0 of job '{job}' step 3 joined")
        outcome = {}

        def wait():
            try:
                outcome["info"] = fut.result(timeout=120)
            except cairn.Error as err:
                outcome["error"] = err
        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.2)  # likely inside the wait by now (either way works)
        ckpt.cancel()
        waiter.join()
        threads[0].join()
        assert isinstance(outcome.get("error"), cairn.CancelledError), outcome
        assert all(s in outcome["error"].message for s in (
            f"job '{job}'", "step 3", "rank 0")), outcome["error"].message
        assert fut.done() and isinstance(fut.exception(),
                                         cairn.CancelledError)
        assert isinstance(results[1], cairn.AbortedError), results
        assert "aborted by rank 0" in results[1].message, results[1].message
        assert "cancel" in results[1].message, results[1].message
        rec = _record(others[1], 3)
        assert rec.state == "ABORTED" and "cancel" in rec.abort_reason, rec
        assert ckpt.latest_step() == 2
        got = {"part0": torch.zeros(4), "step": None}
        assert ckpt.load(got) == 2
        assert torch.equal(got["part0"], part(0, 2)["part0"])

        # Step 4 commits, rank 0 through the same Checkpointer.
        threads, results = save_others(4)
        assert ckpt.save(4, part(0, 4)).state == "COMMITTED"
        for t in threads:
            t.join()
        assert {r: i.state for r, i in results.items()} == {
            1: "COMMITTED", 2: "COMMITTED"}
        assert ckpt.latest_step() == 4
    except BaseException:
        print(f"==== cairnd log:\n{server.log_tail()}")
        raise
    finally:
        server.kill()


# Rank 0 of a 2-rank save through cairn-agent whose rank 1 never comes: it
# waits for the commit until SIGINT.
_SIGINT_AGENT_RANK0 = """
import signal, sys
import torch
import cairn
signal.signal(signal.SIGINT, signal.default_int_handler)
ckpt = cairn.Checkpointer(sys.argv[1], "sigint-agent", 0, 2,
                          agent_socket=sys.argv[2])
try:
    info = ckpt.save(2, {"x": torch.ones(4)})
    print("returned", info, flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
"""


def test_ctrl_c_during_a_save_through_the_agent_aborts_it(
        cairn_bin, tmp_path, start_agent):
    """As in direct mode, Ctrl-C during save() through cairn-agent cancels
    the save: the agent aborts it at cairnd (listed ABORTED naming rank 0
    and the cancel) and KeyboardInterrupt is raised."""
    server = harness.Cairnd.start(
        cairn_bin, tmp_path, flags=["--log-level", "debug",
                                    "--begin-deadline", "3600"])
    proc = None
    try:
        agent = start_agent(server.address)
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-c", _SIGINT_AGENT_RANK0, server.address,
             agent.socket],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ))
        _wait_for_log(server, "rank 0 of job 'sigint-agent' step 2 joined",
                      proc)
        proc.send_signal(signal.SIGINT)
        # Without the cancel it would wait for the begin deadline (1 h).
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err)
        assert out.splitlines() == ["KeyboardInterrupt"], (out, err)
        rec = _record(cairn.Checkpointer(server.address, "sigint-agent", 0, 1),
                      2)
        assert rec.state == "ABORTED", rec
        assert "rank 0" in rec.abort_reason and "cancel" in rec.abort_reason
    except BaseException:
        print(f"==== cairnd log:\n{server.log_tail()}")
        raise
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        server.kill()
