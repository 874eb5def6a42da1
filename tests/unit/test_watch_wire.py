"""`WatchMany` sends messages it serialized itself (an event encoded once, then joined per
watcher): they must parse as the messages the .proto describes."""

from __future__ import annotations

import pytest

from tablekeeper_proto.bookkeeper import kv_pb2
from tablekeeper_proto.v1 import watch_pb2
from tablekeeper_server.core.varint import SMALL_VARINTS, length, varint
from tablekeeper_server.rpc.watch import (
    _UPDATE_EVENT,
    _length_delimited,
    events_update_field,
    response_field,
    update_header,
)

pytestmark = pytest.mark.unit


def _events() -> list[watch_pb2.WatchEvent]:
    return [
        watch_pb2.WatchEvent(
            type=watch_pb2.WatchEvent.PUT,
            kv=kv_pb2.KeyValue(key=b"k", value=b"v" * 300, mod_revision=7, version=2),
            prev_kv=kv_pb2.KeyValue(key=b"k", value=b"u"),
            revision=7,
        ),
        watch_pb2.WatchEvent(
            type=watch_pb2.WatchEvent.DELETE, kv=kv_pb2.KeyValue(key=b"j"), revision=8, index=3
        ),
    ]


@pytest.mark.parametrize("watch_id", [0, 1, 127, 128, 300, 2**40, 2**63 - 1, -1, -(2**63)])
def test_an_update_of_encoded_events_parses_as_the_update(watch_id: int) -> None:
    events = _events()
    encoded = b"".join(_length_delimited(_UPDATE_EVENT, e.SerializeToString()) for e in events)
    response = watch_pb2.WatchStreamResponse.FromString(
        events_update_field(update_header(watch_id), encoded)
    )
    assert response == watch_pb2.WatchStreamResponse(
        updates=[watch_pb2.WatchUpdate(watch_id=watch_id, events=events)]
    )


@pytest.mark.parametrize("repeat", [1, 60, 200])  # an update of 127+ and 16,384+ bytes
def test_a_response_of_events_updates_parses_as_the_response(repeat: int) -> None:
    events = _events() * repeat
    encoded = b"".join(_length_delimited(_UPDATE_EVENT, e.SerializeToString()) for e in events)
    raw = b"".join(events_update_field(update_header(i), encoded) for i in (1, 2**40))
    assert watch_pb2.WatchStreamResponse.FromString(raw) == watch_pb2.WatchStreamResponse(
        updates=[watch_pb2.WatchUpdate(watch_id=i, events=events) for i in (1, 2**40)]
    )


def test_a_response_of_serialized_updates_parses_as_the_response() -> None:
    events = _events()
    updates = [
        watch_pb2.WatchUpdate(watch_id=1, created=True, revision=5),
        watch_pb2.WatchUpdate(watch_id=2, events=events),
        watch_pb2.WatchUpdate(watch_id=3, error_code=11, error_message="compacted", error_status=1),
        watch_pb2.WatchUpdate(
            watch_id=4, events=[events[1]] * 200
        ),  # a length over 127 bytes: a two-byte varint
    ]
    raw = b"".join(response_field(u.SerializeToString()) for u in updates)
    assert watch_pb2.WatchStreamResponse.FromString(raw) == watch_pb2.WatchStreamResponse(
        updates=updates
    )


def test_a_length_is_encoded_as_protobuf_encodes_it() -> None:
    """The one- and two-byte lengths come from a table built at import; longer ones are encoded."""
    assert len(SMALL_VARINTS) == 1 << 14
    assert all(SMALL_VARINTS[n] == varint(n) for n in range(1 << 14))
    for n in (0, 1, 127, 128, 255, 16383, 16384, 100_000):
        field = kv_pb2.KeyValue(key=b"x" * n).SerializeToString()  # tag, length, key
        assert field == (b"\x0a" + length(n) + b"x" * n if n else b"")
