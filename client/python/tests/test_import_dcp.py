"""cairn.torch.import_dcp: checkpoints written by torch's own
FileSystemWriter (dcp.save: .metadata and __R_N.distcp files) imported into
a real cairnd from this single process, then loaded back through Cairn and
compared element by element and object by object with what was saved:

- one process (no_dist): a trained model with Adam, bfloat16, bool, float16,
  int8, a 0-dim and an empty tensor, a transposed (non-contiguous) tensor,
  and objects (param_groups, a dict, bytes, an int step), loaded through
  CairnStorageReader and cairn.Checkpointer;
- 4 gloo ranks: an FSDP2 model with its Adam state (uneven DTensor shards,
  an empty one), DTensors sharded by rows and by columns, replicated and
  per-rank tensors and objects, saved four ways (collective .metadata or
  per-rank __R.metadata of use_collectives=False; torch.save archives or
  safetensors blobs), each loaded into 3 ranks sharded another way through
  DCP (and trained on: test_fsdp2's check) and into 1 process whole through
  the direct API; even DTensor shards (none empty) saved as safetensors,
  collective and per-rank, loaded into 3 ranks and 1 process;
- safetensors directories: HuggingFaceStorageWriter's output (two files and
  model.safetensors.index.json), and shard files with DCP_SHARDING_INFO
  (save_distributed), loaded back whole through both APIs; a file the index
  names lost, overlapping shards, a lost middle shard, a shard cut short;

and every error: a path that is no DCP checkpoint, a missing, truncated or
damaged .distcp file, a per-rank metadata file missing or truncated, ranks'
metadata that disagree (shape, dtype, overlapping chunks, an object's
bytes), a safetensors shard missing, truncated or disagreeing with the
metadata, a step Cairn already has, objects or metadata that weights-only
loading refuses, an unsupported dtype, bad arguments; the CLI entry
`python -m cairn.torch import-dcp`.
"""

import dataclasses
import io
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import threading
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh

import cairn
import cairn.torch as ctorch
from cairn import _dcp

import harness
import test_fsdp2
from test_checkpointer_dtensor import _dtensor_api
from test_dcp import blank, expected_state

pytestmark = pytest.mark.skipif(
    _dtensor_api() is None,
    reason=f"torch {torch.__version__} has no DTensor")

JOB = "imported"

# dcp.save without a process group warns that it assumes one process.
warnings.filterwarnings("ignore", message=".*torch.distributed is disabled")


@dataclasses.dataclass
class Custom:
    """An object class weights-only loading does not build unless allowed."""
    value: int


# ------------------------------------------------------------ one process

def single_state():
    """(tensors, objects) saved by one process: test_dcp's trained model,
    Adam state and interop values, plus more dtypes and layouts."""
    full, objects = expected_state()
    g = torch.Generator().manual_seed(52)
    full["extra.half"] = torch.randn(3, 5, generator=g).to(torch.float16)
    full["extra.int8"] = torch.randint(-128, 127, (11,), dtype=torch.int8,
                                       generator=g)
    full["extra.scalar"] = torch.tensor(2.5, dtype=torch.float64)
    full["extra.empty"] = torch.empty(0, 4)
    # Transposed: FileSystemWriter saves it with its strides, so it is read
    # (and made contiguous), not mapped.
    full["extra.transposed"] = torch.randn(4, 6, generator=g).t()
    objects["step"] = 1200
    objects["sched"] = {"last_epoch": 3, "_last_lr": [0.01, 0.005]}
    return full, objects


def save_single(path):
    full, objects = single_state()
    sd = dict(full)
    sd.update(objects)
    dcp.save(sd, storage_writer=FileSystemWriter(str(path)), no_dist=True)
    return full, objects


@pytest.fixture
def single_dir(tmp_path):
    path = tmp_path / "dcp-single"
    save_single(path)
    return path


def test_single_process_checkpoint_loads_back_exactly(cairnd, single_dir):
    full, objects = single_state()
    r = ctorch.import_dcp(single_dir, JOB, 7, coordinator=cairnd.address)
    assert (r.info.job, r.info.step, r.info.state, r.info.world_size) == (
        JOB, 7, "COMMITTED", 1)
    assert r.tensors == len(full)
    # Every object, and DCP's planner_data (a hidden entry).
    md = pickle.loads((single_dir / ".metadata").read_bytes())
    n_objects = sum(type(e).__name__ == "BytesStorageMetadata"
                    for e in md.state_dict_metadata.values())
    assert r.bytes_entries == n_objects > 5
    assert r.info.num_bytes_entries == n_objects + 1
    nbytes = {k: v.numel() * v.element_size() for k, v in full.items()}
    assert r.read_bytes == nbytes["extra.transposed"]
    assert r.mapped_bytes == sum(nbytes.values()) - r.read_bytes

    summary = cairn.Checkpointer(cairnd.address, JOB).describe(7)
    described = {t.fqn: (t.dtype, list(t.shape)) for t in summary.tensors}
    assert described == {k: (str(v.dtype).rsplit(".", 1)[-1], list(v.shape))
                         for k, v in full.items()}
    assert described["extra.bf16"][0] == "bfloat16"

    # Through DCP (the same structure, zeros and blanks) ...
    sd = {k: torch.zeros_like(v) for k, v in full.items()}
    sd.update({k: blank(v) for k, v in objects.items()})
    dcp.load(sd, storage_reader=ctorch.CairnStorageReader(
        checkpoint_id=f"cairn://{cairnd.address}/{JOB}/7"), no_dist=True)
    for k, v in full.items():
        assert sd[k].dtype == v.dtype and torch.equal(sd[k], v), k
    assert {k: sd[k] for k in objects} == objects

    # ... and through the direct API, which reads the same entries.
    direct = {k: torch.zeros_like(v) for k, v in full.items()}
    direct.update({"step": None, "sched": {"last_epoch": None,
                                           "_last_lr": None},
                   "train": {"meta.epoch": None}})
    assert cairn.Checkpointer(cairnd.address, JOB).load(direct, 7) == 7
    for k, v in full.items():
        assert torch.equal(direct[k], v), k
    assert direct["step"] == 1200
    assert direct["sched"] == objects["sched"]
    assert direct["train"]["meta.epoch"] == 3

    # DCP's planner_data came along: the nested structure is rebuilt.
    from torch.distributed.checkpoint.state_dict_loader import \
        _load_state_dict_from_keys  # pylint: disable=import-outside-toplevel
    nested = _load_state_dict_from_keys(
        {"sched", "train.meta"}, storage_reader=ctorch.CairnStorageReader(
            cairnd.address, JOB, 7))
    assert nested == {"sched": objects["sched"],
                      "train.meta": objects["train.meta"]}


def rss_anon_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


@pytest.mark.parametrize("fmt", ["TORCH_SAVE", "SAFETENSORS"])
def test_chunks_are_mapped_not_read_into_memory(cairnd, tmp_path, fmt):
    # 192 MiB of tensors; the import's own (anonymous) memory stays far
    # below that: the Cairn save reads the chunks from the mapped files
    # (torch.save archives, or safetensors blobs).
    _needs("collective" if fmt == "TORCH_SAVE" else "safetensors")
    options = {}
    if fmt != "TORCH_SAVE":
        # pylint: disable=import-outside-toplevel
        from torch.distributed.checkpoint.filesystem import \
            SerializationFormat
        options["serialization_format"] = SerializationFormat[fmt]
    big = {f"w{i}": torch.full((1024, 16384), float(i)) for i in range(3)}
    dcp.save(big, storage_writer=FileSystemWriter(str(tmp_path / "big"),
                                                  **options), no_dist=True)
    base = rss_anon_kib()
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.wait(0.005):
            peak[0] = max(peak[0], rss_anon_kib())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        r = ctorch.import_dcp(tmp_path / "big", JOB, 1,
                              coordinator=cairnd.address)
    finally:
        done.set()
        sampler.join()
    assert r.mapped_bytes == 3 * 1024 * 16384 * 4 and r.read_bytes == 0
    # (libcairn's staging buffers: about 40 MiB, 192 MiB or 512 MiB saved.)
    grown_mib = (peak[0] - base) / 1024
    assert grown_mib < 96, f"anonymous memory grew {grown_mib:.0f} MiB"
    back = {k: torch.zeros_like(v) for k, v in big.items()}
    cairn.Checkpointer(cairnd.address, JOB).load(back, 1)
    assert all(torch.equal(back[k], v) for k, v in big.items())


# ------------------------------------------------------------ several ranks

EXTRA_FULL = {
    # fqn: (full value, placement dim saved, placement dim loaded); None is
    # Replicate.
    "extra.embed": (torch.arange(7 * 6, dtype=torch.float32).reshape(7, 6)
                    .to(torch.bfloat16) / 8, 0, 1),
    # 9 columns over 4 ranks: 3, 3, 3 and an empty shard.
    "extra.proj": (torch.linspace(-1, 1, 5 * 9).reshape(5, 9), 1, 0),
    "extra.mask": (torch.arange(10) % 3 == 0, 0, None),
    "extra.bias": (torch.arange(5, dtype=torch.int64) * 11, None, 0),
}
# Shards of equal size on 4 ranks (none empty), loaded into 3 ranks sharded
# another way.
EVEN_FULL = {
    "even.rows": (torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6) / 3,
                  0, 1),
    "even.cols": (torch.arange(4 * 8, dtype=torch.float32).reshape(4, 8)
                  .to(torch.bfloat16), 1, 0),
    "even.ids": (torch.arange(16, dtype=torch.int32) * 7, 0, None),
    "even.flags": (torch.arange(12) % 2 == 0, None, 0),
}
RANK_OBJECTS = {"step": 1200,
                "sched": {"last_epoch": 3, "_last_lr": [0.01, 0.005]},
                "run": {"name": "fsdp2-run", "seed": 52}}

# The directories every rank saves the same state dict into: name:
# (FileSystemWriter's serialization_format, dcp.save's use_collectives).
# use_collectives=False: each rank writes __R.metadata of its own items
# (no .metadata), replicated tensors and objects once per rank.
# SAFETENSORS: each __R_N.distcp holds the objects, then one safetensors
# blob of the tensor chunks.
VARIANTS = {
    "collective": ("TORCH_SAVE", True),
    "per-rank": ("TORCH_SAVE", False),
    "safetensors": ("SAFETENSORS", True),
    "safetensors-per-rank": ("SAFETENSORS", False),
}


def _torch_writes(name):
    """Whether this torch (and its safetensors package) saves VARIANTS[name]
    (use_collectives and serialization_format are recent)."""
    # pylint: disable=import-outside-toplevel
    import importlib.util
    import inspect
    import torch.distributed.checkpoint.filesystem as fs
    fmt, collectives = VARIANTS[name]
    if not collectives and "use_collectives" not in inspect.signature(
            dcp.save).parameters:
        return False
    return fmt == "TORCH_SAVE" or (
        hasattr(fs, "SerializationFormat")
        and importlib.util.find_spec("safetensors") is not None)


def _needs(name):
    if not _torch_writes(name):
        pytest.skip(f"torch {torch.__version__} does not save {name} "
                    f"checkpoints")


def rng_of(rank):
    return torch.arange(16, dtype=torch.uint8) * (rank + 1)


def distribute(table, mesh, which, blank_values):
    api = _dtensor_api()
    out = {}
    for fqn, (full, saved, loaded) in table.items():
        dim = saved if which == "saved" else loaded
        value = torch.zeros_like(full) if blank_values else full
        placement = api.Replicate() if dim is None else api.Shard(dim)
        out[fqn.split(".", 1)[1]] = api.distribute_tensor(value, mesh,
                                                          [placement])
    return out


def extras(mesh, rank, world, which, blank_values):
    out = distribute(EXTRA_FULL, mesh, which, blank_values)
    rng = {f"rank{r}": (torch.zeros(16, dtype=torch.uint8) if blank_values
                        else rng_of(r))
           for r in (range(world) if blank_values else [rank])}
    return out, rng


def save_dcp_ranks(rank, world, root):
    """4 ranks: an FSDP2 model trained 2 steps and its Adam state, the
    extra DTensors, per-rank rng tensors and objects, saved with
    FileSystemWriter into root/<variant> for each of VARIANTS; and the even
    DTensors into root/even-<variant>. Rank 0 returns test_fsdp2's expected
    full states."""
    # pylint: disable=import-outside-toplevel
    import torch.distributed.checkpoint.filesystem as fs
    mesh = init_device_mesh("cpu", (world,))
    model = test_fsdp2.shard(test_fsdp2.make_model(0), mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    test_fsdp2.train(model, opt, 2)
    msd, osd = get_state_dict(model, opt)
    extra, rng = extras(mesh, rank, world, "saved", False)
    even = distribute(EVEN_FULL, mesh, "saved", False)
    for name, (fmt, collectives) in VARIANTS.items():
        if not _torch_writes(name):
            continue
        options = ({} if fmt == "TORCH_SAVE" else
                   {"serialization_format": fs.SerializationFormat[fmt]})
        for prefix, sd in (("", {"model": msd, "optim": osd, "extra": extra,
                                 "rng": rng, **RANK_OBJECTS}),
                           ("even-", {"even": even, "step": 7})):
            dcp.save(dict(sd), storage_writer=FileSystemWriter(
                os.path.join(root, prefix + name), **options),
                **({} if collectives else {"use_collectives": False}))
    before = test_fsdp2.full_state(model, opt)
    test_fsdp2.train(model, opt, 1)
    after = test_fsdp2.full_state(model, opt)
    if rank != 0:
        return None
    buf = io.BytesIO()
    torch.save((before, after), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def rank_checkpoints(tmp_path_factory):
    """(root, expected): the directories save_dcp_ranks wrote (one run of 4
    ranks for the module; a test that damages one copies it first)."""
    root = tmp_path_factory.mktemp("dcp-4-ranks")
    expected = harness.run_ranks(save_dcp_ranks, 4, str(root))[0]
    return root, expected


def copy_of(rank_checkpoints, name, tmp_path):
    _needs(name)
    path = tmp_path / name
    shutil.copytree(rank_checkpoints[0] / name, path)
    return path


def load_cairn_ranks(rank, world, address, step, expected):
    """Another world size: test_fsdp2's check of the model and optimizer
    (exact after the load, and one more step as on the saving ranks), then
    the extras sharded another way, all rng tensors and the objects."""
    bad = test_fsdp2.load_ranks(rank, world, address, step, "dcp", (world,),
                                expected)
    mesh = init_device_mesh("cpu", (world,))
    extra, rng = extras(mesh, rank, world=4, which="loaded",
                        blank_values=True)
    sd = {"extra": extra, "rng": rng,
          **{k: blank(v) for k, v in RANK_OBJECTS.items()}}
    dcp.load(sd, storage_reader=ctorch.CairnStorageReader(
        checkpoint_id=f"cairn://{address}/{test_fsdp2.JOB}/{step}"))
    for fqn, (full, _, _) in EXTRA_FULL.items():
        got = sd["extra"][fqn.split(".", 1)[1]].full_tensor()
        if got.dtype != full.dtype or not torch.equal(got, full):
            bad.append(f"{fqn} on rank {rank}")
    for r in range(4):
        if not torch.equal(sd["rng"][f"rank{r}"], rng_of(r)):
            bad.append(f"rng.rank{r} on rank {rank}")
    for k, v in RANK_OBJECTS.items():
        if sd[k] != v:
            bad.append(f"{k} = {sd[k]!r} on rank {rank}")
    return bad


def files_of(path):
    return sorted(p.name for p in pathlib.Path(path).iterdir())


def expected_files(name):
    data = [f"__{r}_0.distcp" for r in range(4)]
    if VARIANTS[name][1]:
        return [".metadata"] + data
    return sorted(data + [f"__{r}.metadata" for r in range(4)])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_dtensor_shards_of_4_ranks_load_into_3_ranks_and_1_process(
        cairnd, rank_checkpoints, name):
    _needs(name)
    root, expected = rank_checkpoints
    path = root / name
    assert files_of(path) == expected_files(name)

    step = 30
    r = ctorch.import_dcp(path, test_fsdp2.JOB, step,
                          coordinator=cairnd.address)
    assert (r.info.state, r.info.world_size) == ("COMMITTED", 1)
    # Every chunk was mapped from its file (safetensors blobs as torch.save
    # archives), none read into memory.
    assert r.read_bytes == 0 and r.mapped_bytes > 0
    summary = cairn.Checkpointer(cairnd.address,
                                 test_fsdp2.JOB).describe(step)
    chunks = {t.fqn: t.chunks for t in summary.tensors}
    # Every rank's shard is a chunk of one tensor, at its box (an empty
    # shard holds nothing to store), whichever rank's metadata listed it.
    assert chunks["extra.proj"] == [([0, 0], [5, 3]), ([0, 3], [5, 3]),
                                    ([0, 6], [5, 3])]
    assert chunks["extra.embed"] == [([0, 0], [2, 6]), ([2, 0], [2, 6]),
                                     ([4, 0], [2, 6]), ([6, 0], [1, 6])]
    # Replicated: stored once, though each rank's metadata lists it.
    assert chunks["extra.bias"] == [([0], [5])]
    assert chunks["optim.state.0.weight.step"] == [([], [])]
    assert r.chunks == sum(len(c) for c in chunks.values())
    md = pickle.loads((root / "collective" / ".metadata").read_bytes())
    assert r.bytes_entries == sum(
        type(e).__name__ == "BytesStorageMetadata"
        for e in md.state_dict_metadata.values())

    per_rank = harness.run_ranks(load_cairn_ranks, 3, cairnd.address, step,
                                 expected)
    assert per_rank == [[]] * 3, per_rank

    # One process, whole tensors, through the direct API.
    before, _ = torch.load(io.BytesIO(expected), weights_only=True)
    tensors = {t.fqn: torch.zeros(t.shape, dtype=getattr(torch, t.dtype))
               for t in summary.tensors}
    objects = {k: blank(v) for k, v in RANK_OBJECTS.items()}
    state = {**tensors, **objects}
    cairn.Checkpointer(cairnd.address, test_fsdp2.JOB).load(state, step)
    for k, v in before.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(state[k], v), k
    assert sum(isinstance(v, torch.Tensor) for v in before.values()) > 10
    for fqn, (full, _, _) in EXTRA_FULL.items():
        assert state[fqn].dtype == full.dtype, fqn
        assert torch.equal(state[fqn], full), fqn
    for rank in range(4):
        assert torch.equal(state[f"rng.rank{rank}"], rng_of(rank))
    assert {k: state[k] for k in RANK_OBJECTS} == RANK_OBJECTS


def load_even_ranks(rank, world, address, step):
    mesh = init_device_mesh("cpu", (world,))
    sd = {"even": distribute(EVEN_FULL, mesh, "loaded", True), "step": None}
    dcp.load(sd, storage_reader=ctorch.CairnStorageReader(
        checkpoint_id=f"cairn://{address}/{JOB}/{step}"))
    bad = [fqn for fqn, (full, _, _) in EVEN_FULL.items()
           if not torch.equal(sd["even"][fqn.split(".", 1)[1]].full_tensor(),
                              full)]
    return bad + ([] if sd["step"] == 7 else [f"step = {sd['step']!r}"])


@pytest.mark.parametrize("name", ["safetensors", "safetensors-per-rank"])
def test_even_shards_of_4_ranks_load_into_3_ranks_and_1_process(
        cairnd, rank_checkpoints, name):
    _needs(name)
    path = rank_checkpoints[0] / ("even-" + name)
    assert files_of(path) == expected_files(name)
    r = ctorch.import_dcp(path, JOB, 40, coordinator=cairnd.address)
    assert (r.tensors, r.chunks, r.bytes_entries, r.read_bytes) == (
        4, 4 + 4 + 4 + 1, 1, 0)
    chunks = {t.fqn: t.chunks for t in cairn.Checkpointer(
        cairnd.address, JOB).describe(40).tensors}
    assert chunks["even.rows"] == [([2 * i, 0], [2, 6]) for i in range(4)]
    assert chunks["even.cols"] == [([0, 2 * i], [4, 2]) for i in range(4)]
    assert chunks["even.flags"] == [([0], [12])]

    assert harness.run_ranks(load_even_ranks, 3, cairnd.address, 40) == \
        [[]] * 3
    state = {fqn: torch.zeros_like(full)
             for fqn, (full, _, _) in EVEN_FULL.items()}
    state["step"] = None
    cairn.Checkpointer(cairnd.address, JOB).load(state, 40)
    for fqn, (full, _, _) in EVEN_FULL.items():
        assert state[fqn].dtype == full.dtype and torch.equal(state[fqn],
                                                              full), fqn
    assert state["step"] == 7


# ------------------------------------------------------------ errors

def _no_record(cairnd, step):
    return all(i.step != step for i in cairn.Checkpointer(
        cairnd.address, JOB).list(True))


def test_a_path_that_is_not_a_dcp_checkpoint_is_named(cairnd, tmp_path):
    c = cairnd.address
    with pytest.raises(cairn.NotFoundError,
                       match=f"{tmp_path / 'nothing'} does not exist"):
        ctorch.import_dcp(tmp_path / "nothing", JOB, 1, coordinator=c)
    (tmp_path / "file").write_text("x")
    with pytest.raises(cairn.InvalidArgumentError,
                       match=f"{tmp_path / 'file'} is not a DCP checkpoint: "
                             f"not a directory"):
        ctorch.import_dcp(tmp_path / "file", JOB, 1, coordinator=c)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.bin").write_bytes(b"\0" * 8)
    with pytest.raises(cairn.InvalidArgumentError,
                       match=f"{other} is not a DCP checkpoint: it has no "
                             r"\.metadata file nor \*\.safetensors files "
                             r"\(it holds 1 entries: model\.bin\)"):
        ctorch.import_dcp(other, JOB, 1, coordinator=c)
    (other / "model.safetensors").write_bytes(b"\0" * 8)
    with pytest.raises(cairn.DataLossError,
                       match=f"{other / 'model.safetensors'} is not a "
                             r"safetensors file"):
        ctorch.import_dcp(other, JOB, 1, coordinator=c)
    (other / "model.safetensors").unlink()
    (other / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(cairn.InvalidArgumentError,
                       match=f"{other / '.metadata'} is not a DCP "
                             f"checkpoint's metadata"):
        ctorch.import_dcp(other, JOB, 1, coordinator=c)
    (other / ".metadata").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(cairn.InvalidArgumentError,
                       match="it holds a dict, not the state_dict_metadata"):
        ctorch.import_dcp(other, JOB, 1, coordinator=c)
    # Per-rank metadata (dcp.save(..., use_collectives=False)) that is
    # not DCP's.
    (other / ".metadata").unlink()
    (other / "__0.metadata").write_bytes(b"")
    with pytest.raises(cairn.DataLossError,
                       match=f"{other / '__0.metadata'} \\(rank 0's metadata"
                             r", saved with use_collectives=False\) is "
                             r"truncated or damaged: it does not unpickle"):
        ctorch.import_dcp(other, JOB, 1, coordinator=c)
    assert _no_record(cairnd, 1)


def test_metadata_is_unpickled_weights_only(cairnd, tmp_path, single_dir):
    # A .metadata naming a class outside DCP's metadata is refused unread
    # (torch's own FileSystemReader would unpickle it: code execution).
    evil = tmp_path / "evil"
    shutil.copytree(single_dir, evil)
    md = pickle.loads((evil / ".metadata").read_bytes())
    md.storage_meta.modules = [Custom(1)]  # any foreign class
    (evil / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(cairn.InvalidArgumentError,
                       match=r"\.metadata: it holds a test_import_dcp\.Custom"
                             r", which is not part of DCP's metadata: not "
                             r"loaded weights-only \(pass weights_only=False"):
        ctorch.import_dcp(evil, JOB, 2, coordinator=cairnd.address)
    assert _no_record(cairnd, 2)
    r = ctorch.import_dcp(evil, JOB, 2, coordinator=cairnd.address,
                          weights_only=False)
    assert r.info.state == "COMMITTED"


def test_objects_weights_only_loading_refuses_fail_the_import(cairnd,
                                                              tmp_path):
    path = tmp_path / "custom"
    dcp.save({"w": torch.ones(2), "obj": Custom(5)},
             storage_writer=FileSystemWriter(str(path)), no_dist=True)
    with pytest.raises(cairn.InvalidArgumentError,
                       match=f"{path}: entry 'obj': Unsupported global: "
                             "GLOBAL test_import_dcp.Custom .*add_safe_globals"
                             r".*\(load with weights_only=False"):
        ctorch.import_dcp(path, JOB, 3, coordinator=cairnd.address)
    assert _no_record(cairnd, 3)
    # Allowed by the user, the object imports and loads weights-only.
    with torch.serialization.safe_globals([Custom]):
        ctorch.import_dcp(path, JOB, 3, coordinator=cairnd.address)
        sd = {"w": torch.zeros(2), "obj": None}
        dcp.load(sd, storage_reader=ctorch.CairnStorageReader(
            cairnd.address, JOB, 3), no_dist=True)
    assert sd["obj"] == Custom(5)
    # Or trusted wholesale: imported unchecked; a weights-only load refuses
    # it then, as it would have refused the import.
    ctorch.import_dcp(path, JOB, 4, coordinator=cairnd.address,
                      weights_only=False)
    ckpt = cairn.Checkpointer(cairnd.address, JOB)
    with pytest.raises(cairn.InvalidArgumentError, match="obj.*Custom"):
        ckpt.load({"w": torch.zeros(2), "obj": None}, 4)
    sd = {"w": torch.zeros(2), "obj": None}
    ckpt.load(sd, 4, weights_only=False)
    assert sd["obj"] == Custom(5) and torch.equal(sd["w"], torch.ones(2))


# safetensors dtype names: what the tests rebuild a blob from.
_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
              "BOOL": torch.bool}


def _per_item_checkpoint(path):
    """One file per item (single_file_per_rank=False): a file to lose is
    one fqn's."""
    full = {"a": torch.arange(64, dtype=torch.float32),
            "b": torch.arange(64, dtype=torch.int64) * 3}
    dcp.save(dict(full), storage_writer=FileSystemWriter(
        str(path), single_file_per_rank=False), no_dist=True)
    md = pickle.loads((path / ".metadata").read_bytes())
    file_of = {i.fqn: info.relative_path
               for i, info in md.storage_data.items()}
    return full, file_of


def test_a_missing_truncated_or_damaged_distcp_file_is_data_loss(cairnd,
                                                                 tmp_path):
    c = cairnd.address
    path = tmp_path / "items"
    _, file_of = _per_item_checkpoint(path)
    pristine = tmp_path / "pristine"
    shutil.copytree(path, pristine)
    b_file = path / file_of["b"]

    b_file.unlink()
    with pytest.raises(cairn.DataLossError,
                       match=f"{b_file} is missing: the metadata places 'b' "
                             r"chunk at offsets \[0\] sizes \[64\] in it"):
        ctorch.import_dcp(path, JOB, 5, coordinator=c)

    data = (pristine / file_of["b"]).read_bytes()
    b_file.write_bytes(data[:len(data) - 100])
    with pytest.raises(cairn.DataLossError,
                       match=f"{b_file} is truncated: it has {len(data) - 100}"
                             f" bytes, the metadata places 'b' chunk at "
                             rf"offsets \[0\] sizes \[64\] at bytes \[0, "
                             rf"{len(data)}\)"):
        ctorch.import_dcp(path, JOB, 5, coordinator=c)

    # One flipped bit in the tensor's bytes: the archive's CRC-32 says so.
    damaged = bytearray(data)
    at = damaged.find((17 * 3).to_bytes(8, "little"))
    assert at > 0
    damaged[at] ^= 0x10
    b_file.write_bytes(bytes(damaged))
    with pytest.raises(cairn.DataLossError,
                       match=f"{b_file}: 'b' chunk .* fails its CRC-32"):
        ctorch.import_dcp(path, JOB, 5, coordinator=c)
    # verify=False skips that read, and the damage goes along.
    ctorch.import_dcp(path, JOB, 6, coordinator=c, verify=False)
    back = {"b": torch.zeros(64, dtype=torch.int64)}
    cairn.Checkpointer(c, JOB).load(back, 6)
    assert (back["b"] != torch.arange(64) * 3).nonzero().flatten().tolist() \
        == [17]
    # Garbage where the archive should be.
    b_file.write_bytes(b"\0" * len(data))
    with pytest.raises(cairn.DataLossError,
                       match=f"{b_file}: 'b' chunk .* is not a torch.save "
                             "archive of a tensor"):
        ctorch.import_dcp(path, JOB, 5, coordinator=c)
    assert _no_record(cairnd, 5)

    shutil.copy(pristine / file_of["b"], b_file)
    assert ctorch.import_dcp(path, JOB, 5, coordinator=c).info.state == \
        "COMMITTED"


def _rank_md(path, rank):
    return pickle.loads((path / f"__{rank}.metadata").read_bytes())


def _write_rank_md(path, rank, md):
    (path / f"__{rank}.metadata").write_bytes(pickle.dumps(md))


def test_per_rank_metadata_missing_or_truncated_is_data_loss(
        cairnd, rank_checkpoints, tmp_path):
    c = cairnd.address
    path = copy_of(rank_checkpoints, "per-rank", tmp_path)
    pristine = rank_checkpoints[0] / "per-rank"

    # A rank's metadata gone, its data file there.
    (path / "__2.metadata").unlink()
    with pytest.raises(cairn.DataLossError,
                       match=f"{path / '__2.metadata'} is missing: the "
                             r"checkpoint holds the per-rank metadata of "
                             r"ranks 0, 1, 3 \(saved with use_collectives="
                             r"False\), and __2_0\.distcp"):
        ctorch.import_dcp(path, JOB, 13, coordinator=c)
    # The last rank's metadata gone (its data file too): what the others
    # list does not cover the tensors it held.
    shutil.copy(pristine / "__2.metadata", path)
    (path / "__3.metadata").unlink()
    with pytest.raises(cairn.DataLossError,
                       match=f"{path / '__3.metadata'} is missing: the "
                             r"checkpoint holds the per-rank metadata of "
                             r"ranks 0, 1, 2 .* and __3_0\.distcp"):
        ctorch.import_dcp(path, JOB, 13, coordinator=c)
    (path / "__3_0.distcp").unlink()
    with pytest.raises(cairn.DataLossError,
                       match=f"{path}: tensor 'model.0.weight' of global "
                             r"shape \[13, 6\]: the chunks in the metadata "
                             r"of ranks 0 to 2 \(__0\.metadata to __2\."
                             r"metadata\) hold 72 of its 78 elements: the "
                             r"metadata of a rank is missing"):
        ctorch.import_dcp(path, JOB, 13, coordinator=c)
    shutil.copy(pristine / "__3.metadata", path)
    shutil.copy(pristine / "__3_0.distcp", path)

    # Truncated: it does not unpickle.
    data = (pristine / "__1.metadata").read_bytes()
    (path / "__1.metadata").write_bytes(data[:len(data) // 2])
    with pytest.raises(cairn.DataLossError,
                       match=f"{path / '__1.metadata'} \\(rank 1's metadata"
                             r", saved with use_collectives=False\) is "
                             r"truncated or damaged: it does not unpickle"):
        ctorch.import_dcp(path, JOB, 13, coordinator=c)
    # A data file a rank's metadata places items in, missing.
    shutil.copy(pristine / "__1.metadata", path)
    (path / "__1_0.distcp").unlink()
    with pytest.raises(cairn.DataLossError,
                       match=f"{path / '__1_0.distcp'} is missing: the "
                             "metadata places .* in it"):
        ctorch.import_dcp(path, JOB, 13, coordinator=c)
    assert _no_record(cairnd, 13)

    shutil.copy(pristine / "__1_0.distcp", path)
    assert ctorch.import_dcp(path, JOB, 13, coordinator=c).info.state == \
        "COMMITTED"


def test_ranks_metadata_that_disagree_is_refused(cairnd, rank_checkpoints,
                                                 tmp_path):
    c = cairnd.address
    path = copy_of(rank_checkpoints, "per-rank", tmp_path)
    pristine = rank_checkpoints[0] / "per-rank"

    md = _rank_md(path, 2)
    md.state_dict_metadata["extra.proj"].size = torch.Size([5, 10])
    _write_rank_md(path, 2, md)
    with pytest.raises(cairn.InvalidArgumentError,
                       match=f"{path}: tensor 'extra.proj' is float32 "
                             r"\[5, 9\] in __0\.metadata but float32 "
                             r"\[5, 10\] in __2\.metadata: the ranks' "
                             r"metadata disagree"):
        ctorch.import_dcp(path, JOB, 14, coordinator=c)
    shutil.copy(pristine / "__2.metadata", path)

    md = _rank_md(path, 1)
    md.state_dict_metadata["extra.bias"].properties.dtype = torch.int32
    _write_rank_md(path, 1, md)
    with pytest.raises(cairn.InvalidArgumentError,
                       match=r"tensor 'extra.bias' is int64 \[5\] in "
                             r"__0\.metadata but int32 \[5\] in "
                             r"__1\.metadata"):
        ctorch.import_dcp(path, JOB, 14, coordinator=c)
    shutil.copy(pristine / "__1.metadata", path)

    # A rank's chunk overlapping another rank's.
    md = _rank_md(path, 3)
    entry = md.state_dict_metadata["extra.embed"]
    index = next(i for i in md.storage_data if i.fqn == "extra.embed")
    info = md.storage_data.pop(index)
    entry.chunks[0].offsets = torch.Size([5, 0])
    md.storage_data[type(index)("extra.embed", torch.Size([5, 0]), 0)] = info
    _write_rank_md(path, 3, md)
    with pytest.raises(cairn.InvalidArgumentError,
                       match=r"tensor 'extra.embed': rank 2's chunk at "
                             r"offsets \[4, 0\] sizes \[2, 6\] \(__2\."
                             r"metadata\) and rank 3's at offsets \[5, 0\] "
                             r"sizes \[1, 6\] \(__3\.metadata\) overlap"):
        ctorch.import_dcp(path, JOB, 14, coordinator=c)
    shutil.copy(pristine / "__3.metadata", path)

    # An object saved with another value by one rank: one value per fqn.
    md = _rank_md(path, 2)
    info = md.storage_data[type(index)("step")]
    buf = io.BytesIO()
    torch.save(1201, buf)
    assert len(buf.getvalue()) == info.length
    with open(path / info.relative_path, "r+b") as f:
        f.seek(info.offset)
        f.write(buf.getvalue())
    with pytest.raises(cairn.InvalidArgumentError,
                       match=f"{path}: bytes entry 'step' holds other bytes "
                             r"in __2_0\.distcp \(rank 2's\) than in "
                             r"__0_0\.distcp \(rank 0's\): a merged checkpoint"
                             r" holds one value per fqn"):
        ctorch.import_dcp(path, JOB, 14, coordinator=c)
    shutil.copy(pristine / "__2_0.distcp", path)

    # A rank's metadata that weights-only loading refuses.
    md = _rank_md(path, 1)
    md.storage_meta.modules = [Custom(1)]
    _write_rank_md(path, 1, md)
    with pytest.raises(cairn.InvalidArgumentError,
                       match=f"{path / '__1.metadata'}: it holds a "
                             r"test_import_dcp\.Custom, which is not part of "
                             r"DCP's metadata"):
        ctorch.import_dcp(path, JOB, 14, coordinator=c)
    assert _no_record(cairnd, 14)


def _safetensors_blob(path, file_name):
    """(offset, header) of the safetensors blob in `file_name`."""
    md = pickle.loads((path / ".metadata").read_bytes())
    offset = next(info.offset for index, info in md.storage_data.items()
                  if info.relative_path == file_name
                  and index.offset is not None)
    data = (path / file_name).read_bytes()
    n = int.from_bytes(data[offset:offset + 8], "little")
    return offset, json.loads(data[offset + 8:offset + 8 + n])


def test_a_safetensors_shard_missing_truncated_or_inconsistent(
        cairnd, rank_checkpoints, tmp_path):
    c = cairnd.address
    path = copy_of(rank_checkpoints, "safetensors", tmp_path)
    pristine = rank_checkpoints[0] / "safetensors"
    shard = path / "__1_0.distcp"
    data = (pristine / "__1_0.distcp").read_bytes()
    offset, header = _safetensors_blob(path, "__1_0.distcp")
    last = max((k for k, v in header.items() if k != "__metadata__"
                and v["data_offsets"][1] > v["data_offsets"][0]),
               key=lambda k: header[k]["data_offsets"][1])

    shard.unlink()
    with pytest.raises(cairn.DataLossError,
                       match=f"{shard} is missing: the metadata places "
                             r"(bytes entry )?'[^']+' .*in it"):
        ctorch.import_dcp(path, JOB, 15, coordinator=c)
    # Its last tensor cut short.
    shard.write_bytes(data[:-1])
    with pytest.raises(cairn.DataLossError,
                       match=f"{shard} is truncated: it has {len(data) - 1} "
                             f"bytes, its safetensors header places '{last}' "
                             r"chunk at offsets .* at bytes \[\d+, "
                             f"{len(data)}\\)"):
        ctorch.import_dcp(path, JOB, 15, coordinator=c)
    # Cut inside the header.
    shard.write_bytes(data[:offset + 40])
    with pytest.raises(cairn.DataLossError,
                       match=f"{shard} is truncated: it has {offset + 40} "
                             "bytes, .*'[^']+' chunk at offsets"):
        ctorch.import_dcp(path, JOB, 15, coordinator=c)
    # A header that disagrees with the metadata: a shape (same bytes).
    from safetensors.torch import save  # pylint: disable=import-outside-toplevel
    md = pickle.loads((path / ".metadata").read_bytes())
    proj = next(i for i, info in md.storage_data.items()
                if i.fqn == "extra.proj" and info.relative_path ==
                "__1_0.distcp")
    assert list(proj.offset) == [0, 3]
    back = {}
    with open(pristine / "__1_0.distcp", "rb") as f:
        n = int.from_bytes(data[offset:offset + 8], "little")
        start = offset + 8 + n
        for k, v in header.items():
            if k == "__metadata__":
                continue
            begin, end = v["data_offsets"]
            f.seek(start + begin)
            raw = bytearray(f.read(end - begin))
            t = torch.frombuffer(raw, dtype=torch.uint8) if raw else \
                torch.empty(0, dtype=torch.uint8)
            back[k] = t.view(_ST_DTYPES[v["dtype"]]).reshape(v["shape"])
    back["extra.proj"] = back["extra.proj"].reshape(3, 5)
    shard.write_bytes(data[:offset] + save(back, metadata=header[
        "__metadata__"]))
    with pytest.raises(cairn.DataLossError,
                       match=f"{shard}: 'extra.proj' chunk at offsets "
                             r"\[0, 3\] sizes \[5, 3\] .* holds a "
                             r"torch.float32 tensor of shape \[3, 5\], the "
                             r"metadata says torch.float32 \[5, 3\]"):
        ctorch.import_dcp(path, JOB, 15, coordinator=c)
    # The offsets DCP recorded in the header disagree with the metadata.
    back["extra.proj"] = back["extra.proj"].reshape(5, 3)
    sharding = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
    sharding["extra.proj"]["saved_offsets"] = [0, 6]
    shard.write_bytes(data[:offset] + save(back, metadata={
        **header["__metadata__"],
        "DCP_SHARDING_INFO": json.dumps(sharding)}))
    with pytest.raises(cairn.DataLossError,
                       match=f"{shard}: 'extra.proj' chunk at offsets "
                             r"\[0, 3\] .* its safetensors header says it "
                             r"was saved at offsets \[0, 6\]"):
        ctorch.import_dcp(path, JOB, 15, coordinator=c)
    assert _no_record(cairnd, 15)

    shutil.copy(pristine / "__1_0.distcp", shard)
    assert ctorch.import_dcp(path, JOB, 15, coordinator=c).info.state == \
        "COMMITTED"


def test_a_safetensors_shard_of_a_per_rank_checkpoint_missing(
        cairnd, rank_checkpoints, tmp_path):
    path = copy_of(rank_checkpoints, "safetensors-per-rank", tmp_path)
    data = (path / "__3_0.distcp").read_bytes()
    (path / "__3_0.distcp").write_bytes(data[:len(data) - 1])
    with pytest.raises(cairn.DataLossError,
                       match=f"{path / '__3_0.distcp'} is truncated: .* its "
                             "safetensors header places '[^']+' chunk"):
        ctorch.import_dcp(path, JOB, 16, coordinator=cairnd.address)
    (path / "__3_0.distcp").unlink()
    with pytest.raises(cairn.DataLossError,
                       match=f"{path / '__3_0.distcp'} is missing: the "
                             "metadata places"):
        ctorch.import_dcp(path, JOB, 16, coordinator=cairnd.address)
    assert _no_record(cairnd, 16)


# ------------------------------------------------------------ safetensors
# directories (Hugging Face)

def hf_state():
    g = torch.Generator().manual_seed(1203)
    return {
        "model.embed.weight": torch.randn(10, 6, generator=g),
        "model.layers.0.attn.q.weight": torch.randn(6, 6, generator=g).to(
            torch.bfloat16),
        "model.layers.0.norm.weight": torch.randn(6, generator=g).to(
            torch.float16),
        "model.position_ids": torch.arange(12, dtype=torch.int64),
        "lm_head.weight": torch.randn(10, 6, generator=g),
    }


def _load_whole(cairnd, step, like):
    got = {k: torch.zeros_like(v) for k, v in like.items()}
    assert cairn.Checkpointer(cairnd.address, JOB).load(got, step) == step
    return got


def test_huggingface_writer_directory_imports_exactly(cairnd, tmp_path):
    from torch.distributed.checkpoint import HuggingFaceStorageWriter  # pylint: disable=import-outside-toplevel
    state = hf_state()
    path = tmp_path / "hf"
    index = {k: 1 if k.startswith("model.") else 2 for k in state}
    dcp.save(dict(state), storage_writer=HuggingFaceStorageWriter(
        str(path), fqn_to_index_mapping=index), no_dist=True)
    names = sorted(p.name for p in path.iterdir())
    assert "model.safetensors.index.json" in names
    assert sum(n.endswith(".safetensors") for n in names) == 2
    r = ctorch.import_dcp(path, JOB, 11, coordinator=cairnd.address)
    assert (r.info.state, r.tensors, r.bytes_entries) == ("COMMITTED",
                                                          len(state), 0)
    assert r.mapped_bytes == sum(v.numel() * v.element_size()
                                 for v in state.values())
    described = {t.fqn: (t.dtype, list(t.shape)) for t in
                 cairn.Checkpointer(cairnd.address, JOB).describe(11).tensors}
    assert described == {k: (str(v.dtype).rsplit(".", 1)[-1], list(v.shape))
                         for k, v in state.items()}
    got = _load_whole(cairnd, 11, state)
    for k, v in state.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    # Through DCP too.
    sd = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(sd, storage_reader=ctorch.CairnStorageReader(
        checkpoint_id=f"cairn://{cairnd.address}/{JOB}/11"), no_dist=True)
    assert all(torch.equal(sd[k], v) for k, v in state.items())

    # A file the index names, lost: refused naming it, nothing committed.
    lost = next(n for n in names if n.endswith(".safetensors"))
    (path / lost).unlink()
    with pytest.raises(cairn.DataLossError,
                       match=f"{path / lost} is missing: "
                             r"model\.safetensors\.index\.json maps tensor"):
        ctorch.import_dcp(path, JOB, 12, coordinator=cairnd.address)
    assert _no_record(cairnd, 12)


def _write_shard(path, tensors, offsets):
    """A shard file as HuggingFaceStorageWriter(save_distributed=True)
    writes it: each tensor's saved_offsets in DCP_SHARDING_INFO."""
    from safetensors.torch import save_file  # pylint: disable=import-outside-toplevel
    save_file(tensors, str(path), metadata={"DCP_SHARDING_INFO": json.dumps(
        {k: {"saved_offsets": offsets[k]} for k in tensors})})


def test_sharded_safetensors_files_tile_the_tensor_or_are_refused(cairnd,
                                                                 tmp_path):
    pytest.importorskip("safetensors")
    g = torch.Generator().manual_seed(7)
    w = torch.randn(9, 4, generator=g)
    cols = torch.randn(3, 8, generator=g).to(torch.bfloat16)
    path = tmp_path / "sharded"
    path.mkdir()
    for i, (r0, r1) in enumerate(((0, 4), (4, 6), (6, 9))):
        _write_shard(path / f"shard-0000{i + 1}-model-00001-of-00001.safetensors",
                     {"w": w[r0:r1].clone(),
                      "cols": cols[:, 0:4].clone() if i == 0 else
                      cols[:, 4:8].clone() if i == 1 else cols[:, :0].clone()},
                     {"w": [r0, 0], "cols": [0, 0] if i == 0 else [0, 4] if
                      i == 1 else [0, 8]})
    r = ctorch.import_dcp(path, JOB, 21, coordinator=cairnd.address)
    assert r.tensors == 2 and r.chunks == 5
    got = _load_whole(cairnd, 21, {"w": w, "cols": cols})
    assert torch.equal(got["w"], w) and torch.equal(got["cols"], cols)

    # Overlapping chunks, and a lost middle shard (elements left out).
    bad = tmp_path / "overlap"
    shutil.copytree(path, bad)
    _write_shard(bad / "shard-00002-model-00001-of-00001.safetensors",
                 {"w": w[3:6].clone()}, {"w": [3, 0]})
    with pytest.raises(cairn.InvalidArgumentError,
                       match=r"tensor 'w': the chunk at offsets \[0, 0\] "
                             r"sizes \[4, 4\] .* overlap"):
        ctorch.import_dcp(bad, JOB, 22, coordinator=cairnd.address)
    (bad / "shard-00002-model-00001-of-00001.safetensors").unlink()
    with pytest.raises(cairn.DataLossError,
                       match=r"tensor 'w' of shape \[9, 4\]: its chunks in .* "
                             r"hold 28 of its 36 elements: a shard file is "
                             r"missing"):
        ctorch.import_dcp(bad, JOB, 22, coordinator=cairnd.address)
    # A shard cut short.
    cut = path / "shard-00003-model-00001-of-00001.safetensors"
    cut.write_bytes(cut.read_bytes()[:-8])
    with pytest.raises(cairn.DataLossError, match=f"{cut} is truncated"):
        ctorch.import_dcp(path, JOB, 22, coordinator=cairnd.address)
    assert _no_record(cairnd, 22)


def test_a_step_cairn_already_has_is_refused(cairnd, single_dir, tmp_path):
    c = cairnd.address
    ctorch.import_dcp(single_dir, JOB, 9, coordinator=c)
    other = tmp_path / "other"
    dcp.save({"x": torch.ones(3)}, storage_writer=FileSystemWriter(
        str(other)), no_dist=True)
    with pytest.raises(cairn.AlreadyExistsError,
                       match=f"import_dcp of {other}: job '{JOB}' step 9 is "
                             f"already committed in Cairn; import into a new "
                             f"step"):
        ctorch.import_dcp(other, JOB, 9, coordinator=c)
    # The checkpoint there is untouched.
    full, _ = single_state()
    back = {k: torch.zeros_like(v) for k, v in full.items()}
    cairn.Checkpointer(c, JOB).load(back, 9)
    assert all(torch.equal(back[k], v) for k, v in full.items())


def test_bad_arguments_are_named(cairnd, single_dir, monkeypatch):
    c = cairnd.address
    for step in (-1, 10**15 + 1, True, "5", 1.0, None):
        with pytest.raises(cairn.InvalidArgumentError,
                           match=rf"step {step!r} is not an int"):
            ctorch.import_dcp(single_dir, JOB, step, coordinator=c)
    for job in ("", "a/b", "..", "x" * 129, None):
        with pytest.raises(cairn.InvalidArgumentError,
                           match="invalid job name"):
            ctorch.import_dcp(single_dir, job, 1, coordinator=c)
    with pytest.raises(cairn.InvalidArgumentError,
                       match="path 42 .* is not a directory path"):
        ctorch.import_dcp(42, JOB, 1, coordinator=c)
    monkeypatch.delenv("CAIRN_COORDINATOR", raising=False)
    with pytest.raises(cairn.InvalidArgumentError,
                       match="no coordinator: pass coordinator="):
        ctorch.import_dcp(single_dir, JOB, 1)
    # CAIRN_COORDINATOR is the default, as everywhere in the package.
    monkeypatch.setenv("CAIRN_COORDINATOR", c)
    assert ctorch.import_dcp(single_dir, JOB, 1).info.step == 1


def test_a_dtype_cairn_cannot_store_is_named(cairnd, tmp_path):
    path = tmp_path / "complex"
    dcp.save({"z": torch.ones(2, dtype=torch.complex64)},
             storage_writer=FileSystemWriter(str(path)), no_dist=True)
    with pytest.raises(cairn.InvalidArgumentError,
                       match=f"{path}: tensor 'z': dtype torch.complex64 "
                             "cannot be checkpointed"):
        ctorch.import_dcp(path, JOB, 1, coordinator=cairnd.address)


def _cli(*args):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "cairn.torch", *args],
                          capture_output=True, text=True, env=env,
                          timeout=300)


def test_cli_entry(cairnd, single_dir):
    r = _cli("import-dcp", str(single_dir), "--job", JOB, "--step", "11",
             "-c", cairnd.address)
    assert r.returncode == 0, r.stderr
    assert f"imported {single_dir} as job {JOB} step 11 (COMMITTED)" in \
        r.stdout, r.stdout
    again = _cli("import-dcp", str(single_dir), "--job", JOB, "--step", "11",
                 "-c", cairnd.address)
    assert again.returncode == 1, again
    assert "cairn: ALREADY_EXISTS: import_dcp of" in again.stderr
    usage = _cli("import-dcp", str(single_dir), "--step", "11")
    assert usage.returncode == 2, usage
    assert "--job" in usage.stderr
    for bad in (["--job", "a/b", "--step", "1"], ["--job", JOB, "--step",
                                                   "-1"]):
        usage = _cli("import-dcp", str(single_dir), *bad, "-c",
                     cairnd.address)
        assert usage.returncode == 2, usage
        assert "must be" in usage.stderr, usage.stderr
    missing = _cli("import-dcp", str(single_dir) + "-nothing", "--job", JOB,
                   "--step", "12", "-c", cairnd.address)
    assert missing.returncode == 1, missing
    assert f"cairn: NOT_FOUND: import_dcp: {single_dir}-nothing does not " \
        "exist" in missing.stderr, missing.stderr
    assert cairn.Checkpointer(cairnd.address, JOB).latest_step() == 11


def test_planner_data_entry_is_the_writers(cairnd, single_dir):
    """The hidden entry is what CairnStorageWriter keeps (same name, same
    form), so the reader treats an imported checkpoint as its own."""
    ctorch.import_dcp(single_dir, JOB, 12, coordinator=cairnd.address)
    ckpt = cairn._cairn.Checkpointer(cairnd.address, JOB, 0, 1)  # pylint: disable=protected-access
    mapping = _dcp.read_planner_data(ckpt, 12)
    md = pickle.loads((single_dir / ".metadata").read_bytes())
    assert mapping == {k: tuple(v) for k, v in md.planner_data.items()}
