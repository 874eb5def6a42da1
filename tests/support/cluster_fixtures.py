"""The pytest fixtures of `TestCluster` (tests/support/cluster.py): tests/conftest.py loads this
module as a plugin, so `make_cluster` is there for every test module.

    cluster = cluster_fixture(3)            # a module-scoped fixture: a started 3-server cluster

    def test_failover(make_cluster: Callable[..., TestCluster]) -> None:
        c = make_cluster(containers=4).start(2)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.cluster import TestCluster
from tests.support.pulsar import PulsarService


@pytest.fixture
def make_cluster(
    tmp_path_factory: pytest.TempPathFactory, pulsar_service: PulsarService
) -> Iterator[Callable[..., TestCluster]]:
    """`make_cluster(**TestCluster options)` -> a not yet started `TestCluster`; call
    `.start(n)`. Every cluster made is closed at the end of the test."""
    made: list[TestCluster] = []

    def make(**options: Any) -> TestCluster:
        cluster = TestCluster(tmp_path_factory.mktemp("cluster"), pulsar_service, **options)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def cluster_fixture(n: int, *, scope: Any = "module", **options: Any) -> Any:
    """A fixture of `scope` (default module) yielding a started `n`-server `TestCluster`:

    cluster = cluster_fixture(3, containers=8)   # at module level of a test module
    """

    @pytest.fixture(scope=scope)
    def fixture(
        tmp_path_factory: pytest.TempPathFactory, pulsar_service: PulsarService
    ) -> Iterator[TestCluster]:
        cluster = TestCluster(tmp_path_factory.mktemp("cluster"), pulsar_service, **options)
        try:
            yield cluster.start(n)
        finally:
            cluster.close()

    return fixture
