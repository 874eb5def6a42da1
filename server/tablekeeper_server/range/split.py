"""Building the children of a split range from the parent's final checkpoint.

A split (`tablekeeper table split`, see `container.splitter`) seals the parent range (a `seal`
command in its log: from then on it refuses every request) and checkpoints it, so the checkpoint
store holds the parent's final state. `build_children` then turns that checkpoint into one
checkpoint per child, published under the child's own range name:

- every table key goes to the child whose hash interval holds its pkey (BookKeeper's routing
  hash, as requests are routed), and so do its pkey's sequential-put counter and its change
  events (so a watch resumes on the child from any revision the parent's history still held);
- every child gets the parent's applied position: the child's log starts numbering after it
  (its range opens by restoring the checkpoint, finds its new log shorter, and reopens the log
  from that position), so revisions keep growing across the split, per key and per watcher;
- the event history's trim point carries over: a watch from before it is "compacted" on the
  child as it was on the parent.

Nothing here touches a live range: the parent is read from its checkpoint, and a child is
routable only once the table's meta range switched to it, after all children were published.
Building again (a split resumed after a crash) rebuilds the same children from the same sealed
parent and publishes them again, in place of what the earlier attempt published.
"""

from __future__ import annotations

import logging
import shutil
import struct
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tablekeeper_server.checkpoint.api import CheckpointStore
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.core.failpoints import NO_FAILPOINTS, Failpoints
from tablekeeper_server.core.keys import SYSTEM_PREFIX, split_store_key
from tablekeeper_server.core.routing import RangeRouter
from tablekeeper_server.errors import CorruptionError
from tablekeeper_server.log.api import LogBackend
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.events import (
    HISTORY_END,
    HISTORY_META_KEY,
    HISTORY_PREFIX,
    decode_event,
)
from tablekeeper_server.range.state_machine import (
    APPLIED_KEY,
    SEAL_KEY,
    sequence_counter_key,
)
from tablekeeper_server.storage.api import KvStore, StoreOpener, WriteBatch

log = logging.getLogger(__name__)

_COUNTER_PREFIX = sequence_counter_key(b"")[:-1]  # the system prefix of every pkey's counter
_HISTORY_META = struct.Struct(">qqq")  # count, trimmed_through, bytes (range.events)
_BATCH_KEYS = 4096


@dataclass(frozen=True, slots=True)
class ChildSpec:
    log_name: str
    """The child range's log (and checkpoint) name."""
    start_hash: int
    """The first routing hash the child holds (children are given in hash order)."""


@dataclass(frozen=True, slots=True)
class SplitBuild:
    applied_sequence: int
    """The parent's final applied position, where every child's log continues."""
    keys_copied: int
    """Table keys copied into the children."""
    seconds: float


class _Child:
    def __init__(self, spec: ChildSpec, store: KvStore) -> None:
        self.spec = spec
        self.store = store
        self.batch: WriteBatch = store.new_batch()
        self.pending = 0
        self.keys = 0
        self.events = 0
        self.event_bytes = 0

    def put(self, key: bytes, value: bytes) -> None:
        self.batch.put(key, value)
        self.pending += 1
        if self.pending >= _BATCH_KEYS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.store.write(self.batch)
            self.batch = self.store.new_batch()
            self.pending = 0


def build_children(
    parent_log_name: str,
    children: Sequence[ChildSpec],
    *,
    store_opener: StoreOpener,
    checkpoint_store: CheckpointStore,
    log_backend: LogBackend,
    clock: Clock,
    work_dir: Path,
    failpoints: Failpoints = NO_FAILPOINTS,
) -> SplitBuild:
    """Publish one checkpoint per child from the parent's newest checkpoint (see module doc).
    Blocking: run it in a worker thread. `work_dir` holds scratch stores (removed after)."""
    started = time.monotonic()
    scratch = work_dir / f".split-{parent_log_name}-{uuid.uuid4().hex}"
    try:
        parent_path = scratch / "parent"
        parent_checkpoints = RangeCheckpointer(
            parent_log_name, parent_path, store_opener, checkpoint_store, log_backend, clock
        )
        if parent_checkpoints.restore() is None:
            raise CorruptionError(f"range {parent_log_name} has no checkpoint to split from")
        parent = store_opener(parent_path, read_only=True)
        try:
            applied, copied = _copy(parent, children, scratch, store_opener, failpoints)
        finally:
            parent.close()
        for spec in children:
            _publish(spec, scratch, store_opener, checkpoint_store, log_backend, clock)
            failpoints.hit("split.during_publish")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return SplitBuild(applied, copied, time.monotonic() - started)


def _copy(
    parent: KvStore,
    specs: Sequence[ChildSpec],
    scratch: Path,
    store_opener: StoreOpener,
    failpoints: Failpoints,
) -> tuple[int, int]:
    """Copy the parent's keys into new child stores under `scratch`; (applied, keys copied)."""
    router = RangeRouter([s.start_hash for s in specs], list(range(len(specs))))
    children = [_Child(s, store_opener(scratch / s.log_name)) for s in specs]
    try:
        raw_applied = parent.get(APPLIED_KEY)
        raw_meta = parent.get(HISTORY_META_KEY)
        if raw_applied is None or parent.get(SEAL_KEY) is None:
            raise CorruptionError("the parent's checkpoint is not sealed: it cannot be split")
        trimmed = 0 if raw_meta is None else _HISTORY_META.unpack(raw_meta)[1]
        for key, value in parent.scan(b"", SYSTEM_PREFIX):
            child = children[router.route(split_store_key(key)[0])]
            child.put(key, value)
            child.keys += 1
        for key, value in parent.scan(_COUNTER_PREFIX, _COUNTER_PREFIX + b"\xff"):
            pkey, _ = split_store_key(key[len(_COUNTER_PREFIX) :])
            children[router.route(pkey)].put(key, value)
        for key, value in parent.scan(HISTORY_PREFIX, HISTORY_END):
            event = decode_event(key, value)
            child = children[router.route(split_store_key(event.key)[0])]
            child.put(key, value)
            child.events += 1
            child.event_bytes += len(value)
        failpoints.hit("split.during_copy")
        for child in children:
            child.put(APPLIED_KEY, raw_applied)
            child.put(
                HISTORY_META_KEY, _HISTORY_META.pack(child.events, trimmed, child.event_bytes)
            )
            child.flush()
        return struct.unpack(">q", raw_applied)[0], sum(c.keys for c in children)
    finally:
        for child in children:
            child.store.close()


def _publish(
    spec: ChildSpec,
    scratch: Path,
    store_opener: StoreOpener,
    checkpoint_store: CheckpointStore,
    log_backend: LogBackend,
    clock: Clock,
) -> None:
    path = scratch / spec.log_name
    store = store_opener(path)
    try:
        checkpointer = RangeCheckpointer(
            spec.log_name, path, store_opener, checkpoint_store, log_backend, clock
        )
        # What an earlier attempt published is of another build, whose files have the same
        # names but not the same contents (incremental checkpoints match files by name).
        checkpointer.delete_all()
        checkpointer.checkpoint(store, truncate_log=False)
    finally:
        store.close()
