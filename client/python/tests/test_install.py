"""The wheel the build makes (build/dist/cairn-*.whl) installs into a fresh
venv and works from outside the source and build trees: no PYTHONPATH, no
build tree. The venv is new and empty but for torch, which it sees through
a .pth file naming the project environment's site-packages (what "a venv
that has torch" means without installing several GB again); cairn itself
comes only from the wheel (the extension finds the libcairn.so.0 the wheel
carries beside it). Saves and loads through both APIs."""

import os
import pathlib
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed.checkpoint as dcp
    import cairn
    import cairn.torch as ctorch
    print(cairn.__file__)
    ckpt = cairn.Checkpointer(sys.argv[1], "install-job", 0, 1)
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    info = ckpt.save(4, {"a": a, "meta": {"from": "wheel"}})
    assert info.state == "COMMITTED", info
    back = {"a": torch.zeros(3, 4), "meta": {"from": None}}
    assert ckpt.load(back) == 4
    assert torch.equal(back["a"], a) and back["meta"] == {"from": "wheel"}
    dcp.save({"w": a * 2}, storage_writer=ctorch.CairnStorageWriter(),
             checkpoint_id=f"cairn://{sys.argv[1]}/install-job/5")
    got = {"w": torch.zeros(3, 4)}
    dcp.load(got, storage_reader=ctorch.CairnStorageReader(),
             checkpoint_id=f"cairn://{sys.argv[1]}/install-job/latest")
    assert torch.equal(got["w"], a * 2)
    try:
        ckpt.describe(99)
    except cairn.NotFoundError as e:
        print("not found:", e.message)
    print("ok")
""")


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, (f"{' '.join(map(str, cmd))} failed "
                               f"({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


# What a manylinux wheel may take from the machine (PEP 600's policies).
_SYSTEM_LIBS = {"linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6",
                "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0",
                "libresolv.so.2", "libstdc++.so.6", "libgcc_s.so.1",
                "libz.so.1"}


def _assert_self_contained(lib: pathlib.Path, site: pathlib.Path):
    out = _run(["ldd", str(lib)]).stdout
    assert "not found" not in out, f"{lib}: missing libraries:\n{out}"
    outside = []
    for line in out.splitlines():
        name, _, where = line.strip().partition(" => ")
        path = where.split(" (")[0].strip() if where else ""
        if path and pathlib.Path(path).resolve().is_relative_to(site):
            continue
        if pathlib.Path(name.split(" (")[0]).name not in _SYSTEM_LIBS:
            outside.append(line.strip())
    assert not outside, (f"{lib.name} loads libraries from outside the wheel "
                         f"(not in the manylinux base set):\n" +
                         "\n".join(outside))


def _wheel() -> pathlib.Path:
    wheel_dir = pathlib.Path(os.environ["CAIRN_WHEEL_DIR"])
    wheels = sorted(wheel_dir.glob("cairn-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {wheel_dir}: {wheels}"
    return wheels[0]


def test_the_wheel_carries_the_extension_and_libcairn():
    names = zipfile.ZipFile(_wheel()).namelist()
    assert "cairn/libcairn.so.0" in names, names
    # auditwheel grafted the C++ libraries libcairn links, and tagged it.
    grafted = [n for n in names if n.startswith("cairn.libs/")]
    for lib in ("libgrpc++", "libprotobuf", "libabsl_status", "libcurl"):
        assert any(n.startswith(f"cairn.libs/{lib}-") for n in grafted), (
            lib, grafted)
    assert "manylinux" in _wheel().name, _wheel().name
    assert any(n.startswith("cairn/_cairn") and n.endswith(".so")
               for n in names), names
    for n in ("cairn/__init__.py", "cairn/torch.py", "cairn/_cairn.pyi",
              "cairn/py.typed"):
        assert n in names, (n, names)
    assert not any("/tests/" in n or n.startswith("tests/") for n in names)


def test_pip_install_the_wheel_into_a_fresh_venv_and_use_it_elsewhere(
        cairnd, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    # torch from the project environment, nothing else of it.
    site = _run([str(py), "-c", "import sysconfig; "
                 "print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    torch_site = pathlib.Path(sysconfig.get_paths()["purelib"])
    assert (torch_site / "torch").is_dir(), torch_site
    (pathlib.Path(site) / "project-torch.pth").write_text(f"{torch_site}\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_NO_INDEX"] = "1"
    _run([str(py), "-m", "pip", "install", "--no-index", "--no-deps",
          str(_wheel())], env=env, cwd=tmp_path)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    (workdir / "use_cairn.py").write_text(_SCRIPT)
    out = _run([str(py), "use_cairn.py", cairnd.address], env=env,
               cwd=workdir).stdout.splitlines()
    installed = pathlib.Path(out[0]).resolve()
    assert installed.is_relative_to(pathlib.Path(site).resolve()), out
    assert "install-job" in out[1] and "99" in out[1], out
    assert out[-1] == "ok"
    pkg = installed.parent
    assert (pkg / "_cairn.pyi").exists() and (pkg / "py.typed").exists()
    assert (pkg / "libcairn.so.0").exists()
    # Self-contained: every library the extension and libcairn load is the
    # wheel's own (auditwheel's cairn.libs) or one of the base system's that
    # the manylinux policy lets a wheel expect (glibc, libstdc++, zlib).
    for lib in [*pkg.glob("_cairn*.so"), pkg / "libcairn.so.0"]:
        _assert_self_contained(lib, pathlib.Path(site).resolve())
    # pip knows it as the distribution "cairn" of the build's version.
    show = _run([str(py), "-m", "pip", "show", "cairn"], env=env).stdout
    version = (pathlib.Path(__file__).parents[3] / "VERSION").read_text().strip()
    assert f"Version: {version}" in show, show
