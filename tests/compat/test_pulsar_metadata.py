"""Pulsar's own metadata-store tests against TableKeeper's Oxia and etcd ports.

Pulsar publishes the compiled tests of its metadata module (`org.apache.pulsar:pulsar-metadata:
4.0.7:tests`, a test-jar on Maven Central). They run here unmodified through a harness of our own
(tests/compat/pulsar_metadata, a small Maven module; `make test-compat` builds it, this file
builds it if it is stale): Pulsar's store data provider (`BaseMetadataStoreTest`'s "impl",
"distributedImpl", "zkImpls") hands every test TableKeeper's stores instead of the containers it
starts upstream, and nothing else changes — test bodies, assertions, Pulsar's retry of a failed
test once (`testRetryCount=1`, its `AnnotationListener`), the groups its build leaves out.

Servers follow the rule upstream's containers follow: a fresh one per test class, and a fresh
one after the base class's clean-up that follows every failure (so a test's retry runs on a new
store, as upstream's does). The JVM asks for one on stdout; this file starts it (Oxia and etcd
ports, an Oxia namespace with one shard as upstream runs Oxia) and answers with the URLs.

Every invocation must pass. What cannot apply to TableKeeper is listed in `NOT_RUN` (test
methods that never take a store from the provider: ZooKeeper-only, or driving upstream's
container directly) and `SKIPPED_BY_PULSAR` (tests that skip themselves for a store, as they do
against a real Oxia); the README lists both with the reasons, and a test here checks the run saw
exactly those.

`make test-compat` runs `DEFAULT_CLASSES`; `make test-pulsar-metadata` runs every class
(`TABLEKEEPER_PULSAR_METADATA_CLASSES=all`, or a comma-separated list of simple class names).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from tests.support.caches import pulsar_cache
from tests.support.server import ServerProcess, free_port

RUN_TIMEOUT_S = 1800.0
"""The whole suite's JVM (every class, both stores) must finish within this."""
pytestmark = [
    pytest.mark.standalone_only("fresh servers of its own, with Oxia and etcd ports"),
    pytest.mark.timeout(RUN_TIMEOUT_S + 300),
]

SUITE_DIR = Path(__file__).parent / "pulsar_metadata"
TARGET = SUITE_DIR / "target"
JAR = TARGET / "pulsar-metadata-suite-0.1.0.jar"
CLASSPATH = TARGET / "classpath.txt"
MAIN_CLASS = "io.tablekeeper.compat.pulsar.MetadataSuite"
STORES = ("Oxia", "Etcd")
OXIA_NAMESPACE = "pulsar"
SERVER_START_TIMEOUT_S = 120.0

PACKAGE = "org.apache.pulsar.metadata"
ALL_CLASSES = (
    "MetadataStoreTest",
    "MetadataStoreExtendedTest",
    "MetadataStoreBatchingTest",
    "MetadataCacheTest",
    "CounterTest",
    "LockManagerTest",
    "LeaderElectionTest",
    "MetadataStoreTableViewTest",
    "coordination.impl.LeaderElectionImplTest",
    "bookkeeper.EndToEndTest",
    "bookkeeper.LedgerManagerIteratorTest",
    "bookkeeper.LedgerUnderreplicationManagerTest",
    "bookkeeper.PulsarLayoutManagerTest",
    "bookkeeper.PulsarLedgerAuditorManagerTest",
    "bookkeeper.PulsarLedgerIdGeneratorTest",
    "bookkeeper.PulsarRegistrationClientTest",
    "bookkeeper.PulsarRegistrationManagerTest",
    "OxiaMetadataStoreErrorTest",
)
"""Every class of the test-jar that extends `BaseMetadataStoreTest` (what takes its stores from
the provider), except `MetadataBenchmark` (a benchmark) and `ZKSessionTest` (ZooKeeper's
sessions); `OxiaMetadataStoreErrorTest` has nothing to run here (see `NOT_RUN`)."""
DEFAULT_CLASSES = ALL_CLASSES[:7]
"""What `make test-compat` runs: the metadata store, its batching and cache, and the
coordination recipes (counter, locks, leader election), about a third of the invocations in a
third of the time; `make test-pulsar-metadata` runs them all."""
NOTHING_TO_RUN = ("OxiaMetadataStoreErrorTest",)

_ZK_ONLY = "ZooKeeper only (a ZooKeeper client, server or session of its own)"
NOT_RUN = {
    # Test method -> why it cannot apply to TableKeeper: it never takes a store from the
    # base class's provider, so TableKeeper is never asked.
    "MetadataCacheTest#testDefaultMetadataCacheConfig": "no store: checks a config object",
    "MetadataCacheTest#testNoBackoffMetadataCacheConfig": "no store: checks a config object",
    "MetadataStoreTest#testOxiaLoadConfigFromFile": (
        "starts upstream's Oxia container itself (not through the provider) for a client "
        "config file read from Pulsar's source tree"
    ),
    "MetadataStoreTest#testThreadSwitchOfZkMetadataStore": _ZK_ONLY,
    "MetadataStoreTest#testZkLoadConfigFromFile": _ZK_ONLY,
    "OxiaMetadataStoreErrorTest#emptyStoreTest": (
        "stops upstream's Oxia container through its handle in the middle of the test"
    ),
    "bookkeeper.PulsarLedgerIdGeneratorTest#testGenerateLedgerIdWithZkPrefix": _ZK_ONLY,
    "bookkeeper.PulsarRegistrationClientTest#testNetworkDelayWithBkZkManager": _ZK_ONLY,
    "bookkeeper.LedgerUnderreplicationManagerTest#"
    "testZkMetasStoreMarkReplicatedDeleteEmptyParentNodes": _ZK_ONLY,
    # Their provider ("zkImpls") offers ZooKeeper and Pulsar's mock of it only.
    "MetadataCacheTest#crossStoreAddDelete": _ZK_ONLY,
    "MetadataCacheTest#crossStoreUpdates": _ZK_ONLY,
    "MetadataCacheTest#readModifyUpdateBadVersionRetry": _ZK_ONLY,
    "MetadataCacheTest#readModifyUpdateOrCreateRetryTimeout": _ZK_ONLY,
}
SKIPPED_BY_PULSAR = {
    # (test method, store) -> why the test skips itself there, as against a real one
    ("MetadataStoreTest#testDeleteUnusedDirectories", "Oxia"): (
        "Oxia and MockZooKeeper do not support deleteUnusedDirectories"
    ),
}


def _classes() -> tuple[str, ...]:
    chosen = os.environ.get("TABLEKEEPER_PULSAR_METADATA_CLASSES", "")
    if not chosen:
        return DEFAULT_CLASSES
    if chosen == "all":
        return ALL_CLASSES
    names = tuple(name.strip() for name in chosen.split(",") if name.strip())
    unknown = [n for n in names if n not in ALL_CLASSES]
    assert not unknown, f"not among the suite's classes: {unknown} (see ALL_CLASSES)"
    return names


def _up_to_date() -> bool:
    if not (JAR.exists() and CLASSPATH.exists()):
        return False
    sources = [SUITE_DIR / "pom.xml", *SUITE_DIR.glob("src/**/*")]
    built = min(JAR.stat().st_mtime, CLASSPATH.stat().st_mtime)
    return all(source.stat().st_mtime <= built for source in sources if source.is_file())


def maven_repository() -> Path:
    """Where the suite's jars live: the local repository `deploy/pulsar.sh fetch` fills (most of
    them are Pulsar's own), so they are fetched once for both."""
    return pulsar_cache() / "m2"


def build() -> list[str]:
    """The command that runs the suite (built here unless `make test-compat` built it)."""
    mvn, java = shutil.which("mvn"), shutil.which("java")
    assert mvn and java, "Pulsar's metadata suite needs mvn and java (Java 17) on PATH"
    if not _up_to_date():
        goals = [
            "-q",
            "-B",
            f"-Dmaven.repo.local={maven_repository()}",
            "package",
            "dependency:build-classpath",
            f"-Dmdep.outputFile={CLASSPATH}",
        ]
        # Offline from the local Maven repository; online only the first time.
        done = subprocess.run(
            [mvn, "-o", *goals], cwd=SUITE_DIR, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            done = subprocess.run(
                [mvn, *goals], cwd=SUITE_DIR, capture_output=True, text=True, check=False
            )
        assert done.returncode == 0, f"mvn failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    classpath = f"{JAR}:{CLASSPATH.read_text().strip()}"
    return [java, "-Xmx768m", "-XX:TieredStopAtLevel=1", "-cp", classpath, MAIN_CLASS]


@dataclass
class Invocation:
    status: str
    test_class: str
    method: str
    store: str
    seconds: float
    trace: list[str] = field(default_factory=list)


@dataclass
class SuiteRun:
    """What one run of the suite reported."""

    invocations: list[Invocation] = field(default_factory=list)
    not_run: set[str] = field(default_factory=set)
    """Test methods that never ran against TableKeeper (`@@tk dropped` and `@@tk norows`)."""
    servers: list[ServerProcess] = field(default_factory=list)
    returncode: int | None = None
    status_line: str | None = None
    stderr_path: Path | None = None
    seconds: float = 0.0

    def of(self, test_class: str, store: str) -> list[Invocation]:
        return [i for i in self.invocations if i.test_class == test_class and i.store == store]

    def stderr_tail(self, lines: int = 80) -> str:
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])


class Harness:
    """The Python side: hands the JVM a fresh server whenever it asks for one. The next server
    is started while the current one serves (a start takes seconds on a busy machine; most
    classes take less), so a test class waits only for one that is not ready yet."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.run = SuiteRun()
        self.server: ServerProcess | None = None
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="next-server")
        self._next: Future[tuple[ServerProcess, str]] | None = None
        self._next_lock = threading.Lock()  # the JVM's reader thread and the fixture
        self._started = 0

    def _start(self) -> tuple[ServerProcess, str]:
        """A fresh server with Oxia and etcd ports and a one-shard Oxia namespace; its URLs."""
        self._started += 1
        oxia_port, etcd_port = free_port(), free_port()
        server = ServerProcess(
            self.workdir / f"server-{self._started}" / "data",
            extra_args=["--oxia-port", str(oxia_port), "--etcd-port", str(etcd_port)],
        )
        self.run.servers.append(server)
        server.start(timeout_s=SERVER_START_TIMEOUT_S)
        command = "import sys; from tablekeeper.cli import main; sys.exit(main())"
        subprocess.run(
            [sys.executable, "-c", command, "--service", server.service, "table", "create",
             f"oxia/{OXIA_NAMESPACE}", "--ranges", "1"],
            check=True, timeout=SERVER_START_TIMEOUT_S, capture_output=True,
        )  # fmt: skip
        urls = (
            f"Oxia=oxia://127.0.0.1:{oxia_port}/{OXIA_NAMESPACE} "
            f"Etcd=etcd:http://127.0.0.1:{etcd_port}"
        )
        return server, urls

    def start_next(self) -> None:
        """Start the next server now (the JVM will ask for one as soon as it runs)."""
        with self._next_lock:
            if self._next is None:
                self._next = self._starter.submit(self._start)

    def answer(self) -> str:
        self.stop_server()
        self.start_next()
        with self._next_lock:
            ready, self._next = self._next, None
        assert ready is not None
        try:
            self.server, urls = ready.result(timeout=2 * SERVER_START_TIMEOUT_S)
        finally:
            self.start_next()
        return urls

    def stop_server(self) -> None:
        if self.server is not None and self.server.running:
            self.server.stop()
        self.server = None

    def close(self) -> None:
        """Stop the server in use and the one started next."""
        self.stop_server()
        if self._next is not None:
            with contextlib.suppress(Exception):
                self._next.result(timeout=2 * SERVER_START_TIMEOUT_S)
            self._next = None
        self._starter.shutdown(wait=True)
        for server in self.run.servers:
            if server.running:
                server.stop()

    def read(self, stdout: IO[str], stdin: IO[str], log: IO[str]) -> None:
        last: Invocation | None = None
        started = time.monotonic()
        for raw in stdout:
            line = raw.rstrip("\n")
            log.write(f"{time.monotonic() - started:7.1f} {raw}")
            log.flush()
            if not line.startswith("@@tk "):
                continue
            kind, _, rest = line[5:].partition(" ")
            if kind == "server":
                try:
                    reply = self.answer()
                except Exception as exc:  # the JVM's test fails with this message
                    reply = f"error {type(exc).__name__}: {exc}".replace("\n", " ")
                stdin.write(reply + "\n")
                stdin.flush()
            elif kind == "result":
                status, name, store, seconds = rest.split(" ")
                test_class, _, method = name.removeprefix(PACKAGE + ".").partition("#")
                last = Invocation(status, test_class, method, _store(store), float(seconds))
                self.run.invocations.append(last)
            elif kind == "trace" and last is not None:
                last.trace.append(rest)
            elif kind == "dropped":
                self.run.not_run.add(rest.removeprefix(PACKAGE + "."))
            elif kind == "norows":
                self.run.not_run.add(rest.split(" ")[0].removeprefix(PACKAGE + "."))
            elif kind == "status":
                self.run.status_line = rest


def _store(shown: str) -> str:
    """The store of an invocation from its first parameter (shown as `oxia://tablekeeper`)."""
    for store in STORES:
        if shown.lower().startswith(store.lower() + "://"):
            return store
    return shown


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SuiteRun]:
    command = build()
    workdir = tmp_path_factory.mktemp("pulsar-metadata")
    harness = Harness(workdir)
    stderr_path = workdir / "jvm-stderr.log"
    harness.run.stderr_path = stderr_path
    classes = [f"{PACKAGE}.{name}" for name in _classes()]
    started = time.monotonic()
    with open(stderr_path, "w") as stderr, open(workdir / "suite.log", "w") as log:
        process = subprocess.Popen(
            [*command, *STORES, "--", *classes],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=workdir,
        )
        assert process.stdin is not None and process.stdout is not None
        reader = threading.Thread(
            target=harness.read, args=(process.stdout, process.stdin, log), daemon=True
        )
        reader.start()
        try:
            harness.start_next()  # while the JVM starts
            harness.run.returncode = process.wait(timeout=RUN_TIMEOUT_S)
            reader.join(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            harness.run.returncode = None
        finally:
            harness.close()
    harness.run.seconds = time.monotonic() - started
    yield harness.run


def _outcome(invocations: list[Invocation]) -> tuple[list[str], list[str]]:
    """(failures, unexpected skips) of one class and store: a test that failed and then passed
    on its retry passed, as in Pulsar's build."""
    failures, skips = [], []
    for inv in invocations:
        if inv.status == "FAIL":
            failures.append(f"{inv.method}:\n    " + "\n    ".join(inv.trace[:25]))
        elif (
            inv.status == "SKIP"
            and (f"{inv.test_class}#{inv.method}", inv.store) not in SKIPPED_BY_PULSAR
        ):
            skips.append(f"{inv.method}: " + (inv.trace[0] if inv.trace else "skipped"))
    return failures, skips


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("test_class", [c for c in _classes() if c not in NOTHING_TO_RUN])
def test_pulsar_metadata_class(suite: SuiteRun, test_class: str, store: str) -> None:
    """Every invocation of one of Pulsar's test classes against one TableKeeper store passes
    (at the latest on Pulsar's one retry)."""
    assert suite.returncode is not None, (
        f"the suite did not finish in {RUN_TIMEOUT_S:.0f} s\n{suite.stderr_tail()}"
    )
    invocations = suite.of(test_class, store)
    assert invocations, f"no test of {test_class} ran against {store}"
    failures, skips = _outcome(invocations)
    assert not failures and not skips, (
        "\n".join(failures + skips) + f"\n--- JVM stderr (end) ---\n{suite.stderr_tail(40)}"
    )


def test_pulsar_metadata_ran_what_the_readme_says(suite: SuiteRun) -> None:
    """The methods left out are exactly those `NOT_RUN` lists (for the classes run), the self-
    skips exactly those `SKIPPED_BY_PULSAR` lists, and TestNG's own verdict is a pass."""
    assert suite.returncode is not None, suite.stderr_tail()
    chosen = set(_classes())
    assert suite.not_run == {m for m in NOT_RUN if m.split("#")[0] in chosen}
    skipped = {
        (f"{i.test_class}#{i.method}", i.store) for i in suite.invocations if i.status == "SKIP"
    }
    assert skipped == {s for s in SKIPPED_BY_PULSAR if s[0].split("#")[0] in chosen}
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for inv in suite.invocations:
        counts[inv.store, inv.status] += 1
    print(
        f"\nPulsar metadata suite, {len(chosen)} classes in {suite.seconds:.0f} s: {dict(counts)}"
    )
    assert suite.returncode == 0, f"TestNG: {suite.status_line}\n{suite.stderr_tail()}"
