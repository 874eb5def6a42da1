"""Options and fixtures of the robustness tests.

    pytest tests/robustness                                  # the short run (make test)
    pytest tests/robustness --robustness-seeds 17 --robustness-duration 45 \\
        --robustness-nemesis pause,kill                      # one seed again, as it failed

The environment (ZooKeeper, Pulsar, 3 servers in network namespaces) is started once for the
module. Without root, `ip` or `nft` the tests are skipped, unless TABLEKEEPER_REQUIRE_NETNS=1
(set by the Makefile, which installs the tools): then they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.robustness.harness import Environment, Tools, build_tools
from tests.robustness.netns import NetworkUnavailableError, check_available

REQUIRE_ENV = "TABLEKEEPER_REQUIRE_NETNS"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("robustness")
    group.addoption("--robustness-seeds", default="", help="comma-separated seeds to run")
    group.addoption("--robustness-duration", type=float, default=0.0, help="seconds per seed")
    group.addoption("--robustness-nemesis", default="", help="comma-separated fault kinds")


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(f"network namespaces are required ({REQUIRE_ENV}) but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def robustness_tools(tmp_path_factory: pytest.TempPathFactory) -> Tools:
    return build_tools(tmp_path_factory.mktemp("robustness-bin"))


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Environment]:
    try:
        check_available()
    except NetworkUnavailableError as exc:
        _unavailable(str(exc))
    env = Environment(tmp_path_factory.mktemp("robustness-env")).start()
    try:
        yield env
    finally:
        env.close()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path
