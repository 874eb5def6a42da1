"""ZooKeeper semantics of the ZooKeeper front-end's writes, on the range state machine itself
(memory store; no sockets): the checks and their order, stats, sequential names, ephemeral
nodes and their session's end, multi's all-or-nothing results, containers and TTL nodes, the
change events watches are made of, and that replaying the log gives the same tree."""

from __future__ import annotations

import collections
import random
import struct

import pytest

from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_proto.zookeeper import apply_pb2
from tablekeeper_server.range.apply import (
    Appliers,
    ApplyContext,
    Command,
    FrontEndCommand,
    front_end_command,
)
from tablekeeper_server.range.events import ChangeEvent, EventHistory
from tablekeeper_server.range.session_apply import SessionApplier
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.memory import MemoryKvStore
from tablekeeper_server.zookeeper import acl as acls
from tablekeeper_server.zookeeper import apply as zk_apply
from tablekeeper_server.zookeeper import commands, jute, paths, reads
from tablekeeper_server.zookeeper import protocol as zk
from tablekeeper_server.zookeeper.apply import Applied, ZooKeeperApplier, prepare
from tablekeeper_server.zookeeper.znode import OPEN_ACL
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit

Stat = tuple[int, ...]
CZXID, MZXID, CTIME, MTIME, VERSION, CVERSION, AVERSION, OWNER, LENGTH, CHILDREN, PZXID = range(11)


def create_body(path: str, data: bytes | None = b"", mode: int = 0, acl: bytes = OPEN_ACL) -> bytes:
    return jute.write_string(path) + jute.write_buffer(data) + acl + jute.INT.pack(mode)


def path_version(path: str, version: int) -> bytes:
    return jute.write_string(path) + jute.INT.pack(version)


def set_data_body(path: str, data: bytes, version: int = -1) -> bytes:
    return jute.write_string(path) + jute.write_buffer(data) + jute.INT.pack(version)


def multi_body(*ops: tuple[int, bytes]) -> bytes:
    parts = [jute.MULTI_HEADER.pack(op, False, -1) + body for op, body in ops]
    return b"".join(parts) + jute.MULTI_HEADER.pack(-1, True, -1)


class Tree:
    """A state machine fed ZooKeeper commands, as the front-end feeds the keyspace's range."""

    def __init__(self) -> None:
        self.store = MemoryKvStore()
        self.sm = RangeStateMachine(self.store, APPLIERS, history=EventHistory(self.store))
        self.log: list[tuple[int, wal_pb2.WalCommand]] = []
        self.now = 1_000
        self.events: list[ChangeEvent] = []
        self.command(front_end_command("zookeeper", commands.init(b"k" * 32)))
        self.session = self.new_session()

    def command(self, command: wal_pb2.WalCommand) -> object:
        sequence = len(self.log) + 1
        self.now += 10
        command.timestamp_ms = self.now
        self.log.append((sequence, command))
        result = self.sm.apply_batch([(sequence, command)])[0]
        self.events = list(self.sm.last_events)
        return result

    def new_session(self) -> int:
        response = self.command(
            wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=5000))
        )
        return int(response.session_id)  # type: ignore[attr-defined]

    def close_session(self, session_id: int) -> None:
        self.command(wal_pb2.WalCommand(session=wal_pb2.SessionCommand(close_id=session_id)))

    def write(
        self,
        op: int,
        body: bytes,
        session: int | None = None,
        auth: list[acls.AuthId] | None = None,
    ) -> tuple[int, int, bytes]:
        """(error, zxid, response body) of one write."""
        payload = commands.request(
            self.session if session is None else session, op, acls.encode_auth(auth or []), body
        )
        result = self.command(front_end_command("zookeeper", payload))
        assert isinstance(result, Applied) and result.header.code == 0
        err, zxid = commands.unpack_result(result.result)
        return err, zxid, result.result[commands.RESULT_HEADER_SIZE :]

    def create(
        self, path: str, data: bytes | None = b"", mode: int = 0, **kw: object
    ) -> tuple[int, str, Stat]:
        err, _, body = self.write(zk.CREATE2, create_body(path, data, mode), **kw)  # type: ignore[arg-type]
        if err:
            return err, "", ()
        created, offset = jute.read_string(body, 0)
        return err, created or "", jute.STAT.unpack_from(body, offset)

    def stat(self, path: str) -> Stat | None:
        err, body = reads.exists(self.store, path, [])
        return jute.STAT.unpack(body) if err == zk.OK else None

    def data(self, path: str) -> bytes | None:
        err, body = reads.get_data(self.store, path, [])
        assert err == zk.OK
        return jute.read_buffer(body, 0)[0]

    def children(self, path: str) -> list[str]:
        return reads.children(self.store, path)

    def dump(self) -> dict[bytes, bytes]:
        return dict(self.store.scan(b"", b"\xff\xff"))


def event_kinds(events: list[ChangeEvent]) -> list[tuple[str, str]]:
    out = []
    for event in events:
        kind = "created" if event.prev is None else "deleted" if event.record is None else "data"
        out.append((kind, paths.path_of(event.key)))
    return out


def test_a_new_keyspace_has_zookeepers_first_nodes_with_their_stats() -> None:
    tree = Tree()
    assert tree.children("/") == ["zookeeper"]
    assert tree.children("/zookeeper") == ["config", "quota"]
    root = tree.stat("/")
    assert root is not None and root[CVERSION] == -1 and root[CHILDREN] == 1
    system = tree.stat("/zookeeper")
    assert system is not None and system[CVERSION] == -2
    config_acl = reads.get_acl(tree.store, "/zookeeper/config", [])[1]
    assert jute.read_acls(config_acl, 0)[0] == [(zk.READ, "world", "anyone")]
    config = tree.stat("/zookeeper/config")
    assert config is not None and config[AVERSION] == -1  # as a fresh ZooKeeper shows it


def test_init_again_changes_nothing() -> None:
    tree = Tree()
    tree.create("/a", b"x")
    before = {k: v for k, v in tree.dump().items() if not k.startswith(b"\xffapplied")}
    tree.command(front_end_command("zookeeper", commands.init(b"other" * 8)))
    after = {k: v for k, v in tree.dump().items() if not k.startswith(b"\xffapplied")}
    assert {k: v for k, v in after.items() if not k.startswith(b"\xffwh")} == {
        k: v for k, v in before.items() if not k.startswith(b"\xffwh")
    }


def test_create_sets_the_nodes_and_its_parents_stats() -> None:
    tree = Tree()
    err, path, stat = tree.create("/a", b"hello")
    assert (err, path) == (zk.OK, "/a")
    zxid = stat[CZXID]
    assert stat[MZXID] == stat[PZXID] == zxid and stat[CTIME] == stat[MTIME] == tree.now
    assert (stat[VERSION], stat[CVERSION], stat[LENGTH], stat[CHILDREN]) == (0, 0, 5, 0)
    err, _, child = tree.create("/a/b")
    parent = tree.stat("/a")
    assert parent is not None
    assert (parent[CVERSION], parent[CHILDREN], parent[PZXID]) == (1, 1, child[CZXID])
    assert parent[MZXID] == zxid  # a child does not change the parent's data
    assert tree.write(zk.DELETE, path_version("/a/b", -1))[0] == zk.OK
    parent = tree.stat("/a")
    assert parent is not None
    assert (parent[CVERSION], parent[CHILDREN]) == (2, 0)  # one create and one delete seen


def test_a_result_is_the_reply_after_its_xid_and_serializes_as_an_apply_result() -> None:
    """The front-end frames an applied write's reply as length, xid and the result unchanged:
    the result is ZooKeeper's reply header after the xid (zxid, then error code) and the
    response record; as a protobuf message it is an `ApplyResult` holding those bytes."""
    tree = Tree()
    payload = commands.request(tree.session, zk.CREATE, b"", create_body("/a", b"x"))
    result = tree.command(front_end_command("zookeeper", payload))
    assert isinstance(result, Applied) and result.header.code == 0
    zxid, err = struct.unpack_from(">qi", result.result)
    assert (err, zxid) == (zk.OK, len(tree.log))
    assert result.result[12:] == jute.write_string("/a")
    message = apply_pb2.ApplyResult.FromString(result.SerializeToString())
    assert message.result == result.result and message.header.code == 0
    failed = tree.command(front_end_command("zookeeper", payload))  # NODEEXISTS: still applied
    assert isinstance(failed, Applied)
    assert commands.unpack_result(failed.result) == (zk.NODE_EXISTS, len(tree.log))


def test_create_errors_come_in_zookeepers_order() -> None:
    tree = Tree()
    tree.create("/a")
    assert tree.create("/a")[0] == zk.NODE_EXISTS
    assert tree.create("/missing/b")[0] == zk.NO_NODE
    assert tree.create("no-slash")[0] == zk.BAD_ARGUMENTS
    assert tree.create("/a/")[0] == zk.BAD_ARGUMENTS  # the parent is there: the path is checked
    assert tree.create("/missing/")[0] == zk.NO_NODE  # the parent first
    assert tree.create("/a/b", mode=9)[0] == zk.BAD_ARGUMENTS
    err, _, _ = tree.write(zk.CREATE2, create_body("/a/c", acl=jute.write_acls([])))
    assert err == zk.INVALID_ACL
    ttl_without_ttl = create_body("/a/t", mode=zk.PERSISTENT_WITH_TTL)
    assert tree.write(zk.CREATE2, ttl_without_ttl)[0] == zk.BAD_ARGUMENTS
    assert tree.create("/a/e", mode=zk.EPHEMERAL)[0] == zk.OK
    assert tree.create("/a/e/child")[0] == zk.NO_CHILDREN_FOR_EPHEMERALS
    assert tree.children("/a") == ["e"]


def test_sequential_names_take_the_parents_cversion() -> None:
    tree = Tree()
    tree.create("/q")
    tree.create("/q/x")
    tree.write(zk.DELETE, path_version("/q/x", -1))
    names = [tree.create("/q/n-", mode=zk.PERSISTENT_SEQUENTIAL)[1] for _ in range(2)]
    assert names == ["/q/n-0000000001", "/q/n-0000000002"]
    assert tree.create("/q/", mode=zk.PERSISTENT_SEQUENTIAL)[1] == "/q/0000000003"


def test_delete_checks_version_and_children() -> None:
    tree = Tree()
    tree.create("/d")
    tree.create("/d/c")
    assert tree.write(zk.DELETE, path_version("/d", -1))[0] == zk.NOT_EMPTY
    assert tree.write(zk.DELETE, path_version("/d/c", 3))[0] == zk.BAD_VERSION
    assert tree.write(zk.DELETE, path_version("/d/none", -1))[0] == zk.NO_NODE
    assert tree.write(zk.DELETE, path_version("/", -1))[0] == zk.BAD_ARGUMENTS
    assert tree.write(zk.DELETE, path_version("/zookeeper", -1))[0] == zk.BAD_ARGUMENTS
    assert tree.write(zk.DELETE, path_version("/d/c", 0))[0] == zk.OK
    assert tree.stat("/d/c") is None


def test_set_data_bumps_version_mzxid_and_mtime() -> None:
    tree = Tree()
    created = tree.create("/s", b"1")[2]
    err, zxid, body = tree.write(zk.SET_DATA, set_data_body("/s", b"22", 0))
    stat = jute.STAT.unpack(body)
    assert err == zk.OK and stat[VERSION] == 1 and stat[MZXID] == zxid != created[MZXID]
    assert stat[CZXID] == created[CZXID] and stat[LENGTH] == 2
    assert tree.write(zk.SET_DATA, set_data_body("/s", b"3", 0))[0] == zk.BAD_VERSION
    assert tree.data("/s") == b"22"
    assert tree.write(zk.SET_DATA, set_data_body("/nope", b"3"))[0] == zk.NO_NODE
    tree.write(zk.SET_DATA, jute.write_string("/s") + jute.write_buffer(None) + jute.INT.pack(-1))
    assert tree.data("/s") is None


def test_acls_are_enforced_inside_the_apply() -> None:
    tree = Tree()
    bob = ("digest", acls.digest_id("bob:pw"))
    only_bob = jute.write_acls([(zk.ALL, "digest", bob[1])])
    assert tree.write(zk.CREATE, create_body("/p", b"x", acl=only_bob))[0] == zk.OK
    assert tree.create("/p/c")[0] == zk.NO_AUTH
    assert tree.create("/p/c", auth=[bob])[0] == zk.OK
    assert tree.write(zk.SET_DATA, set_data_body("/p", b"y"))[0] == zk.NO_AUTH
    assert tree.write(zk.DELETE, path_version("/p/c", -1))[0] == zk.NO_AUTH  # parent's DELETE
    assert reads.get_data(tree.store, "/p", [])[0] == zk.NO_AUTH
    assert reads.get_data(tree.store, "/p", [bob])[0] == zk.OK
    set_acl = jute.write_string("/p") + OPEN_ACL + jute.INT.pack(0)
    assert tree.write(zk.SET_ACL, set_acl)[0] == zk.NO_AUTH
    err, _, body = tree.write(zk.SET_ACL, set_acl, auth=[bob])
    assert err == zk.OK and jute.STAT.unpack(body)[AVERSION] == 1
    assert tree.write(zk.SET_ACL, set_acl, auth=[bob])[0] == zk.BAD_VERSION
    assert tree.write(zk.SET_DATA, set_data_body("/p", b"y"))[0] == zk.OK


def test_auth_in_an_acl_expands_to_the_callers_digest_id() -> None:
    tree = Tree()
    bob = ("digest", acls.digest_id("bob:pw"))
    auth_acl = jute.write_acls([(zk.ALL, "auth", "")])
    assert tree.write(zk.CREATE, create_body("/auth", acl=auth_acl))[0] == zk.INVALID_ACL
    assert tree.write(zk.CREATE, create_body("/auth", acl=auth_acl), auth=[bob])[0] == zk.OK
    stored = reads.get_acl(tree.store, "/auth", [bob])[1]
    assert jute.read_acls(stored, 0)[0] == [(zk.ALL, *bob)]


def test_writes_of_an_ended_session_are_refused() -> None:
    tree = Tree()
    other = tree.new_session()
    tree.close_session(other)
    assert tree.create("/late", session=other)[0] == zk.SESSION_EXPIRED
    assert tree.stat("/late") is None


def test_a_sessions_end_deletes_its_ephemeral_nodes_with_their_parents_updates() -> None:
    tree = Tree()
    other = tree.new_session()
    tree.create("/e")
    first = tree.create("/e/one", mode=zk.EPHEMERAL, session=other)[2]
    tree.create("/e/two", mode=zk.EPHEMERAL_SEQUENTIAL, session=other)
    tree.create("/e/mine", mode=zk.EPHEMERAL)
    assert first[OWNER] == other
    assert reads.ephemerals(tree.store, other, "/e") == jute.write_strings(
        ["/e/one", "/e/two0000000001"]
    )
    tree.close_session(other)
    assert tree.children("/e") == ["mine"]
    parent = tree.stat("/e")
    assert parent is not None and parent[CHILDREN] == 1 and parent[PZXID] == len(tree.log)
    assert sorted(event_kinds(tree.events)) == [
        ("deleted", "/e/one"),
        ("deleted", "/e/two0000000001"),
    ]
    assert reads.ephemerals(tree.store, other, None) == jute.INT.pack(0)


def test_a_multi_applies_all_or_nothing_with_zookeepers_per_op_results() -> None:
    tree = Tree()
    tree.create("/m")
    ok = multi_body(
        (zk.CREATE, create_body("/m/a", b"1")),
        (zk.CREATE, create_body("/m/a/b", b"2")),  # sees the create before it
        (zk.SET_DATA, set_data_body("/m/a", b"3", 0)),
        (zk.CHECK, path_version("/m/a", 1)),
        (zk.DELETE, path_version("/m/a/b", -1)),
    )
    err, zxid, body = tree.write(zk.MULTI, ok)
    assert err == zk.OK
    offset = 0
    seen = []
    while True:
        op, done, result_err = jute.MULTI_HEADER.unpack_from(body, offset)
        offset += jute.MULTI_HEADER.size
        if done:
            break
        seen.append((op, result_err))
        if op == zk.CREATE:
            offset = jute.read_string(body, offset)[1]
        elif op == zk.SET_DATA:
            stat = jute.STAT.unpack_from(body, offset)
            assert stat[MZXID] == zxid and stat[VERSION] == 1
            offset += jute.STAT_SIZE
    assert seen == [(1, 0), (1, 0), (5, 0), (13, 0), (2, 0)]
    assert tree.children("/m") == ["a"] and tree.children("/m/a") == []
    assert event_kinds(tree.events) == [
        ("created", "/m/a"),
        ("created", "/m/a/b"),
        ("data", "/m/a"),
        ("deleted", "/m/a/b"),
    ]

    before = {k: v for k, v in tree.dump().items() if not k.startswith(b"\xff")}
    failing = multi_body(
        (zk.CREATE, create_body("/m/x")),
        (zk.CHECK, path_version("/m/a", 7)),
        (zk.DELETE, path_version("/m/a", -1)),
    )
    err, _, body = tree.write(zk.MULTI, failing)
    assert err == zk.OK  # a multi's failure is in its results
    results = [jute.MULTI_HEADER.unpack_from(body, i * 13) for i in range(4)]
    assert [r[:1] + r[2:] for r in results[:3]] == [
        (zk.ERROR, 0),
        (zk.ERROR, zk.BAD_VERSION),
        (zk.ERROR, zk.RUNTIME_INCONSISTENCY),
    ]
    assert results[3] == (-1, True, -1)
    assert {k: v for k, v in tree.dump().items() if not k.startswith(b"\xff")} == before
    assert tree.events == []


def test_a_multi_that_mixes_reads_in_or_does_not_decode_answers_marshalling_error() -> None:
    tree = Tree()
    mixed = multi_body((zk.GET_DATA, jute.write_string("/") + b"\x00"))
    assert tree.write(zk.MULTI, mixed)[0] == zk.MARSHALLING_ERROR
    assert tree.write(zk.MULTI, b"\x00\x00")[0] == zk.MARSHALLING_ERROR
    assert tree.write(zk.CREATE, b"\x00\x00\x00\x09/a")[0] == zk.MARSHALLING_ERROR


def test_create_modes_ttl_and_container_and_the_sweep() -> None:
    tree = Tree()
    ttl_body = create_body("/t", b"", zk.PERSISTENT_WITH_TTL) + jute.LONG.pack(100)
    err, _, body = tree.write(zk.CREATE_TTL, ttl_body)
    assert err == zk.OK and jute.STAT.unpack_from(body, 6)[OWNER] == 0
    assert tree.write(zk.CREATE_CONTAINER, create_body("/c", b"", zk.CONTAINER))[0] == zk.OK
    tree.create("/c/child")
    tree.write(zk.DELETE, path_version("/c/child", -1))
    tree.write(zk.CREATE_CONTAINER, create_body("/fresh", b"", zk.CONTAINER))

    def sweep(path: str) -> None:
        tree.command(front_end_command("zookeeper", commands.sweep(path)))

    tree.now += 50
    sweep("/t")  # 60 ms after its last change: not due
    assert tree.stat("/t") is not None
    tree.now += 100
    sweep("/t")
    sweep("/c")
    sweep("/fresh")  # never had a child: kept (ZooKeeper's default)
    assert tree.stat("/t") is None and tree.stat("/c") is None and tree.stat("/fresh") is not None
    assert event_kinds(tree.events) == []  # the last sweep deleted nothing
    ttl_index = [k for k in tree.dump() if k.startswith(paths.TTLS + b"/t")]
    assert ttl_index == []


def test_invalid_ttls_are_bad_arguments() -> None:
    tree = Tree()
    for ttl in (0, -5, zk.TTL_MAX_MS + 1):
        body = create_body("/t", b"", zk.PERSISTENT_WITH_TTL) + jute.LONG.pack(ttl)
        assert tree.write(zk.CREATE_TTL, body)[0] == zk.BAD_ARGUMENTS
    ttl_on_plain = create_body("/t", b"", zk.PERSISTENT) + jute.LONG.pack(10)
    assert tree.write(zk.CREATE_TTL, ttl_on_plain)[0] == zk.BAD_ARGUMENTS


def test_all_children_number_counts_every_descendant() -> None:
    tree = Tree()
    for path in ("/n", "/n/a", "/n/a/b", "/n/a/b/c", "/n/d"):
        tree.create(path)
    assert reads.all_children_number(tree.store, "/n", []) == (zk.OK, struct.pack(">i", 4))
    assert reads.all_children_number(tree.store, "/", []) == (zk.OK, struct.pack(">i", 8))


def test_replaying_the_log_rebuilds_the_same_tree() -> None:
    tree = Tree()
    other = tree.new_session()
    tree.create("/r", b"x")
    tree.create("/r/s-", mode=zk.PERSISTENT_SEQUENTIAL)
    tree.create("/r/e", mode=zk.EPHEMERAL, session=other)
    tree.write(zk.SET_DATA, set_data_body("/r", b"y"))
    tree.write(
        zk.MULTI,
        multi_body((zk.CREATE, create_body("/r/m")), (zk.DELETE, path_version("/r/m", -1))),
    )
    tree.close_session(other)
    replayed = MemoryKvStore()
    sm = RangeStateMachine(replayed, APPLIERS, history=EventHistory(replayed))
    sm.apply_batch(tree.log)
    assert dict(replayed.scan(b"", b"\xff\xff")) == tree.dump()


def test_a_range_holding_a_keyspace_refuses_a_split() -> None:
    """The keyspace keeps one total order (the range's revision is its zxid): it cannot be cut."""
    tree = Tree()
    tree.create("/s")
    seal = wal_pb2.WalCommand(seal=wal_pb2.RangeSeal(children=[2, 3], start_hashes=[0, 1]))
    tree.command(seal)
    (refused,) = tree.sm.last_rejections.values()
    assert "ZooKeeper keyspace" in refused.message
    assert tree.sm.sealed is None
    assert sorted(tree.children("/")) == ["s", "zookeeper"]


# ---------------------------------------------------------------------------- the write paths


class _General(ZooKeeperApplier):
    """The ZooKeeper applier with every client write applied on a `_Tree` (`_run`): the
    general path, which single writes take a shorter way around (`_single_*`)."""

    def apply(self, ctx: ApplyContext, command: wal_pb2.WalCommand) -> Applied:
        payload = command.front_end.payload
        if payload[:1] != bytes([commands.REQUEST]):
            return super().apply(ctx, command)  # type: ignore[return-value]
        session_id, op, auth, body = commands.unpack_request(payload)
        tree = zk_apply._Tree(ctx, ctx.revision, ctx.now_ms, auth)
        try:
            if op == zk.MULTI:
                operations = zk_apply.decode_multi(body, zk.MULTI_WRITE_OPS)
                response = zk_apply._multi(tree, session_id, operations)
            else:
                fields = zk_apply.decode_operation(op, body, 0)[0]
                response = zk_apply._run(tree, session_id, op, fields)
        except zk_apply._FailedError as failed:
            return Applied(commands.result(failed.code, ctx.revision))
        except jute.JuteError:
            return Applied(commands.result(zk.MARSHALLING_ERROR, ctx.revision))
        tree.flush()
        return Applied(commands.result(zk.OK, ctx.revision, response))

    def apply_payload(self, ctx: ApplyContext, payload: bytes, prepared: object) -> Applied:
        return self.apply(ctx, front_end_command(self.name, payload))


def _appliers(zookeeper: ZooKeeperApplier) -> Appliers:
    return Appliers([zookeeper, SessionApplier(session_ending=(zookeeper.session_ending,))])


def _random_writes(seed: int, count: int) -> list[tuple[int, int, bytes, int]]:
    """(operation, session index (0, 1: closed halfway, 2: never opened), request, auth index)
    of `count` random writes over a small tree: every error a create, setData or delete can
    answer turns up (no node, node exists, bad version, not empty, no auth, invalid ACL, bad
    arguments, expired session, children of ephemerals), and multis over the same nodes."""
    rng = random.Random(seed)
    paths = ["/a", "/a/b", "/a/b/c", "/a/d", "/e", "/e/f", "/s", "/s/t", "/", "/zookeeper", "x"]
    datas = [b"", None, b"v", b"w" * 300]
    bob = acls.digest_id("bob:pw")
    acl_lists = [
        OPEN_ACL,
        OPEN_ACL,
        jute.write_acls([(zk.ALL, "digest", bob)]),
        jute.write_acls([(zk.READ | zk.CREATE_PERM, "world", "anyone")]),
        jute.write_acls([(zk.ALL, "auth", "")]),
        jute.write_acls([]),
    ]
    out = []
    for _ in range(count):
        path = rng.choice(paths)
        roll = rng.random()
        if roll < 0.45:
            op = rng.choice([zk.CREATE, zk.CREATE, zk.CREATE2, zk.CREATE_CONTAINER, zk.CREATE_TTL])
            mode = rng.choice([0, 0, 0, 1, 2, 3, 5, 6, 7])
            body = create_body(path, rng.choice(datas), mode, rng.choice(acl_lists))
            if op == zk.CREATE_TTL:
                body += jute.LONG.pack(rng.choice([-1, 0, 1, 10_000]))
        elif roll < 0.7:
            op = zk.SET_DATA
            body = jute.write_string(path) + jute.write_buffer(rng.choice(datas))
            body += jute.INT.pack(rng.choice([-1, -1, 0, 1, 2]))
        elif roll < 0.9:
            op = zk.DELETE
            body = path_version(path, rng.choice([-1, -1, 0, 1]))
        else:
            op = zk.MULTI
            body = multi_body(
                (zk.CREATE, create_body(path + "m", b"m")),
                (zk.SET_DATA, set_data_body(rng.choice(paths), b"n")),
                (zk.DELETE, path_version(rng.choice(paths), -1)),
            )
        out.append((op, rng.choice([0] * 8 + [1, 2]), body, rng.choice([0, 0, 1])))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_single_writes_and_prepared_commands_apply_as_the_general_path_does(seed: int) -> None:
    """The same random writes through three paths (the general one; the logged command as
    replay reads it; the command as the front-end queues it, with its decoded request) give the
    same results, events and stored bytes, write by write."""
    bob = [("digest", acls.digest_id("bob:pw"))]
    machines = [
        RangeStateMachine(MemoryKvStore(), _appliers(_General()), history=None),
        RangeStateMachine(MemoryKvStore(), APPLIERS, history=None),
        RangeStateMachine(MemoryKvStore(), APPLIERS, history=None),
    ]
    setup = [
        front_end_command("zookeeper", commands.init(b"k" * 32)),
        wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=5000)),
        wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=5000)),
    ]
    writes = _random_writes(seed, 600)
    sessions = [2, 3, 99]
    codes: dict[int, set[bytes]] = collections.defaultdict(set)
    for sequence, command in enumerate(setup, start=1):
        command.timestamp_ms = 1_000
        for sm in machines:
            sm.apply_batch([(sequence, command)])
    for index, (op, session, body, auth) in enumerate(writes):
        sequence = len(setup) + 1 + index
        if index == len(writes) // 2:  # the second session ends: its ephemerals go
            close = wal_pb2.WalCommand(session=wal_pb2.SessionCommand(close_id=sessions[1]))
            close.timestamp_ms = 2_000
            for sm in machines:
                sm.apply_batch([(sequence, close)])
            setup.append(close)
            sequence += 1
        caller = acls.encode_auth(bob if auth else [])
        frame = jute.INT_INT.pack(index, op) + body
        try:
            payload, prepared = prepare(sessions[session], op, caller, frame)
        except jute.JuteError:
            continue  # the front-end answers it without logging it
        logged = front_end_command("zookeeper", payload)
        queued = FrontEndCommand("zookeeper", payload, prepared)
        logged.timestamp_ms = queued.timestamp_ms = 1_000 + index
        assert queued.SerializeToString() == logged.SerializeToString()
        results = []
        paths_: tuple[Command, ...] = (logged, logged, queued)
        for sm, given in zip(machines, paths_, strict=True):
            response = sm.apply_batch([(sequence, given)])[0]
            # (a createTTL of a mode without a TTL and a ttl of -1 fails in the apply on
            # every path: answered as a failed apply, as ZooKeeper answers its exception)
            results.append((response.SerializeToString(), sm.last_events))
        assert results[1] == results[0], (index, op)
        assert results[2] == results[0], (index, op)
        codes[op].add(apply_pb2.ApplyResult.FromString(results[0][0]).result[8:12])
    dumps = [dict(sm.store.scan(b"", b"\xff" * 8)) for sm in machines]
    assert dumps[1] == dumps[0] and dumps[2] == dumps[0]
    answered = set().union(*(codes[op] for op in (zk.CREATE, zk.SET_DATA, zk.DELETE)))
    expected: tuple[int, ...] = (
        zk.OK,
        zk.NO_NODE,
        zk.NODE_EXISTS,
        zk.BAD_VERSION,
        zk.NO_AUTH,
        zk.BAD_ARGUMENTS,
    )
    expected += (zk.SESSION_EXPIRED, zk.INVALID_ACL)
    assert {jute.INT.pack(code) for code in expected} <= answered  # the writes reach them
