"""cairn.torch's DCP storage layer with dcp.save / dcp.load and their
default planners, in real rank processes (gloo)
against a real cairnd: a small model + Adam optimizer saved by 4 ranks with
ShardedTensor row sharding, loaded into 1, 2 and 3 ranks with column
sharding (bit-exact); no DCP file anywhere; interop (pickled objects as bytes
entries, bfloat16, bool, an empty shard, a non-contiguous target); the plan
cache on an unchanged second save; checkpoint ids."""

import concurrent.futures
import io
import pathlib
import re

import pytest
import torch

import cairn  # first: installs the torch 1.13 import fix
import cairn.torch as ctorch
from cairn import _dcp
from cairn import errors

import harness

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed._shard import sharded_tensor  # noqa: E402
from torch.distributed._shard.metadata import ShardMetadata  # noqa: E402

JOB = "dcp-job"


# ------------------------------------------------------------ state

def expected_state():
    """The full (unsharded) values every rank computes identically: a small
    model trained 2 Adam steps, plus interop tensors and objects."""
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.ReLU(),
                                torch.nn.Linear(12, 6))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.arange(40, dtype=torch.float32).reshape(5, 8) / 40
    for _ in range(2):
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    full = {}
    for name, p in model.state_dict().items():
        full[f"model.{name}"] = p.detach().clone()
    names = dict(enumerate(n for n, _ in model.named_parameters()))
    for idx, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            full[f"optim.{names[idx]}.{k}"] = v.detach().clone()
    g = torch.Generator().manual_seed(7)
    full["extra.bf16"] = torch.randn(10, 4, generator=g).to(torch.bfloat16)
    full["extra.mask"] = torch.rand(9, 5, generator=g) > 0.5
    full["extra.tiny"] = torch.arange(3 * 4, dtype=torch.int64).reshape(3, 4)
    full["extra.colsaved"] = torch.randn(6, 7, generator=g)
    objects = {
        "optim.param_groups": opt.state_dict()["param_groups"],
        "train.meta": {"epoch": 3, "name": "run-α", "losses": [1.5, 0.25]},
        "train.blob": b"\x00\xffraw",
    }
    return full, objects


def bounds(n, world):
    """Split of n rows into `world` ranges (uneven; empty when n < world)."""
    return [(i * n) // world for i in range(world + 1)]


def shard(full, dim, rank, world):
    """A ShardedTensor of `full` split along `dim` over the group (each rank
    one shard, possibly empty), collectively built."""
    b = bounds(full.shape[dim], world)
    metas = []
    local = None
    for r in range(world):
        offsets = [0] * full.dim()
        sizes = list(full.shape)
        offsets[dim] = b[r]
        sizes[dim] = b[r + 1] - b[r]
        md = ShardMetadata(shard_offsets=offsets, shard_sizes=sizes,
                           placement=f"rank:{r}/cpu")
        metas.append(md)
        if r == rank:
            piece = full.narrow(dim, b[r], sizes[dim]).clone()
            local = sharded_tensor.Shard(piece, md)
    return sharded_tensor.init_from_local_shards([local], list(full.shape))


def save_layout(full, objects, rank, world):
    """The state_dict saved by 4 ranks: 2-D and 1-D tensors row sharded,
    0-dim tensors replicated, "extra.colsaved" column sharded, objects."""
    sd = {}
    for fqn, t in full.items():
        if t.dim() == 0:
            sd[fqn] = t.clone()
        elif fqn == "extra.colsaved":
            sd[fqn] = shard(t, 1, rank, world)
        else:
            sd[fqn] = shard(t, 0, rank, world)
    sd.update(objects)
    return sd


def blank(obj):
    """`obj` with the same structure and every leaf None: what a load
    fills in (current DCP flattens lists and dicts of objects into one
    entry per leaf, so the target must have the same structure)."""
    if isinstance(obj, dict):
        return {k: blank(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [blank(v) for v in obj]
    return None


def load_layout(full, objects, rank, world):
    """The state_dict loaded into: zeros, column sharded (1-D and
    "extra.colsaved" row sharded), 0-dim replicated; objects as None."""
    sd = {}
    for fqn, t in full.items():
        z = torch.zeros_like(t)
        if t.dim() == 0:
            sd[fqn] = z
        elif t.dim() == 1 or fqn == "extra.colsaved":
            sd[fqn] = shard(z, 0, rank, world)
        else:
            sd[fqn] = shard(z, 1, rank, world)
    sd.update({k: blank(v) for k, v in objects.items()})
    return sd


def check_loaded(sd, full, objects, rank):
    """torch.equal of every local piece against the expected values."""
    for fqn, t in full.items():
        got = sd[fqn]
        if isinstance(got, sharded_tensor.ShardedTensor):
            for s in got.local_shards():
                want = t
                for d, (o, n) in enumerate(zip(s.metadata.shard_offsets,
                                               s.metadata.shard_sizes)):
                    want = want.narrow(d, o, n)
                assert s.tensor.dtype == t.dtype, fqn
                assert torch.equal(s.tensor, want), (rank, fqn)
        else:
            assert torch.equal(got, t), (rank, fqn)
    for k, v in objects.items():
        assert sd[k] == v, (rank, k)


# ------------------------------------------------------------ rank bodies

def save_ranks(rank, world, address, step):
    full, objects = expected_state()
    sd = save_layout(full, objects, rank, world)
    writer = ctorch.CairnStorageWriter(address, JOB, step)
    dcp.save(sd, storage_writer=writer)
    return writer.last_info.state, dict(writer.last_stats)


def load_ranks(rank, world, address, step):
    full, objects = expected_state()
    sd = load_layout(full, objects, rank, world)
    reader = ctorch.CairnStorageReader(address, JOB, step)
    dcp.load(sd, storage_reader=reader)
    check_loaded(sd, full, objects, rank)
    return reader.loaded_step


def _stored_files(cairnd):
    return [pathlib.PurePosixPath(k) for k in cairnd.stored_keys()]


# ------------------------------------------------------------ tests

def test_4_ranks_row_sharded_load_into_1_2_3_ranks_column_sharded(cairnd):
    saved = harness.run_ranks(save_ranks, 4, cairnd.address, 100)
    assert [s for s, _ in saved] == ["COMMITTED"] * 4

    # No DCP files: only Cairn's objects (data and MANIFEST) under storage.
    files = _stored_files(cairnd)
    assert files, "nothing stored"
    names = [f.name for f in files]
    assert not any(n == ".metadata" or n.endswith(".distcp") for n in names)
    assert any("MANIFEST" in n for n in names), names
    cairn_object = re.compile(
        JOB + r"/0*100/(MANIFEST|attempt-[0-9a-f]+/data/rank-[0-9]+\.bin)")
    assert all(cairn_object.fullmatch(str(f)) for f in files), files

    ls = cairnd.cli("ls", JOB).stdout
    assert "100" in ls and "COMMITTED" in ls, ls
    verify = cairnd.cli("verify", JOB, "100")
    assert verify.returncode == 0, verify.stdout

    for world in (1, 2, 3):
        assert harness.run_ranks(load_ranks, world, cairnd.address,
                                 "latest") == [100] * world


def save_twice(rank, world, address):
    full, objects = expected_state()
    sd = save_layout(full, objects, rank, world)
    stats = []
    for step in (1, 2):
        writer = ctorch.CairnStorageWriter(address, JOB, checkpoint_id=step)
        dcp.save(sd, storage_writer=writer)
        stats.append((writer.last_info.step, writer.last_info.state,
                      dict(writer.last_stats)))
    # A changed layout (a new tensor) is planned afresh.
    sd["extra.new"] = torch.ones(2, 2)
    writer = ctorch.CairnStorageWriter(address, JOB, 3)
    dcp.save(sd, storage_writer=writer)
    stats.append((3, writer.last_info.state, dict(writer.last_stats)))
    return stats


def test_second_unchanged_save_is_planned_from_cairnds_cache(cairnd):
    per_rank = harness.run_ranks(save_twice, 2, cairnd.address)
    for rank, stats in enumerate(per_rank):
        (s1, st1, first), (s2, st2, second), (_, st3, third) = stats
        assert (s1, st1, s2, st2, st3) == (1, "COMMITTED", 2, "COMMITTED",
                                           "COMMITTED"), rank
        assert not first["plan_from_cache"], rank
        assert not first["sent_fingerprint_only"], rank
        assert second["plan_from_cache"], (rank, second)
        assert second["sent_fingerprint_only"], (rank, second)
        assert not third["plan_from_cache"], (rank, third)


def load_one_step(rank, world, address, checkpoint_id):
    full, objects = expected_state()
    sd = load_layout(full, objects, rank, world)
    reader = ctorch.CairnStorageReader(checkpoint_id=checkpoint_id)
    dcp.load(sd, storage_reader=reader)
    check_loaded(sd, full, objects, rank)
    return reader.loaded_step, reader.checkpoint_id


def test_load_by_cairn_uri_and_without_process_group(cairnd):
    harness.run_ranks(save_ranks, 2, cairnd.address, 5)
    uri = f"cairn://{cairnd.address}/{JOB}/5"
    assert harness.run_ranks(load_one_step, 2, cairnd.address, uri) == [
        (5, uri)] * 2

    # DCP's no_dist in this (process-group-less) process: rank 0 of 1, plain
    # tensors as targets, the writer's step from reset(checkpoint_id).
    full, objects = expected_state()
    sd = {k: torch.zeros_like(v) for k, v in full.items()}
    sd.update({k: blank(v) for k, v in objects.items()})
    reader = ctorch.CairnStorageReader(cairnd.address, JOB)
    dcp.load(sd, storage_reader=reader, no_dist=True)
    assert reader.loaded_step == 5
    for k, v in full.items():
        assert torch.equal(sd[k], v), k
    assert {k: sd[k] for k in objects} == objects

    writer = ctorch.CairnStorageWriter(cairnd.address, JOB)
    writer.reset(6)
    plain = {k: v for k, v in full.items()}
    plain["obj"] = {"a": 1}
    dcp.save(plain, storage_writer=writer, no_dist=True)
    assert writer.last_info.world_size == 1
    back = {k: torch.zeros_like(v) for k, v in full.items()}
    back["obj"] = {"a": None}
    dcp.load(back, storage_reader=ctorch.CairnStorageReader(
        checkpoint_id=f"cairn://{cairnd.address}/{JOB}/latest"), no_dist=True)
    assert back["obj"] == {"a": 1}
    assert all(torch.equal(back[k], v) for k, v in full.items())


def test_checkpoint_ids():
    w, r = ctorch.CairnStorageWriter, ctorch.CairnStorageReader
    for good in (0, 7, "12", "cairn://h:1/job/3", "cairn://h:1/a/b/9"):
        assert w.validate_checkpoint_id(good), good
        assert r.validate_checkpoint_id(good), good
    assert r.validate_checkpoint_id("latest")
    assert r.validate_checkpoint_id("cairn://h:1/job/latest")
    for bad in ("latest", "cairn://h:1/job/latest", -1, True, None, 1.5,
                "/tmp/ckpt", pathlib.Path("/tmp/x"), "cairn://h:1/3",
                "cairn:/h/j/1", "12a"):
        assert not w.validate_checkpoint_id(bad), bad
    for bad in (-1, "/tmp/ckpt", "cairn://h:1/job/next"):
        assert not r.validate_checkpoint_id(bad), bad
    assert _dcp.parse_checkpoint_id("cairn://host:77/team/llm/12", False) == (
        "host:77", "team/llm", 12)
    with pytest.raises(errors.InvalidArgumentError, match="/tmp/ckpt"):
        w(checkpoint_id="/tmp/ckpt")
    writer = w("c:1", "j", 4)
    assert writer.checkpoint_id == "cairn://c:1/j/4"
    writer.reset("cairn://d:2/k/5")
    assert (writer.coordinator, writer.job, writer.step) == ("d:2", "k", 5)
    assert writer.storage_meta().checkpoint_id == "cairn://d:2/k/5"
    with pytest.raises(errors.InvalidArgumentError, match="no step"):
        w("c:1", "j").init(True)
    reader = r("c:1", "j")
    assert reader.step == "latest"
    reader.reset(9)
    assert reader.step == 9


def test_defaults_from_environment(monkeypatch):
    monkeypatch.setenv("CAIRN_COORDINATOR", "envhost:9")
    monkeypatch.setenv("CAIRN_JOB", "envjob")
    writer = ctorch.CairnStorageWriter(step=3)
    assert writer.checkpoint_id == "cairn://envhost:9/envjob/3"
    monkeypatch.delenv("CAIRN_JOB")
    with pytest.raises(errors.InvalidArgumentError, match="CAIRN_JOB"):
        ctorch.CairnStorageReader(step=1).read_metadata()


def test_current_dcp_call_sequence(cairnd):
    """The calls current torch.distributed.checkpoint makes (reset with a
    checkpoint_id, set_up_storage_writer/reader with keyword extras,
    storage_meta), driven here with 1.13's default planners in one process."""
    from torch.distributed.checkpoint.default_planner import (  # pylint: disable=import-outside-toplevel
        DefaultLoadPlanner, DefaultSavePlanner)
    full, objects = expected_state()
    full["extra.transposed"] = torch.arange(12.0).reshape(3, 4).t()
    assert not full["extra.transposed"].is_contiguous()
    sd = dict(full)
    sd.update(objects)
    writer = ctorch.CairnStorageWriter()
    uri = f"cairn://{cairnd.address}/{JOB}/8"
    assert writer.validate_checkpoint_id(uri)
    writer.reset(uri)
    writer.set_up_storage_writer(True, rank=0, use_collectives=False)
    assert writer.storage_meta().checkpoint_id == uri
    planner = DefaultSavePlanner()
    planner.set_up_planner(sd, writer.storage_meta(), True)
    # The planner's entries: the tensors, and one per leaf of the objects
    # (DCP flattens nested dicts and lists).
    flat = sorted(planner.state_dict)
    n_objects = len(flat) - len(full)
    assert n_objects >= len(objects)
    local = writer.prepare_local_plan(planner.create_local_plan())
    plans, metadata = planner.create_global_plan([local])
    plans = writer.prepare_global_plan(plans)
    results = writer.write_data(planner.finish_plan(plans[0]), planner).wait()
    assert sorted(r.index.fqn for r in results) == flat
    assert all(r.storage_data == 8 for r in results)
    tensor_bytes = {r.index.fqn: r.size_in_bytes for r in results}
    assert tensor_bytes["model.0.weight"] == 12 * 8 * 4
    writer.finish(metadata, [results])
    assert writer.last_info.state == "COMMITTED"
    assert writer.last_info.num_tensors == len(full)
    # + the saving planner's planner_data (one hidden bytes entry).
    assert writer.last_info.num_bytes_entries == n_objects + 1

    reader = ctorch.CairnStorageReader()
    reader.reset(f"cairn://{cairnd.address}/{JOB}/latest")
    md = reader.read_metadata()
    assert reader.step == 8
    stored = md.state_dict_metadata
    assert sorted(stored) == flat
    assert stored["model.0.weight"].size == torch.Size([12, 8])
    assert stored["extra.bf16"].properties.dtype == torch.bfloat16
    assert [(list(c.offsets), list(c.sizes))
            for c in stored["model.0.weight"].chunks] == [([0, 0], [12, 8])]
    reader.set_up_storage_reader(md, True, rank=0, use_collectives=False)
    back = {k: torch.zeros_like(v) for k, v in full.items()}
    back.update({k: blank(v) for k, v in objects.items()})
    lp = DefaultLoadPlanner()
    lp.set_up_planner(back, md, True)
    local = reader.prepare_local_plan(lp.create_local_plan())
    plans = reader.prepare_global_plan(lp.create_global_plan([local]))
    reader.read_data(lp.finish_plan(plans[0]), lp).wait()
    assert reader.loaded_step == 8
    for k, v in full.items():
        assert torch.equal(back[k], v), k
    assert {k: back[k] for k in objects} == objects
    # reset() forgets the resolved step: the next load resolves latest again.
    reader.reset()
    assert reader.step == "latest"


def test_checkpoint_saved_by_the_binding_loads_through_the_reader(cairnd):
    """Interop: a checkpoint written with cairn._cairn directly (two ranks'
    row blocks, a torch.save'd bytes entry) is a DCP checkpoint too."""
    w = torch.arange(6 * 5, dtype=torch.float32).reshape(6, 5)
    blob = io.BytesIO()
    torch.save({"epoch": 4}, blob)
    ckpts = [cairn._cairn.Checkpointer(cairnd.address, JOB, r, 2)
             for r in range(2)]
    states = []
    for r in range(2):
        st = cairn._cairn.StateDict()
        part = w[3 * r:3 * r + 3]
        st.add_chunks("w", "float32", [6, 5],
                      [([3 * r, 0], [3, 5], part.data_ptr(),
                        part.numel() * 4)])
        if r == 0:
            st.add_bytes("meta", blob.getvalue())
        states.append(st)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        infos = list(pool.map(lambda r: ckpts[r].save(40, states[r]),
                              range(2)))
    assert [i.state for i in infos] == ["COMMITTED"] * 2

    sd = {"w": torch.zeros(6, 5), "meta": None}
    reader = ctorch.CairnStorageReader(cairnd.address, JOB)
    dcp.load(sd, storage_reader=reader, no_dist=True)
    assert torch.equal(sd["w"], w)
    assert sd["meta"] == {"epoch": 4}
    assert [(list(c.offsets), list(c.sizes)) for c in
            reader.read_metadata().state_dict_metadata["w"].chunks] == [
                ([0, 0], [3, 5]), ([3, 0], [3, 5])]


def save_replicated(rank, world, address):
    """DDP-style: every value replicated on every rank."""
    full, objects = expected_state()
    sd = dict(full)
    sd.update(objects)
    writer = ctorch.CairnStorageWriter(address, JOB, 50)
    dcp.save(sd, storage_writer=writer)
    back = {k: torch.zeros_like(v) for k, v in full.items()}
    back.update({k: blank(v) for k, v in objects.items()})
    dcp.load(back, storage_reader=ctorch.CairnStorageReader(address, JOB))
    check_loaded(back, full, objects, rank)
    entries = len(ctorch.CairnStorageReader(address, JOB, 50)
                  .read_metadata().state_dict_metadata)
    return writer.last_stats["items"], entries


def test_replicated_state_written_once(cairnd):
    """Every value on every rank: DCP's planner spreads the writes over the
    ranks (each entry written by one rank; 1.13 gave them all to the
    coordinator), and the checkpoint holds each entry once."""
    per_rank = harness.run_ranks(save_replicated, 2, cairnd.address)
    items = [i for i, _ in per_rank]
    entries = per_rank[0][1]
    # Rank 0 also writes the planner's planner_data (hidden from DCP).
    assert sum(items) == entries + 1 and items[0] > 0, per_rank
