"""cairn.Checkpointer's errors, against a real cairnd: unknown steps and
jobs, shape and dtype mismatches, entries the checkpoint lacks, bad
arguments, a cairnd that is down, and a rank killed mid-save (the previous
checkpoint stays the latest and loadable)."""

import os

import pytest
import torch

import cairn
import harness


@pytest.fixture
def saved(cairnd):
    """Job 'errs' with step 5 committed: {"w": 3x4 float32, "meta": {...}}."""
    ckpt = cairn.Checkpointer(cairnd.address, "errs", 0, 1)
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    ckpt.save(5, {"model": {"w": w}, "meta": {"epoch": 2}})
    return ckpt, w


def test_unknown_step_and_empty_job_are_not_found(cairnd, saved):
    ckpt, _ = saved
    with pytest.raises(cairn.NotFoundError) as e:
        ckpt.load({"model": {"w": torch.zeros(3, 4)}}, step=99)
    assert "errs" in e.value.message and "99" in e.value.message
    with pytest.raises(cairn.NotFoundError) as e:
        ckpt.describe(99)
    assert "errs" in e.value.message and "99" in e.value.message
    empty = cairn.Checkpointer(cairnd.address, "nothing-yet", 0, 1)
    with pytest.raises(cairn.NotFoundError) as e:
        empty.latest_step()
    assert "nothing-yet" in e.value.message
    with pytest.raises(cairn.NotFoundError) as e:
        empty.load({"w": torch.zeros(1)})
    assert "nothing-yet" in e.value.message
    assert empty.list() == []


def test_shape_and_dtype_mismatch_name_the_fqn(saved):
    ckpt, w = saved
    for bad in (torch.zeros(4, 3), torch.zeros(3, 4, dtype=torch.float64),
                torch.zeros(12)):
        with pytest.raises(cairn.InvalidArgumentError) as e:
            ckpt.load({"model": {"w": bad}, "meta": {"epoch": None}})
        assert "model.w" in e.value.message, e.value.message
    # The failed loads changed nothing that a good load then reads.
    target = {"model": {"w": torch.zeros(3, 4)}, "meta": {"epoch": None}}
    assert ckpt.load(target) == 5
    assert torch.equal(target["model"]["w"], w)
    assert target["meta"]["epoch"] == 2


def test_entry_missing_from_the_checkpoint_is_named(saved):
    ckpt, _ = saved
    with pytest.raises(cairn.Error) as e:
        ckpt.load({"model": {"w": torch.zeros(3, 4), "b": torch.zeros(3)}})
    assert "model.b" in e.value.message
    with pytest.raises(cairn.Error) as e:
        ckpt.load({"model": {"w": torch.zeros(3, 4)}, "sched": {"n": 0}})
    assert "sched.n" in e.value.message


def test_bad_arguments(cairnd, monkeypatch):
    monkeypatch.delenv("CAIRN_COORDINATOR", raising=False)
    monkeypatch.delenv("CAIRN_JOB", raising=False)
    with pytest.raises(cairn.InvalidArgumentError) as e:
        cairn.Checkpointer(job="j")
    assert "coordinator" in e.value.message
    assert "CAIRN_COORDINATOR" in e.value.message
    with pytest.raises(cairn.InvalidArgumentError) as e:
        cairn.Checkpointer(cairnd.address)
    assert "job" in e.value.message and "CAIRN_JOB" in e.value.message
    with pytest.raises(cairn.InvalidArgumentError) as e:
        cairn.Checkpointer(cairnd.address, "j", 0, 1, copy_threads=2)
    assert "copy_threads" in e.value.message
    ckpt = cairn.Checkpointer(cairnd.address, "j", 0, 1)
    for step in ("7", 1.5, True):
        with pytest.raises(cairn.InvalidArgumentError) as e:
            ckpt.save(step, {"x": 1})
        assert "job 'j'" in e.value.message and repr(step) in e.value.message
    with pytest.raises(cairn.InvalidArgumentError) as e:
        ckpt.load({"x": None}, step="newest")
    assert "'newest'" in e.value.message
    with pytest.raises(cairn.InvalidArgumentError) as e:
        ckpt.save(1, {"dev": {"t": torch.empty(2, device="meta")}})
    msg = e.value.message
    assert all(s in msg for s in ("'dev.t'", "meta", "job 'j'", "step 1",
                                  "rank 0")), msg
    with pytest.raises(cairn.InvalidArgumentError) as e:
        ckpt.save(1, {"a.b": 1, "a": {"b": 2}})
    assert "'a.b'" in e.value.message and "step 1" in e.value.message


def test_cairnd_down_is_unavailable(cairnd):
    ckpt = cairn.Checkpointer(cairnd.address, "down", 0, 1, max_retries=1,
                              rpc_timeout=5.0)
    cairnd.stop()
    with pytest.raises(cairn.UnavailableError) as e:
        ckpt.save(1, {"x": torch.ones(2)})
    assert "down" in e.value.message
    with pytest.raises(cairn.UnavailableError):
        ckpt.latest_step()


# ------------------------------------------------------------ rank killed

def _state(step):
    torch.manual_seed(step)
    return {"w": torch.randn(256, 256), "step": step}


def save_then_die(rank, world, address, when):
    ckpt = cairn.Checkpointer(address, "killed", collective_timeout=10.0)
    ckpt.save(1, _state(1))
    if rank == 1:
        # Dies before its save of step 2, or with it in flight (os._exit:
        # no cleanup, no abort sent).
        if when == "during":
            ckpt.async_save(2, _state(2))
        os._exit(7)  # pylint: disable=protected-access
    try:
        ckpt.save(2, _state(2))
    except cairn.Error as e:
        return type(e).__name__, e.message
    return "committed", ""


@pytest.mark.parametrize("when", ["before", "during"])
def test_rank_killed_mid_save_leaves_the_previous_checkpoint(cairnd, when):
    results = harness.run_ranks_raw(save_then_die, 2, cairnd.address, when)
    (code0, ok0, res0), (code1, _, _) = results
    assert code1 == 7
    assert code0 == 0 and ok0, res0
    kind, message = res0
    # Rank 0 waits for rank 1 until its collective timeout (or is told the
    # save was aborted), never commits.
    assert kind in ("DeadlineExceededError", "AbortedError"), (kind, message)
    assert "job 'killed'" in message and "step 2" in message, message
    ckpt = cairn.Checkpointer(cairnd.address, "killed", 0, 1)
    assert ckpt.latest_step() == 1
    states = {i.step: i.state for i in ckpt.list(include_uncommitted=True)}
    assert states[1] == "COMMITTED" and states.get(2) != "COMMITTED"
    target = {"w": torch.zeros(256, 256), "step": None}
    assert ckpt.load(target) == 1
    want = _state(1)
    assert torch.equal(target["w"], want["w"]) and target["step"] == 1
