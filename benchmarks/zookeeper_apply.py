"""Process CPU per ZooKeeper write in the range alone: no sockets, no log, no event loop.

The commands the ZooKeeper front-end logs (create of a new node, setData on one of 1,000 nodes,
delete of the nodes created; `--value-size` bytes of data), built as the front-end builds them
(`zookeeper.apply.prepare`: a `FrontEndCommand` carrying its decoded request), are fed to a
`RangeStateMachine` on RocksDB as the range's writer feeds them: each command stamped, checked
and serialized as `Range.submit_many` does, then applied in groups of `--group` by `apply_batch`
(one store write per group). The commands are built before the clock starts (the front-end's
share, like the reply, is not in these figures). Per op: the minimum over `--rounds` rounds of
`--ops` commands each, in microseconds of this process's CPU (`time.process_time`), which a busy
machine disturbs far less than rates.

    .venv/bin/python benchmarks/zookeeper_apply.py [--rounds 5] [--ops 16000] [--group 16]

`benchmarks/zookeeper.py` measures whole requests through the port, against a real ZooKeeper.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.appliers import server_appliers
from tablekeeper_server.range.apply import Command, FrontEndCommand, front_end_command
from tablekeeper_server.range.events import EventHistory
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.rocksdb import RocksKvStore
from tablekeeper_server.zookeeper import commands, jute
from tablekeeper_server.zookeeper import protocol as zk
from tablekeeper_server.zookeeper.apply import NAME, prepare
from tablekeeper_server.zookeeper.znode import OPEN_ACL

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import positive_int  # noqa: E402


class Keyspace:
    """A ZooKeeper keyspace's range state machine, fed in groups."""

    def __init__(self, path: Path, group: int) -> None:
        self.store = RocksKvStore(path)
        self.sm = RangeStateMachine(self.store, server_appliers(), history=EventHistory(self.store))
        self.group = group
        self.sequence = 0
        self.now_ms = 1_000
        self.apply([front_end_command(NAME, commands.init(b"k" * 32))])
        created = self.apply(
            [wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=60_000))]
        )
        self.session = int(created[0].session_id)  # type: ignore[attr-defined]

    def apply(self, batch: Sequence[Command]) -> list[object]:
        out: list[object] = []
        for start in range(0, len(batch), self.group):
            group: list[tuple[int, Command]] = []
            for command in batch[start : start + self.group]:
                self.now_ms += 1
                command.timestamp_ms = self.now_ms
                self.sm.check(command)
                command.SerializeToString()  # what the range logs
                self.sequence += 1
                group.append((self.sequence, command))
            out.extend(self.sm.apply_batch(group))
        return out

    def request(self, op: int, body: bytes) -> Command:
        """The command the front-end queues for a client's request (`Connection._start`)."""
        payload, prepared = prepare(self.session, op, b"", jute.INT_INT.pack(0, op) + body)
        return FrontEndCommand(NAME, payload, prepared)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--ops", type=positive_int, default=16_000, help="commands per round")
    parser.add_argument("--group", type=positive_int, default=16, help="commands per apply")
    parser.add_argument("--value-size", type=positive_int, default=100)
    args = parser.parse_args(argv)
    value = b"v" * args.value_size
    with tempfile.TemporaryDirectory(prefix="zk-apply-") as tmp:
        keyspace = Keyspace(Path(tmp) / "store", args.group)
        n = args.ops

        def creates(prefix: str) -> list[Command]:
            tail = jute.write_buffer(value) + OPEN_ACL + jute.INT.pack(0)
            return [
                keyspace.request(zk.CREATE, jute.write_string(f"/{prefix}{i}") + tail)
                for i in range(n)
            ]

        def sets(prefix: str) -> list[Command]:
            tail = jute.write_buffer(value) + jute.INT.pack(-1)
            return [
                keyspace.request(zk.SET_DATA, jute.write_string(f"/{prefix}{i % 1000}") + tail)
                for i in range(n)
            ]

        def deletes(prefix: str) -> list[Command]:
            tail = jute.INT.pack(-1)
            return [
                keyspace.request(zk.DELETE, jute.write_string(f"/{prefix}{i}") + tail)
                for i in range(n)
            ]

        kinds: dict[str, Callable[[str], list[Command]]] = {
            "create": creates,
            "set": sets,
            "delete": deletes,
        }
        per_op: dict[str, list[float]] = {kind: [] for kind in kinds}
        for round_ in range(args.rounds):
            for kind, make in kinds.items():
                batch = make(f"r{round_}-")
                started = time.process_time()
                results = keyspace.apply(batch)
                per_op[kind].append((time.process_time() - started) / n * 1e6)
                for result in results:
                    err, _ = commands.unpack_result(result.result)  # type: ignore[attr-defined]
                    if err != zk.OK:
                        print(f"{kind}: ZooKeeper error {err}", file=sys.stderr)
                        return 2
        keyspace.store.close()
    print(f"{'op':<8} {'min us/op':>10} {'max us/op':>10}   ({args.rounds} rounds of {n})")
    for kind, figures in per_op.items():
        print(f"{kind:<8} {min(figures):>10.1f} {max(figures):>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
