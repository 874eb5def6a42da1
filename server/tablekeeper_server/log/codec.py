"""On-disk framing of the local write-ahead log: segment file headers and records.

Segment file layout (all integers little-endian)::

    segment header, SEGMENT_HEADER_SIZE = 20 bytes
        magic           4s   b"TKWL"
        version         u8   FORMAT_VERSION (1); other versions are refused
        flags           u8   SEGMENT_FLAG_GAP: the first sequence does not follow the previous
                             segment's last record (the writer was opened with a
                             `min_last_sequence` above what the log held)
        reserved        u16  0
        first_sequence  u64  the sequence the segment's first record has (or would have);
                             equal to the number in the file name
        header_crc      u32  zlib.crc32 of the 16 bytes above
    records, back to back, each RECORD_HEADER_SIZE = 16 bytes then the payload
        length          u32  payload length in bytes
        crc             u32  zlib.crc32 of the sequence word and the payload (the 8 + length
                             bytes that follow this field, so one contiguous checksum)
        sequence word   u64  bits 0..61: the record's sequence number;
                             bit 63 (FLAG_GROUP_START): first record of an `append` group;
                             bit 62 (FLAG_GROUP_END): last record of an `append` group
        payload         length bytes

A segment may end in zeros: the writer preallocates segment space ahead of its appends (so an
append's sync does not also change the file's size), and a fresh `fallocate`d range reads as
zeros. Where a record header would start and every byte from there to the end is zero, the
records end there cleanly (no record is all zeros: a sequence is at least 1). Zeros followed by
data are judged like any other damage, below.

The group flags let recovery tell a torn tail from corruption. An append writes one group with one
`write` and one `fsync`, and the next append starts only after that fsync returned, so after a
crash only the *last* group can be incomplete, and the disk may have kept any subset of its pages
(for example a hole of zeros followed by later records of the same group). A damaged record is
therefore a torn tail when every valid record found after it could belong to the same group, and
corruption when one of them provably belongs to a later group: it starts a group after the
damaged position, or it follows a valid group end. Both flags sit inside the checksummed word.

This module is pure (no file system access beyond reading the stream it is given) and has no
knowledge of segments as files; `local.py` names files and decides what a torn tail means where.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Final

from tablekeeper_server.errors import CorruptionError
from tablekeeper_server.log.api import LogRecord

MAGIC: Final = b"TKWL"
FORMAT_VERSION: Final = 1
SEGMENT_FLAG_GAP: Final = 0x01
_KNOWN_SEGMENT_FLAGS: Final = SEGMENT_FLAG_GAP

FLAG_GROUP_START: Final = 1 << 63
FLAG_GROUP_END: Final = 1 << 62
SEQUENCE_MASK: Final = (1 << 62) - 1
MAX_SEQUENCE: Final = SEQUENCE_MASK
MAX_PAYLOAD_BYTES: Final = 0xFFFF_FFFF

_SEGMENT_HEADER_BODY = struct.Struct("<4sBBHQ")
_SEGMENT_HEADER_CRC = struct.Struct("<I")
SEGMENT_HEADER_SIZE: Final = _SEGMENT_HEADER_BODY.size + _SEGMENT_HEADER_CRC.size

_RECORD_HEADER = struct.Struct("<IIQ")
_LENGTH_CRC = struct.Struct("<II")
_SEQ_WORD = struct.Struct("<Q")
RECORD_HEADER_SIZE: Final = _RECORD_HEADER.size
_CRC_START: Final = 8  # offset of the sequence word inside a record header

_READ_CHUNK: Final = 1 << 20
_ZERO_HEADER: Final = bytes(RECORD_HEADER_SIZE)
_NON_ZERO = re.compile(rb"[^\x00]")


class UnsupportedFormatError(CorruptionError):
    """A segment was written in a format version (or with flags) this build cannot read.

    Raised instead of guessing; upgrade the server or restore a compatible build."""


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    first_sequence: int
    flags: int

    @property
    def gap(self) -> bool:
        """True when `first_sequence` may be above the previous segment's last record + 1."""
        return bool(self.flags & SEGMENT_FLAG_GAP)


@dataclass(frozen=True, slots=True)
class TornTail:
    """Where a segment's valid records end when what follows is a torn (incomplete) append."""

    offset: int
    """Byte offset (in the file) of the first byte that is not part of a valid record."""
    reason: str
    """What was wrong with the bytes at `offset`."""
    discarded_records: int
    """Valid records found after `offset` that belong to the same torn group (usually 0)."""


def encode_segment_header(first_sequence: int, *, flags: int = 0) -> bytes:
    """The `SEGMENT_HEADER_SIZE` bytes starting a segment whose first record is `first_sequence`."""
    if not 1 <= first_sequence <= MAX_SEQUENCE:
        raise ValueError(f"first_sequence {first_sequence} out of range 1..{MAX_SEQUENCE}")
    if flags & ~_KNOWN_SEGMENT_FLAGS:
        raise ValueError(f"unknown segment flags {flags:#x}")
    body = _SEGMENT_HEADER_BODY.pack(MAGIC, FORMAT_VERSION, flags, 0, first_sequence)
    return body + _SEGMENT_HEADER_CRC.pack(zlib.crc32(body))


def is_torn_segment_header(data: bytes, file_size: int) -> bool:
    """True when a segment file looks like its creation was cut short by a crash.

    That is: shorter than a header, or exactly a header's length and all zeros. `data` is the
    file's first `SEGMENT_HEADER_SIZE` bytes (or all of it when shorter). Only the last segment
    of a log may legitimately be in that state.
    """
    if file_size < SEGMENT_HEADER_SIZE:
        return True
    return file_size == SEGMENT_HEADER_SIZE and not any(data[:SEGMENT_HEADER_SIZE])


def decode_segment_header(data: bytes, *, source: str) -> SegmentHeader:
    """Parse and check a segment header. `source` names the file in error messages.

    Raises `UnsupportedFormatError` for an unknown version or flags and `CorruptionError` for a
    bad magic, a checksum mismatch or a short header.
    """
    if len(data) < SEGMENT_HEADER_SIZE:
        raise CorruptionError(
            f"{source}: segment header is {len(data)} bytes, expected {SEGMENT_HEADER_SIZE}"
        )
    magic, version, flags, reserved, first_sequence = _SEGMENT_HEADER_BODY.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptionError(
            f"{source}: not a TableKeeper WAL segment (magic {magic!r}, expected {MAGIC!r})"
        )
    if version != FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{source}: WAL segment format version {version} is not supported "
            f"(this build reads version {FORMAT_VERSION})"
        )
    (crc,) = _SEGMENT_HEADER_CRC.unpack_from(data, _SEGMENT_HEADER_BODY.size)
    if zlib.crc32(data[: _SEGMENT_HEADER_BODY.size]) != crc:
        raise CorruptionError(f"{source}: segment header checksum mismatch at byte offset 0")
    if flags & ~_KNOWN_SEGMENT_FLAGS or reserved:
        raise UnsupportedFormatError(
            f"{source}: WAL segment header has unknown flags {flags:#x}/{reserved:#x}"
        )
    if not 1 <= first_sequence <= MAX_SEQUENCE:
        raise CorruptionError(f"{source}: segment header first sequence {first_sequence} invalid")
    return SegmentHeader(first_sequence=first_sequence, flags=flags)


def encode_batch(first_sequence: int, payloads: Sequence[bytes]) -> bytes:
    """Frame `payloads` as one append group: records `first_sequence`, `first_sequence + 1`, ...

    Returns the bytes to write with a single `write`; `b""` for no payloads. The first record is
    flagged as the group's start and the last as its end. Raises `ValueError` for a payload
    longer than `MAX_PAYLOAD_BYTES` or sequences outside 1..`MAX_SEQUENCE`; nothing is encoded
    then. Pure and thread-safe.
    """
    count = len(payloads)
    if count == 0:
        return b""
    last = first_sequence + count - 1
    if first_sequence < 1 or last > MAX_SEQUENCE:
        raise ValueError(f"sequences {first_sequence}..{last} out of range 1..{MAX_SEQUENCE}")
    pack_word = _SEQ_WORD.pack
    pack_length_crc = _LENGTH_CRC.pack
    crc32 = zlib.crc32
    parts: list[bytes] = []
    append = parts.append
    word = first_sequence | FLAG_GROUP_START
    end_word = last | FLAG_GROUP_END
    if count == 1:
        word |= FLAG_GROUP_END
    for payload in payloads:
        size = len(payload)
        if size > MAX_PAYLOAD_BYTES:
            raise ValueError(f"payload of {size} bytes exceeds {MAX_PAYLOAD_BYTES}")
        seq_word = pack_word(word)
        append(pack_length_crc(size, crc32(payload, crc32(seq_word))))
        append(seq_word)
        append(payload)
        word = (word & SEQUENCE_MASK) + 1
        if word == last:
            word = end_word
    return b"".join(parts)


class RecordDecoder:
    """Walks the records of one segment body in a seekable binary stream.

    Iterating yields `LogRecord`s in order while they are valid and consecutive, starting with
    `first_sequence`. It stops at the end of the data (`end_offset`), after `stop_after`
    (if given), or at the first damaged record. For a damaged record it looks at the rest of the
    data (see the module docstring): if it proves the damage is not a torn tail, iteration
    raises `CorruptionError` naming `source` and the byte offset; otherwise it ends and `torn`
    describes the tail. After iteration, `valid_end` is the offset just past the last valid
    record and `last_sequence` that record's sequence (`first_sequence - 1` if none).

    The stream is read in chunks and only up to `end_offset`, so a file that a writer is
    appending to can be decoded up to the size it had when the caller measured it.

    A zero record header followed by nothing but zeros up to `end_offset` ends the records
    cleanly (a preallocated tail: `torn` stays None, `zero_tail` is its offset). With
    `zero_header_ends`, any zero record header ends them, without looking further: for readers
    of a segment that a writer may be appending to, where bytes past the header can change
    while they look (recovery, which has the log to itself, leaves it False).
    """

    def __init__(
        self,
        stream: BinaryIO,
        *,
        source: str,
        first_sequence: int,
        start_offset: int = SEGMENT_HEADER_SIZE,
        end_offset: int,
        stop_after: int | None = None,
        zero_header_ends: bool = False,
    ) -> None:
        self._stream = stream
        self._zero_header_ends = zero_header_ends
        self._source = source
        self._start = start_offset
        self._end = end_offset
        self._stop_after = stop_after
        self._started = False
        self.first_sequence = first_sequence
        self.last_sequence = first_sequence - 1
        self.valid_end = start_offset
        self.torn: TornTail | None = None
        self.zero_tail: int | None = None
        """Offset where a preallocated (all-zero) tail starts, when the records end in one."""

    def __iter__(self) -> Iterator[LogRecord]:
        if self._started:
            raise RuntimeError("a RecordDecoder can be iterated only once")
        self._started = True
        return self._walk()

    def _walk(self) -> Iterator[LogRecord]:
        stream = self._stream
        end = self._end
        stop_after = self._stop_after
        unpack = _RECORD_HEADER.unpack_from
        crc32 = zlib.crc32
        header_size = RECORD_HEADER_SIZE
        expected = self.first_sequence
        stream.seek(self._start)
        base = self._start  # file offset of buf[0]
        buf = b""
        view = memoryview(buf)
        pos = 0  # offset in buf of the next record
        while True:
            if stop_after is not None and expected > stop_after:
                return
            record_offset = base + pos
            available = len(buf) - pos
            if available < header_size:
                buf, view, base, pos = self._refill(buf, base, pos, header_size)
                available = len(buf) - pos
                if available == 0:
                    return  # clean end
                if available < header_size:
                    if not any(view[pos:]):
                        self.zero_tail = record_offset  # (a zero tail shorter than a header)
                        return
                    self._damaged(record_offset, expected, "incomplete record header")
                    return
            length, crc, word = unpack(buf, pos)
            if not (length or crc or word) and self._ends_in_zeros(record_offset):
                self.zero_tail = record_offset
                return
            total = header_size + length
            if record_offset + total > end:
                self._damaged(
                    record_offset, expected, f"record length {length} runs past the end of data"
                )
                return
            if available < total:
                buf, view, base, pos = self._refill(buf, base, pos, total)
            if crc32(view[pos + _CRC_START : pos + total]) != crc:
                self._damaged(record_offset, expected, "checksum mismatch")
                return
            sequence = word & SEQUENCE_MASK
            if sequence != expected:
                self._damaged(
                    record_offset, expected, f"sequence {sequence} where {expected} was expected"
                )
                return
            pos += total
            self.last_sequence = sequence
            self.valid_end = base + pos
            expected += 1
            yield LogRecord(sequence, buf[pos - length : pos])

    def _refill(
        self, buf: bytes, base: int, pos: int, need: int
    ) -> tuple[bytes, memoryview, int, int]:
        """Drop consumed bytes and read until `need` bytes are buffered (or data ends)."""
        rest = buf[pos:]
        base += pos
        want = min(max(need, _READ_CHUNK), self._end - base) - len(rest)
        chunks = [rest]
        while want > 0:
            chunk = self._stream.read(want)
            if not chunk:
                break
            chunks.append(chunk)
            want -= len(chunk)
        buf = b"".join(chunks)
        return buf, memoryview(buf), base, 0

    def _ends_in_zeros(self, offset: int) -> bool:
        """True when every byte from `offset` (a zero record header) to the end is zero.
        The stream's position is kept."""
        if self._zero_header_ends:
            return True
        stream = self._stream
        position = stream.tell()
        try:
            stream.seek(offset)
            left = self._end - offset
            while left > 0:
                chunk = stream.read(min(left, _READ_CHUNK))
                if not chunk:
                    return True  # the file is shorter than `end_offset` said: nothing follows
                if _NON_ZERO.search(chunk):
                    return False
                left -= len(chunk)
            return True
        finally:
            stream.seek(position)

    def _damaged(self, offset: int, expected: int, reason: str) -> None:
        self._stream.seek(offset)
        rest = self._stream.read(self._end - offset)
        continuation = _find_continuation(rest, expected)
        if _proves_later_group(continuation, expected):
            rel, sequence, _ = continuation[0]
            raise CorruptionError(
                f"{self._source}: damaged record at byte offset {offset} ({reason}); valid "
                f"records follow it (sequence {sequence} at byte offset {offset + rel}), "
                "so this is corruption, not a torn tail"
            )
        self.torn = TornTail(offset=offset, reason=reason, discarded_records=len(continuation))


def _find_continuation(rest: bytes, expected: int) -> list[tuple[int, int, int]]:
    """Valid records in `rest[1:]` whose sequence continues the numbering from `expected`.

    Returns (offset in rest, sequence, sequence word) for each. `rest[0]` is the damaged record.
    Scans byte by byte where framing is lost, skips runs of zeros quickly, and follows the
    framing of every valid record found.
    """
    size = len(rest)
    view = memoryview(rest)
    unpack = _RECORD_HEADER.unpack_from
    crc32 = zlib.crc32
    header_size = RECORD_HEADER_SIZE
    highest = expected + size // header_size
    found: list[tuple[int, int, int]] = []
    candidates: list[int] = []
    if size >= header_size:
        # The damaged header's own length is the likeliest place of the next record.
        length = unpack(rest, 0)[0]
        if header_size + length + header_size <= size:
            candidates.append(header_size + length)
    candidates.append(1)
    for start in candidates:
        pos = start
        while pos + header_size <= size:
            length, crc, word = unpack(rest, pos)
            sequence = word & SEQUENCE_MASK
            total = header_size + length
            if (
                expected <= sequence <= highest
                and pos + total <= size
                and crc32(view[pos + _CRC_START : pos + total]) == crc
            ):
                found.append((pos, sequence, word))
                pos += total
                continue
            if word == 0 and rest[pos : pos + header_size] == _ZERO_HEADER:
                match = _NON_ZERO.search(rest, pos)
                if match is None:
                    break
                pos = max(pos + 1, match.start() - header_size + 1)
                continue
            pos += 1
        if found:
            break
    return found


def _proves_later_group(found: list[tuple[int, int, int]], expected: int) -> bool:
    """True when a record in `found` belongs to a group after the one holding `expected`."""
    highest = max((sequence for _, sequence, _ in found), default=0)
    for _, sequence, word in found:
        if word & FLAG_GROUP_START and sequence > expected:
            return True
        if word & FLAG_GROUP_END and highest > sequence:
            return True
    return False
