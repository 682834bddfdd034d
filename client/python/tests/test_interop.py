"""The two Python APIs read each other's checkpoints: a state saved with
cairn.Checkpointer loads through DCP with CairnStorageReader, and one saved
through DCP with CairnStorageWriter loads with cairn.Checkpointer, tensors
and non-tensor objects alike (the direct API pickles objects, DCP's planner
torch.saves them; cairn._objects reads both). Nested dicts are named
differently by torch 1.13's DCP (one object) and by the direct API (one
entry per leaf), so these states are flat."""

import cairn
import cairn.torch as ctorch
import torch
import torch.distributed.checkpoint as dcp

JOB = "interop"


def original():
    g = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(6, 5, generator=g),
        "b": torch.arange(4, dtype=torch.int64),
        "h": torch.randn(3, 3, generator=g).to(torch.bfloat16),
        "step": 41,
        # Not a nested dict: the direct API (like current DCP's planners)
        # flattens nested dicts into "meta.lr", ...; torch 1.13's DCP stores
        # a nested dict as one object, so the two name it differently.
        "meta": [("lr", 0.5), ["a", "b"], None],
    }


def empty_like(sd):
    return {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else None)
            for k, v in sd.items()}


def check(loaded, expected):
    for k, v in expected.items():
        if isinstance(v, torch.Tensor):
            assert loaded[k].dtype == v.dtype, k
            assert torch.equal(loaded[k], v), k
        else:
            assert loaded[k] == v, k


def test_direct_api_checkpoint_loads_through_dcp(cairnd):
    sd = original()
    with cairn.Checkpointer(cairnd.address, JOB, rank=0, world_size=1) as c:
        assert c.save(10, sd).state == "COMMITTED"
    back = empty_like(sd)
    dcp.load(back, storage_reader=ctorch.CairnStorageReader(cairnd.address, JOB),
                        no_dist=True)
    check(back, sd)


def test_dcp_checkpoint_loads_through_the_direct_api(cairnd):
    sd = original()
    dcp.save(sd, storage_writer=ctorch.CairnStorageWriter(cairnd.address, JOB, 20),
                        no_dist=True)
    back = empty_like(sd)
    with cairn.Checkpointer(cairnd.address, JOB, rank=0, world_size=1) as c:
        assert c.load(back) == 20
    check(back, sd)
