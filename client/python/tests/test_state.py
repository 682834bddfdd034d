"""cairn.state: flattening nested state_dicts into fqns and back (oracle
tests on random nested dicts against a plain recursive reference), name
collisions, and what becomes of each kind of leaf (tensors, arrays,
pickled objects, bad leaves named by fqn)."""

import random

import numpy as np
import pytest
import torch

import cairn
from cairn import state

# ------------------------------------------------------------------ oracle


def reference_flatten(node, prefix=""):
    """The obvious recursive definition: dicts are walked, lists walked when
    they hold a tensor or array at any depth, everything else is a leaf."""
    def holds(v):
        if isinstance(v, (torch.Tensor, np.ndarray)):
            return True
        if isinstance(v, dict):
            return any(holds(x) for x in v.values())
        if isinstance(v, list):
            return any(holds(x) for x in v)
        return False

    out = []
    items = (node.items() if isinstance(node, dict) else enumerate(node))
    for k, v in items:
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) or (isinstance(v, list) and holds(v)):
            out.extend(reference_flatten(v, name))
        else:
            out.append((name, v))
    return out


def reference_paths(node, prefix="", path=()):
    """(fqn, path of keys) of every leaf, by the same rule."""
    flat = reference_flatten(node, prefix)
    out = []
    items = (node.items() if isinstance(node, dict) else enumerate(node))
    for k, v in items:
        name = f"{prefix}.{k}" if prefix else str(k)
        if any(n == name for n, _ in flat):
            out.append((name, path + (k,)))
        else:
            out.extend(reference_paths(v, name, path + (k,)))
    return out


def random_leaf(rng):
    kind = rng.randrange(8)
    if kind == 0:
        return torch.randn(rng.randrange(0, 4), rng.randrange(1, 3))
    if kind == 1:
        return np.arange(rng.randrange(0, 5), dtype=np.int16)
    if kind == 2:
        return rng.randrange(-5, 1000)
    if kind == 3:
        return rng.random()
    if kind == 4:
        return "s" * rng.randrange(4)
    if kind == 5:
        return (rng.randrange(9), "t")
    if kind == 6:
        return [rng.randrange(5) for _ in range(rng.randrange(3))]
    return None


def random_tree(rng, depth):
    """A nested dict with str and int keys (no dots: no collisions), lists
    of tensors, lists without tensors, empty dicts."""
    node = {}
    used = set()
    for _ in range(rng.randrange(0 if depth else 1, 5)):
        key = rng.choice([rng.randrange(6), f"k{rng.randrange(6)}",
                          f"w_{rng.randrange(3)}"])
        if str(key) in used:
            continue
        used.add(str(key))
        r = rng.random()
        if depth < 4 and r < 0.3:
            node[key] = random_tree(rng, depth + 1)
        elif depth < 4 and r < 0.4:
            node[key] = [random_leaf(rng) if rng.random() < 0.5 else
                         torch.zeros(2) for _ in range(rng.randrange(4))]
        else:
            node[key] = random_leaf(rng)
    return node


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b) and
                all(same(a[k], b[k]) for k in a))
    if isinstance(a, list):
        return (isinstance(b, list) and len(a) == len(b) and
                all(same(x, y) for x, y in zip(a, b)))
    return a == b


def test_flatten_matches_the_reference_on_random_trees():
    rng = random.Random(20261123)
    for case in range(400):
        tree = random_tree(rng, 0)
        want = reference_flatten(tree)
        got = state.flatten(tree)
        assert list(got) == [n for n, _ in want], (case, tree)
        for (name, value), (gname, gvalue) in zip(want, got.items()):
            assert name == gname and gvalue is value, (case, name)


def test_unflatten_inverts_flatten_on_random_trees():
    rng = random.Random(7)
    for case in range(400):
        tree = random_tree(rng, 0)
        flat = state.flatten(tree)
        back = state.unflatten(flat, tree)
        assert same(back, tree), case
        # New values land exactly where their fqn says.
        marked = state.unflatten({k: ("mark", k) for k in flat}, tree)
        for name, path in reference_paths(tree):
            node = marked
            for key in path:
                node = node[key]
            assert node == ("mark", name), (case, name)


def test_dict_subclasses_are_walked_and_rebuilt():
    import collections  # pylint: disable=import-outside-toplevel
    dd = collections.defaultdict(list, {"a": torch.ones(1), "b": [1]})
    od = collections.OrderedDict([("z", dd), ("y", 2)])
    assert list(state.flatten({"m": od})) == ["m.z.a", "m.z.b", "m.y"]
    back = state.unflatten(state.flatten({"m": od}), {"m": od})
    assert type(back["m"]) is collections.OrderedDict
    assert same(back, {"m": od})


def test_unflatten_names_a_missing_fqn():
    with pytest.raises(cairn.InvalidArgumentError) as e:
        state.unflatten({"a": 1}, {"a": 0, "b": {"c": 2}})
    assert "'b.c'" in e.value.message


def test_collisions_name_both_paths():
    cases = [
        ({"a.b": 1, "a": {"b": 2}}, "['a.b']", "['a']['b']", "a.b"),
        ({"x": {0: 1, "0": 2}}, "['x'][0]", "['x']['0']", "x.0"),
        ({"m": [torch.ones(1), 5], "m.1": 3}, "['m'][1]", "['m.1']", "m.1"),
    ]
    for tree, first, second, fqn in cases:
        with pytest.raises(cairn.InvalidArgumentError) as e:
            state.flatten(tree)
        msg = e.value.message
        assert first in msg and second in msg and f"'{fqn}'" in msg, msg


def test_random_dotted_keys_collide_exactly_when_names_repeat():
    rng = random.Random(3)
    for _ in range(300):
        tree = {}
        for _ in range(rng.randrange(1, 6)):
            parts = [rng.choice("ab") for _ in range(rng.randrange(1, 3))]
            if rng.random() < 0.5:
                tree[".".join(parts)] = 1
            else:
                node = tree
                for p in parts[:-1]:
                    if not isinstance(node.get(p), dict):
                        node[p] = {}
                    node = node[p]
                node[parts[-1]] = 2
        names = [n for n, _ in reference_flatten(tree)]
        if len(set(names)) == len(names):
            assert list(state.flatten(tree)) == names
        else:
            with pytest.raises(cairn.InvalidArgumentError):
                state.flatten(tree)


def test_top_level_must_be_a_dict():
    with pytest.raises(cairn.InvalidArgumentError) as e:
        state.flatten([torch.ones(1)])
    assert "list" in e.value.message


# ------------------------------------------------------------------ leaves


def test_prepare_save_counts_tensors_and_pickled_entries():
    sd = {"w": torch.ones(2, 3), "nc": torch.ones(3, 2).t(),
          "a": np.zeros(4), "step": 5, "opt": {"groups": [{"lr": 0.1}]}}
    prep = state.prepare_save(sd)
    assert len(prep.state) == 5
    assert prep.fqns == ["w", "nc", "a", "step", "opt.groups"]
    # Zero copy for the contiguous tensor: its own memory is borrowed.
    assert any(b is sd["w"] or (isinstance(b, torch.Tensor) and
                                b.data_ptr() == sd["w"].data_ptr())
               for b in prep.keep)
    snap = state.prepare_save(sd, snapshot=True)
    assert all(b.data_ptr() != sd["w"].data_ptr() for b in snap.keep
               if isinstance(b, torch.Tensor))


def test_non_cpu_tensor_names_fqn_device_and_where():
    sd = {"model": {"w": torch.empty(2, device="meta")}}
    with pytest.raises(cairn.InvalidArgumentError) as e:
        state.prepare_save(sd, "save of job 'j' step 4 rank 1")
    msg = e.value.message
    assert "'model.w'" in msg and "meta" in msg
    assert "job 'j' step 4 rank 1" in msg
    with pytest.raises(cairn.InvalidArgumentError) as e:
        state.prepare_load(sd, "load of job 'j' step 4 rank 1")
    assert "'model.w'" in e.value.message and "meta" in e.value.message


def test_unpicklable_and_unsupported_leaves_are_named():
    with pytest.raises(cairn.InvalidArgumentError) as e:
        state.prepare_save({"hooks": {"f": lambda x: x}})
    assert "'hooks.f'" in e.value.message and "function" in e.value.message
    with pytest.raises(cairn.InvalidArgumentError) as e:
        state.prepare_save({"c": torch.zeros(2, dtype=torch.complex64)})
    assert "'c'" in e.value.message and "complex64" in e.value.message


def test_read_only_array_cannot_be_loaded_into():
    a = np.zeros(3)
    a.setflags(write=False)
    with pytest.raises(cairn.InvalidArgumentError) as e:
        state.prepare_load({"x": {"a": a}})
    assert "'x.a'" in e.value.message and "read-only" in e.value.message


def test_dtensor_needs_a_torch_that_has_it():
    has = False
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        try:
            module = __import__(name, fromlist=["DTensor"])
            has = has or hasattr(module, "DTensor")
        except ImportError:
            pass
    if not has:
        pytest.skip(f"torch {torch.__version__} has no DTensor "
                    f"(torch.distributed.tensor / torch.distributed._tensor)")
    assert state.is_dtensor(torch.zeros(1)) is False
