"""The WAL record framing: round trips, flags, torn tails versus corruption, segment headers."""

from __future__ import annotations

import io
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tablekeeper_server.errors import CorruptionError
from tablekeeper_server.log.api import LogRecord
from tablekeeper_server.log.codec import (
    FLAG_GROUP_END,
    FLAG_GROUP_START,
    MAX_SEQUENCE,
    RECORD_HEADER_SIZE,
    SEGMENT_FLAG_GAP,
    SEGMENT_HEADER_SIZE,
    SEQUENCE_MASK,
    RecordDecoder,
    UnsupportedFormatError,
    decode_segment_header,
    encode_batch,
    encode_segment_header,
    is_torn_segment_header,
)

pytestmark = pytest.mark.unit

SOURCE = "segment-under-test"


def decode(
    body: bytes, first_sequence: int = 1, *, stop_after: int | None = None
) -> tuple[list[LogRecord], RecordDecoder]:
    data = encode_segment_header(first_sequence) + body
    decoder = RecordDecoder(
        io.BytesIO(data),
        source=SOURCE,
        first_sequence=first_sequence,
        end_offset=len(data),
        stop_after=stop_after,
    )
    return list(decoder), decoder


def raw_words(body: bytes) -> list[tuple[int, int, int]]:
    """(length, crc, sequence word) of each record, parsed naively."""
    out, offset = [], 0
    while offset < len(body):
        length, crc, word = struct.unpack_from("<IIQ", body, offset)
        out.append((length, crc, word))
        offset += RECORD_HEADER_SIZE + length
    return out


def test_record_layout_is_length_crc_sequence_payload() -> None:
    body = encode_batch(7, [b"hello"])
    length, crc, word = struct.unpack_from("<IIQ", body)
    assert length == 5
    assert word == 7 | FLAG_GROUP_START | FLAG_GROUP_END
    assert crc == zlib.crc32(body[8:])  # sequence word + payload
    assert body[RECORD_HEADER_SIZE:] == b"hello"
    assert len(body) == RECORD_HEADER_SIZE + 5


@pytest.mark.parametrize("count", [1, 2, 3, 10])
def test_group_flags_mark_first_and_last_record(count: int) -> None:
    words = [word for _, _, word in raw_words(encode_batch(100, [b"x"] * count))]
    assert [w & SEQUENCE_MASK for w in words] == list(range(100, 100 + count))
    assert [bool(w & FLAG_GROUP_START) for w in words] == [True] + [False] * (count - 1)
    assert [bool(w & FLAG_GROUP_END) for w in words] == [False] * (count - 1) + [True]


def test_empty_batch_encodes_to_nothing() -> None:
    assert encode_batch(1, []) == b""
    records, decoder = decode(b"")
    assert records == []
    assert decoder.torn is None
    assert decoder.last_sequence == 0
    assert decoder.valid_end == SEGMENT_HEADER_SIZE


@pytest.mark.parametrize("first", [1, 2, 1 << 40, MAX_SEQUENCE - 4])
def test_round_trip_of_boundary_payloads(first: int) -> None:
    payloads = [b"", b"\x00", bytes(range(256)), b"\xff" * 65536, b"z" * (1 << 20)]
    body = encode_batch(first, payloads[:2]) + encode_batch(first + 2, payloads[2:])
    records, decoder = decode(body, first)
    assert records == [LogRecord(first + i, p) for i, p in enumerate(payloads)]
    assert decoder.torn is None
    assert decoder.last_sequence == first + len(payloads) - 1
    assert decoder.valid_end == SEGMENT_HEADER_SIZE + len(body)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=8), max_size=8),
    st.integers(min_value=1, max_value=1 << 50),
)
def test_round_trip_of_any_groups(groups: list[list[bytes]], first: int) -> None:
    body, sequence, expected = b"", first, []
    for group in groups:
        body += encode_batch(sequence, group)
        expected += [LogRecord(sequence + i, p) for i, p in enumerate(group)]
        sequence += len(group)
    records, decoder = decode(body, first)
    assert records == expected
    assert decoder.torn is None


def test_encode_accepts_any_bytes_like_sequence() -> None:
    assert encode_batch(1, (b"a", bytearray(b"b"))) == encode_batch(1, [b"a", b"b"])  # type: ignore[arg-type]


@pytest.mark.parametrize("first,count", [(0, 1), (-1, 1), (MAX_SEQUENCE, 2)])
def test_sequences_out_of_range_are_refused(first: int, count: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        encode_batch(first, [b"x"] * count)


def test_oversized_payload_is_refused() -> None:
    class Huge(bytes):
        def __len__(self) -> int:
            return 1 << 32

    with pytest.raises(ValueError, match="exceeds"):
        encode_batch(1, [b"fine", Huge()])


def test_every_cut_of_the_last_group_is_a_torn_tail() -> None:
    first = encode_batch(1, [b"alpha", b"beta"])
    last = encode_batch(3, [b"gamma" * 10, b"", b"delta" * 7])
    boundaries = {0}
    offset = 0
    for length, _, _ in raw_words(last):
        offset += RECORD_HEADER_SIZE + length
        boundaries.add(offset)
    for cut in range(len(last) + 1):
        records, decoder = decode(first + last[:cut])
        whole = sum(1 for b in boundaries if 0 < b <= cut)
        assert [r.sequence for r in records] == list(range(1, 3 + whole))
        assert decoder.valid_end == SEGMENT_HEADER_SIZE + len(first) + max(
            b for b in boundaries if b <= cut
        )
        whole_end = max(b for b in boundaries if b <= cut)
        # Bytes of the next record that are all zeros read as a preallocated (zero) tail.
        assert (decoder.torn is None) == (not any(last[whole_end:cut]))
        assert (decoder.zero_tail is not None) == (cut > whole_end and decoder.torn is None)


@pytest.mark.parametrize(
    "tail",
    [
        b"\x01" + bytes(40),
        b"\xde\xad\xbe\xef" * 100,
        bytes(RECORD_HEADER_SIZE) + b"\x07",
        bytes(3 * 1024 * 1024) + b"\x01",
    ],
    ids=[
        "one-byte-then-zeros",
        "junk",
        "zero-header-then-a-byte",
        "mebibytes-of-zeros-then-a-byte",
    ],
)
def test_junk_tail_is_torn(tail: bytes) -> None:
    body = encode_batch(1, [b"a", b"b"]) + encode_batch(3, [b"c"])
    records, decoder = decode(body + tail)
    assert [r.payload for r in records] == [b"a", b"b", b"c"]
    assert decoder.torn is not None
    assert decoder.torn.offset == SEGMENT_HEADER_SIZE + len(body)
    assert decoder.torn.discarded_records == 0
    assert decoder.zero_tail is None


@pytest.mark.parametrize(
    "tail",
    [bytes(5000), bytes(RECORD_HEADER_SIZE), bytes(5), bytes(3 * 1024 * 1024)],
    ids=["zeros", "zero-header", "zeros-shorter-than-a-header", "megabytes-of-zeros"],
)
def test_zero_tail_is_a_clean_end(tail: bytes) -> None:
    """A preallocated segment's unwritten space reads as zeros: the records end there."""
    body = encode_batch(1, [b"a", b"b"]) + encode_batch(3, [b"c"])
    records, decoder = decode(body + tail)
    assert [r.payload for r in records] == [b"a", b"b", b"c"]
    assert decoder.torn is None
    assert decoder.zero_tail == decoder.valid_end == SEGMENT_HEADER_SIZE + len(body)


def test_zero_header_ends_stops_at_zeros_without_looking_further() -> None:
    """A reader of a segment being appended to stops at the first zero header; recovery
    (the default) looks past it and finds the later group."""
    later = encode_batch(3, [b"c"])
    data = encode_segment_header(1) + encode_batch(1, [b"a"]) + bytes(40) + later
    strict = RecordDecoder(io.BytesIO(data), source=SOURCE, first_sequence=1, end_offset=len(data))
    with pytest.raises(CorruptionError, match="not a torn tail"):
        list(strict)
    reader = RecordDecoder(
        io.BytesIO(data),
        source=SOURCE,
        first_sequence=1,
        end_offset=len(data),
        zero_header_ends=True,
    )
    assert [r.payload for r in reader] == [b"a"]
    assert reader.torn is None
    assert reader.zero_tail == SEGMENT_HEADER_SIZE + RECORD_HEADER_SIZE + 1


def test_hole_inside_the_last_group_is_torn() -> None:
    head = encode_batch(1, [b"a"])
    group = bytearray(encode_batch(2, [b"b" * 50, b"c" * 50, b"d" * 50]))
    group[0 : RECORD_HEADER_SIZE + 50] = bytes(RECORD_HEADER_SIZE + 50)
    records, decoder = decode(head + bytes(group))
    assert [r.sequence for r in records] == [1]
    assert decoder.torn is not None
    assert decoder.torn.discarded_records == 2


def test_damage_followed_by_a_later_group_is_corruption() -> None:
    groups = [encode_batch(s, [f"record {s}".encode()]) for s in range(1, 6)]
    body = bytearray(b"".join(groups))
    damaged = len(groups[0]) + len(groups[1])
    body[damaged + RECORD_HEADER_SIZE + 2] ^= 1
    with pytest.raises(CorruptionError) as info:
        decode(bytes(body))
    message = str(info.value)
    assert SOURCE in message
    assert f"byte offset {SEGMENT_HEADER_SIZE + damaged}" in message
    assert "sequence 4" in message


def test_damage_followed_by_a_group_end_and_more_records_is_corruption() -> None:
    """Both group starts are damaged; a valid group end followed by a valid later record still
    proves that the damaged record's group was complete before the next append began."""
    group_a = bytearray(encode_batch(1, [b"a1", b"a2", b"a3"]))
    group_b = bytearray(encode_batch(4, [b"b1", b"b2", b"b3"]))
    group_a[RECORD_HEADER_SIZE] ^= 0xFF  # a1
    group_b[RECORD_HEADER_SIZE] ^= 0xFF  # b1, the only later record flagged as a group start
    with pytest.raises(CorruptionError, match="byte offset"):
        decode(bytes(group_a) + bytes(group_b))
    # Without the later group, the same damage is a torn tail.
    records, decoder = decode(bytes(group_a))
    assert records == []
    assert decoder.torn is not None
    assert decoder.torn.discarded_records == 2


def test_damaged_group_followed_by_a_later_group_start_is_corruption() -> None:
    """Group A is damaged through its end; a valid start of group B proves A was complete."""
    group_a = bytearray(encode_batch(1, [b"a1" * 20, b"a2" * 20]))
    group_a[:] = bytes(len(group_a) - 3) + group_a[-3:]
    group_b = encode_batch(3, [b"b1", b"b2", b"b3"])
    with pytest.raises(CorruptionError, match="sequence 3"):
        decode(bytes(group_a) + group_b)


def test_lost_framing_is_resynchronised() -> None:
    groups = [encode_batch(s, [bytes([s]) * 30]) for s in range(1, 6)]
    body = bytearray(b"".join(groups))
    body[len(groups[0]) + 3] = 0x7F  # length's high byte: framing lost
    with pytest.raises(CorruptionError, match="sequence 3"):
        decode(bytes(body))


def test_wrong_sequence_is_damage() -> None:
    body = encode_batch(1, [b"a"]) + encode_batch(3, [b"c"])  # 2 is missing
    records, decoder = decode(body)
    assert [r.sequence for r in records] == [1]
    assert decoder.torn is not None
    assert "sequence 3 where 2 was expected" in decoder.torn.reason


def test_stop_after_ends_before_reading_further() -> None:
    body = encode_batch(1, [b"a", b"b"]) + b"\xff" * 64
    records, decoder = decode(body, stop_after=1)
    assert [r.sequence for r in records] == [1]
    assert decoder.torn is None


def test_decoder_reads_in_chunks_across_large_records() -> None:
    payloads = [b"x" * 700_000, b"y" * 900_000, b"z" * 3]
    records, _ = decode(encode_batch(1, payloads))
    assert [r.payload for r in records] == payloads


def test_decoder_can_be_iterated_only_once() -> None:
    data = encode_segment_header(1)
    decoder = RecordDecoder(io.BytesIO(data), source=SOURCE, first_sequence=1, end_offset=len(data))
    list(decoder)
    with pytest.raises(RuntimeError):
        iter(decoder)


# -- segment headers ------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [0, SEGMENT_FLAG_GAP])
def test_segment_header_round_trip(flags: int) -> None:
    data = encode_segment_header(123456789, flags=flags)
    assert len(data) == SEGMENT_HEADER_SIZE
    assert data[:4] == b"TKWL"
    header = decode_segment_header(data, source=SOURCE)
    assert header.first_sequence == 123456789
    assert header.gap == bool(flags)


def test_segment_header_version_is_checked() -> None:
    data = bytearray(encode_segment_header(1))
    data[4] = 2
    with pytest.raises(UnsupportedFormatError, match="version 2 is not supported"):
        decode_segment_header(bytes(data), source=SOURCE)


def test_unknown_segment_flags_are_refused() -> None:
    body = struct.pack("<4sBBHQ", b"TKWL", 1, 0x80, 0, 1)
    data = body + struct.pack("<I", zlib.crc32(body))
    with pytest.raises(UnsupportedFormatError, match="unknown flags"):
        decode_segment_header(data, source=SOURCE)
    with pytest.raises(ValueError):
        encode_segment_header(1, flags=0x80)


@pytest.mark.parametrize("offset", [0, 5, 8, 16])
def test_damaged_segment_header_is_corruption(offset: int) -> None:
    data = bytearray(encode_segment_header(1))
    data[offset] ^= 0x10
    with pytest.raises(CorruptionError, match=SOURCE):
        decode_segment_header(bytes(data), source=SOURCE)


def test_torn_segment_header_detection() -> None:
    header = encode_segment_header(1)
    assert is_torn_segment_header(b"", 0)
    assert is_torn_segment_header(header[:7], 7)
    assert is_torn_segment_header(bytes(SEGMENT_HEADER_SIZE), SEGMENT_HEADER_SIZE)
    assert not is_torn_segment_header(header, SEGMENT_HEADER_SIZE)
    assert not is_torn_segment_header(bytes(SEGMENT_HEADER_SIZE), SEGMENT_HEADER_SIZE + 1)
    with pytest.raises(CorruptionError):
        decode_segment_header(header[:10], source=SOURCE)
