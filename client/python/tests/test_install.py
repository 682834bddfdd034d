"""The documented install route works: a venv with --system-site-packages
(Debian's torch and numpy visible), `pip install --no-index
--no-build-isolation build/python`, and `import cairn` from outside the
source and build trees, saving and loading through the installed copy
(its extension finds the libcairn.so.0 installed beside it)."""

import os
import pathlib
import subprocess
import textwrap

_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import cairn
    from cairn import _cairn
    print(cairn.__file__)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    sd = _cairn.StateDict()
    sd.add_chunks("a", "float32", [3, 4], [([0, 0], [3, 4], a.ctypes.data,
                                            a.nbytes)])
    sd.add_bytes("meta", b"installed")
    ckpt = cairn.Checkpointer(sys.argv[1], "install-job", 0, 1)
    info = ckpt.save(4, sd)
    assert info.state == "COMMITTED", info
    b = np.zeros((3, 4), np.float32)
    dst = _cairn.StateDict()
    dst.add_chunks("a", "float32", [3, 4], [([0, 0], [3, 4], b.ctypes.data,
                                             b.nbytes)])
    dst.add_bytes("meta")
    assert ckpt.load(dst) == 4
    assert (a == b).all() and dst.get_bytes("meta") == b"installed"
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


def test_pip_install_into_a_venv_and_import_from_elsewhere(cairnd, cairn_bin,
                                                           tmp_path):
    staged = cairn_bin.build_dir / "python"
    assert (staged / "pyproject.toml").exists(), staged
    venv = tmp_path / "venv"
    _run(["/usr/bin/python3", "-m", "venv", "--system-site-packages",
          str(venv)])
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_NO_INDEX"] = "1"
    # pip builds in a copy so the staged tree gets no build/ or egg-info.
    src = tmp_path / "src"
    _run(["cp", "-r", str(staged), str(src)])
    _run([str(py), "-m", "pip", "install", "--no-index",
          "--no-build-isolation", "--no-cache-dir", str(src)], env=env,
         cwd=tmp_path)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    (workdir / "use_cairn.py").write_text(_SCRIPT)
    out = _run([str(py), "use_cairn.py", cairnd.address], env=env,
               cwd=workdir).stdout.splitlines()
    installed = pathlib.Path(out[0]).resolve()
    assert installed.is_relative_to(venv.resolve()), out
    assert "install-job" in out[1] and "99" in out[1], out
    assert out[-1] == "ok"
    # The installed package has the stubs and the typing marker.
    pkg = installed.parent
    assert (pkg / "_cairn.pyi").exists() and (pkg / "py.typed").exists()
    assert (pkg / "libcairn.so.0").exists()
