"""The ZooKeeper front-end's logged commands (the payload of `WalCommand.front_end` for the
applier "zookeeper") and their results.

A command is everything its apply depends on, so replay decides the same:

- a client's write: kind `REQUEST`, the session, the operation code, the caller's ids
  (`acl.encode_auth`, for the ACL checks) and the client's jute request record, unchanged;
- `INIT`: the keyspace's first nodes (`/`, `/zookeeper`, its `quota` and `config`) and the
  secret session passwords are keyed by, each only if missing;
- `SWEEP`: delete a container that has had children and has none left, or a TTL node whose TTL
  has passed since its last change and has no children (ZooKeeper's `ContainerManager`); the
  apply checks both again.

A result is the operation's zxid (the command's revision) and error code, then the body of
ZooKeeper's response record (nothing for an error): a reply's header after its xid, so the
front-end's reply is its length and xid followed by the result as it is. Results are never
logged (replay makes them again), so their layout may change between versions.
"""

from __future__ import annotations

import struct

REQUEST = 1
INIT = 2
SWEEP = 3

_REQUEST = struct.Struct(">Bqii")
"""kind, session id, operation code, length of the caller's ids (then the ids, the request)."""
_RESULT = struct.Struct(">qi")
"""zxid, error code (ZooKeeper's ReplyHeader after its xid)."""
RESULT_HEADER_SIZE = _RESULT.size


def request(session_id: int, op: int, auth: bytes, body: bytes) -> bytes:
    return _REQUEST.pack(REQUEST, session_id, op, len(auth)) + auth + body


def init(secret: bytes) -> bytes:
    return bytes([INIT]) + secret


def sweep(path: str) -> bytes:
    return bytes([SWEEP]) + path.encode("utf-8", "surrogatepass")


def unpack_request(payload: bytes) -> tuple[int, int, bytes, bytes]:
    """(session id, operation code, the caller's ids, the request record) of a REQUEST."""
    _, session_id, op, auth_len = _REQUEST.unpack_from(payload)
    start = _REQUEST.size
    return session_id, op, payload[start : start + auth_len], payload[start + auth_len :]


def result(err: int, zxid: int, body: bytes = b"") -> bytes:
    return _RESULT.pack(zxid, err) + body


def unpack_result(raw: bytes) -> tuple[int, int]:
    """(error code, zxid) of a result; its body follows at `RESULT_HEADER_SIZE`."""
    zxid, err = _RESULT.unpack_from(raw)
    return err, zxid
