"""cairn.torch through torch.distributed.checkpoint's own entry points
(torch >= 2.6), in real gloo rank processes against a real cairnd: DTensor
state dicts (model, Adam state, objects) saved by 4 ranks with dcp.save,
dcp.async_save (thread and process executors) and use_collectives=False,
loaded with dcp.load into 3, 2 and 1 ranks sharded another way (bit-exact);
no_dist; _load_state_dict_from_keys; DefaultSavePlanner's plan caching;
DefaultLoadPlanner's allow_partial_load; a failing rank."""

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner, DefaultSavePlanner)
try:  # torch >= 2.7; before it async_save has the thread executor only
    from torch.distributed.checkpoint.state_dict_saver import (
        AsyncCheckpointerType)
except ImportError:
    AsyncCheckpointerType = None
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import cairn.torch as ctorch
from cairn import errors as cairn_errors

import harness
from test_dcp import blank as blank_obj

JOB = "dcp2-job"


def expected_state():
    """Full values every rank computes alike: a model trained 2 Adam steps
    (0-dim `step` tensors among its state), odd dtypes, objects."""
    torch.manual_seed(99)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(),
                                torch.nn.Linear(10, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.arange(30, dtype=torch.float32).reshape(5, 6) / 30
    for _ in range(2):
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    full = {f"model.{k}": v.detach().clone()
            for k, v in model.state_dict().items()}
    names = dict(enumerate(n for n, _ in model.named_parameters()))
    for idx, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            full[f"optim.{names[idx]}.{k}"] = v.detach().clone()
    g = torch.Generator().manual_seed(3)
    full["extra.bf16"] = torch.randn(9, 4, generator=g).to(torch.bfloat16)
    full["extra.two_rows"] = torch.randn(2, 5, generator=g)  # empty shards on 4 ranks
    objects = {"train.meta": {"epoch": 2, "name": "run-β", "losses": [0.5]},
               "train.lr": 0.01}
    return full, objects


def dtensor_state(full, objects, world, dims, blank=False):  # pylint: disable=redefined-outer-name
    """DTensors on a 1-D mesh of `world` ranks: 2-D tensors sharded along
    dims[0], 1-D along dims[1] (uneven, some shards empty), 0-dim ones
    replicated; objects (None when blank)."""
    mesh = init_device_mesh("cpu", (world,))
    sd = {}
    for fqn, t in full.items():
        src = torch.zeros_like(t) if blank else t
        if t.dim() == 0:
            place = [Replicate()]
        else:
            place = [Shard(min(dims[0] if t.dim() == 2 else dims[1],
                               t.dim() - 1))]
        sd[fqn] = distribute_tensor(src, mesh, place)
    sd.update({k: (blank_obj(v) if blank else v) for k, v in objects.items()})
    return sd


def check_state(sd, full, objects):
    """Every DTensor's whole value (collective) and every object."""
    bad = []
    for fqn, t in full.items():
        got = sd[fqn].full_tensor()
        if got.dtype != t.dtype or not torch.equal(got, t):
            bad.append(fqn)
    bad += [k for k, v in objects.items() if sd[k] != v]
    assert not bad, f"differ after load: {bad}"


def uri(address, step):
    return f"cairn://{address}/{JOB}/{step}"


def wait_async(result):
    """async_save's Future (or AsyncSaveResponse's upload future)."""
    fut = getattr(result, "upload_completion", result)
    return fut.result()


# ------------------------------------------------------------ rank bodies

def async_kind(mode):
    """async_save's executor argument for `mode` ("thread" / "process")."""
    if AsyncCheckpointerType is None:
        assert mode == "thread", mode
        return {}
    return {"async_checkpointer_type": AsyncCheckpointerType.THREAD
            if mode == "thread" else AsyncCheckpointerType.PROCESS}


# dcp.async_save's PROCESS executor (torch >= 2.7).
needs_process_async = pytest.mark.skipif(
    AsyncCheckpointerType is None,
    reason=f"torch {torch.__version__} has no PROCESS async_save (2.7+)")


def save_ranks(rank, world, address, step, mode):
    full, objects = expected_state()
    sd = dtensor_state(full, objects, world, (0, 0))
    writer = ctorch.CairnStorageWriter()
    if mode == "save":
        dcp.save(sd, storage_writer=writer, checkpoint_id=uri(address, step))
    elif mode == "no_collectives":
        dcp.save(sd, storage_writer=writer, checkpoint_id=uri(address, step),
                 use_collectives=False)
    elif mode in ("thread", "process"):
        res = dcp.async_save(sd, storage_writer=writer,
                             checkpoint_id=uri(address, step),
                             **async_kind(mode))
        # The caller's tensors may change at once: the save has its copy.
        for v in sd.values():
            if isinstance(v, torch.Tensor):
                v.to_local().zero_()
        wait_async(res)
        if mode == "process":
            return "COMMITTED"  # the writer ran in the executor's process
    else:
        raise ValueError(mode)
    return writer.last_info.state


def agent_save_ranks(rank, world, address, step, mode, socket):
    """async_save with the writer as its AsyncStager and a cairn-agent: the
    writer knows its step, so stage() copies the state once into the
    agent's shared memory and hands DCP data-less stand-ins."""
    full, objects = expected_state()
    sd = dtensor_state(full, objects, world, (0, 0))
    writer = ctorch.CairnStorageWriter(checkpoint_id=uri(address, step),
                                       agent_socket=socket)
    res = dcp.async_save(sd, storage_writer=writer,
                         checkpoint_id=uri(address, step),
                         **async_kind(mode))
    # stage() is done: the agent holds this rank's bytes (its copy stats are
    # the writer's), and training may change the tensors at once.
    copied = writer.last_stats.get("bytes", 0)
    for v in sd.values():
        if isinstance(v, torch.Tensor):
            v.to_local().zero_()
    wait_async(res)
    local = sum(v.to_local().numel() * v.element_size()
                for v in sd.values() if isinstance(v, torch.Tensor))
    return copied >= local > 0


def load_ranks(rank, world, address, step):
    full, objects = expected_state()
    sd = dtensor_state(full, objects, world, (1, 0), blank=True)
    reader = ctorch.CairnStorageReader()
    dcp.load(sd, storage_reader=reader, checkpoint_id=uri(address, step))
    check_state(sd, full, objects)
    return reader.loaded_step


def latest_step(address):
    import cairn  # pylint: disable=import-outside-toplevel
    return cairn.Checkpointer(address, JOB, 0, 1).latest_step()


# ------------------------------------------------------------ tests

@pytest.mark.parametrize("mode", ["save", "thread",
                                  pytest.param("process",
                                               marks=needs_process_async),
                                  "no_collectives"])
def test_4_rank_dtensor_save_loads_into_3_2_1_ranks(cairnd, mode):
    step = {"save": 10, "thread": 20, "process": 30, "no_collectives": 40}[mode]
    assert harness.run_ranks(save_ranks, 4, cairnd.address, step,
                             mode) == ["COMMITTED"] * 4
    info = [line for line in cairnd.cli("ls", JOB).stdout.splitlines()
            if f" {step} " in f" {line} "]
    assert info and "COMMITTED" in info[0], info
    # One checkpoint of 4 ranks, not 4 of one rank each.
    show = cairnd.cli("show", JOB, str(step)).stdout
    assert "ranks 4" in show.splitlines()[1], show
    for world in (3, 2, 1):
        assert harness.run_ranks(load_ranks, world, cairnd.address,
                                 step) == [step] * world


def test_no_dist_save_and_load_in_one_process(cairnd):
    full, objects = expected_state()
    sd = dict(full)
    sd.update(objects)
    dcp.save(sd, storage_writer=ctorch.CairnStorageWriter(),
             checkpoint_id=uri(cairnd.address, 5), no_dist=True)
    back = {k: torch.zeros_like(v) for k, v in full.items()}
    back.update({k: blank_obj(v) for k, v in objects.items()})
    reader = ctorch.CairnStorageReader()
    dcp.load(back, storage_reader=reader,
             checkpoint_id=uri(cairnd.address, "latest"), no_dist=True)
    assert reader.loaded_step == 5
    assert all(torch.equal(back[k], v) for k, v in full.items())
    assert {k: back[k] for k in objects} == objects


def test_load_state_dict_from_keys(cairnd):
    # pylint: disable=import-outside-toplevel
    from torch.distributed.checkpoint.state_dict_loader import (
        _load_state_dict_from_keys)
    harness.run_ranks(save_ranks, 2, cairnd.address, 7, "save")
    full, objects = expected_state()
    got = _load_state_dict_from_keys(
        {"model.0.weight", "train.meta"},
        storage_reader=ctorch.CairnStorageReader(
            checkpoint_id=uri(cairnd.address, 7)))
    # Keyed as the saved state_dict was (its keys hold the dots), nested
    # objects rebuilt from the saving planner's planner_data.
    assert sorted(got) == ["model.0.weight", "train.meta"], sorted(got)
    assert torch.equal(got["model.0.weight"], full["model.0.weight"])
    assert got["train.meta"] == objects["train.meta"]
    everything = _load_state_dict_from_keys(
        storage_reader=ctorch.CairnStorageReader(
            checkpoint_id=uri(cairnd.address, "latest")))
    assert sorted(everything) == sorted(list(full) + list(objects))
    assert torch.equal(everything["extra.bf16"], full["extra.bf16"])
    assert cairn_planner_data_entry_is_hidden(everything)


def cairn_planner_data_entry_is_hidden(state):
    from cairn import _dcp  # pylint: disable=import-outside-toplevel
    return _dcp.PLANNER_DATA_FQN not in state


def cached_plan_ranks(rank, world, address):
    full, objects = expected_state()
    sd = dtensor_state(full, objects, world, (0, 0))
    planner = DefaultSavePlanner(enable_plan_caching=True)
    stats = []
    for step in (1, 2, 3):
        if step == 3:
            sd["model.0.weight"].to_local().add_(1)  # new values, same plan
        writer = ctorch.CairnStorageWriter()
        dcp.save(sd, storage_writer=writer, planner=planner,
                 checkpoint_id=uri(address, step))
        stats.append((writer.last_info.state, writer.last_stats["plan_from_cache"]))
    back = dtensor_state(full, objects, world, (1, 0), blank=True)
    dcp.load(back, checkpoint_id=uri(address, 3),
             storage_reader=ctorch.CairnStorageReader())
    full["model.0.weight"] = full["model.0.weight"] + 1
    check_state(back, full, objects)
    return stats


def test_plan_caching_planner_saves_every_step(cairnd):
    per_rank = harness.run_ranks(cached_plan_ranks, 2, cairnd.address)
    for stats in per_rank:
        assert [s for s, _ in stats] == ["COMMITTED"] * 3, stats
        assert not stats[0][1] and stats[1][1] and stats[2][1], stats


def partial_load_ranks(rank, world, address):
    full, objects = expected_state()
    sd = dtensor_state(full, objects, world, (1, 0), blank=True)
    sd["model.new_head"] = distribute_tensor(
        torch.full((4, 4), 7.0), init_device_mesh("cpu", (world,)), [Shard(0)])
    with pytest.raises(dcp.api.CheckpointException, match="model.new_head"):
        dcp.load(sd, storage_reader=ctorch.CairnStorageReader(),
                 checkpoint_id=uri(address, 8))
    dcp.load(sd, storage_reader=ctorch.CairnStorageReader(),
             planner=DefaultLoadPlanner(allow_partial_load=True),
             checkpoint_id=uri(address, 8))
    new_head = sd.pop("model.new_head").full_tensor()
    check_state(sd, full, objects)
    return bool(torch.equal(new_head, torch.full((4, 4), 7.0)))


def test_allow_partial_load_keeps_entries_the_checkpoint_lacks(cairnd):
    harness.run_ranks(save_ranks, 2, cairnd.address, 8, "save")
    assert harness.run_ranks(partial_load_ranks, 2, cairnd.address) == [True] * 2


def failing_rank(rank, world, address):
    """Rank 1 cannot build its state in write_data (as when a tensor of its
    state is broken): DCP's CheckpointException on every rank."""
    from cairn import _dcp  # pylint: disable=import-outside-toplevel
    full, objects = expected_state()
    sd = dtensor_state(full, objects, world, (0, 0))
    if rank == 1:
        def broken(*args, **kwargs):
            raise RuntimeError("rank 1's state cannot be built")
        _dcp.build_save_state = broken
    try:
        dcp.save(sd, storage_writer=ctorch.CairnStorageWriter(),
                 checkpoint_id=uri(address, 99))
    except dcp.api.CheckpointException as e:
        return sorted(e.failures), str(e)
    return None, "saved"


def test_a_failing_rank_fails_every_rank_and_keeps_the_previous_latest(cairnd):
    harness.run_ranks(save_ranks, 2, cairnd.address, 9, "save")
    results = harness.run_ranks(failing_rank, 2, cairnd.address)
    for rank, (failed, text) in enumerate(results):
        assert failed is not None, (rank, text)
        assert 1 in failed, (rank, failed, text)
        assert "rank 1's state cannot be built" in text, (rank, text)
    assert latest_step(cairnd.address) == 9
    assert harness.run_ranks(load_ranks, 2, cairnd.address, "latest") == [9, 9]


@pytest.mark.parametrize("mode", ["thread", pytest.param(
    "process", marks=needs_process_async)])
def test_async_save_stages_into_the_agent(cairnd, start_agent, mode):
    agent = start_agent(cairnd.address)
    step = {"thread": 50, "process": 60}[mode]
    assert harness.run_ranks(agent_save_ranks, 2, cairnd.address, step, mode,
                             agent.socket) == [True, True]
    show = cairnd.cli("show", JOB, str(step)).stdout
    assert "COMMITTED" in show and "ranks 2" in show, show
    for world in (3, 1):
        assert harness.run_ranks(load_ranks, world, cairnd.address,
                                 step) == [step] * world


def reused_writer_ranks(rank, world, address, socket):
    """One writer for two async_saves whose steps come only from
    checkpoint_id: each is staged with a host copy (the writer cannot know
    the step in stage()), then saved through the agent."""
    full, objects = expected_state()
    sd = dtensor_state(full, objects, world, (0, 0))
    writer = ctorch.CairnStorageWriter(agent_socket=socket)
    states = []
    for step in (70, 80):
        res = dcp.async_save(sd, storage_writer=writer,
                             checkpoint_id=uri(address, step))
        wait_async(res)
        states.append((writer.last_info.step, writer.last_info.state))
    return states


def test_a_reused_agent_writer_saves_each_step_it_is_given(cairnd,
                                                           start_agent):
    agent = start_agent(cairnd.address)
    assert harness.run_ranks(reused_writer_ranks, 2, cairnd.address,
                             agent.socket) == [
        [(70, "COMMITTED"), (80, "COMMITTED")]] * 2
    assert harness.run_ranks(load_ranks, 1, cairnd.address, 80) == [80]


def test_agent_only_options_need_an_agent(monkeypatch):
    monkeypatch.delenv("CAIRN_AGENT_SOCKET", raising=False)
    with pytest.raises(cairn_errors.InvalidArgumentError,
                       match=r"\['copy_threads'\] need an agent_socket"):
        ctorch.CairnStorageWriter("127.0.0.1:1", JOB, 1, copy_threads=2)


def test_an_entry_named_like_cairns_planner_data_is_refused(cairnd):
    from cairn._dcp import PLANNER_DATA_FQN  # pylint: disable=import-outside-toplevel
    sd = {PLANNER_DATA_FQN: torch.zeros(3), "w": torch.ones(2)}
    with pytest.raises(dcp.api.CheckpointException,
                       match=f"'{PLANNER_DATA_FQN}' is the name "
                       "Cairn keeps DCP's planner_data under"):
        dcp.save(sd, storage_writer=ctorch.CairnStorageWriter(),
                 checkpoint_id=uri(cairnd.address, 95), no_dist=True)
    assert cairnd.cli("show", JOB, "95", check=False).returncode != 0


def async_beside_training_ranks(rank, world, address):
    """Training's collectives on the default group while dcp.async_save runs
    on a group of its own given only to async_save (DCP does not hand it to
    the writer): the writer must not run a collective of its own on the
    default group from DCP's thread."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    group = dist.new_group(backend="gloo")
    x = torch.ones(1 << 14)
    total = 0.0
    steps = []
    for step in (110, 120, 130):
        sd = {"w": torch.full((1000,), float(step)),
              f"rank{rank}": torch.tensor([rank])}
        res = dcp.async_save(sd, storage_writer=ctorch.CairnStorageWriter(),
                             checkpoint_id=uri(address, step),
                             process_group=group)
        for _ in range(100):
            x.fill_(1.0)
            dist.all_reduce(x)
            total += float(x[-1])
        wait_async(res)
        steps.append(step)
    return steps, total


def test_async_save_beside_training_collectives_on_the_default_group(cairnd):
    got = harness.run_ranks(async_beside_training_ranks, 2, cairnd.address)
    assert [g[0] for g in got] == [[110, 120, 130]] * 2
    assert {g[1] for g in got} == {600.0}  # 300 all_reduces of 1 + 1
    assert latest_step(cairnd.address) == 130
