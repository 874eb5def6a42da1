"""Resource exhaustion against real server processes: a full disk (a small tmpfs under the data
directory) answers a retryable status, not UNEXPECTED, and the range serves again by itself
once space is freed, with every acknowledged write, without a restart."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tablekeeper import Client, RetryPolicy, TableKeeperError, UnavailableError
from tablekeeper.watch import WatchEvent
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.log.codec import RecordDecoder
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

NS = "res"
TABLE = "t"
NO_RETRY = RetryPolicy(deadline_s=0.0, call_timeout_s=10.0)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs mounted as the data directory (the server's own log stays outside)."""
    path = tmp_path / "data"
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(directory: Path) -> Path:
    """Write a ballast file until the filesystem is full; return it."""
    ballast = directory / "ballast"
    with open(ballast, "wb", buffering=0) as file:
        for chunk in (1 << 20, 4096, 1):
            block = b"\0" * chunk
            while True:
                try:
                    file.write(block)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    return ballast


def _unusable_stores(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("db/*/*.unusable-*"))


def test_disk_full_is_retryable_and_the_range_recovers_once_space_is_freed(
    small_disk: Path, server_factory: list[ServerProcess]
) -> None:
    # Small segments: a segment's space is reserved ahead of its records (up to 1 MiB), so on a
    # full disk a log goes on taking records until its segment's reservation is used up, and
    # only then fails to create the next one. With 64 KiB that is a few hundred puts, not
    # thousands.
    server = ServerProcess(
        small_disk,
        extra_args=["--containers", "2", "--checkpoint-interval", "0"]
        + ["--wal-segment-bytes", str(64 * 1024)],
    )
    server_factory.append(server)
    server.start(timeout_s=180)
    assert server.process is not None
    pid = server.process.pid
    acked: dict[str, bytes] = {}
    with Client(server.service) as client:
        client.create_namespace(NS)
        client.create_table(NS, TABLE, ranges=2)
        table = client.table(NS, TABLE)
        for i in range(50):
            table.put(b"p", f"before-{i:03d}", b"v%d" % i)
            acked[f"before-{i:03d}"] = b"v%d" % i

    ballast = _fill(small_disk)
    refused: TableKeeperError | None = None
    with Client(server.service, retry=NO_RETRY) as client:
        table = client.table(NS, TABLE)
        # The segment's reserved space may still take a few hundred records; the next segment
        # cannot be created.
        for i in range(100_000):
            key, value = f"full-{i:06d}", b"x" * 200
            try:
                table.put(b"p", key, value)
            except TableKeeperError as exc:
                refused = exc
                refused_key = key
                break
            acked[key] = value
        assert refused is not None, "the disk never filled up"
        assert isinstance(refused, UnavailableError) and refused.retryable, repr(refused)
        assert refused.code != 600, repr(refused)
        assert "No space left on device" in str(refused), refused

        # Still full: the next request tries to reopen the range and says why, retryably; its
        # store is not set aside (it is not damaged) and nothing is restored.
        with pytest.raises(UnavailableError, match="No space left on device"):
            table.get(b"p", "before-000")
        assert _unusable_stores(small_disk) == []

        # The root range (namespaces, tables) too, once its segment's reserved space is used up.
        namespaces: list[str] = []
        for i in range(100_000):
            try:
                client.create_namespace(f"full_{i:06d}")
            except TableKeeperError as exc:
                assert isinstance(exc, UnavailableError) and exc.code != 600, repr(exc)
                assert "No space left on device" in str(exc), exc
                break
            namespaces.append(f"full_{i:06d}")
        else:
            raise AssertionError("the root range never ran out of space")

    ballast.unlink()
    with Client(server.service) as client:  # retries NOT_FOUND: the range reopens by itself
        table = client.table(NS, TABLE)
        table.put(b"p", "after", b"ok")
        acked["after"] = b"ok"
        missing = []
        for key, value in acked.items():
            kv = table.get(b"p", key)
            if kv is None or kv.value != value:
                missing.append(key)
        assert not missing, f"{len(missing)} acknowledged writes lost: {missing[:10]}"
        assert table.get(b"p", refused_key) is None  # refused, and cut back out of the log
        client.create_namespace("after")  # the root range reopened by itself too
        for name in [*namespaces, "after"]:
            assert client.get_namespace(name) is not None, name
    assert server.process.poll() is None and server.process.pid == pid  # never restarted
    assert _unusable_stores(small_disk) == []
    assert "Traceback" not in server.log_tail(400), server.log_tail(400)


# --------------------------------------------------------------------------- open ranges bound


def _metric(server: ServerProcess, name: str) -> float:
    text = server.metrics()
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}:\n{text}")


def _log_of_pkey(data_dir: Path, table_id: int, pkey: bytes) -> str:
    """The name of the range log holding puts of `pkey` (found by decoding the records)."""
    for log_dir in sorted((data_dir / "wal").iterdir()):
        if f"-{table_id:012d}-" not in log_dir.name:
            continue
        for segment in sorted(log_dir.glob("*.wal")):
            with open(segment, "rb") as file:
                decoder = RecordDecoder(
                    file,
                    source=str(segment),
                    first_sequence=int(segment.stem),
                    end_offset=os.fstat(file.fileno()).st_size,
                )
                for record in decoder:
                    if wal_pb2.WalCommand.FromString(record.payload).put.header.r_key == pkey:
                        return log_dir.name
    raise AssertionError(f"no WAL record for pkey {pkey!r}")


def test_open_ranges_stay_within_the_bound_and_a_watched_range_stays_open(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """--max-open-ranges 4 and two tables of 8 ranges: writing through all 16 ranges in rounds
    closes idle ranges and reopens them on demand (every value stays readable); the open count
    never exceeds the bound; the range a watch is open on is never closed."""
    server = ServerProcess(
        tmp_path / "data",
        extra_args=[
            "--max-open-ranges",
            "4",
            "--containers",
            "2",
            "--checkpoint-interval",
            "0",
            "--log-level",
            "DEBUG",
        ],
    )
    server_factory.append(server)
    server.start(timeout_s=180)
    pkeys = [f"pk-{i:02d}".encode() for i in range(40)]
    watched = pkeys[0]
    rounds = 3
    with Client(server.service) as client, Client(server.service) as watcher:
        client.create_namespace(NS)
        table_ids = [client.create_table(NS, name, ranges=8).table_id for name in ("a", "b")]
        tables = [client.table(NS, name) for name in ("a", "b")]
        events: list[WatchEvent] = []
        with watcher.table(NS, "a").watch(watched, start=b"") as watch:

            def collect() -> None:
                for event in watch:
                    events.append(event)
                    if len(events) == rounds:
                        return

            collector = threading.Thread(target=collect, daemon=True)
            collector.start()
            highest = 0.0
            for round_ in range(rounds):
                for table in tables:
                    for pkey in pkeys:
                        table.put(pkey, f"r{round_}", b"%s-%d" % (pkey, round_))
                        highest = max(highest, _metric(server, "tablekeeper_open_table_ranges"))
            for table in tables:
                for pkey in pkeys:
                    for round_ in range(rounds):
                        kv = table.get(pkey, f"r{round_}")
                        assert kv is not None and kv.value == b"%s-%d" % (pkey, round_)
                    highest = max(highest, _metric(server, "tablekeeper_open_table_ranges"))
            collector.join(60)  # a hang guard: the events were written above
            assert [e.lkey for e in events] == [b"r%d" % r for r in range(rounds)], events

    assert highest <= 4, highest
    assert _metric(server, "tablekeeper_max_open_ranges") == 4
    assert _metric(server, "tablekeeper_range_evictions_total") > 0
    assert _metric(server, "tablekeeper_open_files") > 0
    for table_id in table_ids:  # every range of both tables was opened (and so some reopened)
        logs = [p for p in (server.data_dir / "wal").iterdir() if f"-{table_id:012d}-" in p.name]
        assert len(logs) == 8, logs
    closed = re.findall(r"closing idle range (\S+)", server.log_tail(100_000))
    assert closed, "no range was closed for the bound"
    watched_log = _log_of_pkey(server.data_dir, table_ids[0], watched)
    assert watched_log not in closed, f"the watched range {watched_log} was closed"


# --------------------------------------------------------------------------- RocksDB memory


def test_the_shared_rocksdb_memory_is_reported(tmp_path: Path) -> None:
    """Every range's store draws on one budget (`--rocksdb-memory`); /metrics shows its use."""
    server = ServerProcess(tmp_path / "data", extra_args=["--rocksdb-memory", "32MiB"]).start()
    try:
        assert _metric(server, "tablekeeper_rocksdb_memory_budget_bytes") == 32 * 2**20
        with Client(server.service) as client:
            client.create_namespace("mem")
            client.create_table("mem", "t", ranges=4)
            table = client.table("mem", "t")
            table.batch_put([(f"p{i}", "k", os.urandom(512)) for i in range(2000)])
        # The ranges' memtables hold the writes, charged to the shared budget.
        assert _metric(server, "tablekeeper_rocksdb_memory_bytes") > 0
    finally:
        server.stop()
