"""pytest fixtures shared by the Python tests: real cairnd and cairn-agent
processes (see harness.py). A test fails, never skips, when the binaries are
missing."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import harness  # noqa: E402  pylint: disable=wrong-import-position


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Remembers each phase's report on the item, so fixtures can tell a
    failed test from a passing one at teardown."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


def _failed(request) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return rep is None or rep.failed


@pytest.fixture(scope="session")
def cairn_bin() -> harness.Binaries:
    return harness.Binaries.from_env()


@pytest.fixture
def cairnd(request, cairn_bin, tmp_path):
    """A cairnd of its own for the test, stopped (and its log printed if the
    test failed) afterwards."""
    server = harness.Cairnd.start(cairn_bin, tmp_path)
    yield server
    if _failed(request):
        print(f"\n==== cairnd log ({server.log}):\n{server.log_tail()}")
    server.kill()
    server.delete_storage()


@pytest.fixture
def start_agent(request, cairn_bin, tmp_path):
    """Factory: start_agent(coordinator, node_id=0, num_nodes=1, flags=[])
    -> harness.Agent; every agent started is killed afterwards."""
    agents = []

    def start(coordinator, node_id=0, num_nodes=1, flags=()):
        agent = harness.Agent.start(cairn_bin, tmp_path, coordinator, node_id,
                                    num_nodes, flags)
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        if _failed(request):
            print(f"\n==== cairn-agent {agent.node_id} log:\n"
                  f"{agent.log_tail()}")
        agent.kill()
