"""The test harness itself: rank groups report results and failures, and
cairnd restarts on the same address."""

import pytest

import harness


def _all_reduce(rank, world_size, base):
    import torch
    import torch.distributed as dist
    t = torch.tensor([base + rank], dtype=torch.int64)
    dist.all_reduce(t)
    return (rank, world_size, int(t.item()))


def _fail_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError(f"rank {rank} fails on purpose")
    return rank


def test_run_ranks_returns_every_rank_result():
    results = harness.run_ranks(_all_reduce, 3, 10)
    assert results == [(r, 3, 10 + 11 + 12) for r in range(3)]


def test_run_ranks_raises_with_the_failed_rank_traceback():
    with pytest.raises(AssertionError) as e:
        harness.run_ranks(_fail_on_rank_1, 2)
    assert "rank 1 fails on purpose" in str(e.value)
    assert "1 of 2 ranks" in str(e.value)


def test_cairnd_restarts_on_the_same_address(cairnd):
    before = cairnd.address
    cairnd.restart(kill=True)
    assert cairnd.address == before
    out = cairnd.cli("ls").stdout
    assert out.strip() == "no checkpoints"
