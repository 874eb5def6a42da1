"""Pieces of the Oxia servicer that need no server: what is refused before anything is logged,
how change events become notification batches, where notifications from an old offset resume."""

from __future__ import annotations

import grpc
import pytest

from tablekeeper_proto.oxia import client_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.errors import InvalidKeyError, ResourceLimitError, TableKeeperError
from tablekeeper_server.oxia import keys, reads
from tablekeeper_server.oxia.errors import OxiaError, from_tablekeeper
from tablekeeper_server.oxia.servicer import _check_write, _notification_batches, start_after
from tablekeeper_server.range.events import ChangeEvent, EventHistory
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.records import StoredRecord
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.range.watch import KeySpan, WatchHub
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS

LIMITS = Limits(key_bytes_max=100, value_bytes_max=1000)


def _record(revision: int, version: int) -> StoredRecord:
    return StoredRecord(1, revision, version, False, 0, b"")


@pytest.mark.parametrize(
    "put",
    [
        client_pb2.PutRequest(key="k", sequence_key_delta=[1]),
        client_pb2.PutRequest(
            key="k", partition_key="p", sequence_key_delta=[1], expected_version_id=3
        ),
        client_pb2.PutRequest(key="k", partition_key="p", sequence_key_delta=[0, 1]),
        client_pb2.PutRequest(key="k", expected_version_id=-5),
    ],
)
def test_malformed_puts_are_refused(put: client_pb2.PutRequest) -> None:
    with pytest.raises(OxiaError) as refused:
        _check_write(client_pb2.WriteRequest(puts=[put]), LIMITS)
    assert refused.value.message.startswith("oxia: ")


@pytest.mark.parametrize(
    ("request_", "refusal", "answer"),
    [
        (
            client_pb2.WriteRequest(puts=[client_pb2.PutRequest(key="k" * 101)]),
            InvalidKeyError,
            (grpc.StatusCode.INVALID_ARGUMENT, "oxia: key is 101 bytes; the limit is 100"),
        ),
        (
            client_pb2.WriteRequest(deletes=[client_pb2.DeleteRequest(key="k" * 101)]),
            InvalidKeyError,
            (grpc.StatusCode.INVALID_ARGUMENT, "oxia: key is 101 bytes; the limit is 100"),
        ),
        (
            client_pb2.WriteRequest(puts=[client_pb2.PutRequest(key="k", value=b"v" * 1001)]),
            ResourceLimitError,
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "oxia: value is 1001 bytes; the limit is 1000"),
        ),
        (
            # Each value fits, the request does not (1000 + 2 * 100 + 1 MiB).
            client_pb2.WriteRequest(
                puts=[client_pb2.PutRequest(key=f"k{i}", value=b"v" * 1000) for i in range(1100)]
            ),
            ResourceLimitError,
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "oxia: request is "),
        ),
    ],
)
def test_writes_over_the_shared_limits_are_refused_in_oxia_terms(
    request_: client_pb2.WriteRequest,
    refusal: type[TableKeeperError],
    answer: tuple[grpc.StatusCode, str],
) -> None:
    with pytest.raises(refusal) as refused:
        _check_write(request_, LIMITS)
    error = from_tablekeeper(refused.value)
    assert error.code == answer[0]
    assert error.message.startswith(answer[1])


def test_well_formed_writes_pass() -> None:
    request = client_pb2.WriteRequest(
        puts=[
            client_pb2.PutRequest(key="k", expected_version_id=-1),
            client_pb2.PutRequest(key="s", partition_key="p", sequence_key_delta=[1, 0]),
        ],
        deletes=[client_pb2.DeleteRequest(key="k")],
    )
    _check_write(request, LIMITS)


def test_one_batch_per_revision_in_order() -> None:
    a, b = keys.store_key("/a"), keys.store_key("/b")
    events = [
        ChangeEvent(5, 0, a, _record(5, 0), None),
        ChangeEvent(6, 0, a, _record(6, 1), _record(5, 0)),
        ChangeEvent(6, 1, b, None, _record(2, 0)),
        ChangeEvent(9, 0, b, _record(9, 0), None),
    ]
    batches = list(_notification_batches(7, events, 1234))
    assert [(x.shard, x.offset, x.timestamp) for x in batches] == [
        (7, 5, 1234),
        (7, 6, 1234),
        (7, 9, 1234),
    ]
    first, second, third = (dict(x.notifications) for x in batches)
    # version ids are Oxia's offsets: the revision - 1
    assert first["/a"].type == client_pb2.KEY_CREATED and first["/a"].version_id == 4
    assert second["/a"].type == client_pb2.KEY_MODIFIED and second["/a"].version_id == 5
    assert second["/b"].type == client_pb2.KEY_DELETED
    assert not second["/b"].HasField("version_id")
    assert third["/b"].type == client_pb2.KEY_CREATED


def test_notifications_from_a_trimmed_offset_resume_at_the_oldest_held() -> None:
    store = MemoryKvStore()
    sm = RangeStateMachine(store, APPLIERS, history=EventHistory(store, limit=3))
    for sequence in range(1, 11):
        put = client_pb2.PutRequest(key=f"/k{sequence}", value=b"v")
        command = wal_pb2.WalCommand(
            timestamp_ms=sequence,
            oxia_write=client_pb2.WriteRequest(puts=[put]).SerializeToString(),
        )
        sm.apply_batch([(sequence, command)])
    hub = WatchHub("test", ring_events=2)
    hub.attach(sm.history, sm.applied_sequence)
    span = KeySpan(keys.PREFIX, keys.END)
    assert sm.history is not None and sm.history.trimmed_through > 2
    watcher = start_after(hub, span, 1)
    assert watcher.last[0] == sm.history.trimmed_through  # the oldest held revision is next
    current = start_after(hub, span, 8)
    assert current.last[0] == 8


def _store_with(values: dict[str, bytes]) -> MemoryKvStore:
    store = MemoryKvStore()
    sm = RangeStateMachine(store, APPLIERS)
    puts = [client_pb2.PutRequest(key=key, value=value) for key, value in values.items()]
    command = wal_pb2.WalCommand(
        timestamp_ms=1, oxia_write=client_pb2.WriteRequest(puts=puts).SerializeToString()
    )
    sm.apply_batch([(1, command)])
    return store


def test_a_read_of_large_values_is_sent_in_messages_under_the_client_limit() -> None:
    """Pulsar's MetadataStoreBatchingTest.testBigBatchSize reads 40 values of 500 KB in one
    batch: Oxia's server sends the answers in messages of about 2 MiB of values each, under the
    Java client's 4 MiB limit."""
    values = {f"/big/{i:02d}": bytes([i]) * 500_000 for i in range(40)}
    store = _store_with(values)
    gets = [client_pb2.GetRequest(key=key, include_value=True) for key in values]
    gets.append(client_pb2.GetRequest(key="/big/missing", include_value=True))
    messages = list(reads.read_responses(store, gets))
    pages = [list(message.gets) for message in messages]
    assert max(m.ByteSize() for m in messages) < 4 * 1024 * 1024
    assert [len(page) for page in pages] == [5] * 8 + [1]  # 5 × 500 KB passes 2 MiB
    answers = [answer for page in pages for answer in page]
    assert [a.value for a in answers[:-1]] == list(values.values())
    assert answers[-1].status == client_pb2.Status.KEY_NOT_FOUND


def test_a_value_over_the_page_size_travels_alone_and_no_gets_send_nothing() -> None:
    store = _store_with({"/a": b"a", "/huge": b"h" * 3_000_000, "/b": b"b"})
    gets = [client_pb2.GetRequest(key=k, include_value=True) for k in ("/a", "/huge", "/b")]
    messages = list(reads.read_responses(store, gets))
    assert [[len(g.value) for g in m.gets] for m in messages] == [[1, 3_000_000], [1]]
    assert list(reads.read_responses(store, [])) == []
