"""A bare ZooKeeper wire client for tests: one blocking socket, jute written by hand after
zookeeper.jute, so a test can send what kazoo never sends (persistent watches, setWatches after
a reconnect, containers and TTL nodes, malformed packets) and see exactly what comes back."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

INT = struct.Struct(">i")
LONG = struct.Struct(">q")
OPEN_ACL = INT.pack(1) + INT.pack(31) + INT.pack(5) + b"world" + INT.pack(6) + b"anyone"
STAT = struct.Struct(">qqqqiiiqiiq")


def string(value: str) -> bytes:
    raw = value.encode()
    return INT.pack(len(raw)) + raw


def buffer(value: bytes) -> bytes:
    return INT.pack(len(value)) + value


def strings(values: list[str]) -> bytes:
    return INT.pack(len(values)) + b"".join(string(v) for v in values)


def read_string(data: bytes, offset: int) -> tuple[str, int]:
    (length,) = INT.unpack_from(data, offset)
    offset += 4
    return data[offset : offset + length].decode(), offset + length


@dataclass
class Reply:
    xid: int
    zxid: int
    err: int
    body: bytes


@dataclass
class WireClient:
    """One connection. `events` collects watch notifications (type, path, zxid) in the order
    they arrive, interleaved with replies as `("reply", xid)` markers in `order`."""

    port: int
    timeout_ms: int = 30_000
    sock: socket.socket = field(init=False)
    session_id: int = 0
    password: bytes = b"\x00" * 16
    negotiated_ms: int = 0
    events: list[tuple[int, str, int]] = field(default_factory=list)
    order: list[tuple[str, object]] = field(default_factory=list)
    _xid: int = 0
    _taken: int = 0

    def __post_init__(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_exact(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self.sock.recv(size)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def read_packet(self) -> bytes:
        (length,) = INT.unpack(self._recv_exact(4))
        return self._recv_exact(length)

    def connect(
        self, session_id: int = 0, password: bytes | None = None, last_zxid: int = 0
    ) -> tuple[int, int, bytes]:
        """Send a ConnectRequest; (negotiated timeout, session id, password) of the answer."""
        body = (
            struct.pack(">iqiq", 0, last_zxid, self.timeout_ms, session_id)
            + buffer(password if password is not None else self.password)
            + b"\x00"
        )
        self.send_raw(INT.pack(len(body)) + body)
        answer = self.read_packet()
        _, timeout, sid = struct.unpack_from(">iiq", answer)
        (plen,) = INT.unpack_from(answer, 16)
        passwd = answer[20 : 20 + plen]
        if timeout > 0:
            self.session_id, self.password, self.negotiated_ms = sid, passwd, timeout
        return timeout, sid, passwd

    def send(self, op: int, body: bytes = b"", xid: int | None = None) -> int:
        if xid is None:
            self._xid += 1
            xid = self._xid
        packet = struct.pack(">ii", xid, op) + body
        self.send_raw(INT.pack(len(packet)) + packet)
        return xid

    def receive(self, xid: int) -> Reply:
        """Read until the reply to `xid`, collecting watch events on the way."""
        while True:
            packet = self.read_packet()
            got_xid, zxid, err = struct.unpack_from(">iqi", packet)
            if got_xid == -1:
                kind, _state = struct.unpack_from(">ii", packet, 16)
                path, _ = read_string(packet, 24)
                self.events.append((kind, path, zxid))
                self.order.append(("event", (kind, path)))
                continue
            self.order.append(("reply", got_xid))
            if got_xid != xid:
                raise AssertionError(f"reply to xid {got_xid} while waiting for {xid}")
            return Reply(got_xid, zxid, err, packet[16:])

    def call(self, op: int, body: bytes = b"") -> Reply:
        return self.receive(self.send(op, body))

    def wait_event(self, timeout_s: float = 30.0) -> tuple[int, str, int]:
        """The next watch event not yet taken by this call (pings while waiting for it)."""
        deadline = time.monotonic() + timeout_s
        while len(self.events) <= self._taken:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no watch event after {self.events}")
            self.receive(self.send(11, xid=-2))  # a ping: its reply comes after any event
            time.sleep(0.01)
        self._taken += 1
        return self.events[self._taken - 1]

    def wait_for(self, kind: int, path: str, timeout_s: float = 30.0) -> None:
        """Until event (`kind`, `path`) has come (pings while waiting for it)."""
        deadline = time.monotonic() + timeout_s
        while not any(e[:2] == (kind, path) for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no event {kind} at {path} after {self.events}")
            self.receive(self.send(11, xid=-2))
            time.sleep(0.01)

    # ------------------------------------------------------------------ requests

    def create(
        self, path: str, data: bytes = b"", mode: int = 0, op: int = 1, ttl: int = -1
    ) -> Reply:
        body = string(path) + buffer(data) + OPEN_ACL + INT.pack(mode)
        if op == 21:
            body += LONG.pack(ttl)
        return self.call(op, body)

    def get_data(self, path: str, watch: bool = False) -> Reply:
        return self.call(4, string(path) + bytes([watch]))

    def exists(self, path: str, watch: bool = False) -> Reply:
        return self.call(3, string(path) + bytes([watch]))

    def set_data(self, path: str, data: bytes, version: int = -1) -> Reply:
        return self.call(5, string(path) + buffer(data) + INT.pack(version))

    def delete(self, path: str, version: int = -1) -> Reply:
        return self.call(2, string(path) + INT.pack(version))

    def children(self, path: str, watch: bool = False) -> list[str]:
        reply = self.call(8, string(path) + bytes([watch]))
        assert reply.err == 0, reply.err
        (count,) = INT.unpack_from(reply.body)
        out, offset = [], 4
        for _ in range(count):
            name, offset = read_string(reply.body, offset)
            out.append(name)
        return out

    def add_watch(self, path: str, recursive: bool) -> Reply:
        return self.call(106, string(path) + INT.pack(1 if recursive else 0))

    def set_watches(
        self,
        relative_zxid: int,
        data: Sequence[str] = (),
        exist: Sequence[str] = (),
        child: Sequence[str] = (),
    ) -> Reply:
        body = LONG.pack(relative_zxid) + strings(list(data)) + strings(list(exist))
        return self.receive(self.send(101, body + strings(list(child)), xid=-8))

    def close_session(self) -> Reply:
        return self.call(-11)
