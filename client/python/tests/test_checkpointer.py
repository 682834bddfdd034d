"""cairn.Checkpointer end to end with real rank processes and a real cairnd:
a 2-layer MLP with Adam state, an LR scheduler, a step int and RNG states
saved by 4 ranks with ShardedTensor row sharding of the big weights, loaded
into 1, 2 and 3 ranks with column sharding (torch.equal on every tensor
against deterministic expected values, non-tensor leaves equal), plus the
interop leaves: objects, empty shards, ranks without a local shard,
bfloat16, bool, 0-dim tensors and numpy arrays. The 4 ranks also
async_save the same state and overwrite it at once: the loads of that step
see the snapshot."""

import dataclasses
import random

import numpy as np
import pytest
import torch

import cairn  # noqa: F401  (installs the torch 1.13 sharding import fix)
import harness
from cairn import state as cairn_state
from torch.distributed._shard import sharded_tensor  # noqa: E402
from torch.distributed._shard.metadata import ShardMetadata  # noqa: E402

JOB = "mlp"


@dataclasses.dataclass
class RunInfo:
    """A non-tensor object saved pickled (importable by the loading ranks)."""
    name: str
    tags: tuple


def _model_opt_sched():
    """The same trained-for-two-steps MLP, Adam and scheduler in every
    process (fixed seeds and data)."""
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(10, 7), torch.nn.ReLU(),
                                torch.nn.Linear(7, 5))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x = torch.randn(16, 10)
    for _ in range(2):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model, opt, sched


def expected_state():
    """The nested state every test compares against. Tensors named in
    SHARDED are saved/loaded as ShardedTensors."""
    model, opt, sched = _model_opt_sched()
    gen = torch.Generator().manual_seed(7)
    random.seed(99)
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "sched": sched.state_dict(),
        "step": 1200,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "extra": {
            "bf16": torch.randn(5, 3, generator=gen).to(torch.bfloat16),
            "mask": torch.randn(4, 4, generator=gen) > 0,
            "scalar": torch.tensor(3.25, dtype=torch.float64),
            "np": np.arange(24, dtype=np.int32).reshape(4, 6),
            "few_rows": torch.arange(15, dtype=torch.int64).reshape(3, 5),
            "two_owners": torch.arange(24, dtype=torch.int16).reshape(4, 6),
            "info": RunInfo("mlp", ("a", 1)),
            "lr_history": [0.01, 0.005, 0.0025],
            "blob": b"\x00\xffraw",
        },
    }


# Tensors saved ROW sharded by 4 ranks and loaded COLUMN sharded
# ("extra.few_rows": 3 rows over 4 ranks leaves a rank an empty shard).
SHARDED = ("model.0.weight", "model.2.weight", "optim.state.0.exp_avg",
           "extra.few_rows")


def bounds(n, world):
    return [(i * n) // world for i in range(world + 1)]


def shard(full, dim, rank, world, owners=None):
    """A ShardedTensor of `full` split along `dim` over the first `owners`
    ranks (default: all; each one shard, possibly empty); the other ranks
    hold no local shard."""
    owners = world if owners is None else min(owners, world)
    b = bounds(full.shape[dim], owners)
    local = None
    for r in range(owners):
        offsets = [0] * full.dim()
        sizes = list(full.shape)
        offsets[dim] = b[r]
        sizes[dim] = b[r + 1] - b[r]
        md = ShardMetadata(shard_offsets=offsets, shard_sizes=sizes,
                           placement=f"rank:{r}/cpu")
        if r == rank:
            local = sharded_tensor.Shard(
                full.narrow(dim, b[r], sizes[dim]).clone(), md)
    return sharded_tensor.init_from_local_shards(
        [local] if local is not None else [], list(full.shape))


def _set(sd, fqn, value):
    for _, path, container, key, _ in cairn_state.iter_leaves(sd):
        if ".".join(map(str, path)) == fqn:
            container[key] = value
            return
    raise KeyError(fqn)


def layout(dim, rank, world, blank):
    """The expected state with SHARDED tensors sharded along `dim`; with
    `blank` every tensor zeroed and every other leaf None (a load target)."""
    sd = expected_state()
    for fqn, _, container, key, value in list(cairn_state.iter_leaves(sd)):
        if blank:
            if isinstance(value, torch.Tensor):
                value = torch.zeros_like(value)
            elif isinstance(value, np.ndarray):
                value = np.zeros_like(value)
            else:
                value = None
            container[key] = value
        if fqn in SHARDED:
            container[key] = shard(value, dim, rank, world)
        elif fqn == "extra.two_owners":  # ranks >= 2: no local shard
            container[key] = shard(value, dim, rank, world, owners=2)
    return sd


def check_equal(got, rank, world, dim):
    """torch.equal on every tensor (local shards against their slice),
    == on every other leaf; returns the number of leaves checked."""
    want = cairn_state.flatten(expected_state())
    have = cairn_state.flatten(got)
    assert sorted(have) == sorted(want)
    for fqn, value in have.items():
        exp = want[fqn]
        if isinstance(value, sharded_tensor.ShardedTensor):
            for s in value.local_shards():
                off, size = s.metadata.shard_offsets, s.metadata.shard_sizes
                piece = exp.narrow(dim, off[dim], size[dim])
                assert torch.equal(s.tensor, piece), (fqn, rank, world)
        elif isinstance(value, torch.Tensor):
            assert value.dtype == exp.dtype and torch.equal(value, exp), fqn
        elif isinstance(value, np.ndarray):
            assert value.dtype == exp.dtype and (value == exp).all(), fqn
        else:
            assert value == exp, (fqn, value, exp)
    return len(have)


def save_rows(rank, world, address):
    ckpt = cairn.Checkpointer(address, JOB)   # rank/world from the group
    assert (ckpt.rank, ckpt.world_size) == (rank, world)
    info = ckpt.save(10, layout(0, rank, world, blank=False))
    # The same state again by async_save (background thread): the local
    # shards and tensors changed right after it returns are not what step
    # 11 holds.
    sd = layout(0, rank, world, blank=False)
    fut = ckpt.async_save(11, sd)
    for _, _, _, _, value in cairn_state.iter_leaves(sd):
        if isinstance(value, sharded_tensor.ShardedTensor):
            for s in value.local_shards():
                s.tensor.fill_(-1)
        elif isinstance(value, torch.Tensor):
            value.fill_(-1)
    assert fut.result().step == 11
    return info.state, info.step, info.world_size


def load_columns(rank, world, address):
    ckpt = cairn.Checkpointer(address, JOB, rank, world)
    sd = layout(1, rank, world, blank=True)
    # Objects load the way torch.load does by default (weights_only): a
    # class the user did not allow is refused, naming the entry and class.
    with pytest.raises(cairn.InvalidArgumentError,
                       match=r"entry 'extra.info'.*test_checkpointer.RunInfo"
                             r".*weights_only=False"):
        ckpt.load(sd)
    with torch.serialization.safe_globals([RunInfo]):
        assert ckpt.load(sd) == 11   # latest: the async_save
    assert ckpt.last_load_source == "storage"
    n = check_equal(sd, rank, world, 1)
    # Load step 10 into the same dict (tensors overwritten in place,
    # objects replaced).
    for _, _, container, key, value in cairn_state.iter_leaves(sd):
        if isinstance(value, sharded_tensor.ShardedTensor):
            for s in value.local_shards():
                s.tensor.zero_()
        elif isinstance(value, torch.Tensor):
            value.zero_()
        elif isinstance(value, np.ndarray):
            value[...] = 0
        else:
            container[key] = None
    assert ckpt.load(sd, step=10, weights_only=False) == 10
    assert sd["step"] == 1200
    assert check_equal(sd, rank, world, 1) == n
    return n, ckpt.latest_step()


def test_4_ranks_row_sharded_load_into_1_2_3_ranks_column_sharded(cairnd):
    saved = harness.run_ranks(save_rows, 4, cairnd.address)
    assert saved == [("COMMITTED", 10, 4)] * 4
    for world in (1, 2, 3):
        got = harness.run_ranks(load_columns, world, cairnd.address)
        assert len(got) == world
        for n, latest in got:
            assert latest == 11 and n >= 20
    # Each ShardedTensor was stored as its 4 row chunks (empty ones aside);
    # replicated tensors once.
    desc = cairn.Checkpointer(cairnd.address, JOB).describe(10)
    tensors = {t.fqn: t for t in desc.tensors}
    assert tensors["model.0.weight"].shape == [7, 10]
    assert [s for _, s in tensors["model.0.weight"].chunks] == [
        [1, 10], [2, 10], [2, 10], [2, 10]]
    assert tensors["model.0.bias"].chunks == [([0], [7])]
    assert tensors["extra.two_owners"].chunks == [([0, 0], [2, 6]),
                                                  ([2, 0], [2, 6])]
    assert tensors["extra.bf16"].dtype == "bfloat16"
    assert tensors["extra.scalar"].shape == []
    entries = {b.fqn for b in desc.bytes_entries}
    assert {"step", "optim.param_groups", "extra.info",
            "rng.python"} <= entries


def test_single_process_without_a_group_saves_and_loads(cairnd, monkeypatch):
    """No process group: rank 0 of 1 by default; env supplies coordinator
    and job; a non-contiguous tensor and a non-contiguous array load in
    place through temporaries."""
    monkeypatch.setenv("CAIRN_COORDINATOR", cairnd.address)
    monkeypatch.setenv("CAIRN_JOB", "solo")
    for var in ("CAIRN_RANK", "CAIRN_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    ckpt = cairn.Checkpointer()
    assert (ckpt.coordinator, ckpt.job, ckpt.rank, ckpt.world_size) == (
        cairnd.address, "solo", 0, 1)
    base = torch.arange(12.0).reshape(3, 4)
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    sd = {"t": base.t(), "a": arr.T, "n": {"k": [1, 2]}}
    info = ckpt.save(3, sd)
    assert (info.job, info.step, info.state) == ("solo", 3, "COMMITTED")
    assert ckpt.last_stats["bytes"] > 0
    target_base = torch.zeros(3, 4)
    target_arr = np.zeros((3, 4))
    dst = {"t": target_base.t(), "a": target_arr.T, "n": {"k": None}}
    assert ckpt.load(dst) == 3
    assert torch.equal(target_base, base) and (target_arr == arr).all()
    assert dst["n"]["k"] == [1, 2]
    assert [i.step for i in ckpt.list()] == [3]
    assert ckpt.latest_step() == 3
    # A numpy integer is a step too.
    assert ckpt.load(dst, step=np.int64(3)) == 3


def test_rank_and_world_from_env(cairnd, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("CAIRN_RANK", raising=False)
    monkeypatch.delenv("CAIRN_WORLD_SIZE", raising=False)
    c = cairn.Checkpointer(cairnd.address, "env")
    assert (c.rank, c.world_size) == (1, 4)
    monkeypatch.setenv("CAIRN_RANK", "2")
    monkeypatch.setenv("CAIRN_WORLD_SIZE", "3")
    c = cairn.Checkpointer(cairnd.address, "env")
    assert (c.rank, c.world_size) == (2, 3)
    c = cairn.Checkpointer(cairnd.address, "env", rank=0, world_size=1)
    assert (c.rank, c.world_size) == (0, 1)
    monkeypatch.setenv("CAIRN_RANK", "x")
    with pytest.raises(cairn.InvalidArgumentError) as e:
        cairn.Checkpointer(cairnd.address, "env")
    assert "CAIRN_RANK" in e.value.message
