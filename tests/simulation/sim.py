"""A seeded, deterministic simulation of serving ranges under faults, checked against a model.

One run (`simulate(seed)`) drives a few ranges, each a real `Range` (write path, group commit,
state machine, recovery) over the in-memory log and a store that forgets unflushed writes on a
crash, all on one event loop with a hand-moved clock, so a seed replays exactly:

    python -m tests.simulation --seed 1234        # one seed, with a trace of what it did
    python -m tests.simulation --seeds 5000       # many

Each round sends a burst of concurrent client operations (puts with and without expected
versions, deletes, increments, txns moving an amount between two counters, reads, and hostile
puts whose fields the state machine cannot honour, logged without validation) on distinct
keys of each range, so a sequential model per key is exact. The same ranges also take etcd
writes (puts, deletes and compare-and-puts, as the etcd front-end logs them: `etcd_txn`) and
Oxia writes (puts, some only if absent, and deletes: `oxia_write`) on keys of their own, so one
log mixes all three protocols' commands, each applied by its own applier. Faults between and
during rounds: a crash (the store keeps a random prefix of its unflushed writes, the log keeps
what it acknowledged), a torn append (the log fails mid-append, having persisted the records or
not), a new writer fencing the old one, and lost responses (the client never hears a success).

What every run checks:
- an operation acknowledged as successful is applied, with the model's result code and values;
  one refused before it reached the log is not applied; one whose outcome is unknown is applied
  entirely or not at all (a read after the next recovery decides which, and the model follows);
- versions (0 on create, +1 per update, reset by delete), numbers and values of every key match
  the model after every round, including after every recovery;
- every txn is atomic: a txn whose outcome is unknown moved both counters or neither, and one
  whose chosen branch cannot apply entirely applies nothing;
- replaying each range's whole log into an empty store rebuilds exactly the served state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.etcd import apply_pb2 as etcd_apply_pb2
from tablekeeper_proto.etcd import rpc_pb2 as etcd
from tablekeeper_proto.oxia import apply_pb2 as oxia_apply_pb2
from tablekeeper_proto.oxia import client_pb2 as oxia
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.errors import (
    Code,
    IndeterminateError,
    TableKeeperError,
    UnavailableError,
)
from tablekeeper_server.etcd.keys import PREFIX as ETCD_PREFIX
from tablekeeper_server.log.memory import MemoryLogBackend
from tablekeeper_server.oxia import keys as oxia_keys
from tablekeeper_server.oxia.records import unpack as oxia_unpack
from tablekeeper_server.range.records import StoredRecord
from tablekeeper_server.range.replica import Range, RangeName
from tablekeeper_server.storage.memory import MemoryKvStore, MemoryWriteBatch
from tests.support.appliers import APPLIERS

PKEY = b"p"
OxiaStatus = oxia.Status
T = TypeVar("T")
KEYS_PER_RANGE = 24
Number = int


class SimulationError(AssertionError):
    """The system did something the model forbids; the message says what, the seed replays it."""


# ------------------------------------------------------------------------------------ store


class CrashableStore(MemoryKvStore):
    """A store that keeps only flushed writes, plus a prefix of the later ones, on a crash (as
    RocksDB without its own WAL: each write is atomic, unflushed memtables are lost)."""

    def __init__(self) -> None:
        super().__init__()
        self._flushed = MemoryKvStore()
        self._unflushed: list[MemoryWriteBatch] = []

    def write(self, batch: object) -> None:
        assert isinstance(batch, MemoryWriteBatch)
        super().write(batch)
        self._unflushed.append(batch)

    def flush(self) -> None:
        for batch in self._unflushed:
            self._flushed.write(batch)
        self._unflushed.clear()

    def crash(self, rng: random.Random) -> CrashableStore:
        """The store a restart finds: the flushed state plus a random prefix of the rest."""
        survivor = CrashableStore()
        kept = self._unflushed[: rng.randint(0, len(self._unflushed))]
        for batch in [*self._replay_flushed(), *kept]:
            survivor.write(batch)
        survivor.flush()
        return survivor

    def _replay_flushed(self) -> Iterator[MemoryWriteBatch]:
        batch = MemoryWriteBatch()
        for key, value in self._flushed.scan(b"", b"\xff" * 64):
            batch.put(key, value)
        yield batch

    def create_checkpoint(self, dest: Path) -> None:
        raise RuntimeError("no checkpoints in the simulation")


# ------------------------------------------------------------------------------------ model


@dataclass
class KeyState:
    value: bytes | Number | None = None
    """bytes, a number (counter), or None when the key does not exist"""
    version: int = -1


@dataclass
class Op:
    """One client operation: its command, and what the model says it does if it applies."""

    kind: str
    keys: tuple[bytes, ...]
    command: wal_pb2.WalCommand
    expected_code: int
    apply: Callable[[dict[bytes, KeyState]], None]
    outcome: str = "pending"
    """ack, refused, unknown"""
    response: Any = None
    """the range's answer (a response message) once acknowledged"""
    check: Callable[[Any], str | None] | None = None
    """What else the answer must say (a protocol's own result): None if it does, else why not."""


def _header() -> kv.RoutingHeader:
    return kv.RoutingHeader(stream_id=1024, r_key=PKEY)


def _set(key: bytes, value: bytes | Number) -> Callable[[dict[bytes, KeyState]], None]:
    def apply(model: dict[bytes, KeyState]) -> None:
        state = model[key]
        state.version = 0 if state.value is None else state.version + 1
        state.value = value

    return apply


def _add(key: bytes, amount: int) -> Callable[[dict[bytes, KeyState]], None]:
    def apply(model: dict[bytes, KeyState]) -> None:
        state = model[key]
        base = state.value if isinstance(state.value, int) else 0
        state.version = 0 if state.value is None else state.version + 1
        state.value = base + amount

    return apply


def _remove(key: bytes) -> Callable[[dict[bytes, KeyState]], None]:
    def apply(model: dict[bytes, KeyState]) -> None:
        model[key] = KeyState()

    return apply


def _nothing(model: dict[bytes, KeyState]) -> None:
    pass


def make_op(rng: random.Random, model: dict[bytes, KeyState], keys: list[bytes], uid: int) -> Op:
    """A random operation on `keys` (one or two, unused by other ops of this round)."""
    key = keys[0]
    state = model[key]
    roll = rng.random()
    if roll < 0.03:  # hostile: fields apply cannot honour; refused at apply, nothing changes
        hostile = kv.PutRequest(key=key, value=b"h%d" % uid, header=_header())
        if rng.random() < 0.5:
            hostile.ttl_ms = 2**63 - 1  # now + ttl overflows int64
            code = Code.BAD_REQUEST
        else:
            hostile.lease = 2**62  # no such session on this range
            code = Code.ILLEGAL_OP
        return Op("hostile-put", (key,), wal_pb2.WalCommand(put=hostile), code, _nothing)
    if roll < 0.35:  # put, sometimes conditional
        value = b"v%d" % uid
        request = kv.PutRequest(key=key, value=value, header=_header())
        choice = rng.choice(("none", "absent", "right", "wrong"))
        if choice == "absent":
            request.expected_version = -1
        elif choice == "right":
            request.expected_version = max(state.version, 0)
        elif choice == "wrong":
            request.expected_version = state.version + 7
        # The expected version is checked first, then whether the key holds a number.
        if choice == "absent" and state.value is not None:
            code = Code.KEY_EXISTS
        elif choice in ("right", "wrong") and state.value is None:
            code = Code.KEY_NOT_FOUND
        elif choice in ("right", "wrong") and state.version != request.expected_version:
            code = Code.BAD_VERSION
        elif isinstance(state.value, int):
            code = Code.BAD_REQUEST
        else:
            code = Code.SUCCESS
        apply = _set(key, value) if code == Code.SUCCESS else _nothing
        return Op("put", (key,), wal_pb2.WalCommand(put=request), code, apply)
    if roll < 0.5:
        request_delete = kv.DeleteRangeRequest(key=key, header=_header())
        apply = _remove(key) if state.value is not None else _nothing
        return Op("delete", (key,), wal_pb2.WalCommand(delete_range=request_delete), 0, apply)
    if roll < 0.75:
        amount = rng.randint(-5, 9)
        request_incr = kv.IncrementRequest(key=key, amount=amount, header=_header())
        ok = state.value is None or isinstance(state.value, int)
        return Op(
            "incr",
            (key,),
            wal_pb2.WalCommand(increment=request_incr),
            Code.SUCCESS if ok else Code.BAD_REQUEST,
            _add(key, amount) if ok else _nothing,
        )
    if roll < 0.9 and len(keys) == 2:
        return _transfer(rng, model, keys[0], keys[1])
    return Op("get", (key,), wal_pb2.WalCommand(), Code.SUCCESS, _nothing)


def _transfer(rng: random.Random, model: dict[bytes, KeyState], a: bytes, b: bytes) -> Op:
    """A txn moving an amount from counter `a` to counter `b` if `a`'s version is as the
    client last saw it; otherwise it only reads. Either way a + b stays 0 for pure counters."""
    amount = rng.randint(1, 50)
    seen = model[a].version + (1 if rng.random() < 0.3 else 0)  # sometimes stale: failure branch
    compare = kv.Compare(
        target=kv.Compare.VERSION, result=kv.Compare.EQUAL, key=a, version=max(seen, 0)
    )
    moves = [
        kv.RequestOp(request_increment=kv.IncrementRequest(key=a, amount=-amount)),
        kv.RequestOp(request_increment=kv.IncrementRequest(key=b, amount=amount)),
    ]
    both_numbers = all(model[k].value is None or isinstance(model[k].value, int) for k in (a, b))
    request = kv.TxnRequest(
        compare=[compare],
        success=moves,
        failure=[kv.RequestOp(request_range=kv.RangeRequest(key=a))],
        header=_header(),
    )
    if model[a].value is None:
        code, apply = Code.KEY_NOT_FOUND, _nothing
    elif seen != model[a].version:
        code, apply = Code.SUCCESS, _nothing  # the failure branch only reads
    elif not both_numbers:
        # The success branch is chosen but one of its ops cannot apply: nothing may apply.
        code, apply = Code.BAD_REQUEST, _nothing
    else:
        code = Code.SUCCESS

        def apply(model: dict[bytes, KeyState]) -> None:
            _add(a, -amount)(model)
            _add(b, amount)(model)

    return Op("txn", (a, b), wal_pb2.WalCommand(txn=request), code, apply)


def etcd_store_key(key: bytes) -> bytes:
    return ETCD_PREFIX + key


def make_etcd_op(rng: random.Random, model: dict[bytes, KeyState], key: bytes, uid: int) -> Op:
    """An etcd write on `key`, logged as the etcd front-end logs every write (one txn)."""
    skey = etcd_store_key(key)
    state = model[skey]
    value = b"e%d" % uid
    put = etcd.RequestOp(request_put=etcd.PutRequest(key=key, value=value))
    roll = rng.random()
    if roll < 0.5:
        txn, kind, holds = etcd.TxnRequest(success=[put]), "etcd-put", True
        apply = _set(skey, value)
    elif roll < 0.7:
        delete = etcd.RequestOp(request_delete_range=etcd.DeleteRangeRequest(key=key))
        txn, kind, holds = etcd.TxnRequest(success=[delete]), "etcd-delete", True
        apply = _remove(skey) if state.value is not None else _nothing
    else:  # put if the key's version (etcd's: 0 when absent) is what the client last saw
        current = 0 if state.value is None else state.version + 1
        seen = current + (1 if rng.random() < 0.3 else 0)
        compare = etcd.Compare(
            key=key, target=etcd.Compare.VERSION, result=etcd.Compare.EQUAL, version=seen
        )
        txn, kind, holds = etcd.TxnRequest(compare=[compare], success=[put]), "etcd-cas", False
        holds = seen == current
        apply = _set(skey, value) if holds else _nothing
    present = state.value is not None

    def check(response: Any) -> str | None:
        if not isinstance(response, etcd_apply_pb2.ApplyResult) or response.error:
            return f"not an etcd result: {response}"
        if response.response.succeeded != holds:
            return f"succeeded={response.response.succeeded}, the model says {holds}"
        if kind == "etcd-delete":
            deleted = response.response.responses[0].response_delete_range.deleted
            if deleted != int(present):
                return f"deleted {deleted}, the model says {int(present)}"
        return None

    command = wal_pb2.WalCommand(etcd_txn=txn.SerializeToString())
    return Op(kind, (skey,), command, Code.SUCCESS, apply, check=check)


def make_oxia_op(rng: random.Random, model: dict[bytes, KeyState], key: str, uid: int) -> Op:
    """An Oxia write on `key` (a put, perhaps only if absent, or a delete), as the Oxia
    front-end logs one `WriteRequest`."""
    skey = oxia_keys.store_key(key)
    state = model[skey]
    if rng.random() < 0.7:
        value = b"o%d" % uid
        put = oxia.PutRequest(key=key, value=value)
        if rng.random() < 0.4:
            put.expected_version_id = -1
        refused = put.HasField("expected_version_id") and state.value is not None
        expected = OxiaStatus.UNEXPECTED_VERSION_ID if refused else OxiaStatus.OK
        request, kind = oxia.WriteRequest(puts=[put]), "oxia-put"
        apply = _nothing if refused else _set(skey, value)
    else:
        request, kind = oxia.WriteRequest(deletes=[oxia.DeleteRequest(key=key)]), "oxia-delete"
        expected = OxiaStatus.OK if state.value is not None else OxiaStatus.KEY_NOT_FOUND
        apply = _remove(skey) if state.value is not None else _nothing

    def check(response: Any) -> str | None:
        if not isinstance(response, oxia_apply_pb2.ApplyResult):
            return f"not an Oxia result: {response}"
        answers = response.response.puts or response.response.deletes
        if len(answers) != 1 or answers[0].status != expected:
            return f"answered {list(answers)}, the model says status {expected}"
        return None

    command = wal_pb2.WalCommand(oxia_write=request.SerializeToString())
    return Op(kind, (skey,), command, Code.SUCCESS, apply, check=check)


# ------------------------------------------------------------------------------------ runner


@dataclass
class SimRange:
    name: RangeName
    store: CrashableStore
    serving: Range | None = None
    model: dict[bytes, KeyState] = field(default_factory=dict)
    unresolved: list[Op] = field(default_factory=list)


@dataclass
class Stats:
    rounds: int = 0
    ops: int = 0
    acked: int = 0
    refused: int = 0
    unknown: int = 0
    crashes: int = 0
    torn: int = 0
    fences: int = 0


class Simulation:
    def __init__(self, seed: int, *, rounds: int = 40, ranges: int = 3, trace: bool = False):
        self.seed = seed
        self.rng = random.Random(seed)
        self.rounds = rounds
        self.trace = trace
        self.clock = ManualClock()
        self.log = MemoryLogBackend()
        self.stats = Stats()
        self.ranges = [
            SimRange(RangeName(i, 1024, 1024 + i), CrashableStore()) for i in range(ranges)
        ]
        self.keys = [b"k%02d" % i for i in range(KEYS_PER_RANGE)]
        """BookKeeper's keys (lkeys of pkey `PKEY`)."""
        self.etcd_keys = {etcd_store_key(b"e%02d" % i): b"e%02d" % i for i in range(8)}
        """etcd's keys: store key -> etcd key."""
        self.oxia_keys = {oxia_keys.store_key(f"o/{i:02d}"): f"o/{i:02d}" for i in range(8)}
        """Oxia's keys: store key -> Oxia key."""
        self.uid = 0

    def say(self, message: str) -> None:
        if self.trace:
            print(f"[seed {self.seed}] {message}")

    def fail(self, message: str) -> SimulationError:
        return SimulationError(f"seed {self.seed}: {message}")

    async def open(self, sim: SimRange) -> None:
        store = sim.store
        sim.serving = Range(sim.name, self.log, lambda: store, self.clock, appliers=APPLIERS)
        await sim.serving.open()

    async def run(self) -> Stats:
        # Blocking work (recovery, closing) runs inline instead of on worker threads, so nothing
        # depends on thread timing and a seed replays exactly.
        asyncio.get_running_loop().set_default_executor(InlineExecutor())
        try:
            for sim in self.ranges:
                model_keys = [*self.keys, *self.etcd_keys, *self.oxia_keys]
                sim.model = {key: KeyState() for key in model_keys}
                await self.open(sim)
            for round_number in range(self.rounds):
                self.stats.rounds += 1
                self.clock.advance(self.rng.uniform(0, 2))
                try:
                    async with asyncio.TaskGroup() as group:  # a failure cancels the others
                        for sim in self.ranges:
                            group.create_task(self.round(sim, round_number))
                except* SimulationError as failures:
                    raise failures.exceptions[0] from None
            for sim in self.ranges:
                await self.recover(sim, "final")
                self.check_state(sim, "at the end")
                self.check_replay(sim)
        finally:
            for sim in self.ranges:
                if sim.serving is not None:
                    await sim.serving.close()
        return self.stats

    async def round(self, sim: SimRange, round_number: int) -> None:
        assert sim.serving is not None
        serving = sim.serving
        rng = self.rng
        free = list(self.keys)
        rng.shuffle(free)
        ops: list[Op] = []
        wanted_ops = rng.randint(1, 10)
        free_etcd, free_oxia = list(self.etcd_keys), list(self.oxia_keys)
        rng.shuffle(free_etcd)
        rng.shuffle(free_oxia)
        while len(free) >= 2 and len(ops) < wanted_ops:
            self.uid += 1
            protocol = rng.random()
            if protocol < 0.2 and free_etcd:
                skey = free_etcd.pop()
                ops.append(make_etcd_op(rng, sim.model, self.etcd_keys[skey], self.uid))
                continue
            if protocol < 0.4 and free_oxia:
                skey = free_oxia.pop()
                ops.append(make_oxia_op(rng, sim.model, self.oxia_keys[skey], self.uid))
                continue
            wanted = 2 if rng.random() < 0.3 else 1
            keys, free = free[:wanted], free[wanted:]
            ops.append(make_op(rng, sim.model, keys, self.uid))
        fault = rng.random()
        fenced_by: Range | None = None
        if fault < 0.06:
            self.stats.torn += 1
            persist = rng.random() < 0.5
            self.say(f"range {sim.name.range_id}: torn append (persisted={persist})")
            self.log.fail_next_append(sim.name.log_name, persist=persist)
        elif fault < 0.09:
            # Another writer opens the log mid-round: this one's appends are fenced.
            self.stats.fences += 1
            self.say(f"range {sim.name.range_id}: fenced by a new writer")
            fenced_by = Range(sim.name, self.log, CrashableStore, self.clock, appliers=APPLIERS)
        tasks = [asyncio.ensure_future(self.send(serving, op)) for op in ops]
        if fenced_by is not None:
            await asyncio.sleep(0)
            await fenced_by.open()
        await asyncio.gather(*tasks)
        for op in ops:
            self.say(
                f"range {sim.name.range_id} round {round_number}: {op.kind} {op.keys} "
                f"-> {op.outcome} (model: {op.expected_code})"
            )
            self.stats.ops += 1
            if op.outcome == "ack" and rng.random() < 0.03:
                op.outcome = "unknown"  # the response was lost on its way
            counter = {"ack": "acked", "refused": "refused", "unknown": "unknown"}[op.outcome]
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
            self.settle(sim, op)
        if fenced_by is not None:
            await fenced_by.close()
            # The new writer replayed and closed; the old range is fenced: restart it.
            await self.recover(sim, "after fencing")
        elif serving.failed or rng.random() < 0.05:
            await self.recover(sim, "after a failure" if serving.failed else "crash")
        elif sim.unresolved:
            self.resolve(sim)
        self.check_state(sim, f"after round {round_number}")

    async def send(self, serving: Range, op: Op) -> None:
        try:
            if op.kind == "get":
                op.response = serving.read(kv.RangeRequest(key=op.keys[0], header=_header()))
            else:
                op.response = await serving.execute(op.command)
            op.outcome = "ack"
        except IndeterminateError:
            op.outcome = "unknown"
        except UnavailableError:
            op.outcome = "refused"
        except TableKeeperError as exc:
            raise self.fail(f"{op.kind} {op.keys}: unexpected {exc!r}") from exc

    def settle(self, sim: SimRange, op: Op) -> None:
        if op.outcome == "refused":
            return
        if op.outcome == "unknown":
            sim.unresolved.append(op)
            return
        assert op.response is not None
        code = int(op.response.header.code)
        if code != op.expected_code:
            raise self.fail(
                f"{op.kind} {op.keys} answered {code}, the model says {op.expected_code}"
            )
        if op.kind == "get":
            self.check_read(sim, op.keys[0], op.response, "a get")
            return
        wrong = op.check(op.response) if op.check is not None else None
        if wrong is not None:
            raise self.fail(f"{op.kind} {op.keys}: {wrong}")
        op.apply(sim.model)

    def resolve(self, sim: SimRange) -> None:
        """Decide each unknown op by what the range now holds (applied entirely, or not)."""
        for op in sim.unresolved:
            if op.kind == "get" or op.expected_code != Code.SUCCESS:
                continue  # changes nothing either way
            after = {k: KeyState(sim.model[k].value, sim.model[k].version) for k in sim.model}
            op.apply(after)
            actual = {k: self.read_state(sim, k) for k in op.keys}
            if all(actual[k] == after[k] for k in op.keys):
                sim.model.update({k: after[k] for k in op.keys})
                self.say(f"unknown {op.kind} {op.keys}: applied")
            elif any(actual[k] != sim.model[k] for k in op.keys):
                raise self.fail(
                    f"unknown {op.kind} {op.keys} half applied or corrupted: holds {actual}, "
                    f"model before {[sim.model[k] for k in op.keys]}, after "
                    f"{[after[k] for k in op.keys]}"
                )
        sim.unresolved.clear()

    async def recover(self, sim: SimRange, why: str) -> None:
        assert sim.serving is not None
        if why != "final":
            self.stats.crashes += 1
            self.say(f"range {sim.name.range_id}: restart ({why})")
        # What the disk holds at the crash; the old range's close cannot add to it.
        survivor = sim.store.crash(self.rng)
        await sim.serving.close()
        sim.store = survivor
        await self.open(sim)
        self.resolve(sim)

    def read_state(self, sim: SimRange, key: bytes) -> KeyState:
        assert sim.serving is not None
        if key in self.etcd_keys or key in self.oxia_keys:
            return self.front_end_state(sim.serving.applied_state().get(key), key)
        return _state_of(sim.serving.read(kv.RangeRequest(key=key, header=_header())))

    def front_end_state(self, record: StoredRecord | None, key: bytes) -> KeyState:
        """An etcd or Oxia key's state from its stored record (Oxia's carries its metadata)."""
        if record is None:
            return KeyState()
        value = oxia_unpack(record.value)[1] if key in self.oxia_keys else record.value
        return KeyState(value, record.version)

    def check_read(self, sim: SimRange, key: bytes, response: object, what: str) -> None:
        assert isinstance(response, kv.RangeResponse)
        if any(key in op.keys for op in sim.unresolved):
            return
        got = _state_of(response)
        if got != sim.model[key]:
            raise self.fail(f"{what} of {key!r}: {got}, the model says {sim.model[key]}")

    def check_state(self, sim: SimRange, when: str) -> None:
        uncertain = {k for op in sim.unresolved for k in op.keys}
        for key in sim.model:
            if key in uncertain:
                continue
            got = self.read_state(sim, key)
            if got != sim.model[key]:
                raise self.fail(
                    f"range {sim.name.range_id} {when}: {key!r} holds {got}, "
                    f"the model says {sim.model[key]}"
                )

    def check_replay(self, sim: SimRange) -> None:
        """The whole log, replayed into an empty store, gives exactly what is served."""
        from tablekeeper_server.range.state_machine import RangeStateMachine

        fresh = RangeStateMachine(MemoryKvStore(), APPLIERS)
        records = list(self.log.read(sim.name.log_name, 1))
        commands = []
        for record in records:
            command = wal_pb2.WalCommand()
            command.ParseFromString(record.payload)
            commands.append((record.sequence, command))
        fresh.apply_batch(commands)
        assert sim.serving is not None
        for key in self.keys:
            request = kv.RangeRequest(key=key, header=_header())
            replayed = fresh.read(request, self.clock.now_ms())
            served = sim.serving.read(request)
            if list(replayed.kvs) != list(served.kvs):
                raise self.fail(f"replay differs for {key!r}: {replayed.kvs} vs {served.kvs}")
        for key in [*self.etcd_keys, *self.oxia_keys]:
            if fresh.get(key) != sim.serving.applied_state().get(key):
                raise self.fail(f"replay differs for {key!r}")


def _state_of(response: kv.RangeResponse) -> KeyState:
    if not response.kvs:
        return KeyState()
    record = response.kvs[0]
    value: bytes | Number = record.number_value if record.is_number else record.value
    return KeyState(value, record.version)


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each submitted function at once, on the calling thread (it never starts one)."""

    def submit(
        self, fn: Callable[..., T], /, *args: object, **kwargs: object
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 (handed to the awaiting caller)
            future.set_exception(exc)
        return future


def simulate(seed: int, *, rounds: int = 40, ranges: int = 3, trace: bool = False) -> Stats:
    """Run one seed; raise `SimulationError` naming the seed if the model is violated."""
    return asyncio.run(Simulation(seed, rounds=rounds, ranges=ranges, trace=trace).run())
