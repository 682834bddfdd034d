"""cairn.Checkpointer with DTensors (torch >= 2.0): 2 ranks save a tensor
sharded by rows and a replicated one, 3 ranks load them sharded by columns
(resharding). torch 1.13 (Debian bookworm) has no DTensor: the test is
skipped there, naming the version."""

import pytest
import torch

import cairn
import harness


def _dtensor_api():
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        try:
            module = __import__(name, fromlist=["DTensor"])
        except ImportError:
            continue
        if all(hasattr(module, n) for n in ("DTensor", "DeviceMesh", "Shard",
                                            "Replicate", "Partial", "distribute_tensor")):
            return module
    return None


pytestmark = pytest.mark.skipif(
    _dtensor_api() is None,
    reason=f"torch {torch.__version__} has no DTensor "
           f"(torch.distributed.tensor / torch.distributed._tensor)")

FULL = torch.arange(7 * 5, dtype=torch.float32).reshape(7, 5)
REPL = torch.arange(6, dtype=torch.int64)


def dtensor_ranks(rank, world, address, dim, blank):
    api = _dtensor_api()
    mesh = api.DeviceMesh("cpu", list(range(world)))
    full = torch.zeros_like(FULL) if blank else FULL
    repl = torch.zeros_like(REPL) if blank else REPL
    sd = {"w": api.distribute_tensor(full, mesh, [api.Shard(dim)]),
          "r": api.distribute_tensor(repl, mesh, [api.Replicate()])}
    ckpt = cairn.Checkpointer(address, "dt")
    if not blank:
        return ckpt.save(1, sd).state
    assert ckpt.load(sd) == 1
    whole = sd["w"].redistribute(mesh, [api.Replicate()]).to_local()
    return (torch.equal(whole, FULL), torch.equal(sd["r"].to_local(), REPL))


def test_dtensor_rows_on_2_ranks_load_as_columns_on_3(cairnd):
    assert harness.run_ranks(dtensor_ranks, 2, cairnd.address, 0,
                             False) == ["COMMITTED"] * 2
    assert harness.run_ranks(dtensor_ranks, 3, cairnd.address, 1,
                             True) == [(True, True)] * 3


def partial_ranks(rank, world, address):
    api = _dtensor_api()
    mesh = api.DeviceMesh("cpu", list(range(world)))
    pending = api.DTensor.from_local(torch.ones(3, 2), mesh, [api.Partial()])
    ckpt = cairn.Checkpointer(address, "dt")
    with pytest.raises(cairn.InvalidArgumentError,
                       match=r"DTensor 'grads.w' has a Partial placement"):
        ckpt.save(2, {"grads": {"w": pending}})
    return True


def test_partial_dtensor_is_refused_naming_the_tensor(cairnd):
    assert harness.run_ranks(partial_ranks, 2, cairnd.address) == [True] * 2
