"""The differential run of ZooKeeper's protocol: one seeded random sequence of operations played
against a real ZooKeeper and against TableKeeper's ZooKeeper port through the bare wire client
(tests/support/zookeeper_wire.py), each producing a trace of everything ZooKeeper promises about
the answers; the traces must be equal.

A trace holds, for every operation, its session, request, error code and result (paths, data,
children, stats), and for every session the watch events that reached it since the previous
operation, in their order (every session pings after each operation: ZooKeeper sends a session
the events a change fires before it answers a later request of that session). Zxids are
compared by their order (each is replaced by its rank among the trace's zxids), times not at all,
an ephemeral's owner by which of the run's sessions it is.

Operations: create (persistent, ephemeral, sequential of both, container, TTL; create and
create2), delete and setData with and without versions, exists, getData, getChildren2 with and
without watches, persistent and persistent recursive watches (addWatch), multi (create, delete,
setData, check; committed or failed), sync, ACLs (world, auth, digest; one session
authenticated with digest) with getACL and setACL,
getAllChildrenNumber, getEphemerals, closeSession, and a session that stops talking and expires.

Both servers must keep empty containers and expired TTL nodes until the run ends (their sweeps
are timers of their own): see `zookeeper_env()` and `TABLEKEEPER_ARGS`.

`python -m tests.compat.zookeeper_differential --seeds N --ops M` runs it by hand (both servers
started here); tests/compat/test_zookeeper_differential.py runs it under pytest.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import random
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.compat.zookeeper_compat import start_pair, zookeeper_3_9
from tests.support.zookeeper_wire import (
    INT,
    LONG,
    OPEN_ACL,
    STAT,
    WireClient,
    buffer,
    read_string,
    string,
)

# The real ZooKeeper (3.9.3, `zookeeper_3_9()`): its container sweep an hour apart, TTL nodes
# allowed (deploy/zookeeper.sh passes ZK_EXTRA_OPTS to its JVM).
EXTRA_OPTS = {
    "ZK_EXTRA_OPTS": "-XX:TieredStopAtLevel=1 -Dznode.container.checkIntervalMs=3600000 "
    "-Dzookeeper.extendedTypesEnabled=true"
}
TABLEKEEPER_ARGS = ("--zookeeper-container-check-interval", "0")
SESSIONS = 3


def zookeeper_env() -> dict[str, str]:
    return {**zookeeper_3_9(), **EXTRA_OPTS}


SESSION_TIMEOUT_MS = 30_000
# The session that expires: short, so a run waits seconds for it, yet long enough that a busy
# machine's stall does not end it early (it pings after every operation).
EXPIRING_TIMEOUT_MS = 4_000
EXPIRY_WAIT_S = 120.0  # a hang guard for a session's expiry
NAMES = ("a", "b", "c", "d")
MAX_DEPTH = 3
TTL_MS = 3_600_000

OP_CREATE, OP_DELETE, OP_EXISTS, OP_GET_DATA, OP_SET_DATA = 1, 2, 3, 4, 5
OP_SYNC, OP_CHECK, OP_GET_CHILDREN2, OP_MULTI, OP_CREATE2 = 9, 13, 12, 14, 15
OP_CREATE_CONTAINER, OP_CREATE_TTL, OP_GET_EPHEMERALS, OP_ALL_CHILDREN = 19, 21, 103, 104
OP_ADD_WATCH, OP_GET_ACL, OP_SET_ACL, OP_SET_AUTH = 106, 6, 7, 100
ALICE_SESSION = 2
OP_PING, OP_CLOSE = 11, -11

# create modes: persistent, ephemeral, persistent sequential, ephemeral sequential, container,
# TTL, TTL sequential
MODES = {0: OP_CREATE2, 1: OP_CREATE2, 2: OP_CREATE2, 3: OP_CREATE2, 4: OP_CREATE_CONTAINER}
TTL_MODES = (5, 6)


class Zxids:
    """Every zxid a trace holds, replaced at the end by its rank among them."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def mark(self, zxid: int) -> tuple[str, int]:
        self.seen.add(zxid)
        return ("zxid", zxid)

    def ranked(self, value: Any) -> Any:
        order = {z: i for i, z in enumerate(sorted(self.seen))}

        def walk(item: Any) -> Any:
            if isinstance(item, tuple) and len(item) == 2 and item[0] == "zxid":
                return f"z{order[item[1]]}"
            if isinstance(item, (list, tuple)):
                return type(item)(walk(i) for i in item)
            return item

        return walk(value)


@dataclass
class Run:
    """One server's side of a run: its sessions and the trace they produce."""

    port: int
    zxids: Zxids = field(default_factory=Zxids)
    trace: list[Any] = field(default_factory=list)
    sessions: list[WireClient] = field(default_factory=list)
    owners: dict[int, int] = field(default_factory=dict)  # session id -> the run's number
    opened: int = 0

    def open(self, timeout_ms: int = SESSION_TIMEOUT_MS, *, alice: bool = False) -> WireClient:
        client = WireClient(self.port, timeout_ms)
        client.connect()
        assert client.session_id, f"no session from port {self.port}"
        if alice:  # addauth digest alice:pw (a setAuth packet: xid -4)
            body = INT.pack(0) + string("digest") + buffer(ALICE.encode())
            assert client.receive(client.send(OP_SET_AUTH, body, xid=-4)).err == 0
        self.owners[client.session_id] = self.opened
        self.opened += 1
        return client

    def owner(self, session_id: int) -> Any:
        return 0 if session_id == 0 else f"s{self.owners.get(session_id, '?')}"

    def stat(self, body: bytes, offset: int = 0) -> tuple[Any, ...]:
        (czxid, mzxid, _ct, _mt, version, cversion, aversion, owner, length, children, pzxid) = (
            STAT.unpack_from(body, offset)
        )
        z = self.zxids.mark
        return (
            z(czxid), z(mzxid), version, cversion, aversion, self.owner(owner), length, children,
            z(pzxid),
        )  # fmt: skip

    def fence(self, *, one_change: bool = False) -> None:
        """Each session pings: the events that reached it so far go into the trace. With
        `one_change`, the events came from one change deleting several znodes (a session's
        end deleting its ephemerals), in an order ZooKeeper leaves open (its own is a hash
        set's): they are compared sorted."""
        for number, client in enumerate(self.sessions):
            client.receive(client.send(OP_PING, xid=-2))
            events = [(kind, path) for kind, path, _zxid in client.events]
            if one_change:
                events.sort()
            if events:
                self.trace.append(("events", number, events))
            client.events.clear()


def _acl(perms: int, scheme: str, identity: str) -> bytes:
    return INT.pack(1) + INT.pack(perms) + string(scheme) + string(identity)


ALICE = "alice:pw"  # session 2 authenticates as alice (digest), the others not at all
ALICE_ID = "alice:" + base64.b64encode(hashlib.sha1(ALICE.encode()).digest()).decode()
# world:anyone all, world:anyone read, the creator's ids (auth: INVALIDACL without any), alice's
ACLS = {
    "open": OPEN_ACL,
    "read": _acl(1, "world", "anyone"),
    "creator": _acl(31, "auth", ""),
    "alice": _acl(31, "digest", ALICE_ID),
}


def _create_body(path: str, data: bytes, mode: int, op: int, acl: str = "open") -> bytes:
    body = string(path) + buffer(data) + ACLS[acl] + INT.pack(mode)
    if op == OP_CREATE_TTL:
        body += LONG.pack(TTL_MS)
    return body


@dataclass
class Op:
    """One request: its opcode and body, and how to read its answer."""

    op: int
    body: bytes
    describe: tuple[Any, ...]
    parse: Callable[[Run, bytes], Any]
    write: bool


def _path_result(run: Run, body: bytes) -> Any:
    return read_string(body, 0)[0]


def _path_stat_result(run: Run, body: bytes) -> Any:
    path, offset = read_string(body, 0)
    return (path, run.stat(body, offset))


def _stat_result(run: Run, body: bytes) -> Any:
    return run.stat(body)


def _data_result(run: Run, body: bytes) -> Any:
    (length,) = INT.unpack_from(body)
    data = body[4 : 4 + max(length, 0)] if length >= 0 else None
    return (data, run.stat(body, 4 + max(length, 0)))


def _strings(body: bytes, offset: int = 0) -> tuple[list[str], int]:
    (count,) = INT.unpack_from(body, offset)
    offset += 4
    out = []
    for _ in range(count):
        name, offset = read_string(body, offset)
        out.append(name)
    return out, offset


def _children_result(run: Run, body: bytes) -> Any:
    names, offset = _strings(body)
    return (sorted(names), run.stat(body, offset))


def _acl_result(run: Run, body: bytes) -> Any:
    (count,) = INT.unpack_from(body)
    offset, acl = 4, []
    for _ in range(count):
        (perms,) = INT.unpack_from(body, offset)
        scheme, offset = read_string(body, offset + 4)
        identity, offset = read_string(body, offset)
        acl.append((perms, scheme, identity))
    return (sorted(acl), run.stat(body, offset))


def _int_result(run: Run, body: bytes) -> Any:
    return INT.unpack_from(body)[0]


def _sorted_strings_result(run: Run, body: bytes) -> Any:
    return sorted(_strings(body)[0])


def _nothing(run: Run, body: bytes) -> Any:
    return None


_MULTI_HEADER = struct.Struct(">i?i")


def _multi_result(run: Run, body: bytes) -> Any:
    out: list[Any] = []
    offset = 0
    while True:
        kind, done, err = _MULTI_HEADER.unpack_from(body, offset)
        offset += _MULTI_HEADER.size
        if done:
            return out
        if kind == -1:
            out.append(("error", INT.unpack_from(body, offset)[0]))
            offset += 4
        elif kind == OP_CREATE:
            path, offset = read_string(body, offset)
            out.append(("create", path))
        elif kind in (OP_CREATE2, OP_CREATE_CONTAINER, OP_CREATE_TTL):
            path, offset = read_string(body, offset)
            out.append(("create2", path, run.stat(body, offset)))
            offset += STAT.size
        elif kind == OP_SET_DATA:
            out.append(("setData", run.stat(body, offset)))
            offset += STAT.size
        elif kind in (OP_DELETE, OP_CHECK):
            out.append((kind,))
        else:
            raise AssertionError(f"multi result of unknown type {kind} (err {err})")


class Generator:
    """The seeded sequence. Paths are drawn mostly from the znodes the run's answers say exist
    (and from names under them that may not, so errors come too): the answers steer the
    sequence, which stays the same on both servers for as long as their answers are."""

    def __init__(self, seed: int, base: str) -> None:
        self.rng = random.Random(seed)
        self.base = base
        self.existing: list[str] = [base]  # in the order they were created

    def path(self) -> str:
        node = self.rng.choice(self.existing)
        if self.rng.random() < 0.55 and node != self.base:
            return node
        if node.count("/") - self.base.count("/") >= MAX_DEPTH:
            node = self.base
        return f"{node}/{self.rng.choice(NAMES)}"

    def observe(self, op: Op, err: int, result: Any) -> None:
        """What an answer says about which znodes exist."""
        if err != 0:
            return
        if op.describe[0] == "create" and len(op.describe) > 1:
            self._created(result if isinstance(result, str) else result[0])
        elif op.describe[0] == "delete":
            self._deleted(op.describe[1])
        elif op.describe[0] == "multi" and result and result[-1][0] != "error":
            for part, outcome in zip(op.describe[1], result, strict=True):
                if part[0] == "create":
                    self._created(outcome[1])
                elif part[0] == "delete":
                    self._deleted(part[1])

    def _created(self, path: str) -> None:
        if path not in self.existing:
            self.existing.append(path)

    def _deleted(self, path: str) -> None:
        if path in self.existing:
            self.existing.remove(path)

    def data(self) -> bytes:
        return self.rng.randbytes(self.rng.choice((0, 1, 5, 40)))

    def version(self) -> int:
        return self.rng.choice((-1, -1, 0, 1, 2))

    def create(self) -> Op:
        path = self.path()
        if self.rng.random() < 0.1:
            mode = self.rng.choice(TTL_MODES)
            op = OP_CREATE_TTL
        else:
            mode = self.rng.choice((0, 0, 0, 1, 1, 2, 3, 4))
            op = MODES[mode]
            if mode in (0, 1, 2, 3) and self.rng.random() < 0.3:
                op = OP_CREATE  # the old create: the path only
        parse = _path_result if op == OP_CREATE else _path_stat_result
        acl = "open" if self.rng.random() < 0.85 else self.rng.choice(sorted(ACLS))
        body = _create_body(path, self.data(), mode, op, acl)
        return Op(op, body, ("create", op, path, mode, acl), parse, True)

    def multi_part(self) -> tuple[bytes, tuple[Any, ...]]:
        roll = self.rng.random()
        path = self.path()
        if roll < 0.4:
            mode = self.rng.choice((0, 0, 1, 2, 3))
            op = self.rng.choice((OP_CREATE, OP_CREATE2))
            return (
                _MULTI_HEADER.pack(op, False, -1) + _create_body(path, self.data(), mode, op),
                ("create", op, path, mode),
            )
        version = self.version()
        if roll < 0.6:
            body = string(path) + INT.pack(version)
            return _MULTI_HEADER.pack(OP_DELETE, False, -1) + body, ("delete", path, version)
        if roll < 0.85:
            data = self.data()
            body = string(path) + buffer(data) + INT.pack(version)
            return _MULTI_HEADER.pack(OP_SET_DATA, False, -1) + body, ("setData", path, version)
        body = string(path) + INT.pack(version)
        return _MULTI_HEADER.pack(OP_CHECK, False, -1) + body, ("check", path, version)

    def next(self) -> Op:
        roll = self.rng.random()
        if roll < 0.30:
            return self.create()
        path = self.path()
        watch = self.rng.random() < 0.5
        if roll < 0.40:
            version = self.version()
            return Op(OP_DELETE, string(path) + INT.pack(version), ("delete", path, version),
                      _nothing, True)  # fmt: skip
        if roll < 0.55:
            version = self.version()
            body = string(path) + buffer(self.data()) + INT.pack(version)
            return Op(OP_SET_DATA, body, ("setData", path, version), _stat_result, True)
        if roll < 0.63:
            return Op(OP_EXISTS, string(path) + bytes([watch]), ("exists", path, watch),
                      _stat_result, False)  # fmt: skip
        if roll < 0.71:
            return Op(OP_GET_DATA, string(path) + bytes([watch]), ("getData", path, watch),
                      _data_result, False)  # fmt: skip
        if roll < 0.81:
            return Op(OP_GET_CHILDREN2, string(path) + bytes([watch]),
                      ("getChildren2", path, watch), _children_result, False)  # fmt: skip
        if roll < 0.93:
            parts = [self.multi_part() for _ in range(self.rng.randint(1, 4))]
            body = b"".join(p[0] for p in parts) + _MULTI_HEADER.pack(-1, True, -1)
            return Op(OP_MULTI, body, ("multi", [p[1] for p in parts]), _multi_result, True)
        if roll < 0.945:
            mode = self.rng.choice((0, 1))  # persistent, persistent recursive
            return Op(OP_ADD_WATCH, string(path) + INT.pack(mode), ("addWatch", path, mode),
                      _nothing, False)  # fmt: skip
        if roll < 0.95:
            return Op(OP_SYNC, string(path), ("sync", path), _path_result, False)
        if roll < 0.96:
            return Op(OP_GET_ACL, string(path), ("getACL", path), _acl_result, False)
        if roll < 0.97:
            acl, version = self.rng.choice(sorted(ACLS)), self.version()
            body = string(path) + ACLS[acl] + INT.pack(version)
            return Op(OP_SET_ACL, body, ("setACL", path, acl, version), _stat_result, True)
        if roll < 0.98:
            return Op(OP_ALL_CHILDREN, string(path), ("getAllChildrenNumber", path),
                      _int_result, False)  # fmt: skip
        return Op(OP_GET_EPHEMERALS, string(self.base), ("getEphemerals",),
                  _sorted_strings_result, False)  # fmt: skip


def _apply(run: Run, session: int, op: Op) -> tuple[int, Any]:
    client = run.sessions[session]
    reply = client.call(op.op, op.body)
    result = op.parse(run, reply.body) if reply.err == 0 else None
    if op.op == OP_MULTI and reply.err != 0:
        result = _multi_result(run, reply.body)  # a failed multi: every op's error
    header = run.zxids.mark(reply.zxid) if op.write and reply.err == 0 else None
    run.trace.append(("op", session, op.describe, reply.err, header, result))
    run.fence()
    return reply.err, result


def _replace_session(run: Run, session: int, base: str, *, expire: bool) -> None:
    """End session `session` (closeSession, or silence until it expires) and open another in
    its place. An expiry is awaited through another session: until an ephemeral marker the
    silent session created (beside `base`, so no watch of the run sees it) is gone."""
    old = run.sessions[session]
    if not expire:
        reply = old.close_session()
        run.trace.append(("close", session, reply.err, run.zxids.mark(reply.zxid)))
        old.close()
    else:
        marker = f"{base}-expiring-{run.opened}"
        assert old.create(marker, mode=1).err == 0
        old.close()  # no closeSession: the client just goes quiet
        observer = run.sessions[(session + 1) % len(run.sessions)]
        deadline = time.monotonic() + EXPIRY_WAIT_S
        while observer.exists(marker).err == 0:
            assert time.monotonic() < deadline, "an abandoned session never expired"
            time.sleep(0.05)
        run.trace.append(("expired", session))
    replacement = run.open(
        EXPIRING_TIMEOUT_MS if session == 0 else SESSION_TIMEOUT_MS, alice=session == ALICE_SESSION
    )
    run.sessions[session] = replacement
    run.fence(one_change=True)


def play(port: int, seed: int, ops: int, base: str) -> list[Any]:
    """The trace of seed `seed`'s `ops` operations against the server on `port`, under `base`
    (which must not exist)."""
    run = Run(port)
    # Session 0 has a short timeout: it is the one that stops talking and expires.
    run.sessions = [
        run.open(EXPIRING_TIMEOUT_MS if i == 0 else SESSION_TIMEOUT_MS, alice=i == ALICE_SESSION)
        for i in range(SESSIONS)
    ]
    gen = Generator(seed, base)
    rng = random.Random(seed ^ 0x5EED)
    expire_at = rng.randrange(ops // 3, ops) if ops >= 3 else -1
    close_at = rng.randrange(ops) if ops else -1
    try:
        _apply(run, 1, Op(OP_CREATE2, _create_body(base, b"", 0, OP_CREATE2), ("create",),
                          _path_stat_result, True))  # fmt: skip
        for i in range(ops):
            if i == expire_at:
                _replace_session(run, 0, base, expire=True)
            if i == close_at:
                _replace_session(run, rng.randrange(1, SESSIONS), base, expire=False)
            # Session 0 (short-lived) writes as often as the others: it owns ephemerals.
            op = gen.next()
            gen.observe(op, *_apply(run, gen.rng.randrange(SESSIONS), op))
    finally:
        for client in run.sessions:
            with contextlib.suppress(OSError, AssertionError):
                client.close_session()
            client.close()
    ranked: list[Any] = run.zxids.ranked(run.trace)
    return ranked


def compare(real: list[Any], ours: list[Any]) -> str | None:
    """None if the traces are equal, else where they first differ (with what came before)."""
    for i, (a, b) in enumerate(zip(real, ours, strict=False)):
        if a != b:
            before = "\n".join(f"  {x}" for x in real[max(0, i - 8) : i])
            return (
                f"entry {i} differs:\n  zookeeper:   {a}\n  tablekeeper: {b}\n"
                f"the entries before it:\n{before}"
            )
    if len(real) != len(ours):
        return f"lengths differ: zookeeper {len(real)}, tablekeeper {len(ours)} entries"
    return None


def differences(
    zookeeper_port: int, tablekeeper_port: int, seed: int, ops: int, tag: str
) -> str | None:
    """Play seed `seed` against both servers at once (each under a base path of its own) and
    compare their traces."""
    base = f"/differential-{tag}-{seed}"
    with ThreadPoolExecutor(2) as pool:
        real = pool.submit(play, zookeeper_port, seed, ops, base)
        ours = pool.submit(play, tablekeeper_port, seed, ops, base)
        real_trace, our_trace = real.result(), ours.result()
    # A trace of errors alone would prove little: most operations must have worked.
    worked = sum(1 for entry in real_trace if entry[0] == "op" and entry[3] == 0)
    if worked < ops // 4:
        return f"only {worked} of {ops} operations worked on the real ZooKeeper: {real_trace[:5]}"
    return compare(real_trace, our_trace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--ops", type=int, default=300, help="operations per seed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zk-differential-") as tmp:
        pair = start_pair(Path(tmp), zookeeper_env=zookeeper_env(), server_args=TABLEKEEPER_ARGS)
        failed = 0
        started = time.monotonic()
        tag = f"{socket.gethostname()}-{int(time.time())}"
        try:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                found = differences(pair.zookeeper.port, pair.port, seed, args.ops, tag)
                if found:
                    failed += 1
                    print(f"seed {seed}: {found}", flush=True)
                else:
                    print(f"seed {seed}: same ({args.ops} operations)", flush=True)
        finally:
            pair.stop()
        print(
            f"{args.seeds - failed}/{args.seeds} seeds the same, {args.seeds * args.ops} "
            f"operations, {time.monotonic() - started:.0f} s"
        )
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
