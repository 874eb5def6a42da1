"""Oxia write semantics on the range state machine itself (memory store; no gRPC): versions,
expected versions, sessions, sequence keys, delete and delete range, one command per write, the
change events notifications are made of, and that replaying the log gives the same state."""

from __future__ import annotations

from tablekeeper_proto.oxia import apply_pb2, client_pb2
from tablekeeper_proto.v1 import session_pb2, wal_pb2
from tablekeeper_server.oxia import keys, reads
from tablekeeper_server.range.events import EventHistory
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS

Status = client_pb2.Status


class Shard:
    """A state machine fed Oxia writes, as the front-end feeds a range."""

    def __init__(self) -> None:
        self.store = MemoryKvStore()
        self.sm = RangeStateMachine(self.store, APPLIERS, history=EventHistory(self.store))
        self.log: list[tuple[int, wal_pb2.WalCommand]] = []

    def command(self, command: wal_pb2.WalCommand) -> object:
        sequence = len(self.log) + 1
        command.timestamp_ms = 1000 + sequence
        self.log.append((sequence, command))
        return self.sm.apply_batch([(sequence, command)])[0]

    def write(self, **parts: object) -> client_pb2.WriteResponse:
        request = client_pb2.WriteRequest(**parts)  # type: ignore[arg-type]
        result = self.command(wal_pb2.WalCommand(oxia_write=request.SerializeToString()))
        assert isinstance(result, apply_pb2.ApplyResult)
        assert result.header.code == 0
        return result.response

    def put(self, key: str, value: bytes = b"v", **options: object) -> client_pb2.PutResponse:
        put = client_pb2.PutRequest(key=key, value=value, **options)  # type: ignore[arg-type]
        return self.write(puts=[put]).puts[0]

    def delete(self, key: str, **options: object) -> client_pb2.DeleteResponse:
        delete = client_pb2.DeleteRequest(key=key, **options)  # type: ignore[arg-type]
        return self.write(deletes=[delete]).deletes[0]

    def get(self, key: str) -> client_pb2.GetResponse:
        return reads.get(self.store, client_pb2.GetRequest(key=key, include_value=True))

    def list(self, start: str, end: str) -> list[str]:
        return [k for page in reads.list_pages(self.store, start, end) for k in page]

    def session(self, ttl_ms: int = 5000) -> int:
        command = wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=ttl_ms))
        response = self.command(command)
        assert isinstance(response, session_pb2.SessionResponse)
        return response.session_id

    def close(self, session_id: int) -> None:
        self.command(wal_pb2.WalCommand(session=wal_pb2.SessionCommand(close_id=session_id)))


def test_versions_follow_oxia() -> None:
    shard = Shard()
    created = shard.put("/a", b"1")
    assert created.status == Status.OK
    assert created.version.version_id == 0  # a fresh shard's first write, as Oxia numbers it
    assert created.version.modifications_count == 0
    assert created.version.created_timestamp == created.version.modified_timestamp == 1001
    assert not created.version.HasField("session_id")
    updated = shard.put("/a", b"2")
    assert updated.version.version_id == 1
    assert updated.version.modifications_count == 1
    assert updated.version.created_timestamp == 1001
    assert updated.version.modified_timestamp == 1002
    got = shard.get("/a")
    assert got.value == b"2" and got.version == updated.version
    assert shard.get("/missing").status == Status.KEY_NOT_FOUND


def test_expected_versions() -> None:
    shard = Shard()
    assert shard.put("/k", expected_version_id=5).status == Status.UNEXPECTED_VERSION_ID
    assert shard.get("/k").status == Status.KEY_NOT_FOUND
    first = shard.put("/k", expected_version_id=-1)
    assert first.status == Status.OK
    assert shard.put("/k", expected_version_id=-1).status == Status.UNEXPECTED_VERSION_ID
    assert shard.put("/k", b"x", expected_version_id=99).status == Status.UNEXPECTED_VERSION_ID
    assert shard.get("/k").value == b"v"
    ok = shard.put("/k", b"x", expected_version_id=first.version.version_id)
    assert ok.status == Status.OK
    assert shard.delete("/k", expected_version_id=1).status == Status.UNEXPECTED_VERSION_ID
    assert shard.delete("/k", expected_version_id=ok.version.version_id).status == Status.OK
    assert shard.delete("/k").status == Status.KEY_NOT_FOUND
    assert shard.delete("/k", expected_version_id=3).status == Status.UNEXPECTED_VERSION_ID


def test_one_write_is_one_command_in_oxia_order() -> None:
    shard = Shard()
    shard.put("/x/1")
    response = shard.write(
        puts=[client_pb2.PutRequest(key="/x/2", value=b"2")],
        deletes=[client_pb2.DeleteRequest(key="/x/2")],  # puts come first: it sees /x/2
        delete_ranges=[client_pb2.DeleteRangeRequest(start_inclusive="/x/", end_exclusive="/x//")],
    )
    assert response.puts[0].version.version_id == 1
    assert response.deletes[0].status == Status.OK
    assert response.delete_ranges[0].status == Status.OK
    assert shard.list("/", "~") == []


def test_delete_range_and_list_follow_the_key_order() -> None:
    shard = Shard()
    for key in ("/p", "/p/a", "/p/b", "/p/b/deep", "/p/c", "/p//x", "/q"):
        shard.put(key)
    assert shard.list("/p/", "/p//") == ["/p/a", "/p/b", "/p/c"]
    shard.write(
        delete_ranges=[client_pb2.DeleteRangeRequest(start_inclusive="/p/a", end_exclusive="/p/c")]
    )
    assert shard.list("/p/", "/p//") == ["/p/c"]
    assert shard.get("/p/b/deep").status == Status.OK
    assert shard.list("/z", "/a") == []  # an empty interval


def test_comparisons() -> None:
    shard = Shard()
    for key in ("/b", "/d", "/f"):
        shard.put(key)
    kinds = client_pb2.KeyComparisonType

    def found(key: str, kind: int) -> str | None:
        response = reads.get(shard.store, client_pb2.GetRequest(key=key, comparison_type=kind))  # type: ignore[arg-type]
        return response.key if response.status == Status.OK else None

    assert found("/d", kinds.FLOOR) == "/d"
    assert found("/e", kinds.FLOOR) == "/d"
    assert found("/a", kinds.FLOOR) is None
    assert found("/d", kinds.LOWER) == "/b"
    assert found("/d", kinds.CEILING) == "/d"
    assert found("/c", kinds.CEILING) == "/d"
    assert found("/d", kinds.HIGHER) == "/f"
    assert found("/f", kinds.HIGHER) is None


def test_ephemeral_records_end_with_their_session() -> None:
    shard = Shard()
    unknown = shard.put("/e", session_id=12345, client_identity="c")
    assert unknown.status == Status.SESSION_DOES_NOT_EXIST
    assert shard.get("/e").status == Status.KEY_NOT_FOUND
    session = shard.session()
    put = shard.put("/e", session_id=session, client_identity="me")
    assert put.version.session_id == session and put.version.client_identity == "me"
    shard.put("/kept", session_id=session)
    shard.put("/kept")  # a put without the session detaches the key
    shard.close(session)
    assert shard.get("/e").status == Status.KEY_NOT_FOUND
    assert shard.get("/kept").status == Status.OK


def test_sequence_keys() -> None:
    shard = Shard()
    made = [shard.put("/s", partition_key="p", sequence_key_delta=[1]).key for _ in range(3)]
    assert made == [f"/s-{i:020d}" for i in (1, 2, 3)]
    two = shard.put("/s", partition_key="p", sequence_key_delta=[2, 7])
    assert two.key == f"/s-{5:020d}-{7:020d}"
    assert shard.get(two.key).status == Status.OK
    other = shard.put("/t", partition_key="p", sequence_key_delta=[4])
    assert other.key == f"/t-{4:020d}"


def test_changes_are_events_and_replay_agrees() -> None:
    shard = Shard()
    session = shard.session()
    shard.put("/n", b"1")
    shard.put("/n", b"2", session_id=session)
    shard.put("/s", partition_key="p", sequence_key_delta=[1])
    shard.write(
        delete_ranges=[client_pb2.DeleteRangeRequest(start_inclusive="/", end_exclusive="/~")]
    )
    events = [
        (e.revision, keys.from_store_key(e.key), e.record is not None)
        for e in shard.sm.history.read((0, 0), 100)  # type: ignore[union-attr]
    ]
    assert events == [
        (2, "/n", True),
        (3, "/n", True),
        (4, "/s-" + "1".zfill(20), True),
        (5, "/n", False),
        (5, "/s-" + "1".zfill(20), False),
    ]
    replayed = Shard()
    replayed.sm.apply_batch(shard.log)
    assert dict(replayed.store.scan(b"", b"\xff" * 8)) == dict(shard.store.scan(b"", b"\xff" * 8))
