"""Crash tests against real server processes: kill -9 under load, torn WAL tails, corruption in
the middle of a WAL, and graceful SIGTERM under load.

The durability contract under test: a client hears "ok" only after the command's log record is
fsynced, RocksDB (whose own WAL is off) holds the applied log position in the same write batch as
the data, and a restart replays the log from that position. So after any crash every
acknowledged write is there; writes that were in flight may or may not be, but never half of
one (a txn is all or nothing), never twice, and never with a wrong value.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tablekeeper import Client, KeyValue, RetryPolicy, TableKeeperError
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.log.codec import (
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    RecordDecoder,
    encode_batch,
)
from tests.support.crash_worker import (
    ALL_COUNTER_PKEYS,
    ALL_DATA_PKEYS,
    COUNTER_LKEY,
    JournalSummary,
    Op,
    WorkerProcess,
    value_for,
)
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

NS = "crash"
TABLE = "t"
WORKERS = 4
TASKS_PER_WORKER = 32
LOAD_S = 3.0
ROOT_LOG = "00000-000000000000-000000000000"


# --------------------------------------------------------------------------- helpers


def _start(server: ServerProcess) -> int:
    """Start (or restart) `server`; return the offset in its log file where this run begins."""
    offset = server.log_path.stat().st_size if server.log_path.exists() else 0
    server.start(timeout_s=180)
    return offset


def _log_since(server: ServerProcess, offset: int) -> str:
    with open(server.log_path, "rb") as file:
        file.seek(offset)
        return file.read().decode(errors="replace")


def _create_table(server: ServerProcess, ranges: int = 4) -> int:
    with Client(server.service) as client:
        client.create_namespace(NS)
        return client.create_table(NS, TABLE, ranges=ranges).table_id


@dataclass(frozen=True)
class WalRecord:
    offset: int
    end: int
    sequence: int
    command: wal_pb2.WalCommand

    @property
    def payload_offset(self) -> int:
        return self.offset + RECORD_HEADER_SIZE


def _segments(log_dir: Path) -> list[Path]:
    return sorted(log_dir.glob("*.wal"))


def _wal_records(segment: Path) -> list[WalRecord]:
    """Decode every record of a (valid) segment file, with its byte span."""
    records = []
    with open(segment, "rb") as file:
        decoder = RecordDecoder(
            file,
            source=str(segment),
            first_sequence=int(segment.stem),
            end_offset=os.fstat(file.fileno()).st_size,
        )
        start = SEGMENT_HEADER_SIZE
        for record in decoder:
            command = wal_pb2.WalCommand.FromString(record.payload)
            records.append(WalRecord(start, decoder.valid_end, record.sequence, command))
            start = decoder.valid_end
        assert decoder.torn is None, f"{segment} has a torn tail before the test damaged it"
    return records


def _table_logs(data_dir: Path, table_id: int) -> list[Path]:
    """The WAL directories of the table's ranges that exist (ranges open lazily)."""
    return sorted(p for p in (data_dir / "wal").iterdir() if f"-{table_id:012d}-" in p.name)


def _log_of_pkey(data_dir: Path, table_id: int, pkey: bytes) -> Path:
    """The WAL directory holding the puts of `pkey` (found by decoding the records)."""
    for log_dir in _table_logs(data_dir, table_id):
        for segment in _segments(log_dir):
            for record in _wal_records(segment):
                if record.command.put.header.r_key == pkey:
                    return log_dir
    raise AssertionError(f"no WAL record for pkey {pkey!r}")


def _value(i: int) -> bytes:
    return value_for(f"seq-{i}")


def _flip_byte(path: Path, offset: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))
    return bytes(data)


# --------------------------------------------------------------------------- checking load


@dataclass
class Checked:
    acked: int
    attempted: int
    unacked_applied: list[Op]
    """Puts and txns that are present although their caller never heard "ok"."""


def _check_state(client: Client, journals: list[JournalSummary]) -> Checked:
    """Check the server's state against what the workers journaled (see the module docstring).

    Collects every violation and fails with all of them, so a failure tells the whole story."""
    table = client.table(NS, TABLE)
    state: dict[tuple[str, str], KeyValue] = {}
    for pkey in ALL_DATA_PKEYS:
        for kv in table.scan(pkey):
            state[(pkey, kv.lkey.decode())] = kv
    counters = {pkey: table.get(pkey, COUNTER_LKEY) for pkey in ALL_COUNTER_PKEYS}

    ops: list[Op] = [op for journal in journals for op in journal.ops.values()]
    problems: list[str] = []
    owner: dict[tuple[str, str], Op] = {}
    acked_inc: Counter[str] = Counter()
    attempted_inc: Counter[str] = Counter()
    unacked_applied: list[Op] = []
    for op in ops:
        if op.outcome == "cmp_failed" or "KeyExistsError" in op.error:
            problems.append(f"{op.kind} {op.id} found its unique key present: applied twice? {op}")
        if op.kind == "inc":
            attempted_inc[op.pkey] += 1
            acked_inc[op.pkey] += op.acked
            continue
        present = [(op.pkey, lkey) in state for lkey in op.lkeys]
        for lkey in op.lkeys:
            owner[(op.pkey, lkey)] = op
        if op.acked and not all(present):
            problems.append(f"acknowledged {op.kind} {op.id} lost: {op.lkeys} present={present}")
        if op.kind == "txn" and any(present) and not all(present):
            problems.append(f"txn {op.id} half applied: {op.lkeys} present={present}")
        if not op.acked and any(present):
            unacked_applied.append(op)
        kvs = [state[(op.pkey, lkey)] for lkey in op.lkeys if (op.pkey, lkey) in state]
        if op.kind == "txn" and len({kv.mod_revision for kv in kvs}) > 1:
            problems.append(f"txn {op.id} keys have different revisions: {kvs}")
    for key, kv in state.items():
        if key not in owner:
            problems.append(f"key {key} is present but no worker ever wrote it")
            continue
        if kv.value != value_for(key[1]):
            problems.append(f"key {key} has a wrong value ({len(kv.value)} bytes)")
        if kv.version != 0 or kv.create_revision != kv.mod_revision:
            problems.append(f"key {key} was written more than once: {kv}")
    for pkey in ALL_COUNTER_PKEYS:
        counter = counters[pkey]
        total = 0 if counter is None else counter.number
        if total is None or not acked_inc[pkey] <= total <= attempted_inc[pkey]:
            problems.append(
                f"counter {pkey} = {total}, but {acked_inc[pkey]} increments were acknowledged "
                f"and {attempted_inc[pkey]} attempted"
            )
        elif counter is not None and counter.version != total - 1:
            problems.append(f"counter {pkey} = {total} at version {counter.version}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    return Checked(
        acked=sum(op.acked for op in ops), attempted=len(ops), unacked_applied=unacked_applied
    )


@contextmanager
def _workers(
    server: ServerProcess | str,
    journal_dir: Path,
    round_: int,
    count: int = WORKERS,
    *,
    tasks: int = TASKS_PER_WORKER,
    retry_deadline_s: float = 2.0,
) -> Iterator[list[WorkerProcess]]:
    """`count` worker processes against `server` (or a service URI), killed on the way out."""
    workers: list[WorkerProcess] = []
    try:
        for w in range(count):
            workers.append(
                WorkerProcess(
                    service=server if isinstance(server, str) else server.service,
                    namespace=NS,
                    table=TABLE,
                    journal=journal_dir / f"round{round_}-worker{w}.jsonl",
                    worker=w,
                    round_=round_,
                    tasks=tasks,
                    retry_deadline_s=retry_deadline_s,
                )
            )
        yield workers
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()


def _stop_workers(workers: list[WorkerProcess]) -> list[JournalSummary]:
    """Stop the workers; check they resolved or cancelled every op and exited without a crash."""
    for worker in workers:  # signal all first: they drain in parallel
        worker.request_stop()
    summaries = []
    for worker in workers:
        code = worker.stop()
        summary = worker.summary()
        assert code == 0 and summary.done is not None, (
            f"worker exited with {code} (done={summary.done}): {worker.stderr_tail()}"
        )
        summaries.append(summary)
    return summaries


# --------------------------------------------------------------------------- 1. kill -9 under load


def test_kill_9_under_load_loses_no_acknowledged_write(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """Three rounds of: 4 client processes x 32 tasks of puts / increments / txns, kill -9 the
    server mid-load, restart it on the same data dir, check every write ever acknowledged."""
    server = ServerProcess(tmp_path / "data")
    server_factory.append(server)
    _start(server)
    table_id = _create_table(server)
    journals: list[JournalSummary] = []
    for round_ in range(3):
        with _workers(server, tmp_path, round_) as workers:
            for worker in workers:
                worker.wait_acked(20, timeout_s=60)
            time.sleep(LOAD_S)
            server.kill()
            round_journals = _stop_workers(workers)
        journals += round_journals
        round_acked = sum(j.acked for j in round_journals)
        assert round_acked >= 100, f"round {round_}: only {round_acked} acks; no real load"
        # The only failures are the lost connection; no server-side error under load.
        errors = Counter(
            op.error.split(":")[0] for j in round_journals for op in j.ops.values() if op.error
        )
        assert set(errors) <= {"UnavailableError", "OutcomeUnknownError"}, errors

        offset = _start(server)  # no manual repair: the same data dir, as the crash left it
        with Client(server.service) as client:
            checked = _check_state(client, journals)
        log = _log_since(server, offset)
        assert "refusing" not in log and "Traceback" not in log, log
        # RocksDB's memtables died with the process: every range of the table (opened by the
        # check above) came back by replaying its WAL.
        replayed = set(re.findall(rf"range (\d+-{table_id:012d}-\d+): replayed [1-9]", log))
        assert len(replayed) == 4, f"round {round_}: ranges replayed: {replayed}\n{log}"
        print(
            f"round {round_}: {round_acked} acked this round; cumulative {checked.acked} acked "
            f"of {checked.attempted} attempted, {len(checked.unacked_applied)} unacked but applied"
        )
    assert "Traceback" not in server.log_path.read_text(errors="replace")


# --------------------------------------------------------------------------- 2. torn tail

TORN_KEYS = 40
TORN_PKEY = b"torn"


def _damage_tail(segment: Path, damage: str, last: WalRecord) -> tuple[set[bytes], set[bytes]]:
    """Damage the end of `segment` as an append in flight during a crash could have left it.

    Returns (keys that must survive beyond k000..k038, keys that may survive). The damage
    goes where the records end: inside the segment's reserved (zero) tail, which is where the
    server writes its next group."""
    rng = random.Random(damage)
    size = last.end
    next_sequence = last.sequence + 1

    def in_flight_command(lkey: bytes) -> bytes:
        command = wal_pb2.WalCommand(timestamp_ms=1)
        command.put.header.r_key = TORN_PKEY
        command.put.key = lkey
        command.put.value = b"in flight" * 20
        return command.SerializeToString()

    last_key = f"k{TORN_KEYS - 1:03d}".encode()
    with open(segment, "r+b") as file:
        if damage == "garbage":
            file.seek(size)
            file.write(rng.randbytes(777))
            return {last_key}, set()
        if damage == "zeros":  # pages allocated but never written, past the reserve
            file.seek(segment.stat().st_size)
            file.write(bytes(8192))
            return {last_key}, set()
        if damage == "partial_record":  # a one-record group cut in the middle of its payload
            data = encode_batch(next_sequence, [in_flight_command(b"in-flight")])
            file.seek(size)
            file.write(data[: len(data) // 2])
            return {last_key}, set()
        if damage == "partial_group":  # a 3-record group whose last record never made it
            payloads = [in_flight_command(f"in-flight-{i}".encode()) for i in range(3)]
            data = encode_batch(next_sequence, payloads)
            file.seek(size)
            file.write(data[: len(data) - 10])
            return {last_key}, {b"in-flight-0", b"in-flight-1"}
        if damage == "truncate_last_record":  # the last record itself is the torn append
            file.truncate(last.offset + (last.end - last.offset) // 2)
            return set(), set()
        if damage == "partial_header":
            file.seek(size)
            file.write(encode_batch(next_sequence, [in_flight_command(b"in-flight")])[:9])
            return {last_key}, set()
    raise AssertionError(damage)


@pytest.mark.parametrize(
    "damage",
    [
        "garbage",
        "zeros",
        "partial_header",
        "partial_record",
        "partial_group",
        "truncate_last_record",
    ],
)
def test_torn_tail_is_cut_and_everything_before_it_survives(
    tmp_path: Path, server_factory: list[ServerProcess], damage: str
) -> None:
    """kill -9, then leave the last segment as an append in flight could have: the restart cuts
    the torn tail (and says so; zeros are no torn tail but the segment's reserved space), keeps
    every record before it, and the log goes on from there with consecutive revisions that
    survive a second kill -9."""
    server = ServerProcess(tmp_path / "data")
    server_factory.append(server)
    _start(server)
    table_id = _create_table(server)
    keys = [f"k{i:03d}".encode() for i in range(TORN_KEYS)]
    with Client(server.service) as client:
        table = client.table(NS, TABLE)
        for i, key in enumerate(keys):  # one at a time: one record per append group
            table.put(TORN_PKEY, key, _value(i))
    server.kill()

    log_dir = _log_of_pkey(server.data_dir, table_id, TORN_PKEY)
    segment = _segments(log_dir)[-1]
    records = _wal_records(segment)
    last = records[-1]
    assert last.command.put.key == keys[-1]
    must_extra, may_extra = _damage_tail(segment, damage, last)

    offset = _start(server)
    with Client(server.service) as client:
        table = client.table(NS, TABLE)
        found = {kv.lkey: kv for kv in table.scan(TORN_PKEY)}
        expected = set(keys[:-1]) | must_extra
        assert expected <= set(found), f"lost: {sorted(expected - set(found))}"
        assert set(found) <= expected | may_extra, f"extra: {sorted(set(found) - expected)}"
        for i, key in enumerate(keys):
            if key in found:
                assert found[key].value == _value(i)
        if damage == "truncate_last_record":
            assert keys[-1] not in found
        log = _log_since(server, offset)
        if damage == "zeros":  # zeros after the records are where the next group goes
            assert "cutting a torn tail" not in log, log
        else:
            assert "cutting a torn tail" in log and str(segment) in log, log

        # The log goes on after the cut: new writes take the next revisions, and survive too.
        top = max(kv.mod_revision for kv in found.values())
        for i in range(5):
            table.put(TORN_PKEY, f"after-{i}", _value(100 + i))
        after = {kv.lkey: kv for kv in table.scan(TORN_PKEY)}
        assert [after[f"after-{i}".encode()].mod_revision for i in range(5)] == [
            top + 1 + i for i in range(5)
        ]
    server.kill()
    _start(server)
    with Client(server.service) as client:
        again = {kv.lkey: kv for kv in client.table(NS, TABLE).scan(TORN_PKEY)}
    assert again == after


# --------------------------------------------------------------------------- 3. corruption


def test_corruption_in_the_root_log_refuses_to_start(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """A damaged record followed by valid ones is corruption, not a torn tail: the server exits
    non-zero naming the log file and offset, never serves, and leaves the file untouched."""
    server = ServerProcess(tmp_path / "data")
    server_factory.append(server)
    _start(server)
    with Client(server.service) as client:
        for i in range(4):  # each a record in the root range's log
            client.create_namespace(f"ns{i}")
            client.create_table(f"ns{i}", "t", ranges=2)
    server.kill()  # RocksDB's memtables are lost: the root range must replay its log

    segment = _segments(server.data_dir / "wal" / ROOT_LOG)[-1]
    records = _wal_records(segment)
    assert len(records) >= 8
    victim = records[1]
    corrupted = _flip_byte(segment, victim.payload_offset + (victim.end - victim.offset) // 3)

    for _ in range(2):  # the refusal is stable: the first attempt changed nothing
        offset = server.log_path.stat().st_size
        with pytest.raises(RuntimeError, match="server exited with 3"):
            server.start(timeout_s=180)
        log = _log_since(server, offset)
        assert "refusing to start" in log, log
        assert ROOT_LOG in log and str(segment) in log, log
        assert f"byte offset {victim.offset}" in log, log
        assert "serving on" not in log, log
        assert segment.read_bytes() == corrupted, "recovery modified a corrupted log"


def test_corruption_in_a_table_range_log_is_never_served(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """Table ranges open (and recover) on first use, so the server does come up, but the damaged
    range refuses every request with an error naming the log, never serves partial data, and
    the other ranges keep serving."""
    server = ServerProcess(tmp_path / "data")
    server_factory.append(server)
    _start(server)
    table_id = _create_table(server)
    other_pkeys = [f"other-{i}".encode() for i in range(16)]
    with Client(server.service) as client:
        table = client.table(NS, TABLE)
        for i in range(30):
            table.put(b"victim", f"k{i:03d}", _value(i))
        for pkey in other_pkeys:
            table.put(pkey, "k", pkey)
    server.kill()

    log_dir = _log_of_pkey(server.data_dir, table_id, b"victim")
    segment = _segments(log_dir)[-1]
    records = _wal_records(segment)
    victim = next(r for r in records if r.command.put.key == b"k002")
    assert records[-1].sequence > victim.sequence + 10
    healthy = [p for p in other_pkeys if _log_of_pkey(server.data_dir, table_id, p) != log_dir]
    assert healthy, "every pkey landed in the damaged range"
    corrupted = _flip_byte(segment, victim.payload_offset + 3)

    offset = _start(server)
    with Client(server.service) as client:  # the SDK's patient policy: the healthy ranges serve
        table = client.table(NS, TABLE)
        for pkey in healthy:
            kv = table.get(pkey, "k")
            assert kv is not None and kv.value == pkey
    # Only the calls that must be refused get a short retry budget.
    fast = RetryPolicy(deadline_s=0.5, call_timeout_s=10.0)
    with Client(server.service, retry=fast) as client:
        table = client.table(NS, TABLE)  # the catalog answered above: no retry needed
        for attempt in range(3):  # the same refusal every time, not a different error later
            with pytest.raises(TableKeeperError) as read_error:
                table.get(b"victim", "k000")
            assert log_dir.name in str(read_error.value), (attempt, read_error.value)
            with pytest.raises(TableKeeperError) as scan_error:
                list(table.scan(b"victim"))
            assert log_dir.name in str(scan_error.value), (attempt, scan_error.value)
            with pytest.raises(TableKeeperError) as write_error:
                table.put(b"victim", "new", "x")
            assert log_dir.name in str(write_error.value), (attempt, write_error.value)
    log = _log_since(server, offset)
    assert str(segment) in log and f"byte offset {victim.offset}" in log, log
    assert segment.read_bytes() == corrupted, "recovery modified a corrupted log"


def test_a_missing_last_wal_segment_is_refused_not_silently_lost(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """kill -9, then the newest segment of a range's log disappears: the range must refuse with
    UNEXPECTED (600) and a reason naming the missing segment, not replay what is left and
    serve without the lost tail (the store, flushed lazily, is far behind the log)."""
    server = ServerProcess(
        tmp_path / "data", extra_args=["--wal-segment-bytes", "4096", "--checkpoint-interval", "0"]
    )
    server_factory.append(server)
    _start(server)
    table_id = _create_table(server)
    other_pkeys = [f"other-{i}".encode() for i in range(16)]
    with Client(server.service) as client:
        table = client.table(NS, TABLE)
        for i in range(60):
            table.put(b"victim", f"k{i:03d}", _value(i))
        for pkey in other_pkeys:
            table.put(pkey, "k", pkey)
    server.kill()

    log_dir = _log_of_pkey(server.data_dir, table_id, b"victim")
    segments = _segments(log_dir)
    assert len(segments) >= 3, segments
    last = segments[-1]
    lost = _wal_records(last)
    assert lost, "the last segment holds acknowledged writes"
    healthy = [p for p in other_pkeys if _log_of_pkey(server.data_dir, table_id, p) != log_dir]
    assert healthy, "every pkey landed in the damaged range"
    last.unlink()

    offset = _start(server)
    with Client(server.service) as client:  # the SDK's patient policy: the healthy ranges serve
        table = client.table(NS, TABLE)
        for pkey in healthy:
            kv = table.get(pkey, "k")
            assert kv is not None and kv.value == pkey
    # Only the calls that must be refused get a short retry budget.
    fast = RetryPolicy(deadline_s=0.5, call_timeout_s=10.0)
    with Client(server.service, retry=fast) as client:
        table = client.table(NS, TABLE)  # the catalog answered above: no retry needed
        for attempt in range(2):  # the same refusal every time
            with pytest.raises(TableKeeperError) as read_error:
                table.get(b"victim", "k000")
            assert read_error.value.code == 600, (attempt, read_error.value)
            assert f"{last.name} is missing" in str(read_error.value), (attempt, read_error.value)
            with pytest.raises(TableKeeperError) as write_error:
                table.put(b"victim", "new", "x")
            assert write_error.value.code == 600, (attempt, write_error.value)
    log = _log_since(server, offset)
    assert "refusing to serve" in log and str(last) in log, log
    assert _segments(log_dir) == segments[:-1], "recovery wrote to a log with a lost tail"


# --------------------------------------------------------------------------- 4. SIGTERM


def test_sigterm_under_load_drains_and_stops_cleanly(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """SIGTERM while 4 client processes write: the server drains and exits 0 saying "stopped
    cleanly"; every client call resolves (acked, or a clean transport error); after a restart
    every acknowledged write is there and no refused write was applied. Then one kill -9 round
    on top of the flushed state (replay from a non-zero applied position)."""
    server = ServerProcess(tmp_path / "data")
    server_factory.append(server)
    offset = _start(server)
    _create_table(server)
    with _workers(server, tmp_path, 0) as workers:
        for worker in workers:
            worker.wait_acked(20, timeout_s=60)
        time.sleep(2.0)
        code = server.stop(timeout_s=60)
        journals = _stop_workers(workers)
    log = _log_since(server, offset)
    assert code == 0, log
    assert "stopped cleanly" in log, log
    assert "Traceback" not in log and " ERROR " not in log, log

    ops = [op for journal in journals for op in journal.ops.values()]
    unresolved = [op for op in ops if op.outcome is None]
    assert not unresolved, f"{len(unresolved)} ops never resolved: {unresolved[:5]}"
    # Clean failures only: the server stopped taking calls (or was gone). Nothing indeterminate
    # (UnexpectedError) and no server-side error (InternalServerError).
    errors = Counter(op.error.split(":")[0] for op in ops if op.outcome == "err")
    assert set(errors) <= {"UnavailableError", "OutcomeUnknownError"}, errors
    print(f"{sum(op.acked for op in ops)} acked of {len(ops)}")

    offset = _start(server)
    with Client(server.service) as client:
        checked = _check_state(client, journals)
    assert "replayed" not in _log_since(server, offset), "a clean stop should leave no replay"
    # A write refused during the drain (gRPC CANCELLED: it arrived after the server stopped
    # taking calls) or never sent (no connection) must not have been applied: the SDK treats
    # "could not connect" as safe to retry, so applying it would let a retry apply it twice.
    refused = [
        op
        for op in checked.unacked_applied
        if any(hint in op.error for hint in ("CANCELLED", "failed to connect", "all backends"))
    ]
    assert not refused, f"refused writes were applied: {refused[:5]}"
    print(
        f"{len(checked.unacked_applied)} applied without an ack; errors: "
        f"{Counter(op.error[:50] for op in ops if op.outcome == 'err')}"
    )

    # Then a crash: RocksDB now holds flushed state with an applied position P > 0 (the clean
    # stop flushed it), so recovery must replay from P + 1, not from the start of the log.
    with _workers(server, tmp_path, 1) as workers:
        for worker in workers:
            worker.wait_acked(20, timeout_s=60)
        time.sleep(1.0)
        server.kill()
        journals += _stop_workers(workers)
    offset = _start(server)
    with Client(server.service) as client:
        _check_state(client, journals)
    replays = re.findall(r"replayed (\d+) commands up to (\d+)", _log_since(server, offset))
    assert any(0 < int(count) < int(upto) for count, upto in replays), replays
