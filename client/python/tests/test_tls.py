"""TLS and the bearer token from Python (issue 16): cairn.Checkpointer takes
tls_ca/tls_cert/tls_key/token keywords, defaulting to CAIRN_TLS_CA,
CAIRN_TLS_CERT, CAIRN_TLS_KEY and CAIRN_TOKEN, against a real cairnd serving
mutual TLS with certificates made by the openssl CLI
(tests/testing/make_test_certs.sh)."""
import pathlib
import subprocess

import numpy as np
import pytest

import cairn
import harness

JOB = "tls-py"
MAKE_CERTS = (pathlib.Path(__file__).resolve().parents[3] / "tests" /
              "testing" / "make_test_certs.sh")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    subprocess.run(["sh", str(MAKE_CERTS), str(out)], check=True)
    return out


@pytest.fixture
def mtls_cairnd(request, cairn_bin, tmp_path, certs):
    server = harness.Cairnd.start(cairn_bin, tmp_path / "cairnd", [
        "--tls-cert", str(certs / "server.crt"),
        "--tls-key", str(certs / "server.key"),
        "--tls-client-ca", str(certs / "ca.crt")])
    yield server
    server.stop()


def client_kwargs(certs, client="client"):
    return dict(tls_ca=str(certs / "ca.crt"),
                tls_cert=str(certs / f"{client}.crt"),
                tls_key=str(certs / f"{client}.key"))


def test_save_and_load_over_mutual_tls_with_keywords(mtls_cairnd, certs,
                                                     monkeypatch):
    for name in ("CAIRN_TLS_CA", "CAIRN_TLS_CERT", "CAIRN_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    ckpt = cairn.Checkpointer(mtls_cairnd.address, JOB, 0, 1,
                              **client_kwargs(certs))
    state = {"w": np.arange(12, dtype=np.float32), "step": 3}
    info = ckpt.save(3, state)
    assert info.step == 3
    loaded = {"w": np.zeros(12, dtype=np.float32), "step": None}
    ckpt.load(loaded)
    assert np.array_equal(loaded["w"], state["w"]) and loaded["step"] == 3


def test_environment_is_the_default(mtls_cairnd, certs, monkeypatch):
    monkeypatch.setenv("CAIRN_TLS_CA", str(certs / "ca.crt"))
    monkeypatch.setenv("CAIRN_TLS_CERT", str(certs / "client.crt"))
    monkeypatch.setenv("CAIRN_TLS_KEY", str(certs / "client.key"))
    assert cairn.Checkpointer(mtls_cairnd.address, JOB, 0, 1).list() == []
    # A keyword wins over its variable: a client of another CA is refused.
    with pytest.raises(cairn.UnavailableError):
        cairn.Checkpointer(mtls_cairnd.address, JOB, 0, 1, max_retries=0,
                           **client_kwargs(certs, "other-client")).list()


def test_without_client_certificate_is_refused(mtls_cairnd, certs,
                                               monkeypatch):
    for name in ("CAIRN_TLS_CA", "CAIRN_TLS_CERT", "CAIRN_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(cairn.UnavailableError):
        cairn.Checkpointer(mtls_cairnd.address, JOB, 0, 1, max_retries=0,
                           tls_ca=str(certs / "ca.crt")).list()


def test_missing_file_is_named(mtls_cairnd, certs, tmp_path):
    missing = tmp_path / "nope.crt"
    with pytest.raises(cairn.InvalidArgumentError, match=str(missing)):
        cairn.Checkpointer(mtls_cairnd.address, JOB, 0, 1,
                           tls_ca=str(missing))
