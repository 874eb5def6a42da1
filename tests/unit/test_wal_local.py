"""The local log backend: crash recovery, corruption, segments, syncs, locking."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import subprocess
import sys
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tablekeeper_server.errors import (
    CorruptionError,
    LogFencedError,
    StorageUnavailableError,
    UnavailableError,
)
from tablekeeper_server.log import local as local_log
from tablekeeper_server.log.api import LogRecord
from tablekeeper_server.log.codec import (
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    RecordDecoder,
    UnsupportedFormatError,
    encode_batch,
)
from tablekeeper_server.log.local import LocalLogBackend, LogLockedError, segment_file_name

pytestmark = pytest.mark.unit

T = TypeVar("T")
LOG = "range-7"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class CountingSync:
    """A sync hook that counts calls and can fail or block them."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail_with: OSError | None = None
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        os.fdatasync(fd)


def write(backend: LocalLogBackend, groups: Sequence[Sequence[bytes]]) -> int:
    async def scenario() -> int:
        writer = backend.open_writer(LOG)
        last = writer.last_sequence
        for group in groups:
            last = await writer.append(group)
        await writer.close()
        return last

    return run(scenario())


class FailOnceSync(CountingSync):
    """Fails only the next sync after `fail_with` is set (a disk full only for a moment)."""

    def __call__(self, fd: int) -> None:
        error, self.fail_with = self.fail_with, None
        if error is not None:
            self.calls += 1
            raise error
        super().__call__(fd)


def append_one(backend: LocalLogBackend, payload: bytes) -> int:
    return write(backend, [[payload]])


def segments(backend: LocalLogBackend) -> list[Path]:
    return sorted(backend.log_dir(LOG).glob("*.wal"))


def only_segment(backend: LocalLogBackend) -> Path:
    (path,) = segments(backend)
    return path


def record_offset(payloads: Sequence[bytes], index: int) -> int:
    """File offset of record `index` (0-based) in a single segment holding `payloads`."""
    return SEGMENT_HEADER_SIZE + sum(RECORD_HEADER_SIZE + len(p) for p in payloads[:index])


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def payloads_of(backend: LocalLogBackend) -> list[bytes]:
    return [record.payload for record in backend.read(LOG, 1)]


PAYLOADS = [f"payload-{i}-".encode() * (i + 3) for i in range(6)]


# -- torn tails -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cut",
    [1, RECORD_HEADER_SIZE - 1, RECORD_HEADER_SIZE, RECORD_HEADER_SIZE + 5, -1],
    ids=["1-byte", "mid-header", "header-only", "mid-payload", "last-byte-missing"],
)
def test_torn_last_record_is_cut_off_and_numbering_continues(tmp_path: Path, cut: int) -> None:
    backend = LocalLogBackend(tmp_path)
    write(backend, [[p] for p in PAYLOADS])
    path = only_segment(backend)
    last_start = record_offset(PAYLOADS, 5)
    length = cut if cut > 0 else RECORD_HEADER_SIZE + len(PAYLOADS[5]) + cut
    os.truncate(path, last_start + length)

    backend = LocalLogBackend(tmp_path)
    writer = backend.open_writer(LOG)
    assert writer.last_sequence == 5
    assert path.stat().st_size == last_start
    assert run(writer.append([b"new six"])) == 6
    run(writer.close())
    assert payloads_of(backend) == [*PAYLOADS[:5], b"new six"]


@pytest.mark.parametrize(
    "tail",
    [os.urandom(1000), bytes(8192), b"\xff" * 17, bytes(RECORD_HEADER_SIZE) + b"x" * 50],
    ids=["random-garbage", "zero-filled", "ff-bytes", "zero-header-then-junk"],
)
def test_garbage_after_the_last_record_is_a_torn_tail(tmp_path: Path, tail: bytes) -> None:
    """A segment written without preallocation (as every build before it did): its file ends
    with its records, and what a crash appends after them is cut off."""
    backend = LocalLogBackend(tmp_path, preallocate_bytes=0)
    write(backend, [PAYLOADS[:3], PAYLOADS[3:]])
    path = only_segment(backend)
    good_size = path.stat().st_size
    with open(path, "ab") as file:
        file.write(tail)

    assert payloads_of(backend) == PAYLOADS  # readers stop at a torn tail
    writer = backend.open_writer(LOG)
    assert writer.last_sequence == 6
    # Zeros read as a reserved tail, where the next group goes; anything else is cut off.
    assert path.stat().st_size == good_size + (0 if any(tail) else len(tail))
    assert run(writer.append([b"seven"])) == 7
    run(writer.close())
    assert payloads_of(backend) == [*PAYLOADS, b"seven"]


def test_torn_group_with_a_hole_is_cut_off_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash may persist later pages of the last group but not earlier ones: the records after
    the hole belong to an append that never returned, so recovery drops them."""
    backend = LocalLogBackend(tmp_path)
    first_group, last_group = [b"a" * 100, b"b" * 100], [b"c" * 300, b"d" * 300, b"e" * 300]
    write(backend, [first_group, last_group])
    path = only_segment(backend)
    everything = [*first_group, *last_group]
    hole_start = record_offset(everything, 2)
    data = bytearray(path.read_bytes())
    data[hole_start : hole_start + 200] = bytes(200)  # "d" and "e" stay intact
    path.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING):
        writer = backend.open_writer(LOG)
    assert writer.last_sequence == 2
    assert "2 valid records of the same unfinished group discarded" in caplog.text
    assert path.stat().st_size == hole_start
    assert run(writer.append([b"f"])) == 3
    run(writer.close())
    assert payloads_of(backend) == [*first_group, b"f"]


def test_damage_in_the_last_group_is_treated_as_torn(tmp_path: Path) -> None:
    """Documented limit: damage inside the last group cannot be told from a torn write."""
    backend = LocalLogBackend(tmp_path)
    write(backend, [PAYLOADS[:2], PAYLOADS[2:]])
    flip_byte(only_segment(backend), record_offset(PAYLOADS, 3) + RECORD_HEADER_SIZE)
    writer = backend.open_writer(LOG)
    assert writer.last_sequence == 3
    run(writer.close())


# -- corruption -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field_offset",
    [0, 2, 4, 8, 15, RECORD_HEADER_SIZE, RECORD_HEADER_SIZE + 7],
    ids=["length", "length-high", "crc", "sequence", "flags", "payload-first", "payload"],
)
def test_damaged_middle_record_refuses_to_open(tmp_path: Path, field_offset: int) -> None:
    backend = LocalLogBackend(tmp_path)
    write(backend, [[p] for p in PAYLOADS])
    path = only_segment(backend)
    damaged = record_offset(PAYLOADS, 2)
    flip_byte(path, damaged + field_offset)
    size = path.stat().st_size

    with pytest.raises(CorruptionError) as info:
        backend.open_writer(LOG)
    message = str(info.value)
    assert path.name in message
    assert repr(LOG) in message
    assert f"byte offset {damaged}" in message
    assert path.stat().st_size == size  # nothing was cut
    with pytest.raises(CorruptionError, match=path.name):
        list(backend.read(LOG, 1))
    # The records before the damage can still be read.
    reader = backend.read(LOG, 1)
    assert [next(reader).payload, next(reader).payload] == PAYLOADS[:2]


def test_damage_in_a_non_last_segment_refuses_to_open(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, segment_bytes_max=200)
    write(backend, [[b"x" * 100] for _ in range(6)])
    first, *_ = paths = segments(backend)
    assert len(paths) >= 3
    # Even the *last* record of a non-last segment is not a torn tail.
    flip_byte(first, first.stat().st_size - 1)
    with pytest.raises(CorruptionError, match=first.name):
        backend.open_writer(LOG)
    with pytest.raises(CorruptionError, match=first.name):
        list(backend.read(LOG, 1))


def test_truncated_non_last_segment_refuses_to_open(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, segment_bytes_max=200)
    write(backend, [[b"x" * 100] for _ in range(6)])
    first = segments(backend)[0]
    os.truncate(first, first.stat().st_size - 3)
    with pytest.raises(CorruptionError, match="not the last"):
        backend.open_writer(LOG)


def test_missing_middle_segment_refuses_to_open(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, segment_bytes_max=200)
    write(backend, [[b"x" * 100] for _ in range(6)])
    paths = segments(backend)
    paths[1].unlink()
    with pytest.raises(CorruptionError, match="records are missing"):
        backend.open_writer(LOG)
    with pytest.raises(CorruptionError, match="records are missing"):
        list(backend.read(LOG, 1))


def test_missing_last_segment_refuses_to_open_naming_it(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, segment_bytes_max=200)
    write(backend, [[b"x" * 100] for _ in range(6)])
    *_, last = paths = segments(backend)
    assert len(paths) >= 3
    last.unlink()
    with pytest.raises(CorruptionError, match=f"segment .*{last.name} is missing") as refused:
        backend.open_writer(LOG)
    assert "records are missing" in refused.value.message
    with pytest.raises(CorruptionError, match=f"{last.name} is missing"):
        list(backend.read(LOG, 1))
    # Refusing changed nothing: no segment was created in place of the missing one.
    assert segments(backend) == paths[:-1]


def test_missing_only_segment_after_truncation_refuses_to_open(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, segment_bytes_max=200)
    write(backend, [[b"x" * 100] for _ in range(6)])
    backend.truncate(LOG, 10**6)
    (only,) = segments(backend)
    only.unlink()
    with pytest.raises(CorruptionError, match=f"{only.name} is missing.*none is"):
        backend.open_writer(LOG, min_last_sequence=3)
    assert segments(backend) == []


def test_a_log_without_tail_marker_gets_one_and_is_then_protected(tmp_path: Path) -> None:
    """Logs written before tail markers existed open as before and are protected from then on;
    a crash between creating a segment and moving the marker leaves the marker behind, which
    is not a gap either."""
    backend = LocalLogBackend(tmp_path, segment_bytes_max=200)
    write(backend, [[b"x" * 100] for _ in range(6)])
    marker = backend.log_dir(LOG) / "TAIL"
    marker.unlink()
    writer = backend.open_writer(LOG)
    assert writer.last_sequence == 6
    run(writer.close())
    *_, last = segments(backend)
    assert int(marker.read_text()) == int(last.name.removesuffix(".wal"))
    marker.write_text(f"{1:020d}\n")  # behind the newest segment
    writer = backend.open_writer(LOG)
    assert writer.last_sequence == 6
    run(writer.close())
    assert int(marker.read_text()) == int(last.name.removesuffix(".wal"))
    last.unlink()
    with pytest.raises(CorruptionError, match=f"{last.name} is missing"):
        backend.open_writer(LOG)


def test_damaged_tail_marker_is_corruption(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path)
    append_one(backend, b"a")
    (backend.log_dir(LOG) / "TAIL").write_bytes(b"\x00garbage")
    with pytest.raises(CorruptionError, match="tail marker .* is damaged"):
        backend.open_writer(LOG)


def test_the_tail_marker_moves_only_when_a_segment_is_created(tmp_path: Path) -> None:
    sync = CountingSync()
    backend = LocalLogBackend(tmp_path, segment_bytes_max=1000, sync=sync)
    marker = backend.log_dir(LOG) / "TAIL"

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        before = marker.stat()
        sync.calls = 0
        for _ in range(5):
            await writer.append([b"p" * 100])  # 5 x 116 bytes: no roll
        assert sync.calls == 5  # still one sync per append, nothing for the marker
        after = marker.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        await writer.append([b"p" * 100] * 5)  # rolls
        await writer.close()

    run(scenario())
    assert [p.name for p in segments(backend)] == [segment_file_name(1), segment_file_name(6)]
    assert int(marker.read_text()) == 6


def test_read_skips_segments_before_from_sequence(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, segment_bytes_max=200)
    write(backend, [[b"x" * 100] for _ in range(6)])
    first, second, *_ = segments(backend)
    flip_byte(first, SEGMENT_HEADER_SIZE + RECORD_HEADER_SIZE + 1)
    start = int(second.name.removesuffix(".wal"))
    assert [r.sequence for r in backend.read(LOG, start)] == list(range(start, 7))
    with pytest.raises(CorruptionError):
        list(backend.read(LOG, 1))


def test_unknown_format_version_is_refused(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path)
    append_one(backend, b"a")
    path = only_segment(backend)
    data = bytearray(path.read_bytes())
    data[4] = 9
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedFormatError, match="version 9 is not supported"):
        backend.open_writer(LOG)


def test_bad_magic_is_corruption(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path)
    append_one(backend, b"a")
    path = only_segment(backend)
    flip_byte(path, 0)
    with pytest.raises(CorruptionError, match="not a TableKeeper WAL segment"):
        backend.open_writer(LOG)


def test_segment_header_disagreeing_with_file_name_is_corruption(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path)
    append_one(backend, b"a")
    path = only_segment(backend)
    path.rename(path.with_name(segment_file_name(5)))
    with pytest.raises(CorruptionError, match="file name says 5"):
        backend.open_writer(LOG)


# -- segments -------------------------------------------------------------------------------


def test_segments_roll_and_are_named_by_first_sequence(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, segment_bytes_max=1000)
    payload = b"p" * 100  # 116 bytes a record
    write(backend, [[payload] * 3 for _ in range(10)])
    paths = segments(backend)
    firsts = [int(p.name.removesuffix(".wal")) for p in paths]
    assert [p.name for p in paths] == [segment_file_name(f) for f in firsts]
    assert firsts[0] == 1
    # Groups never straddle segments, and segments stay within the limit.
    assert all((first - 1) % 3 == 0 for first in firsts)
    assert all(p.stat().st_size <= 1000 for p in paths)
    assert len(paths) == 5  # 20 + 8 records of 116 bytes fit in 1000
    assert [r.sequence for r in backend.read(LOG, 1)] == list(range(1, 31))
    assert (backend.log_dir(LOG) / "LOCK").exists()


def test_a_group_larger_than_a_segment_gets_its_own_segment(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, segment_bytes_max=500)
    write(backend, [[b"a"], [b"b" * 400] * 4, [b"c"]])
    assert [p.name for p in segments(backend)] == [
        segment_file_name(1),
        segment_file_name(2),
        segment_file_name(6),
    ]
    assert payloads_of(backend) == [b"a", *[b"b" * 400] * 4, b"c"]


def test_truncate_deletes_whole_segments_only(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, segment_bytes_max=1000)
    write(backend, [[b"p" * 100] * 3 for _ in range(10)])
    firsts = [int(p.name.removesuffix(".wal")) for p in segments(backend)]
    assert firsts == [1, 7, 13, 19, 25]

    backend.truncate(LOG, 12)  # segment 7..12 still holds 12, so only 1..6 goes
    assert [int(p.name.removesuffix(".wal")) for p in segments(backend)] == [7, 13, 19, 25]
    assert next(iter(backend.read(LOG, 1))).sequence == 7
    backend.truncate(LOG, 13)
    assert [int(p.name.removesuffix(".wal")) for p in segments(backend)] == [13, 19, 25]
    backend.truncate(LOG, 10**6)  # never the last segment
    assert [int(p.name.removesuffix(".wal")) for p in segments(backend)] == [25]
    assert [r.sequence for r in backend.read(LOG, 1)] == list(range(25, 31))

    writer = LocalLogBackend(tmp_path, segment_bytes_max=1000).open_writer(LOG)
    assert writer.last_sequence == 30
    assert run(writer.append([b"q"])) == 31
    run(writer.close())


def test_torn_segment_header_of_the_last_segment_is_rewritten(tmp_path: Path) -> None:
    """A crash while a new segment was being created leaves a short file."""
    backend = LocalLogBackend(tmp_path)
    write(backend, [[b"a"], [b"b"]])
    (backend.log_dir(LOG) / segment_file_name(3)).write_bytes(b"TKW")
    writer = backend.open_writer(LOG)
    assert writer.last_sequence == 2
    assert run(writer.append([b"c"])) == 3
    run(writer.close())
    assert payloads_of(backend) == [b"a", b"b", b"c"]
    assert len(segments(backend)) == 2


def test_min_last_sequence_starts_a_gap_segment(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path)
    write(backend, [[b"a"]])
    writer = backend.open_writer(LOG, min_last_sequence=99)
    run(writer.close())
    assert [p.name for p in segments(backend)] == [segment_file_name(1), segment_file_name(100)]
    # Reopening again with the same floor adds nothing, and the empty segment is reused.
    writer = backend.open_writer(LOG, min_last_sequence=99)
    assert writer.last_sequence == 99
    run(writer.close())
    writer = backend.open_writer(LOG, min_last_sequence=200)
    run(writer.close())
    assert [p.name for p in segments(backend)] == [segment_file_name(1), segment_file_name(201)]
    assert payloads_of(backend) == [b"a"]


# -- preallocation ----------------------------------------------------------------------------

RESERVE = 64 * 1024


def records_end(path: Path) -> tuple[int, int | None]:
    """(where the segment's records end, where its zero tail starts or None), decoded."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        decoder = RecordDecoder(
            file, source=str(path), first_sequence=int(path.stem), end_offset=size
        )
        for _ in decoder:
            pass
        assert decoder.torn is None, decoder.torn
        return decoder.valid_end, decoder.zero_tail


def test_appends_go_into_reserved_space_and_the_file_size_stays(tmp_path: Path) -> None:
    """The segment's space is reserved ahead of the appends: their syncs find the size
    unchanged, and only the append that passes the reserve extends it (by another reserve)."""
    backend = LocalLogBackend(tmp_path, preallocate_bytes=RESERVE)
    payload = b"r" * 1000  # 1016 bytes a record
    sizes = []

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        for i in range(100):
            await writer.append([payload + bytes([i])])
            sizes.append(only_segment(backend).stat().st_size)
        await writer.close()

    run(scenario())
    end = SEGMENT_HEADER_SIZE + 100 * (RECORD_HEADER_SIZE + 1001)
    assert records_end(only_segment(backend)) == (end, end)
    # One extension per reserve: the size changed only when the records reached it.
    assert len(set(sizes)) == -(-(end - SEGMENT_HEADER_SIZE) // RESERVE)
    assert sizes[0] == SEGMENT_HEADER_SIZE + RECORD_HEADER_SIZE + 1001 + RESERVE
    assert payloads_of(backend) == [payload + bytes([i]) for i in range(100)]


def test_a_reopened_log_appends_where_its_records_end_not_at_the_file_end(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, preallocate_bytes=RESERVE)
    write(backend, [PAYLOADS[:3], PAYLOADS[3:]])
    path = only_segment(backend)
    size = path.stat().st_size
    end = record_offset(PAYLOADS, 6)
    assert size == record_offset(PAYLOADS, 3) + RESERVE  # reserved by the first append

    writer = LocalLogBackend(tmp_path, preallocate_bytes=RESERVE).open_writer(LOG)
    assert writer.last_sequence == 6
    assert path.stat().st_size == size  # recovery left the reserve in place
    assert run(writer.append([b"seven"])) == 7
    run(writer.close())
    assert path.stat().st_size == size
    assert payloads_of(backend) == [*PAYLOADS, b"seven"]
    assert records_end(path) == (end + RECORD_HEADER_SIZE + 5,) * 2


@pytest.mark.parametrize("damage", ["partial-record", "partial-group", "partial-header", "garbage"])
def test_a_torn_append_inside_the_reserve_is_cut_off(tmp_path: Path, damage: str) -> None:
    """kill -9 in the middle of an append into reserved space: what the disk kept of the group
    sits between the records and the zeros. Recovery cuts it (and the zeros) off; the log goes
    on from the last whole record (as without reserves, the whole records of an unfinished
    group may stay: its caller never heard "ok") and reserves again."""
    backend = LocalLogBackend(tmp_path, preallocate_bytes=RESERVE)
    write(backend, [PAYLOADS[:3], PAYLOADS[3:]])
    path = only_segment(backend)
    end = record_offset(PAYLOADS, 6)
    group = encode_batch(7, [b"in flight " * 20, b"second " * 30, b"third"])
    torn = {
        "partial-record": group[: RECORD_HEADER_SIZE + 50],
        "partial-group": group[:-3],
        "partial-header": group[:9],
        "garbage": os.urandom(300),
    }[damage]
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, torn, end)
    finally:
        os.close(fd)

    kept = [b"in flight " * 20, b"second " * 30] if damage == "partial-group" else []
    assert payloads_of(backend) == [*PAYLOADS, *kept]  # readers stop where whole records end
    writer = LocalLogBackend(tmp_path, preallocate_bytes=RESERVE).open_writer(LOG)
    assert writer.last_sequence == 6 + len(kept)
    end += sum(RECORD_HEADER_SIZE + len(p) for p in kept)
    assert path.stat().st_size == end
    assert run(writer.append([b"next"])) == 7 + len(kept)
    run(writer.close())
    assert path.stat().st_size == end + RECORD_HEADER_SIZE + 4 + RESERVE
    assert payloads_of(backend) == [*PAYLOADS, *kept, b"next"]


def test_a_torn_group_with_a_hole_inside_the_reserve_is_cut_off_whole(tmp_path: Path) -> None:
    """The disk kept a later page of the torn group but not the first: zeros, then records of
    the same group, then the reserve's zeros. The whole group goes."""
    backend = LocalLogBackend(tmp_path, preallocate_bytes=RESERVE)
    write(backend, [PAYLOADS[:3]])
    path = only_segment(backend)
    end = record_offset(PAYLOADS, 3)
    group = bytearray(encode_batch(4, [b"x" * 100, b"y" * 100, b"z" * 100]))
    group[: RECORD_HEADER_SIZE + 100] = bytes(RECORD_HEADER_SIZE + 100)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(group), end)
    finally:
        os.close(fd)
    writer = backend.open_writer(LOG)
    assert writer.last_sequence == 3
    run(writer.close())
    assert path.stat().st_size == end
    assert payloads_of(backend) == PAYLOADS[:3]


def test_a_later_group_after_zeros_in_the_reserve_is_corruption(tmp_path: Path) -> None:
    """Zeros where a record should be, then a whole later group: not a torn tail."""
    backend = LocalLogBackend(tmp_path, preallocate_bytes=RESERVE)
    write(backend, [PAYLOADS[:3]])
    path = only_segment(backend)
    end = record_offset(PAYLOADS, 3)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, encode_batch(4, [b"a"]) + encode_batch(5, [b"b"]), end + 64)
    finally:
        os.close(fd)
    with pytest.raises(CorruptionError, match="not a torn tail"):
        backend.open_writer(LOG)


def test_a_rolled_segment_is_cut_back_to_its_records(tmp_path: Path) -> None:
    """Only the last segment keeps a reserve: the others end with their last record, so a
    build that does not know reserves reads them as it always did."""
    backend = LocalLogBackend(tmp_path, segment_bytes_max=4000, preallocate_bytes=1000)
    write(backend, [[b"p" * 100] * 3 for _ in range(30)])
    paths = segments(backend)
    assert len(paths) == 3
    for path in paths[:-1]:
        end, zero_tail = records_end(path)
        assert zero_tail is None and path.stat().st_size == end
    assert all(p.stat().st_size <= 4000 for p in paths)
    end, zero_tail = records_end(paths[-1])
    assert zero_tail == end < paths[-1].stat().st_size
    assert [r.sequence for r in backend.read(LOG, 1)] == list(range(1, 91))


def test_a_gap_segment_cuts_the_reserve_off_the_segment_before_it(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path, preallocate_bytes=RESERVE)
    write(backend, [[b"a"], [b"b"]])
    writer = backend.open_writer(LOG, min_last_sequence=99)
    assert run(writer.append([b"c"])) == 100
    run(writer.close())
    first, gap = segments(backend)
    assert first.stat().st_size == records_end(first)[0] == record_offset([b"a", b"b"], 2)
    assert gap.name == segment_file_name(100)
    assert payloads_of(backend) == [b"a", b"b", b"c"]


def test_logs_written_with_and_without_reserves_open_in_either_way(tmp_path: Path) -> None:
    """A log from a build without reserves (files end with their records) opens and grows
    with them; one with a reserve opens in a backend that reserves nothing."""
    write(LocalLogBackend(tmp_path, preallocate_bytes=0), [[b"a"], [b"b"]])
    path = only_segment(LocalLogBackend(tmp_path))
    assert path.stat().st_size == record_offset([b"a", b"b"], 2)
    write(LocalLogBackend(tmp_path, preallocate_bytes=RESERVE), [[b"c"]])
    assert path.stat().st_size == record_offset([b"a", b"b", b"c"], 3) + RESERVE
    write(LocalLogBackend(tmp_path, preallocate_bytes=0), [[b"d"]])
    assert path.stat().st_size == record_offset([b"a", b"b", b"c"], 3) + RESERVE
    assert payloads_of(LocalLogBackend(tmp_path)) == [b"a", b"b", b"c", b"d"]


def test_a_file_system_that_cannot_reserve_space_appends_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def no_fallocate(fd: int, offset: int, length: int) -> None:
        calls.append((offset, length))
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", no_fallocate)
    backend = LocalLogBackend(tmp_path, preallocate_bytes=RESERVE)
    write(backend, [[b"a"], [b"b"], [b"c"]])
    assert len(calls) == 1  # tried once, then the writer appends without
    assert only_segment(backend).stat().st_size == record_offset([b"a", b"b", b"c"], 3)
    assert payloads_of(backend) == [b"a", b"b", b"c"]


def test_no_space_to_reserve_fails_the_append_with_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    backend = LocalLogBackend(tmp_path, preallocate_bytes=RESERVE)
    write(backend, [[b"a"]])
    monkeypatch.setattr(os, "posix_fallocate", full)
    writer = backend.open_writer(LOG)

    async def scenario() -> None:
        with pytest.raises(StorageUnavailableError, match="none of them is in the log") as err:
            await writer.append([b"b" * (2 * RESERVE)])
        assert not err.value.maybe_persisted
        await writer.close()

    run(scenario())
    monkeypatch.undo()
    assert write(backend, [[b"b"]]) == 2
    assert payloads_of(backend) == [b"a", b"b"]


# -- durability and the event loop ------------------------------------------------------------


def test_one_sync_per_append_group(tmp_path: Path) -> None:
    sync = CountingSync()
    backend = LocalLogBackend(tmp_path, sync=sync)

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        sync.calls = 0
        for size in [1, 16, 128, 3, 1]:
            await writer.append([b"x" * 100] * size)
        assert sync.calls == 5
        await writer.append([])
        assert sync.calls == 5
        await writer.close()

    run(scenario())


def test_append_syncs_in_a_worker_thread_and_reads_see_only_durable_records(
    tmp_path: Path,
) -> None:
    sync = CountingSync()
    backend = LocalLogBackend(tmp_path, sync=sync)

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        await writer.append([b"durable"])
        sync.gate = threading.Event()
        sync.entered.clear()
        task = asyncio.create_task(writer.append([b"in flight 1", b"in flight 2"]))
        ticks = 0
        while not sync.entered.is_set():
            await asyncio.sleep(0.001)
            ticks += 1
        for _ in range(5):  # the loop keeps running while the sync is blocked
            await asyncio.sleep(0.001)
            ticks += 1
        assert not task.done()
        assert list(backend.read(LOG, 1)) == [LogRecord(1, b"durable")]
        assert writer.last_sequence == 1
        sync.gate.set()
        assert await task == 3
        assert [r.sequence for r in backend.read(LOG, 1)] == [1, 2, 3]
        await writer.close()
        assert ticks >= 5

    run(scenario())


class RecordingSync(CountingSync):
    """Records which thread synced which log, and fails the syncs of the logs in `failing`
    (after the gate, like a disk that fails while it is busy)."""

    def __init__(self) -> None:
        super().__init__()
        self.synced: list[tuple[str, str]] = []
        self.failing: set[str] = set()

    def __call__(self, fd: int) -> None:
        log_name = Path(os.readlink(f"/proc/self/fd/{fd}")).parent.name
        self.synced.append((threading.current_thread().name, log_name))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if log_name in self.failing:
            raise OSError(errno.EIO, "disk on fire")
        os.fdatasync(fd)


async def _blocked_in_sync(
    sync: CountingSync, append: Coroutine[Any, Any, int]
) -> asyncio.Task[int]:
    """Start `append` with every sync held at `sync.gate`; return once it is in its sync."""
    sync.gate = threading.Event()
    sync.entered.clear()
    task = asyncio.create_task(append)
    while not sync.entered.is_set():
        await asyncio.sleep(0.001)
    return task


def test_the_logs_of_one_backend_append_on_its_one_thread_in_turn(tmp_path: Path) -> None:
    sync = RecordingSync()
    backend = LocalLogBackend(tmp_path, sync=sync)

    async def scenario() -> None:
        one, two, three = (backend.open_writer(f"range-{i}") for i in (1, 2, 3))
        sync.synced.clear()
        first = await _blocked_in_sync(sync, one.append([b"a"]))
        rest = [asyncio.create_task(w.append([b"b", b"c"])) for w in (two, three)]
        for _ in range(5):
            await asyncio.sleep(0.001)
        # They wait behind range-1's sync: the backend's thread writes one group at a time.
        assert not first.done() and not any(task.done() for task in rest)
        assert sync.gate is not None
        sync.gate.set()
        assert await first == 1
        assert [await task for task in rest] == [2, 2]
        assert [log_name for _, log_name in sync.synced] == ["range-1", "range-2", "range-3"]
        (thread,) = {thread for thread, _ in sync.synced}
        assert thread.startswith("wal-append-")
        assert await two.append([b"d"]) == 3
        for writer in (one, two, three):
            await writer.close()

    run(scenario())


def test_concurrent_groups_of_many_logs_and_loops_are_each_synced_before_they_are_answered(
    tmp_path: Path,
) -> None:
    """Groups of six logs, appended from two event loops (threads) at once, pile up on the
    backend's one append thread (its syncs are slowed down, so it takes several jobs per
    wake-up): every append is answered with its own last sequence, only after a sync of its log
    that came after its write, and the logs read back every record in order."""
    synced_bytes: dict[str, list[int]] = {}
    lock = threading.Lock()
    rng_lock = threading.Lock()
    rng = random.Random(5)

    def sync(fd: int) -> None:
        with rng_lock:
            pause = rng.random() * 0.002
        threading.Event().wait(pause)
        os.fdatasync(fd)
        log_name = Path(os.readlink(f"/proc/self/fd/{fd}")).parent.name
        with lock:  # how far the log's file was written when this sync made it durable
            synced_bytes.setdefault(log_name, []).append(os.fstat(fd).st_size)

    backend = LocalLogBackend(tmp_path, sync=sync, preallocate_bytes=0)
    groups = 60

    async def appends(log_name: str) -> list[int]:
        writer = backend.open_writer(log_name)
        lasts = []
        for index in range(groups):
            payloads = [f"{log_name}:{index}:{i}".encode() for i in range(index % 3 + 1)]
            last = await writer.append(payloads)
            # What this group wrote is in the file, and a sync of the log covered it.
            size = os.path.getsize(writer._dir / segment_file_name(1))
            with lock:
                assert synced_bytes[log_name] and max(synced_bytes[log_name]) >= size
            lasts.append(last)
        await writer.close()
        return lasts

    def loop_thread(names: list[str], out: dict[str, list[int]]) -> None:
        async def scenario() -> None:
            results = await asyncio.gather(*(appends(name) for name in names))
            out.update(zip(names, results, strict=True))

        asyncio.run(scenario())

    results: dict[str, list[int]] = {}
    names = [f"range-{i}" for i in range(6)]
    threads = [
        threading.Thread(target=loop_thread, args=(names[:3], results)),
        threading.Thread(target=loop_thread, args=(names[3:], results)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive()
    expected_lasts = []
    total = 0
    for index in range(groups):
        total += index % 3 + 1
        expected_lasts.append(total)
    for name in names:
        assert results[name] == expected_lasts
        expected = [
            f"{name}:{index}:{i}".encode() for index in range(groups) for i in range(index % 3 + 1)
        ]
        assert [r.payload for r in backend.read(name, 1)] == expected


def test_a_log_whose_syncs_are_fast_appends_on_the_callers_thread(tmp_path: Path) -> None:
    sync = RecordingSync()
    backend = LocalLogBackend(tmp_path, sync=sync, inline_below_s=3600.0)

    async def scenario() -> str:
        writer = backend.open_writer("range-1")
        sync.synced.clear()
        assert await writer.append([b"a"]) == 1
        assert await writer.append([b"b", b"c"]) == 3
        await writer.close()
        return threading.current_thread().name

    caller = run(scenario())
    assert sync.synced == [(caller, "range-1"), (caller, "range-1")]
    assert [r.payload for r in backend.read("range-1", 1)] == [b"a", b"b", b"c"]


def test_a_log_whose_syncs_are_slower_than_the_bound_appends_on_the_append_thread(
    tmp_path: Path,
) -> None:
    # Before its first sync a log knows no sync time and appends on the caller's thread; that
    # sync takes more than a nanosecond, so the later appends go to the append thread.
    sync = RecordingSync()
    backend = LocalLogBackend(tmp_path, sync=sync, inline_below_s=1e-9)

    async def scenario() -> str:
        writer = backend.open_writer("range-1")
        sync.synced.clear()
        for sequence in (1, 2, 3):
            assert await writer.append([b"x"]) == sequence
        await writer.close()
        return threading.current_thread().name

    caller = run(scenario())
    threads = [thread for thread, _ in sync.synced]
    assert threads[0] == caller, threads
    assert len(threads) == 3 and all(t.startswith("wal-append-") for t in threads[1:]), threads


def test_a_failed_sync_of_one_log_leaves_the_other_logs_appending(tmp_path: Path) -> None:
    sync = RecordingSync()
    backend = LocalLogBackend(tmp_path, sync=sync)

    async def scenario() -> None:
        one, two = backend.open_writer("range-1"), backend.open_writer("range-2")
        first = await _blocked_in_sync(sync, one.append([b"a"]))
        second = asyncio.create_task(two.append([b"b"]))
        await asyncio.sleep(0)  # its group is now queued, behind range-1's failing one
        sync.failing.add("range-1")
        assert sync.gate is not None
        sync.gate.set()
        with pytest.raises(UnavailableError, match="disk on fire"):
            await first
        assert await second == 1
        assert await two.append([b"c"]) == 2
        with pytest.raises(UnavailableError, match="earlier failure"):
            await one.append([b"d"])
        await one.close()
        await two.close()

    run(scenario())


def test_a_cancelled_append_finishes_and_the_thread_goes_on(tmp_path: Path) -> None:
    sync = RecordingSync()
    backend = LocalLogBackend(tmp_path, sync=sync)

    async def scenario() -> None:
        one, two = backend.open_writer("range-1"), backend.open_writer("range-2")
        first = await _blocked_in_sync(sync, one.append([b"a"]))
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.create_task(two.append([b"b"]))
        assert sync.gate is not None
        sync.gate.set()
        assert await second == 1
        with pytest.raises(UnavailableError, match="cancelled"):
            await one.append([b"c"])
        await one.close()
        await two.close()

    run(scenario())
    # The cancelled group was written all the same (its caller just did not wait for it).
    assert [r.payload for r in backend.read("range-1", 1)] == [b"a"]


def test_an_idle_append_thread_ends_and_the_next_append_starts_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_log, "_APPEND_THREAD_IDLE_EXIT_S", 0.01)
    sync = RecordingSync()
    backend = LocalLogBackend(tmp_path, sync=sync)

    def append_threads() -> list[threading.Thread]:
        name = f"wal-append-{tmp_path.name}"
        return [t for t in threading.enumerate() if t.name == name]

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        assert await writer.append([b"a"]) == 1
        (thread,) = append_threads()
        thread.join(10)
        assert not thread.is_alive() and not append_threads()
        assert await writer.append([b"b"]) == 2
        await writer.close()

    run(scenario())
    assert payloads_of(backend) == [b"a", b"b"]


def test_failed_sync_breaks_the_writer_until_reopened(tmp_path: Path) -> None:
    sync = CountingSync()
    backend = LocalLogBackend(tmp_path, sync=sync)

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        await writer.append([b"a"])
        sync.fail_with = OSError(errno.EIO, "disk on fire")
        with pytest.raises(UnavailableError, match="disk on fire"):
            await writer.append([b"b"])
        sync.fail_with = None
        with pytest.raises(UnavailableError, match="earlier failure"):
            await writer.append([b"c"])
        await writer.close()

    run(scenario())
    writer = backend.open_writer(LOG)
    # The write reached the page cache, so recovery finds the record; the numbering holds.
    assert writer.last_sequence == 2
    run(writer.close())


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_no_space_at_sync_cuts_the_group_back_and_is_retryable(tmp_path: Path, code: int) -> None:
    sync = FailOnceSync()
    backend = LocalLogBackend(tmp_path, sync=sync)
    segment_size = SEGMENT_HEADER_SIZE + RECORD_HEADER_SIZE + 1  # the header and record "a"

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        await writer.append([b"a"])
        sync.fail_with = OSError(code, os.strerror(code))
        with pytest.raises(StorageUnavailableError, match="none of them is in the log") as err:
            await writer.append([b"b", b"c"])
        assert not err.value.maybe_persisted
        assert err.value.retryable
        # The group was cut back out of the file (the cut itself synced once more).
        assert only_segment(backend).stat().st_size == segment_size
        with pytest.raises(UnavailableError, match="earlier failure"):
            await writer.append([b"d"])
        await writer.close()

    run(scenario())
    writer = backend.open_writer(LOG)  # space is back: the log continues where it was
    assert writer.last_sequence == 1
    assert run(writer.append([b"b"])) == 2
    run(writer.close())
    assert payloads_of(backend) == [b"a", b"b"]


def test_no_space_while_rolling_leaves_no_new_segment(tmp_path: Path) -> None:
    sync = FailOnceSync()
    backend = LocalLogBackend(tmp_path, segment_bytes_max=200, sync=sync)

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        await writer.append([b"x" * 100])
        sync.fail_with = OSError(errno.ENOSPC, "No space left on device")
        with pytest.raises(StorageUnavailableError) as err:
            await writer.append([b"y" * 100])  # needs a new segment, whose header sync fails
        assert not err.value.maybe_persisted
        await writer.close()

    run(scenario())
    assert [p.name for p in segments(backend)] == [segment_file_name(1)]
    assert payloads_of(backend) == [b"x" * 100]
    writer = backend.open_writer(LOG)
    assert run(writer.append([b"y" * 100])) == 2
    run(writer.close())
    assert [p.name for p in segments(backend)] == [segment_file_name(1), segment_file_name(2)]


def test_when_the_cut_back_fails_too_the_group_may_be_durable(tmp_path: Path) -> None:
    sync = CountingSync()
    backend = LocalLogBackend(tmp_path, sync=sync)

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        sync.fail_with = OSError(errno.ENOSPC, "No space left on device")
        with pytest.raises(StorageUnavailableError, match="may or may not be durable") as err:
            await writer.append([b"a"])
        assert err.value.maybe_persisted
        await writer.close()

    run(scenario())


def test_oversized_payload_is_refused_without_breaking_the_writer(tmp_path: Path) -> None:
    class Huge(bytes):
        def __len__(self) -> int:
            return 1 << 32

    backend = LocalLogBackend(tmp_path)

    async def scenario() -> None:
        writer = backend.open_writer(LOG)
        with pytest.raises(ValueError, match="exceeds"):
            await writer.append([b"ok", Huge(b"x")])
        assert await writer.append([b"fine"]) == 1
        await writer.close()

    run(scenario())


# -- locking and fencing ----------------------------------------------------------------------


def test_another_backend_in_the_same_process_fences_the_writer(tmp_path: Path) -> None:
    async def scenario() -> None:
        first = LocalLogBackend(tmp_path).open_writer(LOG)
        await first.append([b"a"])
        second = LocalLogBackend(tmp_path).open_writer(LOG)
        with pytest.raises(LogFencedError):
            await first.append([b"b"])
        assert await second.append([b"b"]) == 2
        await first.close()
        await second.close()

    run(scenario())


_HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_log_locked_by_another_process_cannot_be_opened_or_deleted(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path)
    append_one(backend, b"a")
    lock = backend.log_dir(LOG) / "LOCK"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LogLockedError, match=f"pid {holder.pid}"):
            backend.open_writer(LOG)
        with pytest.raises(LogLockedError):
            backend.delete(LOG)
        assert payloads_of(backend) == [b"a"]  # reading needs no lock
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
    writer = backend.open_writer(LOG)  # free again once the other process is gone
    assert writer.last_sequence == 1
    run(writer.close())


def test_delete_removes_the_directory(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path)
    write(backend, [[b"a"], [b"b"]])
    backend.delete(LOG)
    assert not backend.log_dir(LOG).exists()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "a/b", "nul\x00", "x" * 201])
def test_invalid_log_names_are_refused(tmp_path: Path, name: str) -> None:
    backend = LocalLogBackend(tmp_path)
    with pytest.raises(ValueError, match="invalid log name"):
        backend.open_writer(name)
    with pytest.raises(ValueError, match="invalid log name"):
        backend.read(name, 1)
