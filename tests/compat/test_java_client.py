"""The unmodified BookKeeper Java table client (`stream-storage-java-client` 4.17.2, what Pulsar
4.0.x ships for Functions state) against a real server.

tests/compat/java is a small Maven module: a driver program that runs every check through the
client's public API and prints one JSON object per observation. This file builds it (once; `make
test-compat` builds it first), runs it for both of the client's shapes at the same time against
the `server` fixture (the module's standalone server, or one server of the module's 3-server
cluster with `TABLEKEEPER_TEST_CLUSTER=3`; every run has namespaces of its own) and compares
every observation with what BookKeeper's server makes the client return:

- `routed`: `StorageClientImpl`, the default. It asks `GetStorageContainerEndpoint` where each
  storage container lives and sends every call to its owner, with the `bk-rt-sc-id-bin` header and
  the range id in the body's routing header; only NOT_FOUND is retried.
- `simple`: `enableServerSideRouting(true)`, every call to the service URI with `bk-rt-sc-id-bin`
  = 0 plus `bk-rt-sid-bin`/`bk-rt-key-bin`; it retries any gRPC error but never looks at the status
  in a table response's body (a refused increment or put looks like a success).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.cluster import ClusterServer, Server
from tests.compat.conftest import CLUSTER_KEY
from tests.support.server import SERVER_COMMAND, ServerProcess

pytestmark = pytest.mark.compat

JAVA_DIR = Path(__file__).parent / "java"
TARGET = JAVA_DIR / "target"
JAR = TARGET / "bookkeeper-java-client-compat-0.1.0.jar"
CLASSPATH = TARGET / "classpath.txt"
MAIN_CLASS = "io.tablekeeper.compat.JavaClientCompat"
# Calls each client has in flight at once in each concurrent phase: above the 1,000 unstarted
# calls from which gRPC's default backlog cap began cancelling calls (see rpc/server.py).
CONCURRENT_OPS = {"routed": 2000, "simple": 1000}
DRIVER_TIMEOUT_S = 300.0
TABLE_METHODS = ("Put", "Range", "Delete", "Increment", "Txn")

# What the client returns against BookKeeper's server: check -> (value, error). The error is
# the exception's class, with the gRPC status, KV code or server code after a colon.
EXPECTED: dict[str, tuple[Any, str | None]] = {
    "ns.create": ("{ns}", None),
    "ns.create.duplicate": (None, "NamespaceExistsException"),
    "ns.get.equals_created": (True, None),
    "ns.get.missing": (None, "NamespaceNotFoundException"),
    "ns.delete.missing": (None, "NamespaceNotFoundException"),
    "ns.create.invalid_name": (None, "InvalidNamespaceNameException"),
    "table.create": ("kv id>=1024:true conf_equal:true", None),
    "table.create.duplicate": (None, "StreamExistsException"),
    "table.get.equals_created": (True, None),
    "table.get.missing": (None, "StreamNotFoundException"),
    "table.create.missing_ns": (None, "NamespaceNotFoundException"),
    "table.create.invalid_name": (None, "InvalidStreamNameException"),
    "table.create_delete_get": ("deleted:true then StreamNotFoundException", None),
    "table.delete.missing": (None, "StreamNotFoundException"),
    "table.open.missing": (None, "StreamNotFoundException"),
    "kv.put": (None, None),
    # The default read options: limit -1, revision bounds Long.MIN_VALUE..Long.MAX_VALUE.
    "kv.get.default_options": ("v1", None),
    "kv.getKv": ("k1=v1 version=0 revisions_ok=true", None),
    "kv.put.update": (None, None),
    "kv.getKv.updated": ("k1=v2 version=1 revisions_ok=true", None),
    "kv.get.missing": (None, None),
    "kv.getKv.missing": (None, None),
    "counter.increment": (8, None),
    "counter.incrementAndGet": (10, None),
    "counter.getAndIncrement": (10, None),
    "counter.getKv": ("c=number:11 version=3 revisions_ok=true", None),
    "counter.negative": (-9, None),
    "counter.getNumber.missing": (None, None),
    "counter.getNumber.bytes_key": (None, "KvApiException:ILLEGAL_OP"),
    "counter.increment.bytes_key": (None, "InternalServerException:BAD_REQUEST"),
    "kv.put.number_key": (None, "InternalServerException:BAD_REQUEST"),
    "counter.after_refused_put": (-9, None),
    "kv.delete": ("v2", None),
    "kv.get.deleted": (None, None),
    "kv.delete.missing": (None, None),
    "kv.put.after_delete": ("k1=v3 version=0 revisions_ok=true", None),
    "kv.put.empty_value": ("empty= version=0 revisions_ok=true", None),
    "kv.put.large_value": (True, None),
    "range.put": ("ok", None),
    "range.get.point": ("val-c", None),
    "range.inclusive": ("a=val-a,b=val-b,c=val-c,d=val-d,e=val-e", None),
    "range.limit": ("a=val-a,b=val-b count=2 more=true", None),
    "range.count_only": ("count=4 kvs=0", None),
    "range.delete_range": ("b=val-b,c=val-c,d=val-d", None),
    "range.after_delete_range": ("a=val-a,e=val-e", None),
    "range.other_pkey_untouched": ("other-pkey", None),
    "range.delete.blind": ("prev_kvs=0", None),
    "range.after_blind_delete": ("e=val-e", None),
    "txn.putIfAbsent.absent": (None, None),
    "txn.putIfAbsent.present": ("first", None),
    "txn.putIfAbsent.value": ("first", None),
    "txn.vPut.match": (1, None),
    "txn.vPut.mismatch": (None, "KvApiException:BAD_REVISION"),
    # A version compare on a missing key fails the txn with KEY_NOT_FOUND in the body.
    "txn.vPut.missing_key": (None, "InternalServerException:KEY_NOT_FOUND"),
    "txn.vPut.value": ("t1=v-next version=1 revisions_ok=true", None),
    "txn.delete_if_value.mismatch": (False, None),
    "txn.delete_if_value.match": (True, None),
    "txn.delete_if_value.gone": (None, None),
    "txn.vDelete": ("t2=y version=1 revisions_ok=true", None),
    "txn.vDelete.mismatch": (None, "KvApiException:BAD_REVISION"),
    "txn.rDelete": ("mod_revision_matches:true", None),
    "txn.rDelete.mismatch": (None, "KvApiException:BAD_REVISION"),
    "txn.compares.success": ("success=true [put delete:a=1 range:b=2]", None),
    "txn.compares.applied": ("b=2,c=3", None),
    "txn.compares.failure": ("success=false [range:b=2 put]", None),
    "txn.compares.failure_applied": ("b=2,c=3,e=else", None),
    # Thousands of calls in flight from one client: none fails, every value reads back.
    "concurrent.put.errors": ("", None),
    "concurrent.get.errors": ("", None),
    "concurrent.get.mismatches": (0, None),
    "concurrent.increment.errors": ("", None),
    "concurrent.increment.total": ("{n}", None),
    "concurrent.mixed.errors": ("", None),
    "concurrent.mixed.putIfAbsent_wins": (25, None),
    "concurrent.mixed.counter": ("{n/4}", None),
    "done": (True, None),
}
# Where the server-side-routing client differs: it ignores the body status of table calls, so a
# refused write returns normally (and changes nothing: `counter.after_refused_put` is still -9),
# and a txn answered KEY_NOT_FOUND reads as "compares failed".
SIMPLE_CLIENT: dict[str, tuple[Any, str | None]] = {
    "counter.increment.bytes_key": (None, None),
    "kv.put.number_key": (None, None),
    "txn.vPut.missing_key": (None, "KvApiException:BAD_REVISION"),
}


def _expected(kind: str, namespace: str, n: int) -> dict[str, tuple[Any, str | None]]:
    expected = {**EXPECTED, **(SIMPLE_CLIENT if kind == "simple" else {})}
    placeholders = {"{ns}": namespace, "{n}": n, "{n/4}": n // 4}
    return {
        check: (placeholders.get(value, value) if isinstance(value, str) else value, error)
        for check, (value, error) in expected.items()
    }


def _up_to_date() -> bool:
    if not (JAR.exists() and CLASSPATH.exists()):
        return False
    sources = [JAVA_DIR / "pom.xml", *JAVA_DIR.glob("src/**/*.java")]
    built = min(JAR.stat().st_mtime, CLASSPATH.stat().st_mtime)
    return all(source.stat().st_mtime <= built for source in sources)


@pytest.fixture(scope="session")
def java_driver() -> list[str]:
    """The command that runs the driver (built here unless `make test-compat` built it)."""
    mvn, java = shutil.which("mvn"), shutil.which("java")
    assert mvn and java, "the Java compatibility suite needs mvn and java (Java 17) on PATH"
    if not _up_to_date():
        goals = [
            "-q",
            "-B",
            "package",
            "dependency:build-classpath",
            f"-Dmdep.outputFile={CLASSPATH}",
        ]
        # Offline from the local Maven repository; online only the first time.
        done = subprocess.run(
            [mvn, "-o", *goals], cwd=JAVA_DIR, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            done = subprocess.run(
                [mvn, *goals], cwd=JAVA_DIR, capture_output=True, text=True, check=False
            )
        assert done.returncode == 0, f"mvn failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    classpath = f"{JAR}:{CLASSPATH.read_text().strip()}"
    return [java, "-Xmx512m", "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", classpath, MAIN_CLASS]  # fmt: skip


class Driver:
    """One run of the driver program in the background."""

    def __init__(self, command: list[str], server: Server, kind: str, namespace: str) -> None:
        self.kind = kind
        self.namespace = namespace
        self.n = CONCURRENT_OPS[kind]
        self.process = subprocess.Popen(
            [*command, server.service, kind, namespace, str(self.n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def results(self) -> dict[str, dict[str, Any]]:
        """Every observation by check name; fails on a driver that did not finish."""
        try:
            out, err = self.process.communicate(timeout=DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, err = self.process.communicate()
            pytest.fail(f"{self.kind} driver hung:\n{out[-4000:]}\n{err[-4000:]}")
        self.stderr = err
        observed = {}
        for line in out.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                observed[record["check"]] = record
        assert self.process.returncode == 0 and "done" in observed, (
            f"{self.kind} driver failed ({self.process.returncode}):\n{out[-4000:]}\n{err[-4000:]}"
        )
        return observed

    def check(self) -> None:
        observed = self.results()
        expected = _expected(self.kind, self.namespace, self.n)
        wrong = {
            check: {"expected": {"value": value, "error": error}, "observed": observed.get(check)}
            for check, (value, error) in expected.items()
            if observed.get(check, {}).get("value", "(missing)") != value
            or observed.get(check, {}).get("error", "(missing)") != error
        }
        assert set(observed) == set(expected), set(observed) ^ set(expected)
        assert not wrong, f"{self.kind} client:\n" + json.dumps(wrong, indent=1)


def _metrics(server: ClusterServer) -> dict[tuple[str, str], float]:
    """(metric name, method) -> value, summed over the other labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as response:
        text = response.read().decode()
    totals: dict[tuple[str, str], float] = {}
    for match in re.finditer(r"^(\w+)\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        method = re.search(r'method="(\w+)"', match.group(2))
        if method is not None:
            key = (match.group(1), method.group(1))
            totals[key] = totals.get(key, 0.0) + float(match.group(3))
    return totals


def _table_calls(servers: list[ClusterServer]) -> dict[int, tuple[float, float]]:
    """Per server index: (table calls answered, table calls forwarded to another server) so
    far; the counters count since the server started, so a test compares two readings."""
    calls = {}
    for s in servers:
        metrics = _metrics(s)
        served = sum(metrics.get(("tablekeeper_requests_total", m), 0.0) for m in TABLE_METHODS)
        forwarded = sum(
            metrics.get(("tablekeeper_forwarded_requests_total", m), 0.0) for m in TABLE_METHODS
        )
        calls[s.index] = (served, forwarded)
    return calls


def _calls_since(
    servers: list[ClusterServer], before: dict[int, tuple[float, float]]
) -> Iterator[tuple[int, float, float]]:
    """Per server: (index, table calls answered, table calls forwarded) since `before`."""
    for index, (served, forwarded) in _table_calls(servers).items():
        yield index, served - before[index][0], forwarded - before[index][1]


@pytest.mark.on_cluster("the routed client finds each container's owner; the other is forwarded")
@pytest.mark.on_grpc_aio("thousands of calls in flight on one connection")
def test_java_client(
    request: pytest.FixtureRequest, server: Server, java_driver: list[str]
) -> None:
    cluster = request.node.stash.get(CLUSTER_KEY, None)
    if cluster is None:
        # Standalone: both clients at once, each with its own namespace.
        drivers = [Driver(java_driver, server, kind, f"java_{kind}") for kind in CONCURRENT_OPS]
        for driver in drivers:
            driver.check()
        return
    # Cluster, entered through one server (the module's cluster: the other tests of the module
    # run before or after, never during, so the counters' changes are this test's calls). The
    # routed client alone first: it must have found every container's owner itself, so its
    # table calls reached several servers and none of them had to forward one.
    before = _table_calls(cluster.servers)
    Driver(java_driver, server, "routed", "java_routed").check()
    calls = list(_calls_since(cluster.servers, before))
    assert all(forwarded == 0 for _, _, forwarded in calls), calls
    assert sum(1 for _, served, _ in calls if served > 0) >= 2, calls
    # The server-side-routing client: everything through the one endpoint, forwarded there.
    before = _table_calls(cluster.servers)
    Driver(java_driver, server, "simple", "java_simple").check()
    entry = next(s.index for s in cluster.servers if s.port == getattr(server, "port", None))
    after = {index: forwarded for index, _, forwarded in _calls_since(cluster.servers, before)}
    assert after[entry] > 0, after


def run_paused_driver(
    java_driver: list[str], args: list[str], meanwhile: Callable[[], None]
) -> tuple[dict[str, tuple[Any, Any]], str]:
    """Run the driver in a mode that pauses (restart, split): once it prints "paused", run
    `meanwhile`, let it go on, and return its observations (check -> (value, error)) and its
    stderr."""
    driver = subprocess.Popen(
        [*java_driver, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None and driver.stdin is not None
        paused = driver.stdout.readline()  # EOF ("") if the driver failed before pausing
        assert '"check":"paused"' in paused, paused
        meanwhile()
        driver.stdin.write("go\n")
        driver.stdin.flush()
        out, err = driver.communicate(timeout=DRIVER_TIMEOUT_S)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {record["check"]: (record["value"], record["error"]) for record in records}, err


@pytest.mark.on_grpc_aio("the client reconnects through the server's own shutdown")
@pytest.mark.standalone_only("restarts the standalone server the client is connected to")
def test_java_client_goes_on_after_its_server_restarts(
    server: Server, java_driver: list[str]
) -> None:
    """The routed client caches each container's owner and its channel; after the server
    restarts (same address), the same client object writes and reads again."""
    assert isinstance(server, ServerProcess)  # the module's server: restarted in place

    def restart() -> None:
        server.stop()
        server.start()

    observed, err = run_paused_driver(
        java_driver, [server.service, "routed", "java_restart", "restart"], restart
    )
    assert observed.get("restart.put") == (None, None), (observed, err[-4000:])
    assert observed.get("restart.get") == ("after", None), (observed, err[-4000:])


@pytest.mark.on_cluster("the routed client's cached owners after splits on a cluster")
@pytest.mark.cluster_only(
    "on a cluster one child of a split stays on the parent's container and server, the other "
    "may go to another server's: the standalone case and routing and forwarding besides"
)
@pytest.mark.parametrize("kind", ["routed", "simple"])
def test_java_client_goes_on_through_range_splits(
    server: Server, java_driver: list[str], kind: str
) -> None:
    """The client read the table's ranges (routed: and caches each one's container); then two
    of them split (`tablekeeper table split`) while it waits; the same client object reads
    every key back, increments every counter once more and reads it: the server routes its
    requests, which still name the retired ranges, to the children holding their keys."""
    namespace = f"java_split_{kind}"

    def split_twice() -> None:
        for _ in range(2):
            split = subprocess.run(
                [str(SERVER_COMMAND), "--service", server.service, "table", "split"]
                + [f"{namespace}/kv"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert split.returncode == 0, split.stderr

    observed, err = run_paused_driver(
        java_driver, [server.service, kind, namespace, "split"], split_twice
    )
    assert observed.get("split.get") == (200, None), (observed, err[-4000:])
    assert observed.get("split.counters") == (200, None), (observed, err[-4000:])
