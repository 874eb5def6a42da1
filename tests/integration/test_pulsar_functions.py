"""Pulsar Functions keep their state in TableKeeper: a real Pulsar 4.0.7 functions worker.

`deploy/pulsar-functions.sh` (one start for this module) runs TableKeeper, ZooKeeper, a
bookie and Pulsar standalone in ZooKeeper mode with `--only-broker` and the worker setting
`stateStorageServiceUrl: bk://127.0.0.1:<TableKeeper>` (see deploy/README.md for why exactly
that configuration). Then:

* the stock WordCountFunction (pulsar-functions-api-examples 4.0.7) counts the words of known
  sentences; every counter is exact through `pulsar-admin functions querystate` and directly
  in TableKeeper (namespace `public_default`, table `wordcount`: Pulsar's
  `getStateNamespace` is `<tenant>_<namespace>` with '-' turned into '_', the table is the
  function's name; each key is its own pkey), and the table holds nothing else;
* Pulsar's own table service was not used: the worker runs with our URL and the BookKeeper
  state store, no Pulsar process listens on any other port (the table service would be a gRPC
  port of its own), and ZooKeeper has no `/stream` (its cluster metadata);
* a function that reads its state back (`getCounter`, `getState`, a value from `putstate`,
  which `querystate` and TableKeeper also show): the Java client's reads
  (RangeRequest.limit = -1) as the function runtime sends them; then deleting that function
  drops its state table in TableKeeper (that function's own: the wordcount function stays for
  the other tests, whatever their order).
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pulsar
import pytest
from kazoo.client import KazooClient

from tablekeeper import Client
from tests.support.pulsar_functions import (
    READBACK_CLASS,
    FunctionsDeployment,
    build_readback_jar,
    fetch_paths,
    listening_tcp,
    start_deployment,
)
from tests.support.server import TABLEKEEPER

pytestmark = [pytest.mark.integration, pytest.mark.pulsar, pytest.mark.timeout(1800)]

T = TypeVar("T")
FN = ["--tenant", "public", "--namespace", "default"]
STATE_NAMESPACE = "public_default"
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "the dog sleeps",
    "a fox and a dog",
    "state lives in tablekeeper",
    "the fox",
]
EXPECTED = Counter(word for sentence in SENTENCES for word in sentence.split())
GREETING = "hello from pulsar-admin putstate"


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 120) -> T:
    """Poll `probe` until it returns something other than None (a hang guard, not a timing
    assertion)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def quiet_logger() -> logging.Logger:
    quiet = logging.getLogger("pulsar-functions-test-client")
    quiet.addHandler(logging.NullHandler())
    quiet.setLevel(logging.ERROR)
    quiet.propagate = False
    return quiet


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FunctionsDeployment]:
    yield from start_deployment(tmp_path_factory.mktemp("functions"))


@pytest.fixture(scope="module")
def tablekeeper(deployment: FunctionsDeployment) -> Iterator[Client]:
    with Client(deployment.tablekeeper) as client:
        yield client


@pytest.fixture(scope="module")
def pulsar_client(deployment: FunctionsDeployment) -> Iterator[pulsar.Client]:
    client = pulsar.Client(deployment.service_url, logger=quiet_logger())
    yield client
    client.close()


def function_status(deployment: FunctionsDeployment, name: str) -> dict[str, Any]:
    """What `pulsar-admin functions status` shows, from the same REST endpoint (cheap enough to
    poll)."""
    url = f"{deployment.admin_url}/admin/v3/functions/public/default/{name}/status"
    with urllib.request.urlopen(url, timeout=10) as response:
        status: dict[str, Any] = json.load(response)
    return status


def user_exceptions(status: dict[str, Any]) -> list[str]:
    return [
        error["exceptionString"]
        for instance in status.get("instances", [])
        for error in instance["status"].get("latestUserExceptions", [])
    ]


def state_tables(tablekeeper: Client) -> set[str]:
    if STATE_NAMESPACE not in {ns.name for ns in tablekeeper.list_namespaces()}:
        return set()
    return {table.name for table in tablekeeper.list_tables(STATE_NAMESPACE)}


def counters_in_tablekeeper(tablekeeper: Client, table: str, words: list[str]) -> dict[str, int]:
    """The number each word's key holds in TableKeeper (0 if absent)."""
    state = tablekeeper.table(STATE_NAMESPACE, table)
    values = {}
    for word in words:
        kv = state.get(word, word)
        values[word] = 0 if kv is None or kv.number is None else kv.number
    return values


def scan_table(deployment: FunctionsDeployment, table: str) -> dict[str, object]:
    """Every key of a state table, through the CLI's whole-table scan: {lkey: value}."""
    done = subprocess.run(
        [
            str(TABLEKEEPER),
            "--service",
            deployment.tablekeeper,
            "scan",
            f"{STATE_NAMESPACE}/{table}",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(row["pkey"] == row["lkey"] for row in rows), rows
    return {row["lkey"]: row["value"] for row in rows}


@pytest.fixture(scope="module")
def wordcount(
    deployment: FunctionsDeployment, tablekeeper: Client, pulsar_client: pulsar.Client
) -> str:
    """The stock WordCountFunction, deployed and fed SENTENCES; its counters have reached
    EXPECTED in TableKeeper."""
    examples_jar = fetch_paths()["examples_jar"]
    topic = "persistent://public/default/wordcount-sentences"
    output = deployment.admin(
        "functions", "create", *FN, "--name", "wordcount",
        "--jar", str(examples_jar),
        "--classname", "org.apache.pulsar.functions.api.examples.WordCountFunction",
        "--inputs", topic, "--subs-position", "Earliest",
    )  # fmt: skip
    assert "Created successfully" in output
    # a STRING producer: the function's consumer is one, and a topic that BYTES producers made
    # active refuses it ("Failed to add schema to an active topic with empty(BYTES) schema")
    producer = pulsar_client.create_producer(topic, schema=pulsar.schema.StringSchema())
    for sentence in SENTENCES:
        producer.send(sentence)
    producer.close()
    words = sorted(EXPECTED)

    seen: dict[str, int] = {}

    def counted() -> bool | None:
        if "wordcount" not in state_tables(tablekeeper):
            return None
        seen.update(counters_in_tablekeeper(tablekeeper, "wordcount", words))
        return True if seen == dict(EXPECTED) else None

    try:
        wait_for("the word counters to reach the expected values in TableKeeper", counted)
    except AssertionError as exc:
        status = deployment.admin("functions", "status", *FN, "--name", "wordcount")
        raise AssertionError(f"{exc}: last seen {seen}; function status:\n{status}") from None
    return "wordcount"


def test_wordcount_counters_exact_in_querystate_and_tablekeeper(
    deployment: FunctionsDeployment, tablekeeper: Client, wordcount: str
) -> None:
    words = sorted(EXPECTED)
    outputs = deployment.shell(
        [f"functions querystate {' '.join(FN)} --name {wordcount} --key {w}" for w in words]
    )
    for word, output in zip(words, outputs, strict=True):
        state = json.loads(output)
        assert state["key"] == word
        assert state["numberValue"] == EXPECTED[word], (word, state)
    assert counters_in_tablekeeper(tablekeeper, wordcount, words) == dict(EXPECTED)
    assert scan_table(deployment, wordcount) == dict(EXPECTED)  # nothing else in the table


def test_pulsar_table_service_not_used(
    deployment: FunctionsDeployment, tablekeeper: Client, wordcount: str
) -> None:
    ports = deployment.ports
    # the worker runs with our URL and the BookKeeper state store provider
    log = deployment.broker_log()
    assert f"stateStorageServiceUrl=bk://127.0.0.1:{ports['TK_PORT']}," in log
    assert (
        "stateStorageProviderImplementation="
        + ("org.apache.pulsar.functions.instance.state.BKStateStoreProviderImpl,")
        in log
    )
    assert "PulsarMetadataStateStoreProviderImpl" not in log
    # no stream storage anywhere: the broker and the bookie listen on their own ports only,
    # on loopback (the table service would be one more gRPC port)
    assert listening_tcp(deployment.pid("broker")) == {
        ("127.0.0.1", ports["PORT"]),
        ("127.0.0.1", ports["HTTP_PORT"]),
    }
    assert listening_tcp(deployment.pid("bookie")) == {("127.0.0.1", ports["BOOKIE_PORT"])}
    # and BookKeeper's table service never initialised its cluster metadata
    zk = KazooClient(hosts=f"127.0.0.1:{ports['ZK_PORT']}", timeout=10)
    zk.start(timeout=10)
    try:
        assert zk.exists("/stream") is None
        assert zk.exists("/ledgers/available") is not None
    finally:
        zk.stop()
    # the state is where the worker was told to put it
    assert wordcount in state_tables(tablekeeper)


def test_function_reads_its_state_back(
    deployment: FunctionsDeployment,
    tablekeeper: Client,
    pulsar_client: pulsar.Client,
    tmp_path: Path,
) -> None:
    jar = build_readback_jar(tmp_path, fetch_paths()["functions_api_jar"])
    name = "readback"
    inputs = "persistent://public/default/readback-in"
    outputs = "persistent://public/default/readback-out"
    consumer = pulsar_client.subscribe(
        outputs,
        "test",
        initial_position=pulsar.InitialPosition.Earliest,
        schema=pulsar.schema.StringSchema(),
    )
    deployment.admin(
        "functions", "create", *FN, "--name", name, "--jar", str(jar),
        "--classname", READBACK_CLASS, "--inputs", inputs, "--output", outputs,
        "--subs-position", "Earliest",
    )  # fmt: skip
    # State put from outside (pulsar-admin putstate): querystate and TableKeeper see it, and
    # so does the function (get:greeting below).
    state = json.dumps({"key": "greeting", "stringValue": GREETING}, separators=(",", ":"))
    deployment.admin("functions", "putstate", *FN, "--name", name, "--state", state)
    (output,) = deployment.shell(
        [f"functions querystate {' '.join(FN)} --name {name} --key greeting"]
    )
    assert json.loads(output)["stringValue"] == GREETING
    kv = tablekeeper.table(STATE_NAMESPACE, name).get("greeting", "greeting")
    assert kv is not None and kv.value == GREETING.encode() and kv.number is None
    sent = ["alpha", "alpha", "beta", "get:last", "get:greeting", "get:absent"]
    producer = pulsar_client.create_producer(inputs, schema=pulsar.schema.StringSchema())
    for message in sent:
        producer.send(message)
    producer.close()
    expected = [
        "alpha=1 last=alpha",
        "alpha=2 last=alpha",
        "beta=1 last=beta",
        "get:last=beta",
        f"get:greeting={GREETING}",
        "get:absent=<none>",
    ]
    received: list[str] = []
    deadline = time.monotonic() + 120
    while len(received) < len(expected):
        try:
            message = consumer.receive(timeout_millis=2000)
        except pulsar.Timeout:
            status = function_status(deployment, name)
            errors = user_exceptions(status)
            if errors or time.monotonic() > deadline:
                raise AssertionError(
                    f"got {received}, expected {expected}; the function failed with {errors}"
                    f"\nstatus: {json.dumps(status)}"
                ) from None
            continue
        received.append(message.value())
        consumer.acknowledge(message)
    consumer.close()
    assert received == expected
    assert counters_in_tablekeeper(tablekeeper, name, ["alpha", "beta"]) == {
        "alpha": 2,
        "beta": 1,
    }
    last = tablekeeper.table(STATE_NAMESPACE, name).get("last", "last")
    assert last is not None and last.value == b"beta"

    # Deleting the function drops its state table (here, not on the module's wordcount
    # function, which the other tests read: no test depends on running before this one).
    assert "Deleted successfully" in deployment.admin("functions", "delete", *FN, "--name", name)
    wait_for(
        "the readback state table to be dropped",
        lambda: True if name not in state_tables(tablekeeper) else None,
    )
    (listing,) = deployment.shell([f"functions list {' '.join(FN)}"])
    assert name not in listing.split()
