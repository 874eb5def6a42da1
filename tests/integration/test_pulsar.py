"""TableKeeper on Apache Pulsar (BookKeeper), against the real Pulsar of `pulsar_service`.

* The Pulsar log backend beyond the shared contract (tests/contract/test_log_backend.py):
  fencing by the broker across clients, many writers taking turns, large records, truncation
  that really deletes ledgers, stale-epoch records, Pulsar unreachable.
* The Pulsar checkpoint store.
* The whole SDK suite of tests/integration/test_sdk.py against a server with `--log pulsar`.
* Disk loss: a server with the Pulsar log and checkpoint store is killed -9 under load, its data
  directory deleted; a new server on a fresh directory has every acknowledged write.
* Fencing: a frozen (SIGSTOP) server is replaced by a second one on the same logs; once resumed,
  none of its writes is acknowledged or visible.
* Pulsar restarted under load: writes fail with a retryable error while it is down, succeed
  after, and nothing acknowledged is lost.

Every test uses its own Pulsar namespace.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tablekeeper import AsyncClient, Client, RetryPolicy
from tablekeeper_server.checkpoint.pulsar import PulsarCheckpointStore
from tablekeeper_server.core.clock import SystemClock
from tablekeeper_server.errors import CorruptionError, LogFencedError, UnavailableError
from tablekeeper_server.log import pulsar as pulsar_log
from tablekeeper_server.log.api import LogRecord
from tablekeeper_server.log.pulsar import KIND_DATA, PulsarLogBackend, encode_header
from tablekeeper_server.pulsar_common.admin import PulsarAdmin
from tablekeeper_server.pulsar_common.send import send_and_wait
from tests.integration import test_sdk as sdk
from tests.integration.test_crash import (
    NS,
    TABLE,
    _check_state,
    _create_table,
    _stop_workers,
    _workers,
)
from tests.support.crash_worker import (
    ALL_COUNTER_PKEYS,
    ALL_DATA_PKEYS,
    JournalSummary,
    Op,
)
from tests.support.pulsar import PulsarService, unique_namespace
from tests.support.server import ServerProcess, wait_all_threads_stopped

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

T = TypeVar("T")
LOG = "range-1"
MiB = 1 << 20


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def pulsar_args(
    service: PulsarService, namespace: str, *, checkpoints: bool = False, timeout_s: float = 10
) -> list[str]:
    args = [
        "--log=pulsar",
        f"--pulsar-url={service.service_url}",
        f"--pulsar-admin-url={service.admin_url}",
        f"--pulsar-namespace=public/{namespace}",
        f"--pulsar-timeout={timeout_s}",
    ]
    return [*args, "--checkpoint-store=pulsar"] if checkpoints else args


@pytest.fixture
def backends(pulsar_service: PulsarService) -> Iterator[Callable[[], PulsarLogBackend]]:
    """Make Pulsar log backends (separate clients, like separate processes) on one namespace."""
    namespace = unique_namespace("log")
    made: list[PulsarLogBackend] = []

    def make() -> PulsarLogBackend:
        backend = PulsarLogBackend(
            pulsar_service.service_url, pulsar_service.admin_url, namespace=namespace, timeout_s=10
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def payloads_of(records: list[LogRecord]) -> list[bytes]:
    return [r.payload for r in records]


# --------------------------------------------------------------------------- the log backend


def test_a_writer_of_another_client_is_fenced_by_the_broker(
    backends: Callable[[], PulsarLogBackend],
) -> None:
    first, second = backends(), backends()

    async def scenario() -> None:
        old = first.open_writer(LOG)
        assert await old.append([b"a", b"b"]) == 2
        new = second.open_writer(LOG)  # no shared process state: only the broker fences
        assert new.last_sequence == 2 and new.epoch > old.epoch
        with pytest.raises(LogFencedError) as fenced:
            await old.append([b"lost"])
        # Sent after the new FENCE: it reads on to that FENCE and finds none of its records.
        assert not fenced.value.maybe_persisted, fenced.value
        assert "none of them is in the log before its fence" in str(fenced.value)
        with pytest.raises(LogFencedError):
            await old.append([b"lost again"])
        assert await new.append([b"c"]) == 3
        await old.close()
        assert await new.append([b"d"]) == 4
        await new.close()

    run(scenario())
    assert payloads_of(list(backends().read(LOG, 1))) == [b"a", b"b", b"c", b"d"]


def test_a_fenced_writer_whose_record_slipped_in_before_the_fence_says_it_may_be_there(
    backends: Callable[[], PulsarLogBackend],
) -> None:
    first, second = backends(), backends()

    async def scenario() -> None:
        old = first.open_writer(LOG)
        assert await old.append([b"a", b"b"]) == 2
        # Record 3 of the old writer reaches the topic, its acknowledgement never comes back
        # to the append (sent here on the writer's own producer, as an append in flight would).
        assert old._producer is not None
        send_and_wait(old._producer, [encode_header(KIND_DATA, old.epoch, 3) + b"slipped"], 10)
        new = second.open_writer(LOG)  # counts record 3: it precedes the new FENCE
        assert new.last_sequence == 3
        with pytest.raises(LogFencedError) as fenced:
            await old.append([b"slipped"])  # its sequence 3 is in the log before the FENCE
        assert fenced.value.maybe_persisted, fenced.value
        assert "may have reached the log before its fence" in str(fenced.value)
        await old.close()
        await new.close()

    run(scenario())
    assert payloads_of(list(backends().read(LOG, 1))) == [b"a", b"b", b"slipped"]


def test_a_fenced_writer_that_cannot_see_the_new_fence_says_its_group_may_be_there(
    backends: Callable[[], PulsarLogBackend],
) -> None:
    backend = backends()

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        assert await writer.append([b"a"]) == 1
        # No FENCE of a newer writer follows (nobody took the log over): nothing can be told.
        look = backend._fenced_group_reached_log
        assert look(LOG, writer.epoch, 2, 2, None, wait_s=0.5) is None
        assert look(LOG, writer.epoch, 1, 1, None, wait_s=0.5) is True
        assert look("no-such-log", writer.epoch, 1, 1, None, wait_s=0.5) is None
        await writer.close()

    run(scenario())


def test_writers_taking_turns_keep_exactly_the_acknowledged_records(
    backends: Callable[[], PulsarLogBackend],
) -> None:
    clients = [backends(), backends(), backends()]
    acked: list[bytes] = []

    async def scenario() -> None:
        previous = None
        for turn in range(9):
            writer = clients[turn % 3].open_writer(LOG)
            assert writer.last_sequence == len(acked)
            if previous is not None:
                with pytest.raises(LogFencedError):
                    await previous.append([b"from a fenced writer"])
                await previous.close()
            for group in range(3):
                batch = [f"t{turn}g{group}r{i}".encode() for i in range(turn + 1)]
                assert await writer.append(batch) == len(acked) + len(batch)
                acked.extend(batch)
            previous = writer
        assert previous is not None
        await previous.close()

    run(scenario())
    records = list(backends().read(LOG, 1))
    assert [r.sequence for r in records] == list(range(1, len(acked) + 1))
    assert payloads_of(records) == acked


def test_records_over_the_message_size_limit_are_fragmented(
    backends: Callable[[], PulsarLogBackend],
) -> None:
    big = os.urandom(9 * MiB + 123)  # three fragments; Pulsar refuses messages over 5 MB
    payloads = [b"before", big, b"", big[: 4 * MiB], b"after"]

    async def scenario() -> None:
        writer = backends().open_writer(LOG)
        assert await writer.append(payloads[:2]) == 2
        assert await writer.append(payloads[2:]) == 5
        await writer.close()

    run(scenario())
    assert payloads_of(list(backends().read(LOG, 1))) == payloads
    assert payloads_of(list(backends().read(LOG, 2))) == payloads[1:]


def test_the_tail_a_takeover_reads_to_fence_the_log_is_not_read_twice(
    backends: Callable[[], PulsarLogBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    payloads = [f"record {i}".encode() for i in range(1, 31)]

    async def fill() -> None:
        writer = backends().open_writer(LOG)
        await writer.append(payloads)
        await writer.close()

    run(fill())
    scans: list[object] = []
    real_scan = pulsar_log._Scan

    def counting_scan(*args: Any) -> Any:
        scans.append(args)
        return real_scan(*args)

    monkeypatch.setattr(pulsar_log, "_Scan", counting_scan)
    # The new owner's recovery scan reads the log once; the replay after it takes those records.
    backend = backends()
    writer = backend.open_writer(LOG)
    assert len(scans) == 1
    assert payloads_of(list(backend.read(LOG, 11))) == payloads[10:]
    assert len(scans) == 1
    assert payloads_of(list(backend.read(LOG, 1))) == payloads  # later reads go to Pulsar
    assert len(scans) == 2
    run(writer.close())
    # A tail over the bound is not kept: the replay reads it from Pulsar.
    monkeypatch.setattr(pulsar_log, "RECOVERED_TAIL_BYTES_MAX", 100)
    backend = backends()
    writer = backend.open_writer(LOG)
    assert payloads_of(list(backend.read(LOG, 1))) == payloads
    assert len(scans) == 4
    run(writer.close())


def test_a_takeover_begins_its_recovery_at_the_recovery_cursor(
    backends: Callable[[], PulsarLogBackend],
    pulsar_service: PulsarService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    payloads = [f"record {i}".encode() for i in range(1, 301)]
    owner = backends()

    async def fill() -> None:
        writer = owner.open_writer(LOG)
        for lo in range(0, len(payloads), 10):  # the writer indexes what it appends
            await writer.append(payloads[lo : lo + 10])
        await writer.close()

    run(fill())
    backends().mark_recovery_start(LOG, 201)  # knows no record start: leaves no cursor
    stats = _internal_stats(PulsarAdmin(pulsar_service.admin_url), owner, LOG)
    assert pulsar_log.RECOVERY_SUBSCRIPTION not in stats["cursors"]
    owner.truncate(LOG, 101)  # before the oldest kept checkpoint, say
    owner.mark_recovery_start(LOG, 201)  # after the newest

    read_by_scans: list[int] = []
    real_next = pulsar_log._Scan.next

    def counting_next(scan: Any) -> Any:
        out = real_next(scan)
        if out is not None:
            read_by_scans.append(out[0].sequence)
        return out

    monkeypatch.setattr(pulsar_log._Scan, "next", counting_next)
    taker = backends()  # another server: no index of this log
    handed_over: list[LogRecord] = []
    writer = taker.open_writer(LOG, on_record=handed_over.append)
    assert writer.last_sequence == 300
    # The recovery read one interval: from the indexed start at or before 201, not from 101.
    first = read_by_scans[0]
    assert 201 - pulsar_log.INDEX_STRIDE - 10 <= first <= 201
    assert read_by_scans == list(range(first, 301))
    # Each record it read was handed over as it went, in order: what a takeover applies early.
    assert [r.sequence for r in handed_over] == read_by_scans
    assert payloads_of(handed_over) == payloads[first - 1 :]
    # The replay of the newest checkpoint takes those records without reading again ...
    assert payloads_of(list(taker.read(LOG, 201))) == payloads[200:]
    assert len(read_by_scans) == 301 - first
    # ... and a replay falling back to the older checkpoint reads from the truncation point.
    assert payloads_of(list(taker.read(LOG, 101))) == payloads[100:]
    assert read_by_scans[-200:] == list(range(101, 301))
    assert run(writer.append([b"after the takeover"])) == 301
    run(writer.close())
    again = backends().open_writer(LOG)
    assert again.last_sequence == 301 and again.epoch > writer.epoch
    run(again.close())


def test_a_restoring_open_begins_at_the_recovery_cursor_whatever_it_knows(
    backends: Callable[[], PulsarLogBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server that owned the log before knows record starts of its own; a store it restored
    # from the newest checkpoint needs the records from the recovery cursor on, not from there.
    payloads = [f"record {i}".encode() for i in range(1, 301)]
    backend = backends()

    async def fill() -> None:
        writer = backend.open_writer(LOG)
        for lo in range(0, len(payloads), 10):
            await writer.append(payloads[lo : lo + 10])
        await writer.close()

    run(fill())
    backend.truncate(LOG, 101)
    backend.mark_recovery_start(LOG, 201)
    known = backend._state(LOG).index[-1].sequence
    assert known > 201

    firsts: list[int] = []
    real_next = pulsar_log._Scan.next

    def first_of_each_scan(scan: Any) -> Any:
        out = real_next(scan)
        if out is not None and not getattr(scan, "counted", False):
            scan.counted = True
            firsts.append(out[0].sequence)
        return out

    monkeypatch.setattr(pulsar_log._Scan, "next", first_of_each_scan)
    # Its own store being current (no restore), an open begins at the last start it knows ...
    run(backend.open_writer(LOG).close())
    assert firsts == [known]
    # ... but one that applies the tail onto a restored store begins at the recovery cursor.
    handed_over: list[LogRecord] = []
    writer = backend.open_writer(LOG, on_record=handed_over.append)
    assert writer.last_sequence == 300
    assert firsts[1] == handed_over[0].sequence
    assert 201 - pulsar_log.INDEX_STRIDE - 10 <= handed_over[0].sequence <= 201
    assert payloads_of(handed_over) == payloads[handed_over[0].sequence - 1 :]
    run(writer.close())


def _internal_stats(admin: PulsarAdmin, backend: PulsarLogBackend, log: str) -> dict[str, Any]:
    _, stats = admin.call("GET", f"{backend._topic_path(log)}/internalStats")
    assert isinstance(stats, dict)
    return stats


def test_truncation_deletes_acknowledged_ledgers(
    pulsar_service: PulsarService, backends: Callable[[], PulsarLogBackend]
) -> None:
    backend = backends()
    admin = PulsarAdmin(pulsar_service.admin_url)

    async def fill(count: int) -> None:
        writer = backend.open_writer(LOG)
        for _ in range(count // 10):
            await writer.append([b"x" * 1000] * 10)
        await writer.close()

    run(fill(200))
    first_ledgers = [
        ledger["ledgerId"] for ledger in _internal_stats(admin, backend, LOG)["ledgers"]
    ]
    # Unloading the topic closes its ledger: later records go to a new one.
    admin.call("PUT", f"{backend._topic_path(LOG)}/unload")
    run(fill(200))
    size_before = backend.size_bytes(LOG)
    backend.truncate(LOG, 350)
    remaining = [r.sequence for r in backend.read(LOG, 1)]
    assert remaining[0] <= 350 and remaining == list(range(remaining[0], 401))
    # Every entry of the first ledgers is acknowledged now: Pulsar deletes them.
    deadline = time.monotonic() + 30
    while True:
        ledgers = [ledger["ledgerId"] for ledger in _internal_stats(admin, backend, LOG)["ledgers"]]
        if not set(first_ledgers) & set(ledgers):
            break
        assert time.monotonic() < deadline, f"ledgers {first_ledgers} still in {ledgers}"
        time.sleep(0.5)
    assert backend.size_bytes(LOG) < size_before
    # Truncating never goes back and never loses the last record.
    backend.truncate(LOG, 10)
    backend.truncate(LOG, 10**9)
    reopened = backends()
    writer = reopened.open_writer(LOG)
    assert writer.last_sequence == 400
    assert run(writer.append([b"next"])) == 401
    writer.close_sync()
    tail = [r.sequence for r in reopened.read(LOG, 1)]
    assert tail[0] > 300 and tail[-2:] == [400, 401]


def test_stale_epoch_records_are_skipped_and_foreign_messages_are_corruption(
    backends: Callable[[], PulsarLogBackend],
) -> None:
    backend = backends()

    def raw_send(log: str, message: bytes) -> None:
        producer = backend._client().create_producer(backend._topic(log))
        try:
            send_and_wait(producer, [message], 10)
        finally:
            producer.close()

    async def scenario() -> None:
        first = backend.open_writer(LOG)
        await first.append([b"a", b"b"])
        old_epoch = first.epoch
        await first.close()
        second = backend.open_writer(LOG)
        await second.close()
        # A record of the first writer that reached the topic after the second one's FENCE.
        raw_send(LOG, encode_header(KIND_DATA, old_epoch, 3) + b"stale")
        assert payloads_of(list(backend.read(LOG, 1))) == [b"a", b"b"]
        third = backends().open_writer(LOG)
        assert third.last_sequence == 2
        assert await third.append([b"c"]) == 3
        await third.close()
        assert payloads_of(list(backend.read(LOG, 1))) == [b"a", b"b", b"c"]

        other = backend.open_writer("other")
        await other.append([b"x"])
        await other.close()
        raw_send("other", b"not a TableKeeper record")
        with pytest.raises(CorruptionError, match="damaged message"):
            list(backend.read("other", 1))
        with pytest.raises(CorruptionError):
            backends().open_writer("other")

    run(scenario())


def test_pulsar_unreachable_is_unavailable() -> None:
    from tests.support.server import free_port

    backend = PulsarLogBackend(
        f"pulsar://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}", timeout_s=2
    )
    store = PulsarCheckpointStore(
        f"pulsar://127.0.0.1:{free_port()}",
        f"http://127.0.0.1:{free_port()}",
        timeout_s=2,
        clock=SystemClock(),
    )
    calls: list[Callable[[], object]] = [
        lambda: backend.open_writer(LOG),
        lambda: list(backend.read(LOG, 1)),
        lambda: backend.truncate(LOG, 5),
        lambda: store.exists("r/objects/x"),
        lambda: store.put_bytes("r/manifests/m", b"{}"),
    ]
    try:
        for call in calls:
            started = time.monotonic()
            with pytest.raises(UnavailableError):
                call()
            # Bounded by `timeout_s`, not by the Pulsar client's own operation timeout (30 s)
            # nor by an HTTP call without one.
            assert time.monotonic() - started < 30
        assert backend.size_bytes(LOG) == 0
    finally:
        backend.close()
        store.close()


# --------------------------------------------------------------------------- checkpoint store


def test_checkpoint_store(pulsar_service: PulsarService, tmp_path: Path) -> None:
    namespace = unique_namespace("ckpt")

    def make() -> PulsarCheckpointStore:
        return PulsarCheckpointStore(
            pulsar_service.service_url,
            pulsar_service.admin_url,
            namespace=namespace,
            timeout_s=10,
            clock=SystemClock(),
        )

    store, other = make(), make()
    admin = PulsarAdmin(pulsar_service.admin_url)

    def data_topics() -> set[str]:
        _, topics = admin.call("GET", f"/admin/v2/persistent/public/{namespace}")
        return {t.rsplit("/", 1)[1] for t in topics if t.rsplit("/", 1)[1].startswith("d.")}

    try:
        obj = "r1/objects/" + "ab" * 32
        assert not store.exists(obj)
        assert store.list("r1") == []
        with pytest.raises(FileNotFoundError):
            store.get_bytes(obj)
        with pytest.raises(FileNotFoundError):
            store.get_file(obj, tmp_path / "missing")

        big = os.urandom(5 * MiB // 2 + 7)  # three 1 MiB chunks
        source = tmp_path / "big.sst"
        source.write_bytes(big)
        assert store.put_file(obj, source) == len(big)
        assert store.put_file(obj, source) == 0  # immutable: a second put is a no-op
        assert store.exists(obj) and other.exists(obj)
        other.get_file(obj, tmp_path / "copy")
        assert (tmp_path / "copy").read_bytes() == big
        assert len(data_topics()) == 1

        manifest = "r1/manifests/00000000000000000042-000001700000000000.json"
        store.put_bytes(manifest, b'{"v": 1}')
        assert other.get_bytes(manifest) == b'{"v": 1}'
        store.put_bytes(manifest, big[: 300 * 1024])  # over the inline limit: a data topic
        assert other.get_bytes(manifest) == big[: 300 * 1024]
        assert len(data_topics()) == 2
        store.put_bytes(manifest, b'{"v": 3}')  # replaced: the old version's data is deleted
        assert other.get_bytes(manifest) == b'{"v": 3}'
        assert len(data_topics()) == 1

        odd = "r1/objects/with spaces, é and =/x"
        store.put_bytes(odd, b"")
        assert other.get_bytes(odd) == b""
        store.put_bytes("r10/objects/x", b"elsewhere")
        assert other.list("r1") == sorted([obj, manifest, odd])
        assert other.list("r1/objects/") == sorted([obj, odd])
        assert other.list("r10") == ["r10/objects/x"]

        other.delete(obj)
        other.delete(obj)  # idempotent
        other.delete("r1/objects/never")
        assert not store.exists(obj)
        assert data_topics() == set()
        with pytest.raises(FileNotFoundError):
            store.get_file(obj, tmp_path / "gone")
        assert store.list("r1") == sorted([manifest, odd])
        with pytest.raises(ValueError):
            store.put_bytes("r1//x", b"")
    finally:
        store.close()
        other.close()


# --------------------------------------------------------------------------- the SDK suite

# Every test of tests/integration/test_sdk.py runs here too, against a server whose range logs
# are Pulsar topics: the same fixtures names, served by a Pulsar-backed server.
client = sdk.client
ns = sdk.ns
table = sdk.table
for _name in dir(sdk):
    if _name.startswith("test_"):
        globals()[_name] = getattr(sdk, _name)


@pytest.fixture(scope="module")
def shared_server(
    pulsar_service: PulsarService, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("sdk-pulsar") / "data",
        extra_args=pulsar_args(pulsar_service, unique_namespace("sdk")),
    ).start(timeout_s=180)
    yield server
    assert server.process is not None
    if server.process.poll() is None:
        server.stop()


@pytest.fixture
def server(
    pulsar_service: PulsarService, tmp_path: Path, server_factory: list[ServerProcess]
) -> ServerProcess:
    """A fresh server on its own Pulsar namespace (overrides the conftest one)."""
    s = ServerProcess(
        tmp_path / "data", extra_args=pulsar_args(pulsar_service, unique_namespace("sdk"))
    )
    server_factory.append(s)
    return s.start(timeout_s=180)


# --------------------------------------------------------------------------- disk loss


def test_disk_loss_under_load_loses_no_acknowledged_write(
    pulsar_service: PulsarService, tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """kill -9 under load (with checkpoints every second truncating the logs), delete the data
    directory, start a new server process on a fresh one: every acknowledged write is there,
    rebuilt from the Pulsar checkpoints and the log tails."""
    args = [
        *pulsar_args(pulsar_service, unique_namespace("diskloss"), checkpoints=True),
        "--checkpoint-interval=1",
    ]
    first = ServerProcess(tmp_path / "first", extra_args=args)
    server_factory.append(first)
    first.start(timeout_s=180)
    table_id = _create_table(first)
    with _workers(first, tmp_path, 0, count=2) as workers:
        for worker in workers:
            worker.wait_acked(20, timeout_s=60)
        # Kill once a table range has been checkpointed under the load (a busy machine takes a
        # few seconds to get through the catalog ranges first), and a little later.
        checkpointed = rf"range \d+-{table_id:012d}-\d+: checkpoint at [1-9]"
        deadline = time.monotonic() + 90
        while not re.search(checkpointed, first.log_path.read_text(errors="replace")):
            assert time.monotonic() < deadline, first.log_tail()
            time.sleep(0.2)
        time.sleep(1)
        first.kill()
        journals = _stop_workers(workers)
    shutil.rmtree(first.data_dir)

    second = ServerProcess(tmp_path / "second", extra_args=args)
    server_factory.append(second)
    second.start(timeout_s=180)
    with Client(second.service) as c:
        checked = _check_state(c, journals)
    assert checked.acked >= 100, checked
    log = second.log_path.read_text(errors="replace")
    restored = re.findall(rf"range (\d+-{table_id:012d}-\d+): restored checkpoint at [1-9]", log)
    assert restored, log
    assert "Traceback" not in log and "refusing" not in log, log
    print(
        f"disk loss: {checked.acked} acked of {checked.attempted}; "
        f"{len(set(restored))} table ranges restored from Pulsar checkpoints"
    )


# --------------------------------------------------------------------------- fencing


def _ops(journals: list[JournalSummary]) -> dict[str, Op]:
    return {op.id: op for journal in journals for op in journal.ops.values()}


def _attempted(workers: list[Any]) -> set[str]:
    return {op_id for worker in workers for op_id in worker.summary().ops}


class _HeldWrites:
    """Puts of unique keys, each its own request, sent on a client that connected earlier."""

    def __init__(self, service: str, keys: list[tuple[str, str]]) -> None:
        self.keys = keys
        self.outcomes: dict[str, str] = {}
        self._ready = threading.Event()
        self._go = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run(service)))
        self._thread.daemon = True
        self._thread.start()
        assert self._ready.wait(30), "the client did not connect"

    async def _run(self, service: str) -> None:
        retry = RetryPolicy(deadline_s=2.0, call_timeout_s=60.0)
        async with AsyncClient(service, retry=retry) as c:
            t = await c.table(NS, TABLE)
            await t.get(self.keys[0][0], "warm-up")
            self._ready.set()
            await asyncio.to_thread(self._go.wait)

            async def one(pkey: str, lkey: str) -> None:
                try:
                    await t.put(pkey, lkey, b"held by the frozen server", expected_version=-1)
                    self.outcomes[pkey] = "ok"
                except Exception as exc:  # every outcome is recorded; the test judges them
                    self.outcomes[pkey] = f"{type(exc).__name__}: {exc}"

            await asyncio.gather(*(one(p, k) for p, k in self.keys))

    def send(self) -> None:
        self._go.set()

    @property
    def pending(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def _visible(c: Client, keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    t = c.table(NS, TABLE)
    return [(p, k) for p, k in keys if t.get(p, k) is not None]


def test_a_frozen_server_is_fenced_by_the_server_that_takes_over(
    pulsar_service: PulsarService, tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    args = pulsar_args(pulsar_service, unique_namespace("fencing"), checkpoints=True)
    first = ServerProcess(tmp_path / "first", extra_args=args)
    server_factory.append(first)
    first.start(timeout_s=180)
    _create_table(first)
    assert first.process is not None
    # Keys outside the workers' pkeys (their check scans those), spread over every range.
    held_keys = [(f"held-{i}", "k") for i in range(32)]
    takeover_keys = [(f"takeover-{i}", "k") for i in range(16)]
    with _workers(first, tmp_path, 0, count=2) as workers:
        for worker in workers:
            worker.wait_acked(20, timeout_s=60)
        held = _HeldWrites(first.service, held_keys)
        os.kill(first.process.pid, signal.SIGSTOP)
        try:
            wait_all_threads_stopped(first.process.pid)  # else a held write could be answered
            in_flight_at_stop = _attempted(workers)
            held.send()  # requests the frozen server holds (on its sockets) when it resumes
            second = ServerProcess(tmp_path / "second", extra_args=args)  # own dir and ports
            server_factory.append(second)
            second.start(timeout_s=180)
            with Client(second.service) as c:
                t = c.table(NS, TABLE)
                for pkey in ALL_DATA_PKEYS + ALL_COUNTER_PKEYS:
                    t.count(pkey)  # opens every range of the table: the first server is fenced
                for pkey, lkey in takeover_keys:
                    t.put(pkey, lkey, b"from the second server", expected_version=-1)
            assert held.pending, f"the frozen server answered: {held.outcomes}"
        finally:
            os.kill(first.process.pid, signal.SIGCONT)
        resumed_at = _attempted(workers)
        held.join(timeout_s=60)
        assert not held.pending
        time.sleep(1)  # the workers keep trying against the fenced server
        journals = _stop_workers(workers)
    first.kill()

    # The frozen server acknowledged nothing it held or got after resuming.
    assert len(held.outcomes) == len(held_keys)
    assert not [k for k, outcome in held.outcomes.items() if outcome == "ok"], held.outcomes
    after_resume = [op for op_id, op in _ops(journals).items() if op_id not in resumed_at]
    assert after_resume, "the workers sent nothing to the resumed server"
    assert not [op for op in after_resume if op.acked], after_resume
    # Refused as "not served here" (retryable: nothing applied): UnavailableError, or
    # InternalServerError for an op of a coalesced Batch the server marked retryable.
    # (A write cut off after it left is an OutcomeUnknownError, a subclass of UnavailableError.)
    # Or, for the writes of a group the resumed server was appending when Pulsar refused it as
    # fenced, UnexpectedError: a fenced producer's send may have reached the topic before the
    # fence, so the server cannot say whether they were applied (`check` below shows that no
    # put of theirs was). Which one an op gets depends on where the resumed server first finds
    # out that it lost the range, so each is accepted.
    errors = Counter(_error_kind(op) for op in after_resume)
    allowed = {"UnavailableError", "OutcomeUnknownError", "InternalServerError"}
    assert set(errors) <= allowed | {"UnexpectedError"}, errors
    unknown = [op.error for op in after_resume if _error_kind(op) == "UnexpectedError"]
    assert all("log fenced by a newer writer" in error for error in unknown), unknown[:3]
    assert not [op.error for op in after_resume if _BUG.search(op.error)]

    def check(c: Client) -> None:
        checked = _check_state(c, journals)  # every write ever acknowledged is there
        assert not _visible(c, held_keys)
        assert len(_visible(c, takeover_keys)) == len(takeover_keys)
        t = c.table(NS, TABLE)
        late = [op for op in after_resume if op.kind != "inc"]
        assert not [op for op in late if any(t.get(op.pkey, k) for k in op.lkeys)]
        print(
            f"fencing: {checked.acked} acked of {checked.attempted}; "
            f"{len(in_flight_at_stop)} attempted before the freeze, {len(after_resume)} after it"
        )

    with Client(second.service) as c:
        check(c)
    # ... and a server replaying the logs from scratch sees the same.
    assert second.stop() == 0
    third = ServerProcess(tmp_path / "third", extra_args=args)
    server_factory.append(third)
    third.start(timeout_s=180)
    with Client(third.service) as c:
        check(c)


# --------------------------------------------------------------------------- Pulsar restart


_BUG = re.compile(r"RocksDB|internal error|refusing|damaged|Corruption|Traceback")


def _error_kind(op: Op) -> str:
    return op.error.split(":")[0]


def _error_kinds(ops: list[Op]) -> Counter[str]:
    return Counter(_error_kind(op) for op in ops if op.outcome == "err")


@pytest.fixture
def restartable_pulsar(
    pulsar_service: PulsarService, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PulsarService]:
    """The session's Pulsar when this test may stop and start it, else (one shared by other
    test processes, named by its URLs: `make test`'s) a Pulsar of the test's own."""
    if pulsar_service.restartable:
        yield pulsar_service
        return
    own = PulsarService.launch(tmp_path_factory.mktemp("own-pulsar") / "pulsar", timeout_s=240)
    try:
        yield own
    finally:
        own.close()


def test_pulsar_restart_under_load(
    restartable_pulsar: PulsarService, tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    pulsar_service = restartable_pulsar  # (its servers stop before it: fixtures' order)
    server = ServerProcess(
        tmp_path / "data",
        extra_args=pulsar_args(pulsar_service, unique_namespace("restart"), timeout_s=5),
    )
    server_factory.append(server)
    server.start(timeout_s=180)
    _create_table(server)
    with _workers(server, tmp_path, 0, count=2) as workers:
        for worker in workers:
            worker.wait_acked(20, timeout_s=60)
        pulsar_service.stop()
        down = _attempted(workers)
        time.sleep(3)
        while_down = _attempted(workers)  # resolved long before Pulsar is back
        time.sleep(5)  # more than --pulsar-timeout: appends in flight time out
        pulsar_service.start()
        up = _attempted(workers)
        deadline = time.monotonic() + 90
        while True:  # writes succeed again
            ops = _ops([w.summary() for w in workers])
            recovered = [op for op_id, op in ops.items() if op_id not in up and op.acked]
            if len(recovered) >= 50:
                break
            assert time.monotonic() < deadline, _error_kinds(list(ops.values()))
            time.sleep(0.2)
        journals = _stop_workers(workers)

    ops = _ops(journals)
    during = [op for op_id, op in ops.items() if op_id in while_down and op_id not in down]
    kinds = _error_kinds(list(ops.values()))
    # While Pulsar is down writes fail with errors the SDK calls retryable ("not applied"):
    # UnavailableError, or InternalServerError for an op of a coalesced Batch the server marked
    # retryable. The appends in flight when it went away: UnexpectedError ("may or may not be
    # applied"). Nothing else: no damaged or half-open range.
    assert kinds["UnavailableError"] + kinds["InternalServerError"] > 0, kinds
    allowed = {"UnavailableError", "OutcomeUnknownError", "InternalServerError", "UnexpectedError"}
    assert set(kinds) <= allowed, kinds
    assert {"UnavailableError", "InternalServerError"} & {_error_kind(op) for op in during}
    bad = [op.error for op in ops.values() if _BUG.search(op.error)]
    assert not bad, bad[:5]
    assert during and not [op for op in during if op.acked], "acknowledged while Pulsar was down"
    with Client(server.service) as c:
        checked = _check_state(c, journals)
    # The logs hold everything: a kill -9 and a replay from Pulsar give the same state.
    server.kill()
    server.start(timeout_s=180)
    with Client(server.service) as c:
        _check_state(c, journals)
    print(f"pulsar restart: {checked.acked} acked of {checked.attempted}; errors {dict(kinds)}")
