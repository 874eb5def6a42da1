"""Fixtures shared by all test tiers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pulsar_fixtures import pulsar_service  # noqa: F401 (a session fixture)
from tests.support.server import ServerProcess

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the SDK-only environment of `make test-floors` has no hypothesis
    pass
else:
    # Property tests judge what they draw, never how fast: on a busy machine drawing an input
    # or running an example may take seconds, which is no failure of the code under test.
    settings.register_profile(
        "tablekeeper", deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.load_profile("tablekeeper")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reverse",
        action="store_true",
        help="run the selected tests in reverse order: a test that relies on what an earlier "
        "test of its module left behind (a key, a revision, a count) fails",
    )


@pytest.hookimpl(trylast=True)  # after pytest has grouped the tests by their shared fixtures
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("reverse"):
        items.reverse()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pulsar: needs a real Pulsar (started by the `pulsar_service` fixture)"
    )
    # The `make_cluster` fixture. Its module imports our protos, which a run of only the compat
    # tests must not load (tests/compat/__init__.py).
    compat = Path(__file__).resolve().parent / "compat"
    args = [Path(config.invocation_params.dir, a.split("::")[0]).resolve() for a in config.args]
    if not (args and all(a.is_relative_to(compat) for a in args)):
        config.pluginmanager.import_plugin("tests.support.cluster_fixtures")


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Make servers with `ServerProcess(tmp_path / "name").start()`; all are stopped at the end.

    Yields the list the test appends its servers to.
    """
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        if server.process is not None and server.process.poll() is None:
            server.kill()


@pytest.fixture
def server(tmp_path: Path, server_factory: list[ServerProcess]) -> ServerProcess:
    """A fresh standalone server on free ports with its own data directory."""
    s = ServerProcess(tmp_path / "data")
    server_factory.append(s)
    return s.start()
