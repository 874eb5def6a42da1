"""The ZooKeeper Java client (3.9.3, the one Pulsar 4.0.7 ships) and Apache Curator's recipes
(5.x) through their public APIs against TableKeeper's ZooKeeper port, each run beside the same
driver against a real ZooKeeper of the same release (3.9.3, deploy/zookeeper.sh with Pulsar's
jars): every observation must be the one the real ZooKeeper gives (drivers in
tests/compat/zookeeper_java, built with Maven).

One TableKeeper and one ZooKeeper for the module; the two drivers' runs against them overlap.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.compat.zookeeper_compat import (
    RUNTIME_REASON,
    STANDALONE_REASON,
    ZooKeeperPair,
    maven_classpath,
    start_pair,
    zookeeper_3_9,
)

pytestmark = [
    pytest.mark.standalone_only(STANDALONE_REASON),
    pytest.mark.default_runtime_only(RUNTIME_REASON),
]

MODULE = Path(__file__).parent / "zookeeper_java"
JAR = MODULE / "target" / "zookeeper-java-compat-0.1.0.jar"
PACKAGE = "io.tablekeeper.compat.zookeeper"
RUN_TIMEOUT_S = 600.0  # a hang guard: a run takes about 20 s on an idle machine

# Calls the client refuses itself, before anything is sent.
CLIENT_SIDE = {"create.bad_path": "IllegalArgumentException: Path must not end with / character"}

# What Curator's recipes must achieve, on either server.
CURATOR_OUTCOMES = {
    "mutex": "max_holders=1 counter=100 lock_nodes_left=0",
    "mutex.holder_killed": (
        "waited_while_held=true acquired_after_holder_died=true lock_nodes_while_held=1 "
        "lock_nodes_left=0"
    ),
    "leaderLatch": "participants=3 agreed=true first_is_leader=true next_differs=true",
    "curatorCache": (
        "initial [create /=root, create /before=b] then [create /a=1, create /b=, "
        "create /b/c=2, change /a=3, delete /before] content {/=root, /a=3, /b=, /b/c=2}"
    ),
    "treeCache": (
        "initial [INITIALIZED, NODE_ADDED /, NODE_ADDED /x, NODE_ADDED /x/y, NODE_ADDED /x/y/z] "
        "then [NODE_UPDATED /x/y/z, NODE_REMOVED /x/y/z, NODE_REMOVED /x/y, NODE_ADDED /end] "
        "children_of_x []"
    ),
    "distributedAtomicLong": "value=60 failed_increments=0 cas=true:100 stale_cas=false",
    "persistentNode": "first_owner_is_session=true new_owner_is_new_session=true data=here",
    "persistentWatcher": (
        "[NodeCreated /a, NodeCreated /a/b, NodeDataChanged /a/b, NodeDeleted /a/b, "
        "NodeDeleted /a, NodeCreated /end]"
    ),
    "sharedCount": "b_heard=5 stale_set=false fresh_set=true a=6",
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperPair]:
    started = start_pair(tmp_path_factory.mktemp("zookeeper-java"), zookeeper_env=zookeeper_3_9())
    yield started
    started.stop()


@pytest.fixture(scope="module")
def classpath() -> str:
    assert shutil.which("java"), "the ZooKeeper Java compatibility tests need java (17) on PATH"
    return maven_classpath(MODULE, JAR)


def run_driver(classpath: str, main: str, hosts: str) -> dict[str, dict[str, str]]:
    """Run a driver against `hosts` under a base path of its own: its observations by check."""
    base = f"/java-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", classpath,
         "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", f"{PACKAGE}.{main}", hosts, base],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, f"{main} against {hosts} exited {done.returncode}:\n{done.stderr}"
    observations: dict[str, dict[str, str]] = {}
    for line in done.stdout.splitlines():
        seen = json.loads(line)
        observations[seen.pop("check")] = seen
    assert observations, f"{main} observed nothing:\n{done.stderr[-4000:]}"
    return observations


def both(
    pair: ZooKeeperPair, classpath: str, main: str
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """The driver's observations against the real ZooKeeper and against TableKeeper."""
    with ThreadPoolExecutor(2) as pool:
        real = pool.submit(run_driver, classpath, main, pair.zookeeper_hosts)
        ours = pool.submit(run_driver, classpath, main, pair.tablekeeper_hosts)
        return real.result(), ours.result()


def client_side_failures(observations: dict[str, dict[str, str]]) -> dict[str, str]:
    """Checks that threw something other than a KeeperException (a driver or set-up failure: a
    KeeperException's code is an upper-case name)."""
    return {
        name: seen["error"]
        for name, seen in observations.items()
        if "error" in seen and not seen["error"].isupper()
    }


def test_the_zookeeper_java_client_sees_what_a_real_zookeeper_shows_it(
    pair: ZooKeeperPair, classpath: str
) -> None:
    real, ours = both(pair, classpath, "ZooKeeperClientCompat")
    assert client_side_failures(real) == CLIENT_SIDE, "the driver fails against a real ZooKeeper"
    assert len(real) >= 45, sorted(real)
    assert sorted(ours) == sorted(real)
    differences = {
        name: {"zookeeper": real[name], "tablekeeper": ours[name]}
        for name in real
        if real[name] != ours[name]
    }
    assert differences == {}


def test_curator_recipes_work_as_on_a_real_zookeeper(pair: ZooKeeperPair, classpath: str) -> None:
    real, ours = both(pair, classpath, "CuratorRecipesCompat")
    expected = {name: {"value": outcome} for name, outcome in CURATOR_OUTCOMES.items()}
    assert real == expected, "the driver's expectations do not hold on a real ZooKeeper"
    assert ours == expected
