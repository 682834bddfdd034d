"""The PyTorch example (client/python/examples/train.py: a transformer
trained with FSDP2 on gloo ranks, dcp.async_save through CairnStorageWriter)
against a real cairnd, run as its users run it: a command spawning its
ranks.

Run A (a module fixture, with the module's cairnd) trains WORLD ranks to
the last step uninterrupted; both tests start from it.

- Killed and resumed: run B is killed with SIGKILL, sent here to every rank
  process once its first checkpoint is committed (wherever the ranks then
  are: an async_save may be in flight), and run again. It must resume from
  its latest committed step, not from scratch, and end with A's parameters
  and optimizer state, bit for bit (torch.equal): anything the checkpoint
  missed or restored wrongly (a parameter shard, AdamW's moments or step,
  the learning rate, the data position, a rank's RNG) makes B diverge.
- Another world size: run A's last checkpoint (2 ranks) is loaded into 3
  ranks, whose full (unsharded) state right after the load must equal the
  saved one element by element; then into 1 rank, which trains on from it
  and saves.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading

import pytest
import torch

from cairn import _cairn
from cairn import state as cairn_state

import harness

EXAMPLE = (pathlib.Path(__file__).resolve().parents[1] / "examples" /
           "train.py")
WORLD = 2  # gloo's sum of two gradients is exact in any order
STEPS = 30
SAVE_EVERY = 5
EVERY = list(range(SAVE_EVERY, STEPS + 1, SAVE_EVERY))  # the saved steps
KILL_AFTER = "step 5 committed"  # printed as step 10's save begins
RUN_TIMEOUT_S = 300


def _command(cairnd, job, world, steps, final_state, extra=()):
    return [sys.executable, str(EXAMPLE), "--coordinator", cairnd.address,
            "--job", job, "--world-size", str(world), "--steps", str(steps),
            "--save-every", str(SAVE_EVERY), "--timeout", "120",
            "--final-state", str(final_state), *extra]


def _train(cairnd, job, tmp_path, final_state, world=WORLD, steps=STEPS,
           extra=()):
    cmd = _command(cairnd, job, world, steps, final_state, extra)
    r = subprocess.run(cmd, capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S, cwd=tmp_path, env=dict(os.environ))
    assert r.returncode == 0, (
        f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}\n"
        f"==== cairnd log:\n{cairnd.log_tail()}")
    return r.stdout


def _train_and_kill(cairnd, job, tmp_path):
    """Runs the example and SIGKILLs its rank processes (their pids are in
    its output) once it prints KILL_AFTER; returns its output."""
    cmd = _command(cairnd, job, WORLD, STEPS, tmp_path / "never.pt")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env=dict(os.environ))
    out, pids, killed = [], [], False
    # A run that hangs is killed (its ranks die with it: spawn's
    # parent-death signal), which ends the loop below.
    timed_out = threading.Event()

    def expire():
        timed_out.set()
        proc.kill()

    watchdog = threading.Timer(RUN_TIMEOUT_S, expire)
    watchdog.start()
    try:
        for line in proc.stdout:
            out.append(line)
            pids += [int(pid) for pid in
                     re.findall(r"rank \d+ of \d+: pid (\d+)", line)]
            if KILL_AFTER in line:
                assert len(pids) == WORLD, "".join(out)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                killed = True
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(out)
    assert not timed_out.is_set(), f"no end within {RUN_TIMEOUT_S} s:\n{text}"
    assert killed, f"the run ended before printing '{KILL_AFTER}':\n{text}"
    assert rc == 128 + signal.SIGKILL, f"exited {rc}:\n{text}"
    return text


def _checkpoints(cairnd, job):
    """{step: world size} of the job's committed checkpoints."""
    ckpt = _cairn.Checkpointer(cairnd.address, job, 0, 1)
    return {i.step: i.world_size for i in ckpt.list()
            if i.state == "COMMITTED"}


def _full_state(path):
    """{flattened name: value} of a --final-state file."""
    saved = torch.load(path, weights_only=True)
    return saved["step"], cairn_state.flatten(
        {"model": saved["model"], "optim": saved["optim"]})


def _differences(path_a, path_b):
    """The entries of two --final-state files that differ (exact)."""
    step_a, a = _full_state(path_a)
    step_b, b = _full_state(path_b)
    bad = [] if step_a == step_b else [f"step {step_a} vs {step_b}"]
    bad += [f"{k}: only in one" for k in sorted(set(a) ^ set(b))]
    for k in sorted(set(a) & set(b)):
        va, vb = a[k], b[k]
        if isinstance(va, torch.Tensor):
            same = (isinstance(vb, torch.Tensor) and va.dtype == vb.dtype
                    and torch.equal(va, vb))
        else:
            same = va == vb
        if not same:
            bad.append(k)
    return bad


def _saved_steps(out, job):
    return [int(s) for s in re.findall(rf"job {job}: saving step (\d+)\b", out)]


class RunA:
    """cairnd, and on it run A: WORLD ranks trained to STEPS uninterrupted
    (job run-a), with its final state."""

    def __init__(self, cairnd, final_state):
        self.cairnd = cairnd
        self.final_state = final_state


@pytest.fixture(scope="module")
def run_a(cairn_bin, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run-a")
    cairnd = harness.Cairnd.start(cairn_bin, workdir)
    try:
        out = _train(cairnd, "run-a", workdir, workdir / "a.pt")
        assert "job run-a: no checkpoint" in out, out
        assert "resumed" not in out
        assert f"job run-a: step {STEPS} committed" in out, out
        assert sorted(_checkpoints(cairnd, "run-a")) == EVERY
        yield RunA(cairnd, workdir / "a.pt")
    finally:
        cairnd.kill()
        cairnd.delete_storage()


def test_killed_run_resumes_bit_identical(run_a, tmp_path):
    cairnd = run_a.cairnd
    out_b1 = _train_and_kill(cairnd, "run-b", tmp_path)
    assert re.search(r"job run-b: rank \d was killed \(SIGKILL\)", out_b1), out_b1
    assert f"step {STEPS} committed" not in out_b1, out_b1
    assert not (tmp_path / "never.pt").exists()

    out_b2 = _train(cairnd, "run-b", tmp_path, tmp_path / "b.pt")
    m = re.search(r"job run-b: resumed from step (\d+) \(lr ", out_b2)
    assert m, out_b2
    resumed_from = int(m.group(1))
    # From the checkpoint committed before the kill (or the one being
    # committed as it came), not from scratch; training went on after it.
    assert SAVE_EVERY <= resumed_from < STEPS, out_b1 + out_b2
    assert resumed_from in _saved_steps(out_b1, "run-b"), out_b1 + out_b2
    assert _saved_steps(out_b2, "run-b") == [
        s for s in EVERY if s > resumed_from], out_b2
    assert sorted(_checkpoints(cairnd, "run-b")) == EVERY

    assert _differences(run_a.final_state, tmp_path / "b.pt") == []
    # The checkpoints are the same too, and the comparison can fail:
    # training moved the parameters on after the resume point, so a resume
    # that lost or mangled part of the state would not end where A did.
    fqn = "train.model.head.weight"
    at_resume = _stored(cairnd, "run-b", resumed_from, fqn)
    assert torch.equal(at_resume, _stored(cairnd, "run-a", resumed_from, fqn))
    _, final = _full_state(run_a.final_state)
    assert not torch.equal(at_resume, final["model.head.weight"])


def _stored(cairnd, job, step, fqn):
    """Tensor `fqn` of checkpoint `step`, whole, read with the extension
    directly (independent of DCP and of the example)."""
    ckpt = _cairn.Checkpointer(cairnd.address, job, 0, 1)
    [entry] = [t for t in ckpt.describe(step).tensors if t.fqn == fqn]
    assert entry.dtype == "float32", entry.dtype
    out = torch.empty(entry.shape, dtype=torch.float32)
    sd = _cairn.StateDict()
    sd.add_chunks(fqn, "float32", entry.shape,
                  [([0] * len(entry.shape), entry.shape, out.data_ptr(),
                    out.numel() * 4)])
    assert ckpt.load(sd, step) == step
    return out


def test_resumed_into_another_world_size(run_a, tmp_path):
    cairnd, saved = run_a.cairnd, run_a.final_state
    assert _checkpoints(cairnd, "run-a")[STEPS] == WORLD

    # 3 ranks load step STEPS and train no further: their full state is the
    # one the 2 ranks saved, every element.
    loaded = tmp_path / "loaded-by-3.pt"
    out3 = _train(cairnd, "run-a", tmp_path, loaded, world=3)
    assert (f"job run-a: resumed from step {STEPS} (lr " in out3 and
            f"saved by {WORLD} ranks, resharded to 3, RNG reseeded" in out3
            ), out3
    assert "saving step" not in out3, out3
    assert _differences(saved, loaded) == []

    # 1 rank resumes from it and trains on, saving.
    more = STEPS + 2 * SAVE_EVERY
    trained = tmp_path / "trained-by-1.pt"
    out1 = _train(cairnd, "run-a", tmp_path, trained, world=1, steps=more)
    assert (f"job run-a: resumed from step {STEPS} (lr " in out1 and
            f"saved by {WORLD} ranks, resharded to 1, RNG reseeded" in out1
            ), out1
    assert f"job run-a: step {more} committed" in out1, out1
    assert _saved_steps(out1, "run-a") == [STEPS + SAVE_EVERY, more]
    checkpoints = _checkpoints(cairnd, "run-a")
    assert checkpoints[STEPS] == WORLD and checkpoints[more] == 1, checkpoints
    step, after = _full_state(trained)
    assert step == more
    changed = _differences(saved, trained)
    assert "model.head.weight" in changed, changed
    assert all(torch.isfinite(v).all() for v in after.values()
               if isinstance(v, torch.Tensor))


def test_saves_through_a_cairn_agent(run_a, tmp_path, cairn_bin):
    """--agent-socket: async_save stages into the agent's shared memory and
    the agent commits; the checkpoints are the ones run A wrote directly."""
    cairnd = run_a.cairnd
    agent = harness.Agent.start(cairn_bin, tmp_path, cairnd.address, 0, 1, ())
    try:
        _train(cairnd, "run-c", tmp_path, tmp_path / "c.pt",
               extra=("--agent-socket", agent.socket))
        log = harness.tail(agent.log, 400)
    finally:
        agent.kill()
    for rank in range(WORLD):  # the agent wrote them, not the ranks
        assert f"job 'run-c' step {STEPS} rank {rank} committed" in log, log
    assert sorted(_checkpoints(cairnd, "run-c")) == EVERY
    assert _differences(run_a.final_state, tmp_path / "c.pt") == []
    for step in (SAVE_EVERY, STEPS):
        for fqn in ("train.model.head.weight",
                    "train.optim.state.head.weight.exp_avg"):
            assert torch.equal(_stored(cairnd, "run-c", step, fqn),
                               _stored(cairnd, "run-a", step, fqn)), (step, fqn)


def test_missing_coordinator_is_a_usage_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_COORDINATOR"}
    r = subprocess.run([sys.executable, str(EXAMPLE), "--job", "x"],
                       capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=env)
    assert r.returncode == 2
    assert "no coordinator" in r.stderr and "CAIRN_COORDINATOR" in r.stderr
