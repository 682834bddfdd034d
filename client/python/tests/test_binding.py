"""The extension cairn._cairn against a real cairnd: saves from numpy arrays
and torch CPU tensors (their own memory), loads into differently chunked
buffers bit-exact, every error class and its message, the queries, and agent
mode through a real cairn-agent."""

import pickle
import threading

import numpy as np
import pytest
import torch

import cairn
from cairn import _cairn
from cairn import errors


def _ptr(a):
    """(ptr, nbytes) of a contiguous numpy array or CPU tensor."""
    if isinstance(a, torch.Tensor):
        assert a.is_contiguous()
        n = a.numel() * a.element_size()
        return (a.data_ptr() if n else 0), n
    assert a.flags["C_CONTIGUOUS"]
    return (a.ctypes.data if a.nbytes else 0), a.nbytes


def _whole(sd, fqn, dtype, a):
    """Adds `a` as one chunk covering the whole tensor."""
    shape = list(a.shape)
    ptr, n = _ptr(a)
    sd.add_chunks(fqn, dtype, shape, [([0] * len(shape), shape, ptr, n)])


def _rows(sd, fqn, dtype, parts, shape):
    """Adds row blocks `parts` (stacked along dim 0) of a tensor of `shape`."""
    chunks, row = [], 0
    for p in parts:
        ptr, n = _ptr(p)
        chunks.append(([row] + [0] * (len(shape) - 1), list(p.shape), ptr, n))
        row += p.shape[0]
    sd.add_chunks(fqn, dtype, shape, chunks)


def _ckpt(cairnd, job="job1", rank=0, world_size=1, **kw):
    return _cairn.Checkpointer(cairnd.address, job, rank, world_size, **kw)


def _source_state(rng):
    state = {
        "w": rng.standard_normal((6, 5)).astype(np.float32),
        "mask": rng.integers(0, 2, size=(7,)).astype(np.bool_),
        "ids": rng.integers(-2**62, 2**62, size=(3, 4), dtype=np.int64),
        "bf": torch.randn(4, 3).to(torch.bfloat16),
    }
    sd = _cairn.StateDict()
    _whole(sd, "w", "float32", state["w"])
    _whole(sd, "mask", "bool", state["mask"])
    _whole(sd, "ids", "int64", state["ids"])
    _whole(sd, "bf", "bfloat16", state["bf"])
    sd.add_bytes("meta", b"\x00pickled\xffobject")
    sd.add_bytes("empty", b"")
    return state, sd


def test_save_and_load_into_differently_chunked_buffers(cairnd):
    rng = np.random.default_rng(1)
    src, sd = _source_state(rng)
    assert len(sd) == 6
    ckpt = _ckpt(cairnd)
    info = ckpt.save(10, sd)
    assert (info.job, info.step, info.state) == ("job1", 10, "COMMITTED")
    assert info.world_size == 1
    assert info.num_tensors == 4 and info.num_bytes_entries == 2
    assert info.committed is not None and info.created is not None
    assert info.committed >= info.created
    assert ckpt.last_stats["bytes"] >= (6 * 5 * 4 + 7 + 3 * 4 * 8 + 4 * 3 * 2)

    # Load: "w" as 3 row blocks, "ids" as two column halves, "bf" into a
    # torch tensor's memory in two row blocks, "mask" whole.
    w_parts = [np.zeros((2, 5), np.float32) for _ in range(3)]
    ids_cols = [np.zeros((3, 2), np.int64), np.zeros((3, 2), np.int64)]
    bf_parts = [torch.zeros(1, 3, dtype=torch.bfloat16),
                torch.zeros(3, 3, dtype=torch.bfloat16)]
    mask = np.zeros(7, np.bool_)
    dst = _cairn.StateDict()
    _rows(dst, "w", "float32", w_parts, [6, 5])
    dst.add_chunks("ids", "int64", [3, 4], [
        ([0, 0], [3, 2]) + _ptr(ids_cols[0]),
        ([0, 2], [3, 2]) + _ptr(ids_cols[1])])
    _rows(dst, "bf", "bfloat16", bf_parts, [4, 3])
    _whole(dst, "mask", "bool", mask)
    dst.add_bytes("meta")
    dst.add_bytes("empty")
    loader = _ckpt(cairnd)
    assert loader.load(dst) == 10  # latest
    np.testing.assert_array_equal(np.concatenate(w_parts), src["w"])
    np.testing.assert_array_equal(np.concatenate(ids_cols, axis=1), src["ids"])
    assert torch.equal(torch.cat(bf_parts), src["bf"])
    np.testing.assert_array_equal(mask, src["mask"])
    assert dst.get_bytes("meta") == b"\x00pickled\xffobject"
    assert dst.get_bytes("empty") == b""
    assert loader.last_stats["bytes"] > 0


def test_queries_list_latest_describe(cairnd):
    _, sd = _source_state(np.random.default_rng(2))
    ckpt = _ckpt(cairnd, job="queries")
    with pytest.raises(cairn.NotFoundError, match="queries"):
        ckpt.latest_step()
    assert ckpt.list() == []
    ckpt.save(3, sd)
    ckpt.save(7, sd)
    assert ckpt.latest_step() == 7
    assert [i.step for i in ckpt.list()] == [3, 7]
    assert all(i.state == "COMMITTED" for i in ckpt.list())

    summary = ckpt.describe(3)
    assert summary.info.step == 3 and summary.info.job == "queries"
    tensors = {t.fqn: t for t in summary.tensors}
    assert [t.fqn for t in summary.tensors] == sorted(tensors)
    assert (tensors["w"].dtype, tensors["w"].shape) == ("float32", [6, 5])
    assert tensors["w"].bytes == 6 * 5 * 4
    assert (tensors["bf"].dtype, tensors["bf"].bytes) == ("bfloat16", 24)
    assert (tensors["mask"].dtype, tensors["ids"].dtype) == ("bool", "int64")
    assert tensors["w"].chunks == [([0, 0], [6, 5])]
    assert tensors["mask"].chunks == [([0], [7])]
    assert {(b.fqn, b.bytes) for b in summary.bytes_entries} == {
        ("meta", 15), ("empty", 0)}
    # Results outlive the objects they came from.
    first = summary.tensors[0]
    del summary
    assert first.fqn == "bf"

    with pytest.raises(cairn.NotFoundError) as e:
        ckpt.describe(99)
    assert "queries" in e.value.message and "99" in e.value.message
    assert e.value.code == "NOT_FOUND"


def test_checkpoint_info_pickles(cairnd):
    _, sd = _source_state(np.random.default_rng(3))
    info = _ckpt(cairnd).save(1, sd)
    back = pickle.loads(pickle.dumps(info))
    for attr in ("job", "step", "state", "world_size", "bytes", "num_tensors",
                 "num_bytes_entries", "created", "committed", "storage_uri",
                 "abort_reason"):
        assert getattr(back, attr) == getattr(info, attr), attr
    assert "step=1" in repr(back) and "COMMITTED" in repr(back)


def test_load_of_unknown_step_is_not_found_naming_job_and_step(cairnd):
    _, sd = _source_state(np.random.default_rng(4))
    ckpt = _ckpt(cairnd, job="nf-job")
    ckpt.save(1, sd)
    dst = _cairn.StateDict()
    dst.add_bytes("meta")
    with pytest.raises(cairn.NotFoundError) as e:
        ckpt.load(dst, step=5)
    assert isinstance(e.value, cairn.Error)
    assert "nf-job" in str(e.value) and "5" in e.value.message
    with pytest.raises(cairn.InvalidArgumentError, match="negative"):
        ckpt.load(dst, step=-1)


def test_wrong_buffer_size_is_invalid_argument_naming_fqn():
    a = np.zeros((4, 4), np.float32)
    sd = _cairn.StateDict()
    with pytest.raises(cairn.InvalidArgumentError) as e:
        sd.add_chunks("layer.wq", "float32", [4, 4],
                      [([0, 0], [4, 4], a.ctypes.data, a.nbytes - 4)])
    assert "layer.wq" in e.value.message
    with pytest.raises(cairn.InvalidArgumentError, match="layer.wk"):
        sd.add_chunks("layer.wk", "float33", [4, 4], [])
    with pytest.raises(cairn.InvalidArgumentError,
                       match="layer.wv.*null address"):
        sd.add_chunks("layer.wv", "float32", [4, 4],
                      [([0, 0], [4, 4], 0, a.nbytes)])
    with pytest.raises(cairn.InvalidArgumentError, match="layer.wo"):
        sd.add_chunks("layer.wo", "float32", [4, 4],
                      [([0, 0], [8, 4], a.ctypes.data, a.nbytes * 2)])
    _whole(sd, "ok", "float32", a)
    with pytest.raises(cairn.AlreadyExistsError, match="'ok'"):
        sd.add_bytes("ok", b"x")
    with pytest.raises(cairn.NotFoundError, match="'nope'"):
        sd.get_bytes("nope")
    assert len(sd) == 1


def test_load_with_wrong_shape_is_invalid_argument_naming_fqn(cairnd):
    _, sd = _source_state(np.random.default_rng(5))
    ckpt = _ckpt(cairnd, job="shape-job")
    ckpt.save(2, sd)
    dst = _cairn.StateDict()
    _whole(dst, "w", "float32", np.zeros((5, 6), np.float32))
    with pytest.raises(cairn.InvalidArgumentError) as e:
        ckpt.load(dst, step=2)
    assert "'w'" in e.value.message


def test_cairnd_down_is_unavailable(cairnd):
    address = cairnd.address
    cairnd.kill()
    ckpt = _cairn.Checkpointer(address, "down-job", 0, 1, max_retries=1,
                               rpc_timeout=5.0)
    with pytest.raises(cairn.UnavailableError) as e:
        ckpt.list()
    assert e.value.code == "UNAVAILABLE"
    assert "job 'down-job'" in e.value.message and "rank 0" in e.value.message
    sd = _cairn.StateDict()
    sd.add_bytes("x", b"1")
    with pytest.raises(cairn.UnavailableError,
                       match="rank 0 saving job 'down-job' step 1: cairnd at "
                       f"{address} was never reached"):
        ckpt.save(1, sd)


def test_bad_options_are_invalid_argument_naming_job_and_rank(cairnd):
    with pytest.raises(cairn.InvalidArgumentError,
                       match="job 'opt' rank 0.*partial_chunk_check"):
        _cairn.Checkpointer(cairnd.address, "opt", 0, 1,
                            partial_chunk_check="sometimes")
    with pytest.raises(cairn.InvalidArgumentError, match="rpc_timeout"):
        _cairn.Checkpointer(cairnd.address, "opt", 0, 1, rpc_timeout=-1.0)
    with pytest.raises(cairn.InvalidArgumentError, match="opt"):
        _cairn.Checkpointer(cairnd.address, "opt", 2, 2)
    c = _cairn.Checkpointer(cairnd.address, "opt", 1, 3)
    assert (c.job, c.rank, c.world_size, c.coordinator) == (
        "opt", 1, 3, cairnd.address)
    assert c.incarnation != 0


def _save_rank(address, rank, results, step=1):
    sd = _cairn.StateDict()
    a = np.full(4, rank, np.int32)
    sd.add_chunks("t", "int32", [8], [([4 * rank], [4], a.ctypes.data, 16)])
    try:
        results[rank] = _cairn.Checkpointer(address, "busy", rank, 2).save(
            step, sd) if rank else results["ckpt0"].save(step, sd)
    except BaseException as e:  # pylint: disable=broad-except
        results[rank] = e


def test_save_releases_the_gil_and_calls_do_not_overlap(cairnd):
    """Rank 0's save blocks in a thread until rank 1 arrives; meanwhile this
    thread runs Python (the GIL is free) and a second call on the same
    Checkpointer is refused instead of racing."""
    results = {"ckpt0": _cairn.Checkpointer(cairnd.address, "busy", 0, 2)}
    t0 = threading.Thread(target=_save_rank, args=(cairnd.address, 0, results))
    t0.start()
    refused = None
    while refused is None and t0.is_alive():
        try:
            results["ckpt0"].list()
        except cairn.FailedPreconditionError as e:
            refused = e
    assert refused is not None, results.get(0)
    assert "job 'busy' rank 0" in refused.message
    assert "list()" in refused.message
    t1 = threading.Thread(target=_save_rank, args=(cairnd.address, 1, results))
    t1.start()
    t0.join()
    t1.join()
    assert results[0].state == "COMMITTED", results[0]
    assert results[1].state == "COMMITTED", results[1]
    assert [i.step for i in results["ckpt0"].list()] == [1]
    # Each rank's chunk is stored where it saved it.
    chunks = results["ckpt0"].describe(1).tensors[0].chunks
    assert chunks == [([0], [4]), ([4], [4])]


@pytest.mark.parametrize("code,cls", [
    ("CANCELLED", errors.CancelledError), ("UNKNOWN", errors.UnknownError),
    ("INVALID_ARGUMENT", errors.InvalidArgumentError),
    ("DEADLINE_EXCEEDED", errors.DeadlineExceededError),
    ("NOT_FOUND", errors.NotFoundError),
    ("ALREADY_EXISTS", errors.AlreadyExistsError),
    ("PERMISSION_DENIED", errors.PermissionDeniedError),
    ("RESOURCE_EXHAUSTED", errors.ResourceExhaustedError),
    ("FAILED_PRECONDITION", errors.FailedPreconditionError),
    ("ABORTED", errors.AbortedError), ("OUT_OF_RANGE", errors.OutOfRangeError),
    ("UNIMPLEMENTED", errors.UnimplementedError),
    ("INTERNAL", errors.InternalError),
    ("UNAVAILABLE", errors.UnavailableError),
    ("DATA_LOSS", errors.DataLossError),
    ("UNAUTHENTICATED", errors.UnauthenticatedError)])
def test_from_status_maps_every_code(code, cls):
    e = errors.from_status(code, "job 'j' step 3 rank 1: why")
    assert type(e) is cls  # pylint: disable=unidiomatic-typecheck
    assert isinstance(e, cairn.Error) and isinstance(e, Exception)
    assert (e.code, e.message) == (code, "job 'j' step 3 rank 1: why")
    assert str(e) == f"{code}: job 'j' step 3 rank 1: why"
    assert getattr(cairn, cls.__name__) is cls
    assert type(pickle.loads(pickle.dumps(e))) is cls  # pylint: disable=unidiomatic-typecheck


def test_from_status_keeps_an_unknown_code():
    e = errors.from_status("NEW_CODE", "m")
    assert isinstance(e, errors.UnknownError) and e.code == "NEW_CODE"


def test_agent_async_save_and_load(cairnd, start_agent):
    agent = start_agent(cairnd.address)
    src = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd = _cairn.StateDict()
    _whole(sd, "x", "float32", src)
    sd.add_bytes("rng", b"state")
    ac = _cairn.AgentCheckpointer(agent.socket, cairnd.address, "agent-job",
                                  0, 1)
    fut = ac.async_save(5, sd)
    assert fut.step == 5
    assert ac.last_save_stats["bytes"] >= src.numel() * 4
    info = fut.wait(timeout=120.0)
    assert (info.step, info.state) == (5, "COMMITTED")
    assert fut.done()
    assert fut.wait().step == 5

    dst_t = torch.zeros(4, 6)
    dst = _cairn.StateDict()
    _rows(dst, "x", "float32", [dst_t[:1], dst_t[1:]], [4, 6])
    dst.add_bytes("rng")
    # Views of one tensor: rows [0:1] and [1:4] are contiguous slices.
    assert ac.load(dst) == 5
    assert torch.equal(dst_t, src)
    assert dst.get_bytes("rng") == b"state"
    assert ac.last_load_source in ("agent_memory", "storage")
    with pytest.raises(cairn.InvalidArgumentError, match="timeout"):
        fut.wait(timeout=-1.0)


def _stub_classes():
    """{class name: set of public member names} declared in _cairn.pyi."""
    import ast  # pylint: disable=import-outside-toplevel
    import pathlib  # pylint: disable=import-outside-toplevel
    tree = ast.parse(pathlib.Path(_cairn.__file__).with_name(
        "_cairn.pyi").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                n.name for n in node.body
                if isinstance(n, ast.FunctionDef) and
                (not n.name.startswith("_") or n.name in ("__len__",))}
    return out


def test_stubs_match_the_extension_and_everything_has_a_docstring():
    stubs = _stub_classes()
    public = {n for n in dir(_cairn) if not n.startswith("_")}
    assert set(stubs) == public
    for name, members in stubs.items():
        cls = getattr(_cairn, name)
        assert cls.__doc__ and len(cls.__doc__.strip()) > 20, name
        actual = {m for m in vars(cls) if not m.startswith("_")}
        if "__len__" in vars(cls):
            actual.add("__len__")
        assert members == actual, name
        # Methods carry their own docstring; attributes are described in
        # the class docstring.
        for m in actual - {"__len__"}:
            if isinstance(vars(cls)[m], property):
                assert vars(cls)[m].__doc__ or m in cls.__doc__, (
                    f"{name}.{m} is documented nowhere")
            else:
                assert len(getattr(cls, m).__doc__) > 80, f"{name}.{m}"


def _signature_defaults(fn):
    """{keyword: default} of the signature pybind11 reports for `fn` (the
    first line of its docstring)."""
    import ast  # pylint: disable=import-outside-toplevel
    line = fn.__doc__.splitlines()[0]
    params, depth, cur = [], 0, ""
    for ch in line[line.index("(") + 1:line.rindex(")")]:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            params.append(cur)
            cur = ""
        else:
            cur += ch
    params.append(cur)
    return {p.split(":")[0].strip(): ast.literal_eval(p.split("=", 1)[1].strip())
            for p in params if "=" in p}


def _stub_init_defaults(cls_name):
    """{keyword: default node} of __init__'s keyword-only parameters in
    _cairn.pyi."""
    import ast  # pylint: disable=import-outside-toplevel
    import pathlib  # pylint: disable=import-outside-toplevel
    tree = ast.parse(pathlib.Path(_cairn.__file__).with_name(
        "_cairn.pyi").read_text())
    cls = next(n for n in tree.body
               if isinstance(n, ast.ClassDef) and n.name == cls_name)
    init = next(n for n in cls.body
                if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return {a.arg: d for a, d in zip(init.args.kwonlyargs,
                                     init.args.kw_defaults)}


@pytest.mark.parametrize("cls", [_cairn.Checkpointer, _cairn.AgentCheckpointer])
def test_keyword_defaults_come_from_libcairn_alone(cls):
    """The keyword defaults are libcairn's options (default_options(), read
    from a default-constructed CheckpointerOptions/AgentCheckpointerOptions):
    the extension's signature has exactly them, the stub writes none of
    them out (`...`, or None for the environment's), and the Python layer
    names every keyword."""
    import ast  # pylint: disable=import-outside-toplevel
    native = cls.default_options()
    assert native["io_threads"] >= 1 and native["rpc_timeout"] > 0
    assert _signature_defaults(cls.__init__) == native
    stub = _stub_init_defaults(cls.__name__)
    assert set(stub) == set(native)
    for name, node in stub.items():
        assert isinstance(node, ast.Constant), name
        want = None if native[name] is None else Ellipsis
        assert node.value is want, (
            f"_cairn.pyi: {cls.__name__}(... {name}={node.value!r}): a "
            f"default written out can drift from libcairn's "
            f"({native[name]!r}); write ...")
    for name in native:
        assert name in cairn.Checkpointer.__doc__, name
    agent_only = set(_cairn.AgentCheckpointer.default_options()) - set(
        _cairn.Checkpointer.default_options())
    assert agent_only == {"copy_threads", "wait_for_space", "allow_streaming"}
    # Without an agent they are refused, naming them.
    with pytest.raises(cairn.InvalidArgumentError, match="copy_threads"):
        cairn.Checkpointer("127.0.0.1:1", "j", 0, 1, copy_threads=2)


def test_cancel_before_a_save_cancels_it_once(cairnd):
    """cancel() with nothing running cancels the next save (CancelledError
    naming rank, job and step); the save after that runs normally."""
    ckpt = _ckpt(cairnd, job="cancel-job")
    _, sd = _source_state(np.random.default_rng(6))
    ckpt.cancel()
    with pytest.raises(cairn.CancelledError) as e:
        ckpt.save(1, sd)
    assert "cancel-job" in e.value.message and "rank 0" in e.value.message
    assert e.value.code == "CANCELLED"
    assert ckpt.save(1, sd).state == "COMMITTED"


# Rank 0 of a 2-rank save whose rank 1 never comes: it waits in BeginSave
# until SIGINT. Prints what happened; the checkpointer stays usable.
_SIGINT_RANK0 = """
import signal, sys
import numpy as np
from cairn import _cairn
signal.signal(signal.SIGINT, signal.default_int_handler)
a = np.full(4, 9, np.int32)
sd = _cairn.StateDict()
sd.add_chunks("t", "int32", [8], [([0], [4], a.ctypes.data, a.nbytes)])
ckpt = _cairn.Checkpointer(sys.argv[1], "sigint", 0, 2)
try:
    info = ckpt.save(2, sd)
    print("returned", info, flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    print("steps", [i.step for i in ckpt.list()], flush=True)
"""


def test_ctrl_c_during_save_aborts_it_and_the_previous_step_stays(
        cairn_bin, tmp_path):
    import os  # pylint: disable=import-outside-toplevel
    import signal  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    import harness  # pylint: disable=import-outside-toplevel
    # A long begin deadline: only the cancel can end rank 0's wait.
    server = harness.Cairnd.start(
        cairn_bin, tmp_path, flags=["--log-level", "debug",
                                    "--begin-deadline", "3600"])
    proc = None
    try:
        # Step 1 by both ranks.
        parts = [np.arange(4, dtype=np.int32) + 100 * r for r in range(2)]
        results = {}

        def save1(rank):
            sd = _cairn.StateDict()
            sd.add_chunks("t", "int32", [8], [([4 * rank], [4]) +
                                              _ptr(parts[rank])])
            results[rank] = _cairn.Checkpointer(server.address, "sigint", rank,
                                                2).save(1, sd)
        threads = [threading.Thread(target=save1, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results[0].state == results[1].state == "COMMITTED", results

        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-c", _SIGINT_RANK0, server.address],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ))
        # Wait until cairnd has rank 0 parked in BeginSave for step 2.
        while "step 2 joined the save" not in server.log.read_text():
            assert proc.poll() is None, proc.communicate()
            threading.Event().wait(0.05)
        proc.send_signal(signal.SIGINT)
        # Without the cancel it would wait for the begin deadline (1 h).
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err)
        assert out.splitlines()[0] == "KeyboardInterrupt", (out, err)
        assert out.splitlines()[1] == "steps [1]", (out, err)

        ckpt = _cairn.Checkpointer(server.address, "sigint", 0, 1)
        states = {i.step: i for i in ckpt.list(include_uncommitted=True)}
        assert states[2].state == "ABORTED", states[2]
        assert "rank 0" in states[2].abort_reason
        assert "cancel" in states[2].abort_reason
        assert ckpt.latest_step() == 1
        back = np.zeros(8, np.int32)
        dst = _cairn.StateDict()
        _whole(dst, "t", "int32", back)
        assert ckpt.load(dst) == 1
        np.testing.assert_array_equal(back, np.concatenate(parts))
    except BaseException:
        print(f"==== cairnd log:\n{server.log_tail()}")
        raise
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        server.kill()


def test_save_future_wait_times_out_while_the_save_cannot_commit(
        cairnd, start_agent):
    """Rank 0 of 2 saves through the agent; rank 1 never does, so the save
    cannot commit: done() is False and wait(timeout) raises
    DeadlineExceededError naming job, rank and step (not the agent's
    internal wait slice)."""
    agent = start_agent(cairnd.address)
    a = np.arange(4, dtype=np.float32)
    sd = _cairn.StateDict()
    sd.add_chunks("x", "float32", [8], [([0], [4]) + _ptr(a)])
    ac = _cairn.AgentCheckpointer(agent.socket, cairnd.address, "lonely", 0,
                                  2)
    fut = ac.async_save(3, sd)
    assert not fut.done()
    with pytest.raises(cairn.DeadlineExceededError) as e:
        fut.wait(timeout=1.5)
    assert "job 'lonely' rank 0 step 3" in e.value.message
    assert "1.5s" in e.value.message
    assert not fut.done()


# Rank 0 of a 2-rank resharding load whose rank 1 never comes: it waits for
# its peer to verify a partly read chunk until SIGINT, which a helper thread
# sends once the main thread is executing the load() line (then inside the
# call, whose GIL release lets the helper run; were the signal to land just
# before the call, KeyboardInterrupt would come from there, never a hang).
_SIGINT_LOAD_RANK0 = """
import os, signal, sys, threading
import numpy as np
from cairn import _cairn
signal.signal(signal.SIGINT, signal.default_int_handler)
ckpt = _cairn.Checkpointer(sys.argv[1], "sigint-load", 0, 2)
main = threading.main_thread().ident

def interrupt_when_loading():
    while sys._current_frames()[main].f_lineno != LOAD_LINE:
        threading.Event().wait(0.01)
    os.kill(os.getpid(), signal.SIGINT)

half = np.zeros((4, 2), np.float32)
sd = _cairn.StateDict()
sd.add_chunks("w", "float32", [4, 4], [([0, 0], [4, 2], half.ctypes.data,
                                       half.nbytes)])
threading.Thread(target=interrupt_when_loading, daemon=True).start()
try:
    step = ckpt.load(sd)  # LOAD_LINE
    print("returned", step, flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    print("latest", ckpt.latest_step(), flush=True)
"""
_SIGINT_LOAD_RANK0 = _SIGINT_LOAD_RANK0.replace(
    "LOAD_LINE:", str(next(
        i for i, line in enumerate(_SIGINT_LOAD_RANK0.splitlines(), 1)
        if line.endswith("# LOAD_LINE"))) + ":")


def test_ctrl_c_during_load_cancels_it(cairn_bin, tmp_path):
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    import harness  # pylint: disable=import-outside-toplevel
    # Long load deadlines: only the cancel can end rank 0's wait for rank 1.
    server = harness.Cairnd.start(
        cairn_bin, tmp_path, flags=["--load-join-grace", "3600",
                                    "--load-verify-deadline", "3600"])
    try:
        w = np.arange(16, dtype=np.float32).reshape(4, 4)
        sd = _cairn.StateDict()
        _whole(sd, "w", "float32", w)
        _cairn.Checkpointer(server.address, "sigint-load", 0, 1).save(1, sd)
        # Without the cancel it would wait for the grace (1 h).
        r = subprocess.run([sys.executable, "-c", _SIGINT_LOAD_RANK0,
                            server.address], capture_output=True, text=True,
                           timeout=120, check=False)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert r.stdout.splitlines() == ["KeyboardInterrupt", "latest 1"], (
            r.stdout, r.stderr)
    except BaseException:
        print(f"==== cairnd log:\n{server.log_tail()}")
        raise
    finally:
        server.kill()


# Daemon threads still inside calls (a query loop; a save parked in
# BeginSave for a rank that never comes) when the interpreter exits.
_DAEMONS_AT_EXIT = """
import sys, threading
import numpy as np
from cairn import _cairn
ckpt = _cairn.Checkpointer(sys.argv[1], "daemon", 0, 1)
parked = _cairn.Checkpointer(sys.argv[1], "daemon2", 0, 2)
a = np.zeros(4, np.int32)
sd = _cairn.StateDict()
sd.add_chunks("t", "int32", [8], [([0], [4], a.ctypes.data, a.nbytes)])
listing, saving = threading.Event(), threading.Event()

def spin():
    while True:
        listing.set()
        ckpt.list()

def save():
    saving.set()
    parked.save(1, sd)

threading.Thread(target=spin, daemon=True).start()
threading.Thread(target=save, daemon=True).start()
listing.wait()
saving.wait()
print("exiting", flush=True)
"""


def test_daemon_threads_inside_calls_do_not_abort_the_exit(cairnd):
    """CPython ends such threads (pthread_exit) when they take the GIL back;
    the binding takes it back outside destructors, so the process exits
    normally instead of std::terminate (SIGABRT)."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", _DAEMONS_AT_EXIT,
                            cairnd.address], capture_output=True, text=True,
                           timeout=120, check=False)
        assert (r.returncode, r.stdout) == (0, "exiting\n"), r.stderr


def test_a_state_dict_in_use_by_a_save_cannot_change(cairnd):
    """While rank 0's save waits for rank 1 (GIL released), another thread
    can neither add to its StateDict nor load into it; reads are fine, and
    it is usable again once the save returns."""
    a = np.arange(4, dtype=np.int32)
    sd = _cairn.StateDict()
    sd.add_chunks("t", "int32", [8], [([0], [4]) + _ptr(a)])
    sd.add_bytes("meta", b"m")
    results = {}

    def save(rank, state):
        try:
            results[rank] = _cairn.Checkpointer(cairnd.address, "in-use", rank,
                                                2).save(1, state)
        except BaseException as e:  # pylint: disable=broad-except
            results[rank] = e
    t0 = threading.Thread(target=save, args=(0, sd))
    t0.start()
    refused, probes = None, 0
    while refused is None and t0.is_alive():
        try:
            sd.add_bytes(f"probe{probes}", b"")  # before the save started
            probes += 1
        except cairn.FailedPreconditionError as e:
            refused = e
    assert refused is not None, results.get(0)
    assert f"add_bytes('probe{probes}')" in refused.message
    assert "running save" in refused.message
    with pytest.raises(cairn.FailedPreconditionError, match="add_chunks"):
        sd.add_chunks("u", "int32", [1], [])
    with pytest.raises(cairn.FailedPreconditionError, match="running save"):
        _ckpt(cairnd, job="other").load(sd)
    assert sd.get_bytes("meta") == b"m"

    b = np.arange(4, dtype=np.int32) + 4
    sd1 = _cairn.StateDict()
    sd1.add_chunks("t", "int32", [8], [([4], [4]) + _ptr(b)])
    t1 = threading.Thread(target=save, args=(1, sd1))
    t1.start()
    t0.join()
    t1.join()
    assert results[0].state == results[1].state == "COMMITTED", results
    sd.add_bytes("after", b"")
    assert len(sd) == 3 + probes
