"""cairn.torch's DCP storage layer when things go wrong, in real rank
processes against a real cairnd: a step or job that does not exist, a
state_dict key the checkpoint lacks, a wrong dtype, a rank failing inside
write_data (the save fails on every rank and the previous checkpoint stays
latest and loadable), ranks naming different steps."""

import pytest
import torch

import cairn
import cairn.torch as ctorch
from cairn import errors

import harness
from test_dcp import JOB, check_loaded, expected_state, load_layout, \
    save_layout, save_ranks

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import \
    CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import \
    DefaultSavePlanner  # noqa: E402


def _failures(exc):
    """{rank: exception} of a DCP CheckpointException."""
    return {r: e for r, (e, _) in exc.failures.items()}


# ------------------------------------------------------------ load errors

def load_missing_step(rank, world, address, job, step):
    full, objects = expected_state()
    sd = load_layout(full, objects, rank, world)
    try:
        dcp.load(sd, storage_reader=ctorch.CairnStorageReader(address, job, step))
    except CheckpointException as e:
        return {r: (type(x).__name__, str(x), isinstance(x, cairn.Error))
                for r, x in _failures(e).items()}
    return None


def test_load_of_a_missing_step_or_job_is_not_found(cairnd):
    harness.run_ranks(save_ranks, 2, cairnd.address, 3)
    for job, step in ((JOB, 4), ("nojob", "latest"), ("nojob", 3)):
        per_rank = harness.run_ranks(load_missing_step, 2, cairnd.address,
                                     job, step)
        for rank, failures in enumerate(per_rank):
            assert failures is not None, (rank, job, step)
            assert sorted(failures) == [0, 1], failures
            for name, msg, is_cairn in failures.values():
                # torch >= 2.9 re-raises read_metadata's error as an
                # AssertionError carrying its message (the status code too).
                assert ((name, is_cairn) == ("NotFoundError", True) or
                        (name == "AssertionError" and
                         "metadata read failed: NOT_FOUND: " in msg)), msg
                assert job in msg, msg
                if step != "latest":
                    assert str(step) in msg, msg

    # The same directly, outside DCP: the reader's read_metadata.
    with pytest.raises(cairn.NotFoundError, match=f"{JOB}.*4|4.*{JOB}"):
        ctorch.CairnStorageReader(cairnd.address, JOB, 4, rank=0,
                                  world_size=1).read_metadata()


def load_with_extra_key(rank, world, address):
    full, objects = expected_state()
    sd = load_layout(full, objects, rank, world)
    sd["model.extra.weight"] = torch.zeros(3, 3)
    try:
        dcp.load(sd, storage_reader=ctorch.CairnStorageReader(address, JOB, 3))
    except CheckpointException as e:
        return {r: (type(x).__name__, str(x), isinstance(x, cairn.NotFoundError),
                    isinstance(x, KeyError))
                for r, x in _failures(e).items()}
    return None


def load_with_wrong_dtype(rank, world, address):
    full, objects = expected_state()
    sd = load_layout(full, objects, rank, world)
    sd["extra.tiny"] = torch.zeros(3, 4, dtype=torch.float32)
    try:
        dcp.load(sd, storage_reader=ctorch.CairnStorageReader(address, JOB, 3))
    except CheckpointException as e:
        return {r: (type(x).__name__, str(x)) for r, x in _failures(e).items()}
    return None


def test_state_dict_key_missing_in_checkpoint_names_fqn(cairnd):
    harness.run_ranks(save_ranks, 2, cairnd.address, 3)
    per_rank = harness.run_ranks(load_with_extra_key, 2, cairnd.address)
    for failures in per_rank:
        assert sorted(failures) == [0, 1], failures
        for name, msg, not_found, key_error in failures.values():
            if name == "RuntimeError":
                # Current DCP's planner checks the keys itself, before the
                # reader sees them, naming the fqn.
                assert ("Missing key in checkpoint state_dict: "
                        "model.extra.weight" in msg), msg
                continue
            assert not_found and key_error, (name, msg)
            assert "'model.extra.weight'" in msg, msg
            assert f"job '{JOB}' step 3" in msg, msg

    per_rank = harness.run_ranks(load_with_wrong_dtype, 2, cairnd.address)
    for failures in per_rank:
        assert failures, failures
        for name, msg in failures.values():
            assert name == "InvalidArgumentError", msg
            assert "extra.tiny" in msg, msg


# ------------------------------------------------------------ save errors

class FailingPlanner(DefaultSavePlanner):
    """Raises while resolving one item on one rank (an injected failure)."""

    def __init__(self, failing_rank):
        super().__init__()
        self.failing_rank = failing_rank

    def resolve_data(self, write_item):
        import torch.distributed as dist  # pylint: disable=import-outside-toplevel
        if dist.get_rank() == self.failing_rank:
            raise OSError(f"injected failure resolving {write_item.index.fqn}")
        return super().resolve_data(write_item)


def save_failing(rank, world, address, how):
    full, objects = expected_state()
    sd = save_layout(full, objects, rank, world)
    planner = None
    if how == "meta" and rank == 1:
        # Its shard of model.0.weight on the meta device (no memory to save).
        local = sd["model.0.weight"].local_shards()[0]
        local.tensor = torch.empty(local.tensor.shape, device="meta")
    elif how == "planner":
        planner = FailingPlanner(failing_rank=2)
    writer = ctorch.CairnStorageWriter(address, JOB, 20)
    try:
        dcp.save(sd, storage_writer=writer, planner=planner)
    except CheckpointException as e:
        return {r: (type(x).__name__, str(x)) for r, x in _failures(e).items()}
    return None


def load_latest(rank, world, address):
    full, objects = expected_state()
    sd = load_layout(full, objects, rank, world)
    reader = ctorch.CairnStorageReader(address, JOB)
    dcp.load(sd, storage_reader=reader)
    check_loaded(sd, full, objects, rank)
    return reader.loaded_step


@pytest.mark.parametrize("how,failing_rank,what", [
    ("meta", 1, "device meta"),
    ("planner", 2, "injected failure"),
])
def test_a_rank_failing_in_write_data_fails_the_save_everywhere(
        cairnd, how, failing_rank, what):
    harness.run_ranks(save_ranks, 3, cairnd.address, 10)
    per_rank = harness.run_ranks(save_failing, 3, cairnd.address, how)
    for rank, failures in enumerate(per_rank):
        assert failures is not None, f"rank {rank} saw no failure"
        # The failing rank's own error, naming what failed ...
        name, msg = failures[failing_rank]
        assert what in msg, msg
        if how == "meta":
            assert name == "InvalidArgumentError", msg
            assert "model.0.weight" in msg, msg
        # ... and every other rank aborted naming it, before any byte moved.
        for r, (name, msg) in failures.items():
            if r != failing_rank:
                assert name == "AbortedError", msg
                assert f"rank {failing_rank} failed" in msg, msg
                assert f"job '{JOB}' step 20" in msg, msg
        assert sorted(failures) == [0, 1, 2], failures
    ls = cairnd.cli("ls", JOB).stdout
    assert [line.split()[1] for line in ls.splitlines()[1:]] == ["10"], ls
    with pytest.raises(cairn.NotFoundError):
        cairn._cairn.Checkpointer(cairnd.address, JOB, 0, 1).describe(20)
    assert cairn._cairn.Checkpointer(cairnd.address, JOB, 0,
                                     1).latest_step() == 10
    assert harness.run_ranks(load_latest, 2, cairnd.address) == [10, 10]


def save_different_steps(rank, world, address):
    full, objects = expected_state()
    sd = save_layout(full, objects, rank, world)
    writer = ctorch.CairnStorageWriter(address, JOB, 30 + rank)
    try:
        dcp.save(sd, storage_writer=writer)
    except CheckpointException as e:
        return {r: (type(x).__name__, str(x)) for r, x in _failures(e).items()}
    return None


def test_ranks_naming_different_steps_fail_before_writing(cairnd):
    per_rank = harness.run_ranks(save_different_steps, 2, cairnd.address)
    for failures in per_rank:
        assert list(failures) == [0], failures
        name, msg = failures[0]
        assert name == "AbortedError", msg
        assert "ranks [0]: step 30" in msg and "ranks [1]: step 31" in msg, msg
    assert cairnd.cli("ls", JOB, check=False).stdout.count("COMMITTED") == 0
    with pytest.raises(errors.NotFoundError, match=JOB):
        cairn._cairn.Checkpointer(cairnd.address, JOB, 0, 1).latest_step()


def load_different_steps(rank, world, address):
    full, objects = expected_state()
    sd = load_layout(full, objects, rank, world)
    # As if a save of step 2 committed between the ranks' resolutions of
    # "latest": rank 0 reads step 1, rank 1 step 2.
    reader = ctorch.CairnStorageReader(address, JOB, 1 + rank)
    try:
        dcp.load(sd, storage_reader=reader)
    except CheckpointException as e:
        return {r: (type(x).__name__, str(x)) for r, x in _failures(e).items()}
    return None


def test_ranks_loading_different_steps_fail_before_reading(cairnd):
    harness.run_ranks(save_ranks, 2, cairnd.address, 1)
    harness.run_ranks(save_ranks, 2, cairnd.address, 2)
    for failures in harness.run_ranks(load_different_steps, 2,
                                      cairnd.address):
        assert list(failures) == [0], failures
        name, msg = failures[0]
        assert name == "AbortedError", msg
        assert "ranks [0]: step 1" in msg and "ranks [1]: step 2" in msg, msg
        assert "load again" in msg, msg
