"""cairn.Checkpointer's errors, against a real cairnd: unknown steps and
jobs, shape and dtype mismatches, entries the checkpoint lacks, bad
arguments, a cairnd that is down, and a rank killed mid-save (the previous
checkpoint stays the latest and loadable)."""

import os
import signal
import socket
import threading

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
    for step in (-1, 10**15 + 1, 2**70):
        for call in (lambda: ckpt.save(step, {"x": 1}),
                     lambda: ckpt.load({"x": None}, step=step)):
            with pytest.raises(cairn.InvalidArgumentError) as e:
                call()
            assert f"invalid step {step}" in e.value.message
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


def _refused_port():
    """A loopback port bound and closed: connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_never_reached_cairnd_fails_within_the_first_contact_timeout():
    """A rank pointed at a port where nothing listens fails within
    first_contact_timeout (default 5 s), naming the address and gRPC's
    reason, instead of using the restart budget (max_retries=200: over 16
    minutes). The 60 s join is a hang guard."""
    assert cairn._cairn.Checkpointer.default_options()[
        "first_contact_timeout"] == 5.0
    address = f"127.0.0.1:{_refused_port()}"
    ckpt = cairn.Checkpointer(address, "never", 0, 1, max_retries=200)
    errors = []

    def save():
        try:
            ckpt.save(1, {"x": torch.ones(2)})
        except cairn.Error as e:  # pylint: disable=broad-except
            errors.append(e)

    t = threading.Thread(target=save, daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():
        ckpt.cancel()
        t.join(60)
        pytest.fail("save to a port where nothing listens still retried "
                    "after 60 s")
    assert len(errors) == 1
    e = errors[0]
    assert isinstance(e, cairn.UnavailableError), e
    assert f"cairnd at {address} was never reached" in e.message, e.message
    assert "Connection refused" in e.message, e.message
    assert "job 'never'" in e.message and "rank 0" in e.message, e.message


# ------------------------------------------------------------ rank killed

def _state(step):
    torch.manual_seed(step)
    return {"w": torch.randn(256, 256), "step": step}


def save_then_die(rank, world, address, when):
    ckpt = cairn.Checkpointer(address, "killed", collective_timeout=10.0)
    ckpt.save(1, _state(1))
    if rank == 1:
        # Dies before its save of step 2 (os._exit: no cleanup, no abort
        # sent), or with it in flight: its bytes written, SIGKILLed by the
        # crash point just before its CommitSave (rank_env below), so the
        # save can never complete, however the machine schedules it.
        if when == "during":
            ckpt.async_save(2, _state(2)).result()
        os._exit(7)  # pylint: disable=protected-access
    try:
        ckpt.save(2, _state(2))
    except cairn.Error as e:
        return type(e).__name__, e.message
    return "committed", ""


@pytest.mark.parametrize("when", ["before", "during"])
def test_rank_killed_mid_save_leaves_the_previous_checkpoint(cairnd, when):
    rank_env = {1: {"CAIRN_CRASH_POINTS": "client.before_commit@2"}}
    results = harness.run_ranks_raw(save_then_die, 2, cairnd.address, when,
                                    rank_env=rank_env)
    (code0, ok0, res0), (code1, _, _) = results
    assert code1 == (-signal.SIGKILL if when == "during" else 7), code1
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


# Rank 0 of 2 saves a nested state through cairn.Checkpointer; rank 1 never
# comes, so it waits in the save until SIGINT.
_SIGINT_RANK0 = """
import signal, sys
import torch
import cairn
signal.signal(signal.SIGINT, signal.default_int_handler)
ckpt = cairn.Checkpointer(sys.argv[1], "sigint", 0, 2)
try:
    ckpt.save(2, {"model": {"w": torch.full((4,), 9.0)}, "step": 2})
    print("returned", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    print("latest", ckpt.latest_step(), flush=True)
"""


def _rank_saves_step_1(rank, world, address):
    ckpt = cairn.Checkpointer(address, "sigint")
    return ckpt.save(1, {"model": {"w": torch.full((4,), 5.0)},
                         "step": 1}).state


def test_ctrl_c_during_save_aborts_it_and_the_previous_step_stays(
        cairn_bin, tmp_path):
    import signal  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    import threading  # pylint: disable=import-outside-toplevel
    # A long begin deadline: only the cancel can end rank 0's wait.
    server = harness.Cairnd.start(cairn_bin, tmp_path, flags=[
        "--log-level", "debug", "--begin-deadline", "3600"])
    try:
        assert harness.run_ranks(_rank_saves_step_1, 2,
                                 server.address) == ["COMMITTED"] * 2
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-c", _SIGINT_RANK0, server.address],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ))
        try:
            # Wait until cairnd has rank 0 parked in the save of step 2.
            while "step 2 joined the save" not in server.log.read_text():
                assert proc.poll() is None, proc.communicate()
                threading.Event().wait(0.05)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, (out, err)
        assert out.splitlines() == ["KeyboardInterrupt", "latest 1"], (out,
                                                                      err)
        ckpt = cairn.Checkpointer(server.address, "sigint", 0, 1)
        states = {i.step: i for i in ckpt.list(include_uncommitted=True)}
        assert states[2].state == "ABORTED" and "rank 0" in (
            states[2].abort_reason)
        target = {"model": {"w": torch.zeros(4)}, "step": None}
        assert ckpt.load(target) == 1 and target["step"] == 1
        assert torch.equal(target["model"]["w"], torch.full((4,), 5.0))
    finally:
        server.kill()
