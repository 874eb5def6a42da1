"""Change events of a range and their durable, bounded history in the range's own store.

The state machine reports every change it applies as a `ChangeEvent` (store key, new record or
None for a delete, previous record, revision). Besides handing them to live watchers (see
`range.watch`), it writes each event into the range's store under the system prefix, in the same
write batch as the change itself, so the history is exactly as durable as the data: it survives
restarts and travels in checkpoints. The write-ahead log holds commands, not their effects, so
this history (not the log) is what serves watches from older revisions.

The events of an applier that keeps no history (`Applier.keeps_history`) are not written: the
history then counts their revision as trimmed.

The history keeps about the newest `limit` events and at most about `bytes_limit` bytes of them
per range (64 MiB by default: values are kept in full), trimmed at each commit (one apply batch
may overshoot briefly). `trimmed_through` is the highest revision ever trimmed: a watch starting
at or below it would miss events and is answered "compacted". A front-end may also drop every
event below a revision (`compact`, etcd's Compact), at the next commit.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from tablekeeper_server.core.keys import system_key
from tablekeeper_server.range.records import StoredRecord, decode_record
from tablekeeper_server.storage.api import KvStore, WriteBatch

HISTORY_PREFIX = system_key(b"wh/")
HISTORY_END = system_key(b"wh0")  # "0" follows "/": the end of the history prefix
HISTORY_META_KEY = system_key(b"wh-meta")
HISTORY_LIMIT_DEFAULT = 10_000
HISTORY_BYTES_DEFAULT = 64 * 1024 * 1024
_POSITION = struct.Struct(">qI")  # revision, index of the event within its command
_META = struct.Struct(">qqq")  # count, trimmed_through, bytes
_LEN = struct.Struct(">I")


class ChangeEvent(NamedTuple):
    """One change a command made (immutable). A named tuple rather than a frozen dataclass:
    every write makes one, and a frozen dataclass's constructor (one `object.__setattr__` per
    field) costs about four times as much."""

    revision: int
    index: int  # type: ignore[assignment]  # (hides `tuple.index`, which nothing calls)
    """Position of the event among the changes of its command (revision)."""
    key: bytes
    """The store key (see `core.keys`)."""
    record: StoredRecord | None
    """The new record; None for a delete."""
    prev: StoredRecord | None

    @property
    def position(self) -> tuple[int, int]:
        return (self.revision, self.index)


def history_key(revision: int, index: int) -> bytes:
    return HISTORY_PREFIX + _POSITION.pack(revision, index)


def encode_event(event: ChangeEvent) -> bytes:
    parts = [_LEN.pack(len(event.key)), event.key]
    for record in (event.record, event.prev):
        if record is None:
            parts.append(b"\x00")
        else:
            raw = record.encode()
            parts += [b"\x01", _LEN.pack(len(raw)), raw]
    return b"".join(parts)


def decode_event(key: bytes, raw: bytes) -> ChangeEvent:
    revision, index = _POSITION.unpack_from(key, len(HISTORY_PREFIX))
    (klen,) = _LEN.unpack_from(raw, 0)
    offset = _LEN.size
    store_key = raw[offset : offset + klen]
    offset += klen
    records: list[StoredRecord | None] = []
    for _ in range(2):
        flag = raw[offset]
        offset += 1
        if not flag:
            records.append(None)
            continue
        (rlen,) = _LEN.unpack_from(raw, offset)
        offset += _LEN.size
        records.append(decode_record(raw[offset : offset + rlen]))
        offset += rlen
    return ChangeEvent(revision, index, store_key, records[0], records[1])


class EventHistory:
    """The bounded event history of one range's store. Used by the state machine while it
    applies (one caller at a time)."""

    def __init__(
        self,
        store: KvStore,
        limit: int = HISTORY_LIMIT_DEFAULT,
        bytes_limit: int = HISTORY_BYTES_DEFAULT,
    ) -> None:
        self.store = store
        self.limit = max(1, limit)
        self.bytes_limit = max(1, bytes_limit)
        raw = store.get(HISTORY_META_KEY)
        count, trimmed, size = (0, 0, 0) if raw is None else _META.unpack(raw)
        self.count: int = count
        self.trimmed_through: int = trimmed
        self.bytes: int = size
        # Trimming resumes here, not at the prefix start: iterating over the tombstones of
        # everything trimmed before would make every commit slower until RocksDB compacts.
        self._trim_from = history_key(trimmed, 0)
        self._floor = 0  # `compact`: events below it go at the next seal

    def compact(self, revision: int) -> None:
        """Drop every committed event below `revision` at the next `seal`; from then on
        `trimmed_through` is at least `revision - 1`."""
        self._floor = max(self._floor, revision)

    def forget(self, revision: int) -> None:
        """The events of `revision` are not kept (their applier keeps no history): a watch
        starting at or before it is answered "compacted" from now on (recorded at the next
        `seal`)."""
        if revision > self.trimmed_through:
            self.trimmed_through = revision

    def append(self, batch: WriteBatch, event: ChangeEvent) -> None:
        raw = encode_event(event)
        batch.put(history_key(event.revision, event.index), raw)
        self.count += 1
        self.bytes += len(raw)

    def seal(self, batch: WriteBatch) -> None:
        """Before a batch is written: trim the oldest committed events beyond the limits and
        record the count, size and trim point, all in `batch`."""
        below_floor = self.trimmed_through < self._floor - 1
        if self.count > self.limit or self.bytes > self.bytes_limit or below_floor:
            for key, raw in self.store.scan(self._trim_from, HISTORY_END):
                revision, _index = _POSITION.unpack_from(key, len(HISTORY_PREFIX))
                within = self.count <= self.limit and self.bytes <= self.bytes_limit
                if within and revision >= self._floor:
                    break
                batch.delete(key)
                self.trimmed_through = max(self.trimmed_through, revision)
                self.count -= 1
                self.bytes -= len(raw)
                self._trim_from = key + b"\x00"
            self.trimmed_through = max(self.trimmed_through, self._floor - 1)
        batch.put(HISTORY_META_KEY, _META.pack(self.count, self.trimmed_through, self.bytes))

    def read(self, after: tuple[int, int], limit: int) -> list[ChangeEvent]:
        """Up to `limit` committed events strictly after position `after`, in order."""
        return self.read_page(after, limit, 2**62)[0]

    def read_page(
        self, after: tuple[int, int], limit: int, bytes_max: int
    ) -> tuple[list[ChangeEvent], bool]:
        """Committed events strictly after position `after`, in order: up to `limit` of them
        and `bytes_max` bytes (stored size; at least one event), and whether that was all."""
        start = history_key(after[0], after[1]) + b"\x00"
        out: list[ChangeEvent] = []
        size = 0
        for key, raw in self.store.scan(start, HISTORY_END):
            if out and (len(out) >= limit or size + len(raw) > bytes_max):
                return out, False
            out.append(decode_event(key, raw))
            size += len(raw)
        return out, True


def iter_history(store: KvStore) -> Iterator[ChangeEvent]:
    for key, raw in store.scan(HISTORY_PREFIX, HISTORY_END):
        yield decode_event(key, raw)
