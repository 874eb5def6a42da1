"""Applying an Oxia write (`WalCommand.oxia_write`) inside the range's state machine.

One Oxia `WriteRequest` (the puts, deletes and delete ranges of one shard) is one logged command,
applied atomically at its revision with Oxia's semantics, in Oxia's order: every put, then every
delete, then every delete range, each seeing the effects of those before it.

- A put's `version_id` is the command's log offset (its revision - 1, `records.version_id`), its
  `modifications_count` starts at 0 and grows by one per put; created/modified timestamps are
  the command's timestamp.
- `expected_version_id`: -1 = the key must not exist; N = its version_id must be N; otherwise
  UNEXPECTED_VERSION_ID and the put does nothing.
- `session_id` makes the record ephemeral (the range's session index, as for every session
  key); an unknown session answers SESSION_DOES_NOT_EXIST. A put without it detaches the key.
- `sequence_key_delta`: the key is `key` followed by `-%020d` per delta, each part the last
  value of that part plus its delta. The last parts are kept per prefix in a system key (Oxia
  derives them from the highest existing key; here they never go back, even if that key was
  deleted). The servicer refuses malformed sequence puts before they are logged.
- A delete answers KEY_NOT_FOUND for a missing key; with an expected version, a missing key or
  another version answers UNEXPECTED_VERSION_ID.
- A delete range removes every key in [start, end) in Oxia's order (see `oxia.keys`).

Writes are staged with `ApplyContext.stage_writes`, so they produce the range's change events
(and history, which serves Oxia notifications) and session index like every other write. The
result depends only on the store and the command: replay agrees.

`OxiaApplier` is the applier (see `range.apply`) of `WalCommand.oxia_write`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.oxia import apply_pb2, client_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.keys import prefix_end, system_key
from tablekeeper_server.oxia import keys
from tablekeeper_server.oxia.records import OxiaMeta, pack, unpack, version_id
from tablekeeper_server.range.apply import ApplyContext, Rejected, Response
from tablekeeper_server.range.records import StoredRecord

Status = client_pb2.Status
NAME = "oxia"
_SEQUENCE_PREFIX = system_key(b"oxseq/")
"""Sequence keys' last parts, per prefix key: a split could not divide them by pkey."""
_PART = struct.Struct(">Q")
SEQUENCE_PART_MAX = 2**64 - 1


def sequence_state_key(prefix_key: str) -> bytes:
    """The system key holding the last parts generated for sequence keys under `prefix_key`."""
    return _SEQUENCE_PREFIX + keys.encode(prefix_key)


def sequence_key(prefix_key: str, parts: list[int]) -> str:
    return prefix_key + "".join(f"-{part:020d}" for part in parts)


class OxiaApplier:
    """Applies `WalCommand.oxia_write`."""

    name = NAME
    ops = ("oxia_write",)
    keeps_history = True

    def apply(self, ctx: ApplyContext, command: wal_pb2.WalCommand) -> Response | Rejected:
        return apply_oxia_write(ctx, command.oxia_write)

    def error_response(self, command: wal_pb2.WalCommand, code: int) -> Response:
        return apply_pb2.ApplyResult(header=kv_rpc_pb2.ResponseHeader(code=code))  # type: ignore[arg-type]

    def check(self, command: wal_pb2.WalCommand, context: Callable[[], ApplyContext]) -> None:
        return None

    def refuse_split(self, ctx: ApplyContext, seal: wal_pb2.RangeSeal) -> str | None:
        if next(ctx.scan(_SEQUENCE_PREFIX, prefix_end(_SEQUENCE_PREFIX)), None) is not None:
            return "this range holds etcd or Oxia bookkeeping: splitting it is not supported"
        return None


class _Overlay:
    """The range during the apply plus this command's own writes (not yet flushed)."""

    def __init__(self, view: ApplyContext) -> None:
        self.view = view
        self.writes: dict[bytes, StoredRecord | None] = {}

    def get(self, key: bytes) -> StoredRecord | None:
        if key in self.writes:
            return self.writes[key]
        return self.view.get(key)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]:
        self.view.write_settled()  # earlier commands of this batch: scans read the store
        merged: dict[bytes, StoredRecord | None] = dict(self.view.scan(start, end))
        merged.update((k, r) for k, r in self.writes.items() if start <= k < end)
        for key in sorted(merged):
            record = merged[key]
            if record is not None:
                yield key, record


_OK = Status.Value("OK")
_KEY_NOT_FOUND = Status.Value("KEY_NOT_FOUND")
_UNEXPECTED_VERSION_ID = Status.Value("UNEXPECTED_VERSION_ID")
_SESSION_DOES_NOT_EXIST = Status.Value("SESSION_DOES_NOT_EXIST")


def apply_oxia_write(view: ApplyContext, payload: bytes) -> apply_pb2.ApplyResult:
    revision, now = view.revision, view.now_ms
    request = client_pb2.WriteRequest.FromString(payload)
    state = _Overlay(view)
    # The answers are built inside the result (no message copied into another on the way).
    result = apply_pb2.ApplyResult(header=kv_rpc_pb2.ResponseHeader())
    response = result.response
    add_put = response.puts.add
    for put in request.puts:
        _put(state, put, revision, now, add_put())
    add_delete = response.deletes.add
    for delete in request.deletes:
        _delete(state, delete, add_delete())
    for delete_range in request.delete_ranges:
        start, end = keys.store_span(delete_range.start_inclusive, delete_range.end_exclusive)
        if start < end:
            for key, _ in list(state.scan(start, end)):
                state.writes[key] = None
        response.delete_ranges.add(status=_OK)
    if not (request.puts or request.deletes or request.delete_ranges):
        result.response.SetInParent()
    view.stage_writes(state.writes)
    return result


def _put(
    state: _Overlay,
    req: client_pb2.PutRequest,
    revision: int,
    now: int,
    response: client_pb2.PutResponse,
) -> None:
    session_id = req.session_id if req.HasField("session_id") else None
    if session_id is not None and not state.view.session_exists(session_id):
        response.status = _SESSION_DOES_NOT_EXIST
        return
    key = req.key
    if req.sequence_key_delta:
        counter_key = sequence_state_key(req.key)
        counter = state.get(counter_key)
        last = [] if counter is None else _parts(counter.value)
        parts = []
        for index, delta in enumerate(req.sequence_key_delta):
            base = last[index] if index < len(last) else 0
            parts.append(min(base + delta, SEQUENCE_PART_MAX))
        state.writes[counter_key] = StoredRecord(
            0, revision, 0, False, 0, b"".join(_PART.pack(p) for p in parts)
        )
        key = sequence_key(req.key, parts)
        response.key = key
    skey = keys.store_key(key)
    prev = state.get(skey)
    if req.HasField("expected_version_id"):
        expected = req.expected_version_id
        if (expected == -1 and prev is not None) or (
            expected != -1 and (prev is None or version_id(prev) != expected)
        ):
            response.Clear()
            response.status = _UNEXPECTED_VERSION_ID
            return
    identity = req.client_identity if req.HasField("client_identity") else None
    if prev is None:
        meta = OxiaMeta(now, now, session_id, identity)
        record = StoredRecord(revision, revision, 0, False, 0, pack(meta, req.value))
    else:
        created = unpack(prev.value)[0].created_ms
        meta = OxiaMeta(created, now, session_id, identity)
        record = StoredRecord(
            prev.create_revision, revision, prev.version + 1, False, 0, pack(meta, req.value)
        )
    state.writes[skey] = record
    state.view.leases[skey] = session_id or 0
    version = response.version
    version.version_id = revision - 1  # `version_id(record)`: written at this revision
    version.modifications_count = record.version
    version.created_timestamp = meta.created_ms
    version.modified_timestamp = now
    if session_id is not None:
        version.session_id = session_id
    if identity is not None:
        version.client_identity = identity


def _delete(
    state: _Overlay, req: client_pb2.DeleteRequest, response: client_pb2.DeleteResponse
) -> None:
    skey = keys.store_key(req.key)
    prev = state.get(skey)
    if req.HasField("expected_version_id") and (
        prev is None or version_id(prev) != req.expected_version_id
    ):
        response.status = _UNEXPECTED_VERSION_ID
    elif prev is None:
        response.status = _KEY_NOT_FOUND
    else:
        state.writes[skey] = None


def _parts(raw: bytes) -> list[int]:
    return [_PART.unpack_from(raw, i)[0] for i in range(0, len(raw), _PART.size)]
