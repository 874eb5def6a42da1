"""Building the children of a split range from the parent's checkpoint and log.

`ChildrenBuilder` (driven by `container.splitter`) copies the parent's newest checkpoint into
one new store per child, in a scratch directory:

- every table key goes to the child whose hash interval holds its pkey (BookKeeper's routing
  hash, as requests are routed), and so do its pkey's sequential-put counter and its change
  events (so a watch resumes on the child from any revision the parent's history still held);
- every child gets the parent's position: the child's log starts numbering after it (its range
  opens by restoring the checkpoint, finds its new log shorter, and reopens the log from that
  position), so revisions keep growing across the split, per key and per watcher;
- the event history's trim point carries over: a watch from before it is "compacted" on the
  child as it was on the parent;
- every session goes, with its bookkeeping, to the child holding the pkey it was created for,
  and each ephemeral key's index entries to the child holding the key (the seal refuses a
  split that would part them).

When that checkpoint was taken before the parent was sealed, `apply_tail` then applies the
parent's commands from the checkpoint to the seal, each to the child holding its pkey, with the
same state machine the ranges use (so keys, versions, revisions and events come out as on the
parent). `publish` checkpoints each child into the checkpoint store under the child's own range
name. Nothing here touches a live range, and a child is routable only once the table's meta
range switched to it, after all children were published; building again (a split resumed after
a crash) rebuilds the same children and publishes them in place of the earlier attempt's.
"""

from __future__ import annotations

import logging
import shutil
import struct
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.checkpoint.api import CheckpointStore
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.core.failpoints import NO_FAILPOINTS, Failpoints
from tablekeeper_server.core.keys import SYSTEM_PREFIX, prefix_end, split_store_key
from tablekeeper_server.core.routing import RangeRouter
from tablekeeper_server.errors import CorruptionError
from tablekeeper_server.log.api import LogBackend
from tablekeeper_server.range.apply import APPLIED_KEY, Appliers
from tablekeeper_server.range.bookkeeper_apply import sequence_counter_key
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.events import (
    HISTORY_END,
    HISTORY_META_KEY,
    HISTORY_PREFIX,
    EventHistory,
    decode_event,
)
from tablekeeper_server.range.records import decode_record
from tablekeeper_server.range.session_keys import (
    SESSION_HOME_PREFIX,
    SESSION_KEY_PREFIXES,
    member_store_key,
    session_of_key,
)
from tablekeeper_server.range.state_machine import SEAL_KEY, RangeStateMachine
from tablekeeper_server.storage.api import KvStore, StoreOpener, WriteBatch

log = logging.getLogger(__name__)

_COUNTER_PREFIX = sequence_counter_key(b"")[:-1]  # the system prefix of every pkey's counter
_HISTORY_META = struct.Struct(">qqq")  # count, trimmed_through, bytes (range.events)
_BATCH_KEYS = 4096
CATCH_UP_ROUNDS = 3
CATCH_UP_ENOUGH = 256
"""Catching up before the seal stops once a round applied at most this many commands."""


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


class TailGapError(CorruptionError):
    """The parent's log no longer holds the records between the copied checkpoint and the
    seal (a checkpoint truncated them): the children are built from the sealed parent instead."""


class ChildrenBuilder:
    """The children of one split, built in a scratch directory under `work_dir`, from the
    parent's newest checkpoint (`copy_checkpoint`) and then, if it was taken before the seal,
    the parent's log from there to the seal (`apply_tail`); `publish` puts each child's
    checkpoint in the checkpoint store. Blocking: call it from a worker thread; `close` it."""

    def __init__(
        self,
        parent_log_name: str,
        specs: Sequence[ChildSpec],
        *,
        store_opener: StoreOpener,
        checkpoint_store: CheckpointStore,
        log_backend: LogBackend,
        clock: Clock,
        work_dir: Path,
        appliers: Appliers,
        ttl_seconds: int = 0,
        failpoints: Failpoints = NO_FAILPOINTS,
    ) -> None:
        self.parent_log_name = parent_log_name
        self._specs = specs
        self._work_dir = work_dir
        self._open = store_opener
        self._checkpoints = checkpoint_store
        self._log = log_backend
        self._clock = clock
        self._ttl_seconds = ttl_seconds
        self._appliers = appliers
        self._failpoints = failpoints
        self._scratch = work_dir / f".split-{parent_log_name}-{uuid.uuid4().hex}"
        self._router = RangeRouter([s.start_hash for s in specs], list(range(len(specs))))
        self._children = [_Child(s, store_opener(self._scratch / s.log_name)) for s in specs]
        self._published = False
        self.applied_sequence = 0
        """Where the children stand in the parent's log."""
        self.keys_copied = 0
        self.tail_commands = 0

    def copy_checkpoint(self, *, sealed: bool) -> int:
        """Copy the parent's newest checkpoint into the children (`sealed`: it must be the
        sealed parent's); returns its position."""
        parent_path = self._scratch / "parent"
        parent_checkpoints = RangeCheckpointer(
            self.parent_log_name, parent_path, self._open, self._checkpoints, self._log, self._clock
        )
        if parent_checkpoints.restore() is None:
            raise CorruptionError(f"range {self.parent_log_name} has no checkpoint to split from")
        parent = self._open(parent_path, read_only=True)
        try:
            self.applied_sequence, self.keys_copied = _copy(
                parent, self._children, self._router, self._failpoints, require_sealed=sealed
            )
        finally:
            parent.close()
        shutil.rmtree(parent_path, ignore_errors=True)
        return self.applied_sequence

    def apply_tail(self, through: int | None) -> int:
        """Apply the parent's commands after the children's position up to `through` (its
        seal; None: up to the log's end now, while the parent still serves) to the children,
        each command to the child holding its pkey (a session's create to the child of its
        pkey, a session's end to every child: only the one holding it has anything to end);
        returns how many. Every child's
        position becomes `through` (or the last command applied). Raises `TailGapError` if the
        log misses some of them."""
        machines = [
            RangeStateMachine(
                c.store,
                self._appliers,
                ttl_seconds=self._ttl_seconds,
                history=EventHistory(c.store),
            )
            for c in self._children
        ]
        pending: list[list[tuple[int, wal_pb2.WalCommand]]] = [[] for _ in machines]
        expected = self.applied_sequence + 1
        applied = 0
        for record in self._log.read(self.parent_log_name, expected):
            if through is not None and record.sequence > through:
                break
            if record.sequence != expected:
                raise TailGapError(
                    f"log {self.parent_log_name} holds {record.sequence} where {expected} was due"
                )
            expected += 1
            command = wal_pb2.WalCommand.FromString(record.payload)
            op = command.WhichOneof("op")
            if op in _KEYED_OPS:
                pkey = getattr(command, str(op)).header.r_key
                targets = [self._router.route(pkey)]
            elif op == "session" and command.session.pkey:  # a create, for its pkey
                targets = [self._router.route(command.session.pkey)]
            elif op == "session":
                # A close (or a create without its pkey, which the seal refuses): the child
                # holding the session ends it, the others find nothing to end.
                targets = list(range(len(machines)))
            elif op == "seal":
                # The end: what the log holds after it was queued before the seal applied,
                # and refused ("range moved") without changing anything.
                through = record.sequence if through is None else through
                expected = through + 1
                break
            else:
                raise TailGapError(f"a {op} command cannot be divided by pkey")
            for index in targets:
                pending[index].append((record.sequence, command))
                if len(pending[index]) >= _BATCH_KEYS:
                    machines[index].apply_batch(pending[index])
                    pending[index] = []
            applied += 1
        if through is not None and expected <= through:
            raise TailGapError(
                f"log {self.parent_log_name} ends at {expected - 1}, before the seal at {through}"
            )
        for machine, batch in zip(machines, pending, strict=True):
            if batch:
                machine.apply_batch(batch)
        position = expected - 1 if through is None else through
        for child in self._children:
            child.put(APPLIED_KEY, struct.pack(">q", position))
            child.flush()
        self.applied_sequence = position
        self.tail_commands += applied
        return applied

    def catch_up(self, *, rounds: int = CATCH_UP_ROUNDS, enough: int = CATCH_UP_ENOUGH) -> None:
        """Before the seal: apply the parent's log to its end, again while a round applied more
        than `enough` commands (at most `rounds` times), so the seal leaves a short tail."""
        for _ in range(rounds):
            if self.apply_tail(None) <= enough:
                return

    def publish(self) -> None:
        """Checkpoint each child into the checkpoint store. The first time, whatever an
        earlier attempt published is deleted first: that was another build, whose files have
        the same names but not the same contents (incremental checkpoints match files by name);
        a second publish of this build uploads only what changed."""

        def one(child: _Child) -> None:
            checkpointer = RangeCheckpointer(
                child.spec.log_name,
                self._scratch / child.spec.log_name,
                self._open,
                self._checkpoints,
                self._log,
                self._clock,
            )
            if not self._published:
                checkpointer.delete_all()
            checkpointer.checkpoint(child.store, publish_only=True)
            self._failpoints.hit("split.during_publish")

        with ThreadPoolExecutor(len(self._children), thread_name_prefix="split-publish") as pool:
            for done in [pool.submit(one, child) for child in self._children]:
                done.result()
        self._published = True

    def again(self) -> ChildrenBuilder:
        """A new, empty builder of the same children (this one is done with)."""
        return ChildrenBuilder(
            self.parent_log_name,
            self._specs,
            store_opener=self._open,
            checkpoint_store=self._checkpoints,
            log_backend=self._log,
            clock=self._clock,
            work_dir=self._work_dir,
            appliers=self._appliers,
            ttl_seconds=self._ttl_seconds,
            failpoints=self._failpoints,
        )

    def close(self) -> None:
        for child in self._children:
            child.store.close()
        shutil.rmtree(self._scratch, ignore_errors=True)


def build_children(
    parent_log_name: str,
    specs: Sequence[ChildSpec],
    *,
    store_opener: StoreOpener,
    checkpoint_store: CheckpointStore,
    log_backend: LogBackend,
    clock: Clock,
    work_dir: Path,
    appliers: Appliers,
    failpoints: Failpoints = NO_FAILPOINTS,
) -> SplitBuild:
    """Publish one checkpoint per child from the sealed parent's newest checkpoint."""
    started = time.monotonic()
    builder = ChildrenBuilder(
        parent_log_name,
        specs,
        store_opener=store_opener,
        checkpoint_store=checkpoint_store,
        log_backend=log_backend,
        clock=clock,
        work_dir=work_dir,
        appliers=appliers,
        failpoints=failpoints,
    )
    try:
        applied = builder.copy_checkpoint(sealed=True)
        builder.publish()
    finally:
        builder.close()
    return SplitBuild(applied, builder.keys_copied, time.monotonic() - started)


_KEYED_OPS = frozenset({"put", "increment", "delete_range", "txn"})


def _copy_sessions(parent: KvStore, children: Sequence[_Child], router: RangeRouter) -> None:
    """Each session's bookkeeping to the child holding the pkey it was created for; each
    ephemeral key's index entries to the child holding the key. (The seal refuses a split that
    would part a session from its keys; a session without its pkey goes to every child, which
    only happens when the seal will refuse the split.)"""
    homes = {}
    for key, value in parent.scan(*_span(SESSION_HOME_PREFIX)):
        session_id = session_of_key(key)
        assert session_id is not None
        homes[session_id] = router.route(decode_record(value).value)
    everyone = list(range(len(children)))
    for prefix in SESSION_KEY_PREFIXES:
        for key, value in parent.scan(*_span(prefix)):
            ephemeral = member_store_key(key)
            if ephemeral is not None:
                targets = [router.route(split_store_key(ephemeral)[0])]
            else:
                session_id = session_of_key(key)
                home = homes.get(session_id) if session_id is not None else None
                targets = everyone if home is None else [home]
            for index in targets:
                children[index].put(key, value)


def _span(prefix: bytes) -> tuple[bytes, bytes]:
    return prefix, prefix_end(prefix)


def _copy(
    parent: KvStore,
    children: Sequence[_Child],
    router: RangeRouter,
    failpoints: Failpoints,
    *,
    require_sealed: bool,
) -> tuple[int, int]:
    """Copy the parent's keys into the children's stores; (parent's position, keys copied)."""
    raw_applied = parent.get(APPLIED_KEY)
    raw_meta = parent.get(HISTORY_META_KEY)
    if raw_applied is None or (require_sealed and parent.get(SEAL_KEY) is None):
        raise CorruptionError("the parent's checkpoint is not sealed: it cannot be split")
    trimmed = 0 if raw_meta is None else _HISTORY_META.unpack(raw_meta)[1]
    for key, value in parent.scan(b"", SYSTEM_PREFIX):
        child = children[router.route(split_store_key(key)[0])]
        child.put(key, value)
        child.keys += 1
    for key, value in parent.scan(_COUNTER_PREFIX, _COUNTER_PREFIX + b"\xff"):
        pkey, _ = split_store_key(key[len(_COUNTER_PREFIX) :])
        children[router.route(pkey)].put(key, value)
    _copy_sessions(parent, children, router)
    for key, value in parent.scan(HISTORY_PREFIX, HISTORY_END):
        event = decode_event(key, value)
        child = children[router.route(split_store_key(event.key)[0])]
        child.put(key, value)
        child.events += 1
        child.event_bytes += len(value)
    failpoints.hit("split.during_copy")
    for child in children:
        child.put(APPLIED_KEY, raw_applied)
        child.put(HISTORY_META_KEY, _HISTORY_META.pack(child.events, trimmed, child.event_bytes))
        child.flush()
    return struct.unpack(">q", raw_applied)[0], sum(c.keys for c in children)
