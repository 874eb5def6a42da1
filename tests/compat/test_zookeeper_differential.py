"""The differential test of ZooKeeper's protocol (tests/compat/zookeeper_differential.py): seeded
random sequences of operations against a real ZooKeeper (3.9.3) and TableKeeper's ZooKeeper
port must give the same traces (errors, paths, data, children, stats, watch events in order;
zxids by their order).

`make test` plays a few seeds (TABLEKEEPER_ZK_DIFFERENTIAL_SEEDS, default 3, of
TABLEKEEPER_ZK_DIFFERENTIAL_OPS operations, default 150); `make test-zookeeper-differential`
plays thousands of operations. One TableKeeper and one ZooKeeper for the module.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.compat.zookeeper_compat import (
    RUNTIME_REASON,
    STANDALONE_REASON,
    ZooKeeperPair,
    start_pair,
)
from tests.compat.zookeeper_differential import TABLEKEEPER_ARGS, differences, zookeeper_env

pytestmark = [
    pytest.mark.standalone_only(STANDALONE_REASON),
    pytest.mark.default_runtime_only(RUNTIME_REASON),
]

SEEDS = int(os.environ.get("TABLEKEEPER_ZK_DIFFERENTIAL_SEEDS", "3"))
FIRST_SEED = int(os.environ.get("TABLEKEEPER_ZK_DIFFERENTIAL_FIRST_SEED", "1"))
OPS = int(os.environ.get("TABLEKEEPER_ZK_DIFFERENTIAL_OPS", "150"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperPair]:
    started = start_pair(
        tmp_path_factory.mktemp("zookeeper-differential"),
        zookeeper_env=zookeeper_env(),
        server_args=TABLEKEEPER_ARGS,
    )
    yield started
    started.stop()


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + SEEDS))
def test_a_seeded_sequence_gets_the_answers_a_real_zookeeper_gives(
    pair: ZooKeeperPair, seed: int
) -> None:
    found = differences(pair.zookeeper.port, pair.port, seed, OPS, uuid.uuid4().hex[:8])
    assert found is None, (
        f"seed {seed} ({OPS} operations; replay: python -m tests.compat.zookeeper_differential "
        f"--first-seed {seed} --seeds 1 --ops {OPS}):\n{found}"
    )
