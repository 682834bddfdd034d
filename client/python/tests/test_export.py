"""`cairn export --format safetensors` of a state saved by 2 real ranks
(cairn.Checkpointer, gloo): the files load with safetensors.torch.load_file
and hold every tensor whole and bit-identical to what was saved, bfloat16
and bool included (DTensors sharded unevenly by rows and by columns where
torch has DTensor, replicated tensors, per-rank tensors); a small
--max-shard-size gives model-0000i-of-0000N files and an index.json as
transformers writes them; --filter keeps a prefix; the non-tensor entries
are skipped and counted."""

import json

import pytest
import torch

import cairn
import harness

from test_checkpointer_dtensor import _dtensor_api

import safetensors.torch as safetensors_torch  # pinned in the project environment

JOB = "export"




def full_tensors(world):
    """Every tensor of the saved state, whole, by fqn (the same in every
    process: fixed seed)."""
    gen = torch.Generator().manual_seed(52)
    out = {
        # Sharded (DTensor) where torch has it: 7 rows over 2 ranks (4 + 3),
        # 9 columns (5 + 4).
        "model.embed.weight":
            torch.randn(7, 6, generator=gen).to(torch.bfloat16),
        "model.layers.0.mlp.weight": torch.randn(5, 9, generator=gen),
        # Replicated (the same on both ranks: stored once).
        "model.layers.0.mlp.bias": torch.randn(5, generator=gen),
        "model.mask": torch.randn(4, 4, generator=gen) > 0,
        "model.positions": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "model.scale": torch.tensor(0.5, dtype=torch.float64),
        "model.half": torch.randn(3, generator=gen).to(torch.float16),
        "model.empty": torch.empty(0, 4),
    }
    for rank in range(world):  # per-rank values under per-rank names
        out[f"rng.rank{rank}"] = torch.randint(
            0, 255, (16,), dtype=torch.uint8, generator=gen)
    return out


SHARDED = {"model.embed.weight": 0, "model.layers.0.mlp.weight": 1}


def save_ranks(rank, world, address):
    full = full_tensors(world)
    api = _dtensor_api()
    mesh = api.DeviceMesh("cpu", list(range(world))) if api else None
    model = {}
    for fqn, t in full.items():
        if not fqn.startswith("model."):
            continue
        name = fqn[len("model."):]
        if fqn in SHARDED and api is not None:
            model[name] = api.distribute_tensor(t, mesh,
                                                [api.Shard(SHARDED[fqn])])
        else:
            model[name] = t
    state = {"model": model,
             "rng": {f"rank{rank}": full[f"rng.rank{rank}"]},
             "step": 1200,
             "run": {"name": "export-test"}}
    return cairn.Checkpointer(address, JOB).save(1, state).state


@pytest.fixture
def saved(cairnd):
    assert harness.run_ranks(save_ranks, 2, cairnd.address) == [
        "COMMITTED"] * 2
    if _dtensor_api() is not None:
        # What export assembles: each sharded tensor in two uneven chunks,
        # one per rank.
        manifest = json.loads(cairnd.cli("show", JOB, "1", "--json").stdout)
        chunks = {t["fqn"]: t["num_chunks"] for t in manifest["tensors"]}
        assert chunks["model.embed.weight"] == 2
        assert chunks["model.layers.0.mlp.weight"] == 2
    return full_tensors(2)


def expect_same(loaded, expected):
    assert sorted(loaded) == sorted(expected)
    for fqn, want in expected.items():
        got = loaded[fqn]
        assert got.dtype == want.dtype, fqn
        assert got.shape == want.shape, fqn
        assert torch.equal(got, want), fqn


def test_export_loads_with_safetensors_and_holds_every_tensor(cairnd, saved,
                                                              tmp_path):
    out = tmp_path / "hf"
    r = cairnd.cli("export", JOB, "latest", "--format", "safetensors",
                   "--out", str(out))
    assert f"{len(saved)} tensors" in r.stdout
    assert "skipped 2 non-tensor (bytes) entries" in r.stdout  # step, run.name
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    assert not list(tmp_path.glob("hf.tmp-*"))
    loaded = safetensors_torch.load_file(str(out / "model.safetensors"))
    expect_same(loaded, saved)
    assert loaded["model.embed.weight"].dtype == torch.bfloat16
    with safetensors_torch.safe_open(str(out / "model.safetensors"),
                                     "pt") as f:
        assert f.metadata()["format"] == "pt"


def test_small_max_shard_size_writes_an_index_as_transformers(cairnd, saved,
                                                              tmp_path):
    out = tmp_path / "sharded"
    cairnd.cli("export", JOB, "1", "--out", str(out), "--max-shard-size",
               "100")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index) == {"metadata", "weight_map"}
    weight_map = index["weight_map"]
    assert sorted(weight_map) == sorted(saved)
    files = sorted(set(weight_map.values()))
    n = len(files)
    assert n > 2
    assert files == [f"model-{i:05d}-of-{n:05d}.safetensors"
                     for i in range(1, n + 1)]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        files + ["model.safetensors.index.json"])
    loaded = {}
    for name in files:
        part = safetensors_torch.load_file(str(out / name))
        assert sorted(part) == sorted(k for k, v in weight_map.items()
                                      if v == name)
        # Within the cap, unless one tensor alone is larger.
        nbytes = sum(t.numel() * t.element_size() for t in part.values())
        assert nbytes <= 100 or len(part) == 1, name
        loaded.update(part)
    expect_same(loaded, saved)
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in saved.values())


def test_filter_keeps_a_prefix_and_a_bad_one_is_an_error(cairnd, saved,
                                                         tmp_path):
    out = tmp_path / "model-only"
    cairnd.cli("export", JOB, "1", "--out", str(out), "--filter", "model.")
    loaded = safetensors_torch.load_file(str(out / "model.safetensors"))
    expect_same(loaded, {k: v for k, v in saved.items()
                         if k.startswith("model.")})
    bad = cairnd.cli("export", JOB, "1", "--out", str(tmp_path / "none"),
                     "--filter", "modle.", check=False)
    assert bad.returncode == 1
    assert "--filter 'modle.' matches no tensor" in bad.stderr
    assert "model.embed.weight" in bad.stderr
    assert not (tmp_path / "none").exists()
    assert not list(tmp_path.glob("none.tmp-*"))
