"""The direct-API example (client/python/examples/train_direct.py, the
training image's) against a real cairnd, run as the user runs it: a
subprocess spawning its gloo ranks.

Run A trains to the last step without interruption; run B is killed hard
(os._exit in every rank) in the middle, restarted, resumes from its latest
committed checkpoint and trains to the same step. A and B must end with
bit-identical model parameters and optimizer state (torch.equal): anything
the checkpoint missed or restored wrongly (a parameter, Adam's moments or
step, the scheduler's learning rate, a rank's torch or Python RNG, the step
counter) makes B diverge from A.
"""

import os
import pathlib
import re
import subprocess
import sys
import time

import torch

from cairn import _cairn

EXAMPLE = (pathlib.Path(__file__).resolve().parents[1] / "examples" /
           "train_direct.py")
WORLD = 2  # two ranks: gloo's sum of two gradients is exact in any order
STEPS = 24
SAVE_EVERY = 5
KILL_AT = 13  # saves 5 and 10 committed, 11 and 12 run, then killed


def _train(cairnd, job, tmp_path, *extra, expect_rc=0):
    cmd = [sys.executable, str(EXAMPLE), "--coordinator", cairnd.address,
           "--job", job, "--world-size", str(WORLD), "--steps", str(STEPS),
           "--save-every", str(SAVE_EVERY), "--timeout", "120", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       cwd=tmp_path, env=dict(os.environ))
    assert r.returncode == expect_rc, (
        f"{' '.join(cmd)} exited {r.returncode}, expected {expect_rc}:\n"
        f"{r.stdout}\n{r.stderr}")
    return r.stdout


def _committed_steps(cairnd, job):
    ckpt = _cairn.Checkpointer(cairnd.address, job, 0, 1)
    return sorted(i.step for i in ckpt.list() if i.state == "COMMITTED")


def _wait_until_settled(cairnd, job, timeout=120.0):
    """Waits until no checkpoint of `job` is still WRITING (an async save the
    agent was finishing when its ranks died); returns the committed steps."""
    ckpt = _cairn.Checkpointer(cairnd.address, job, 0, 1)
    deadline = time.monotonic() + timeout
    while True:
        infos = ckpt.list(include_uncommitted=True)
        writing = [i.step for i in infos if i.state == "WRITING"]
        if not writing:
            return sorted(i.step for i in infos if i.state == "COMMITTED")
        assert time.monotonic() < deadline, (
            f"job {job}: steps {writing} still WRITING after {timeout} s")
        time.sleep(0.1)


def _assert_same_final_state(path_a, path_b):
    a = torch.load(path_a)
    b = torch.load(path_b)
    assert a["model"].keys() == b["model"].keys()
    for fqn, t in a["model"].items():
        assert torch.equal(t, b["model"][fqn]), f"model.{fqn} differs"
    assert a["optim"].keys() == b["optim"].keys()
    for idx, st in a["optim"].items():
        for key, t in st.items():
            assert torch.equal(t, b["optim"][idx][key]), (
                f"optim.state.{idx}.{key} differs")


def test_killed_run_resumes_bit_identical(cairnd, tmp_path):
    out_a = _train(cairnd, "run-a", tmp_path, "--final-state",
                   str(tmp_path / "a.pt"))
    assert "job run-a: no checkpoint" in out_a
    assert "resumed" not in out_a
    assert re.search(r"job run-a: saved step 24\b", out_a), out_a
    assert _committed_steps(cairnd, "run-a") == [5, 10, 15, 20, 24]

    out_b1 = _train(cairnd, "run-b", tmp_path, "--kill-at-step", str(KILL_AT),
                    expect_rc=137)
    assert "job run-b: saved step 10" in out_b1, out_b1
    assert "saved step 15" not in out_b1
    assert f"killed before step {KILL_AT}" in out_b1, out_b1
    assert _committed_steps(cairnd, "run-b") == [5, 10]

    out_b2 = _train(cairnd, "run-b", tmp_path, "--final-state",
                    str(tmp_path / "b.pt"))
    assert re.search(r"job run-b: resumed from step 10\b", out_b2), out_b2
    assert "saved step 10" not in out_b2  # it continued after the resume
    assert "job run-b: saved step 15" in out_b2, out_b2
    assert _committed_steps(cairnd, "run-b") == [5, 10, 15, 20, 24]

    _assert_same_final_state(tmp_path / "a.pt", tmp_path / "b.pt")
    # The check can fail: training moved the parameters away from run A's
    # checkpoint at step 10, so a resume that silently restarted or skipped
    # steps would not match.
    assert not torch.equal(torch.load(tmp_path / "a.pt")["model"]["fc1.weight"],
                           _fc1_at_step(cairnd, "run-a", 10))


def test_resume_with_async_saves_through_agent(cairnd, start_agent, tmp_path):
    agent = start_agent(cairnd.address)
    sock = ["--agent-socket", str(agent.socket)]
    _train(cairnd, "plain", tmp_path, "--final-state", str(tmp_path / "a.pt"))
    out1 = _train(cairnd, "async", tmp_path, *sock, "--kill-at-step",
                  str(KILL_AT), expect_rc=137)
    assert "job async: saved step 10" in out1 and "async_save" in out1, out1
    # Step 10's save was waited for only at the next save (none came before
    # the kill), so the resume is from 10 if the agent committed it in the
    # background, else from 5: either way the result must match the
    # uninterrupted run.
    resumed_from = max(_wait_until_settled(cairnd, "async"))
    assert resumed_from in (5, 10)
    out2 = _train(cairnd, "async", tmp_path, *sock, "--final-state",
                  str(tmp_path / "b.pt"))
    assert f"job async: resumed from step {resumed_from}" in out2, out2
    assert "job async: step 24 committed" in out2, out2
    _assert_same_final_state(tmp_path / "a.pt", tmp_path / "b.pt")


def test_missing_coordinator_is_a_usage_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_COORDINATOR"}
    r = subprocess.run([sys.executable, str(EXAMPLE), "--job", "x"],
                       capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=env)
    assert r.returncode == 2
    assert "no coordinator" in r.stderr and "CAIRN_COORDINATOR" in r.stderr


def _fc1_at_step(cairnd, job, step):
    """fc1.weight as stored in checkpoint `step` of `job`, read with the
    extension directly (independent of the example's own load path)."""
    ckpt = _cairn.Checkpointer(cairnd.address, job, 0, 1)
    summary = ckpt.describe(step)
    [entry] = [t for t in summary.tensors if t.fqn.endswith("fc1.weight")]
    out = torch.empty(entry.shape, dtype=torch.float32)
    sd = _cairn.StateDict()
    sd.add_chunks(entry.fqn, "float32", entry.shape,
                  [([0] * len(entry.shape), entry.shape, out.data_ptr(),
                    out.numel() * 4)])
    ckpt.load(sd, step)
    return out
