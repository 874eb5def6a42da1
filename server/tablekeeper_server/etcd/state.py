"""Reading an etcd keyspace: the state views etcd's Range runs on, and Range itself.

A view answers `get`, `scan` (store keys in order) and `lease` of a key. `StoreView` is the
range's applied state; `PastView` is that state as it was at an earlier revision, rebuilt from
the range's event history (each key touched since then takes the `prev` of its first later
event); `OverlayView` (in `etcd.apply`) adds a txn's own writes while it applies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from tablekeeper_proto.etcd import kv_pb2, rpc_pb2
from tablekeeper_server.etcd.errors import EtcdError
from tablekeeper_server.etcd.keys import COMPACTED_KEY, END, PREFIX, span, to_kv
from tablekeeper_server.range.events import EventHistory
from tablekeeper_server.range.records import StoredRecord, decode_record
from tablekeeper_server.range.session_keys import members_prefix, owner_key
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.api import KvStore

_PAST_EVENTS_MAX = 100_000
_SORT_FIELDS = {
    rpc_pb2.RangeRequest.KEY: lambda kv: kv.key,
    rpc_pb2.RangeRequest.VERSION: lambda kv: kv.version,
    rpc_pb2.RangeRequest.CREATE: lambda kv: kv.create_revision,
    rpc_pb2.RangeRequest.MOD: lambda kv: kv.mod_revision,
    rpc_pb2.RangeRequest.VALUE: lambda kv: kv.value,
}


def compacted_revision(record: StoredRecord | None) -> int:
    """The revision of the keyspace's last Compact, from its record (0: never compacted)."""
    return 0 if record is None else record.number


__all__ = ["PastView", "StoreView", "compacted_revision", "do_range", "members_prefix", "owner_key"]
"""`owner_key` and `members_prefix` are the range's session index (`range.session_keys`): an etcd
lease is a range session."""


class View(Protocol):
    def get(self, key: bytes) -> StoredRecord | None: ...

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]: ...

    def lease(self, key: bytes) -> int: ...


class StoreView:
    """The applied state of the keyspace's range (read synchronously on the range's loop)."""

    def __init__(self, sm: RangeStateMachine) -> None:
        self.store: KvStore = sm.store
        self.sessions = sm.sessions
        self.history: EventHistory | None = sm.history
        self.revision = sm.applied_sequence

    def get(self, key: bytes) -> StoredRecord | None:
        raw = self.store.get(key)
        return None if raw is None else decode_record(raw)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]:
        for key, raw in self.store.scan(start, end):
            yield key, decode_record(raw)

    @property
    def compacted(self) -> int:
        """The revision of the last Compact: reads from before it are refused."""
        return compacted_revision(self.get(COMPACTED_KEY))

    def lease(self, key: bytes) -> int:
        if not self.sessions:
            return 0
        raw = self.store.get(owner_key(key))
        return 0 if raw is None else decode_record(raw).number


class PastView:
    """The keyspace as it was at `revision`: the current state with every later change undone.
    Raises `EtcdError("compacted")` when the history no longer reaches back that far."""

    def __init__(self, current: StoreView, revision: int) -> None:
        history = current.history
        if history is None or history.trimmed_through > revision or revision < current.compacted:
            raise EtcdError("compacted")
        self.current = current
        self.undo: dict[bytes, StoredRecord | None] = {}
        events = history.read((revision, 2**32 - 1), _PAST_EVENTS_MAX)
        if len(events) >= _PAST_EVENTS_MAX:
            raise EtcdError("compacted")
        for event in events:
            if PREFIX <= event.key < END and event.key not in self.undo:
                self.undo[event.key] = event.prev

    def get(self, key: bytes) -> StoredRecord | None:
        if key in self.undo:
            return self.undo[key]
        return self.current.get(key)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]:
        merged: dict[bytes, StoredRecord | None] = dict(self.current.scan(start, end))
        for key, record in self.undo.items():
            if start <= key < end:
                merged[key] = record
        for key in sorted(merged):
            record = merged[key]
            if record is not None:
                yield key, record

    def lease(self, key: bytes) -> int:
        return 0 if key in self.undo else self.current.lease(key)


def _filtered(req: rpc_pb2.RangeRequest) -> bool:
    return bool(
        req.min_mod_revision
        or req.max_mod_revision
        or req.min_create_revision
        or req.max_create_revision
    )


def _passes(req: rpc_pb2.RangeRequest, record: StoredRecord) -> bool:
    if req.min_mod_revision and record.mod_revision < req.min_mod_revision:
        return False
    if req.max_mod_revision and record.mod_revision > req.max_mod_revision:
        return False
    if req.min_create_revision and record.create_revision < req.min_create_revision:
        return False
    return not (req.max_create_revision and record.create_revision > req.max_create_revision)


def do_range(view: View, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
    """etcd's Range over `view` (the header is the caller's): `count` is every key in the range
    whatever the limit and filters; sorting and the limit apply after the filters."""
    response = rpc_pb2.RangeResponse()
    if not req.key:
        raise EtcdError("empty_key")
    start, end = span(req.key, req.range_end)
    order = req.sort_order
    if req.sort_target != rpc_pb2.RangeRequest.KEY and order == rpc_pb2.RangeRequest.NONE:
        order = rpc_pb2.RangeRequest.ASCEND
    elif req.sort_target == rpc_pb2.RangeRequest.KEY and order == rpc_pb2.RangeRequest.ASCEND:
        order = rpc_pb2.RangeRequest.NONE  # store order is key order
    # Without sorting or filters, only the first `limit` + 1 records are kept (the rest counted).
    keep = req.limit + 1 if req.limit > 0 and order == 0 and not _filtered(req) else 0
    kvs: list[kv_pb2.KeyValue] = []
    count = 0
    if req.range_end:
        items: Iterator[tuple[bytes, StoredRecord]] = view.scan(start, end)
    else:
        record = view.get(start)
        items = iter(() if record is None else ((start, record),))
    for key, record in items:
        count += 1
        if req.count_only or (keep and len(kvs) >= keep) or not _passes(req, record):
            continue
        kvs.append(to_kv(key, record, view.lease(key), keys_only=req.keys_only))
    response.count = count
    if req.count_only:
        return response
    if order != rpc_pb2.RangeRequest.NONE:
        kvs.sort(
            key=_SORT_FIELDS[req.sort_target],
            reverse=order == rpc_pb2.RangeRequest.DESCEND,
        )
    if req.limit > 0 and len(kvs) > req.limit:
        del kvs[req.limit :]
        response.more = True
    response.kvs.extend(kvs)
    return response
