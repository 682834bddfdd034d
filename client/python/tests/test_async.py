"""cairn.Checkpointer.async_save: through a real cairn-agent (snapshot into
its shared memory, loads from its memory tier) and through the background
thread of the direct path. Tensors modified right after async_save returns
do not change what was saved; one save is in flight at a time."""

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
