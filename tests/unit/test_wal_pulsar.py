"""The Pulsar log's message format and replay rules, without a Pulsar (see log/pulsar.py).

The rules decide which messages of a topic are the log's records: FENCE starts a newer epoch,
START sets the numbering, DATA of the current epoch with the next sequence is the next record;
stale epochs, duplicates and gaps are skipped; anything else that is not ours is corruption.
"""

from __future__ import annotations

import struct

import pytest

from tablekeeper_server.checkpoint.pulsar import decode_object_name, encode_object_name
from tablekeeper_server.errors import CorruptionError
from tablekeeper_server.log.api import LogRecord
from tablekeeper_server.log.pulsar import (
    FRAGMENT_BYTES,
    GROUP_BYTES_MAX,
    GROUP_RECORD_BYTES_MAX,
    HEADER,
    KIND_DATA,
    KIND_FENCE,
    KIND_GROUP,
    KIND_START,
    _Replay,
    encode_header,
    encode_records,
)
from tablekeeper_server.pulsar_common.positions import Position

pytestmark = pytest.mark.unit


def fence(epoch: int, nonce: bytes = b"n") -> bytes:
    return encode_header(KIND_FENCE, epoch, 0) + nonce


def start(epoch: int, base: int) -> bytes:
    return encode_header(KIND_START, epoch, base)


def data(
    epoch: int, sequence: int, payload: bytes = b"", fragment: int = 0, count: int = 1
) -> bytes:
    return encode_header(KIND_DATA, epoch, sequence, fragment, count) + (
        payload or f"p{sequence}".encode()
    )


def group(epoch: int, first: int, count: int, payloads: list[bytes] | None = None) -> bytes:
    bodies = payloads or [f"p{first + i}".encode() for i in range(count)]
    assert len(bodies) == count
    return encode_header(KIND_GROUP, epoch, first, 0, count) + b"".join(
        struct.pack(">I", len(b)) + b for b in bodies
    )


def replay(messages: list[bytes], replay_: _Replay | None = None) -> list[LogRecord]:
    state = replay_ or _Replay("log")
    records = []
    for entry, message in enumerate(messages):
        position: Position = (1, entry, -1)
        records += [record for record, _ in state.feed(message, position)]
    return records


def seqs(records: list[LogRecord]) -> list[int]:
    return [r.sequence for r in records]


def test_epochs_and_numbering() -> None:
    records = replay(
        [fence(1), start(1, 0), data(1, 1), data(1, 2), fence(2), start(2, 2), data(2, 3)]
    )
    assert records == [LogRecord(1, b"p1"), LogRecord(2, b"p2"), LogRecord(3, b"p3")]


def test_start_raises_the_numbering() -> None:
    state = _Replay("log")
    records = replay(
        [fence(1), start(1, 0), data(1, 1), fence(2), start(2, 41), data(2, 42)], state
    )
    assert seqs(records) == [1, 42]
    assert state.last == 42 and state.epoch == 2 and state.max_epoch == 2


def test_records_of_a_fenced_epoch_that_slipped_in_are_skipped() -> None:
    state = _Replay("log")
    records = replay(
        [
            fence(1),
            start(1, 0),
            data(1, 1),
            data(1, 2),  # in flight when fenced, persisted before the new FENCE: a record
            fence(2),
            data(1, 3),  # persisted after the new FENCE: never acknowledged, skipped
            start(2, 2),
            data(2, 3, b"new"),
            data(1, 4),
        ],
        state,
    )
    assert records == [LogRecord(1, b"p1"), LogRecord(2, b"p2"), LogRecord(3, b"new")]
    assert state.skipped == 2


def test_duplicates_from_client_resends_are_skipped() -> None:
    records = replay(
        [fence(1), start(1, 0), data(1, 1), data(1, 2), data(1, 1), data(1, 2), data(1, 3)]
    )
    assert seqs(records) == [1, 2, 3]


def test_a_gap_is_a_failed_append_and_is_skipped() -> None:
    records = replay(
        [fence(1), start(1, 0), data(1, 1), data(1, 3), fence(2), start(2, 1), data(2, 2)]
    )
    assert seqs(records) == [1, 2]


def test_a_losing_fence_is_ignored() -> None:
    # Two writers opened at once with the same epoch; the later one re-fenced with epoch 3.
    state = _Replay("log")
    records = replay(
        [fence(1), start(1, 0), data(1, 1), fence(2, b"a"), fence(2, b"b"), fence(3, b"b")],
        state,
    )
    assert seqs(records) == [1]
    assert state.epoch == 3 and state.fence == (3, b"b")
    assert seqs(replay([start(3, 1), data(3, 2)], state)) == [2]


def test_fragments_are_reassembled_in_order() -> None:
    big = bytes(range(256)) * (FRAGMENT_BYTES // 256) + b"tail"
    messages = encode_records(1, 1, [b"small", big, b""])
    assert len(messages) == 4
    assert all(len(m) <= HEADER.size + FRAGMENT_BYTES for m in messages)
    records = replay([fence(1), start(1, 0), *messages])
    assert records == [LogRecord(1, b"small"), LogRecord(2, big), LogRecord(3, b"")]


def test_fragments_out_of_order_or_cut_short_are_not_records() -> None:
    records = replay(
        [
            fence(1),
            start(1, 0),
            data(1, 1, b"a", 0, 2),
            data(1, 1, b"c", 2, 3),  # another shape: skipped
            fence(2),  # the fragment in progress was never completed
            start(2, 0),
            data(2, 1, b"x", 1, 2),  # no fragment 0
            data(2, 1, b"a", 0, 2),
            data(2, 1, b"b", 1, 2),
        ]
    )
    assert records == [LogRecord(1, b"ab")]


def test_a_read_after_truncation_adopts_the_first_message() -> None:
    assert seqs(replay([data(4, 120), data(4, 121), fence(5), start(5, 121), data(5, 122)])) == [
        120,
        121,
        122,
    ]
    assert seqs(replay([start(4, 9), data(4, 10)])) == [10]
    assert seqs(replay([fence(4), start(4, 9), data(4, 10)])) == [10]
    assert seqs(replay([data(4, 7, b"x", 1, 2), data(4, 8)])) == [8]


def test_record_positions_point_at_the_first_fragment() -> None:
    state = _Replay("log")
    state.feed(fence(1), (1, 0, -1))
    state.feed(start(1, 0), (1, 1, -1))
    assert state.feed(data(1, 1, b"a", 0, 2), (1, 2, -1)) == []
    out = state.feed(data(1, 1, b"b", 1, 2), (1, 3, -1))
    assert out == [(LogRecord(1, b"ab"), (1, 2, -1))]


def test_an_append_packs_small_records_into_groups() -> None:
    payloads = [bytes([i % 251]) * 100 for i in range(300)]
    messages = encode_records(1, 7, payloads)
    assert len(messages) == 1
    assert HEADER.unpack_from(messages[0])[2:] == (KIND_GROUP, 1, 7, 0, 300)
    records = replay([fence(1), start(1, 6), *messages])
    assert records == [LogRecord(7 + i, p) for i, p in enumerate(payloads)]


def test_groups_are_bounded_and_large_records_go_alone_in_order() -> None:
    small = b"s" * 1000
    large = b"L" * (GROUP_RECORD_BYTES_MAX + 1)
    huge = b"H" * (FRAGMENT_BYTES + 1)
    payloads = [small] * 600 + [large] + [small] * 3 + [huge, b"", small]
    messages = encode_records(1, 1, payloads)
    shapes = [
        (kind, seq, count) for _, _, kind, _, seq, _, count in map(HEADER.unpack_from, messages)
    ]
    per_group = GROUP_BYTES_MAX // len(small)  # 524 records of 1000 bytes
    # 600 small records: two groups within the byte bound; the large record alone; a group of
    # 3; the huge record in two fragments; then a group of the last two.
    assert shapes == [
        (KIND_GROUP, 1, per_group),
        (KIND_GROUP, 1 + per_group, 600 - per_group),
        (KIND_DATA, 601, 1),
        (KIND_GROUP, 602, 3),
        (KIND_DATA, 605, 2),
        (KIND_DATA, 605, 2),
        (KIND_GROUP, 606, 2),
    ]
    assert len(messages[0]) == HEADER.size + per_group * (4 + len(small))
    records = replay([fence(1), start(1, 0), *messages])
    assert records == [LogRecord(i, p) for i, p in enumerate(payloads, start=1)]


def test_a_group_of_one_is_a_data_message() -> None:
    (message,) = encode_records(3, 5, [b"only"])
    assert message == encode_header(KIND_DATA, 3, 5) + b"only"


def test_group_duplicates_overlaps_and_gaps_follow_the_data_rules() -> None:
    state = _Replay("log")
    records = replay(
        [
            fence(1),
            start(1, 0),
            group(1, 1, 3),
            group(1, 1, 3),  # a client resend: every record a duplicate
            group(1, 2, 4, [b"x2", b"x3", b"p4", b"p5"]),  # 2 and 3 duplicates, 4 and 5 new
            group(1, 8, 2),  # a gap: a failed append, skipped
            data(1, 6),
        ],
        state,
    )
    assert seqs(records) == [1, 2, 3, 4, 5, 6]
    assert records[3] == LogRecord(4, b"p4")
    assert state.skipped == 3 + 2 + 2


def test_a_fenced_writers_group_is_skipped_and_an_unannounced_epoch_is_corruption() -> None:
    state = _Replay("log")
    records = replay(
        [fence(1), start(1, 0), group(1, 1, 2), fence(2), group(1, 3, 2), start(2, 2)], state
    )
    assert seqs(records) == [1, 2]
    assert state.skipped == 2
    with pytest.raises(CorruptionError, match="without that epoch's FENCE"):
        replay([fence(1), start(1, 0), group(2, 1, 2)])


def test_every_record_of_a_group_points_at_its_message() -> None:
    state = _Replay("log")
    state.feed(fence(1), (1, 0, -1))
    state.feed(start(1, 0), (1, 1, -1))
    out = state.feed(group(1, 1, 3), (1, 2, 0))
    assert [(r.sequence, p) for r, p in out] == [(1, (1, 2, 0)), (2, (1, 2, 0)), (3, (1, 2, 0))]


def test_a_read_after_truncation_adopts_a_groups_numbering() -> None:
    assert seqs(replay([group(4, 120, 3), data(4, 123)])) == [120, 121, 122, 123]


def test_a_group_completes_over_a_large_record_never_finished() -> None:
    records = replay(
        [fence(1), start(1, 0), data(1, 1, b"a", 0, 2), group(1, 1, 2), data(1, 1, b"b", 1, 2)]
    )
    assert records == [LogRecord(1, b"p1"), LogRecord(2, b"p2")]


@pytest.mark.parametrize(
    "message",
    [
        group(1, 2, 3)[:-1],  # the last record cut short
        group(1, 2, 2) + b"x",  # bytes after the records
        encode_header(KIND_GROUP, 1, 2, 0, 2) + struct.pack(">I", 1) + b"a",  # one missing
        encode_header(KIND_GROUP, 1, 2, 0, 2) + b"\x00\x00",  # a length cut short
        encode_header(KIND_GROUP, 1, 2, 1, 2) + group(1, 2, 2)[HEADER.size :],  # a fragment
        encode_header(KIND_GROUP, 1, 2, 0, 0),  # no records
    ],
)
def test_damaged_groups_are_corruption(message: bytes) -> None:
    with pytest.raises(CorruptionError, match="damaged message"):
        replay([fence(1), start(1, 0), data(1, 1), message])


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"short",
        b"XX" + bytes(HEADER.size),
        encode_header(9, 1, 1),
        encode_header(KIND_DATA, 1, 1, 3, 2),
        HEADER.pack(b"TK", 2, KIND_DATA, 1, 1, 0, 1),
    ],
)
def test_foreign_or_damaged_messages_are_corruption(message: bytes) -> None:
    with pytest.raises(CorruptionError, match="damaged message"):
        replay([fence(1), start(1, 0), data(1, 1), message, data(1, 2)])


def test_a_record_of_an_unannounced_epoch_is_corruption() -> None:
    with pytest.raises(CorruptionError, match="without that epoch's FENCE"):
        replay([fence(1), start(1, 0), data(2, 1)])


def test_a_start_below_the_last_record_is_corruption() -> None:
    with pytest.raises(CorruptionError, match="already holds"):
        replay([fence(1), start(1, 0), data(1, 1), data(1, 2), start(1, 1)])


@pytest.mark.parametrize(
    "name",
    [
        "00000-000000000000-000000000000/objects/" + "ab" * 32,
        "r/manifests/00000000000000000042-000001700000000.json",
        "with=equals and spaces/é/ü.x",
        "a..b/.c",
    ],
)
def test_checkpoint_object_names_map_to_topic_names_reversibly(name: str) -> None:
    local = encode_object_name(name)
    assert all(c.isalnum() or c in "_.-=" for c in local)
    assert decode_object_name(local) == name
    # Encoded byte by byte: a prefix's topic name is a prefix of the name's (what `list`
    # filters on before decoding).
    for end in range(len(name) + 1):
        assert local.startswith(encode_object_name(name[:end]))


def test_other_topics_are_not_objects() -> None:
    assert decode_object_name("d.1700000000000.abc") is None
    assert decode_object_name("o.bad=Z") is None
