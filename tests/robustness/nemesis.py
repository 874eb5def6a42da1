"""The faults a robustness run injects into a live cluster while its clients run.

Each fault starts, is held for a while, and is healed; `Nemesis.run` draws a schedule of them
from the run's seed (a seeded shuffle of the allowed kinds, repeated, so a short run still meets
several kinds) and logs each step, with CLOCK_MONOTONIC times, to `nemesis.jsonl` beside the
histories (the checker draws them into its visualisation).

- `pause`: SIGSTOP a server past its ZooKeeper session timeout, then SIGCONT;
- `kill`: kill -9 a server, then start it again (same data directory and address);
- `partition-zk`: cut a server from ZooKeeper (its session expires; it must stop serving);
- `partition-pulsar`: cut a server from Pulsar (its log appends and reads fail);
- `partition-peers`: cut a server from the other servers (forwarding fails);
- `partition-owner`: cut a range's owner from ZooKeeper, Pulsar and its peers but not from the
  clients, the stale-read case: it must stop answering before another server takes over;
- `slow-fsync`: make a server's log appends slow (failpoints `wal.append` and `wal.sync`);
- `move`: SIGTERM a server and start it again: its containers move to the others and back;
- `split`: split a range of the SDK's table while it is written.

A target is a range's owner where one matters: the etcd keyspace's, an Oxia shard's or an SDK
table range's (drawn from the seed), else any server.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tablekeeper import Client
from tests.robustness.history import now_ns
from tests.support.routes import etcd_keyspace_container, table_router

KINDS = (
    "pause",
    "kill",
    "partition-zk",
    "partition-pulsar",
    "partition-peers",
    "partition-owner",
    "slow-fsync",
    "move",
    "split",
)


class Environment:
    """What the nemesis needs of the cluster under test (harness.Environment implements it)."""

    session_timeout_s: float
    sdk_table: tuple[str, str]

    def server_count(self) -> int:
        raise NotImplementedError

    def server_target(self, i: int) -> str:
        raise NotImplementedError

    def server_pid(self, i: int) -> int | None:
        raise NotImplementedError

    def server_index(self, endpoint: str) -> int:
        raise NotImplementedError

    def assigned_to(self, container: int) -> str | None:
        raise NotImplementedError

    def kill(self, i: int) -> None:
        raise NotImplementedError

    def stop(self, i: int) -> None:
        raise NotImplementedError

    def restart(self, i: int) -> None:
        raise NotImplementedError

    def cut(self, i: int, what: tuple[str, ...]) -> None:
        """Cut server `i` from some of: "zk", "pulsar", "peers", "clients"."""
        raise NotImplementedError

    def heal(self) -> None:
        raise NotImplementedError

    def slow_file(self, i: int) -> Path:
        raise NotImplementedError

    def wait_ready(self, timeout_s: float) -> None:
        raise NotImplementedError

    def service(self) -> str:
        raise NotImplementedError


@dataclass
class Event:
    kind: str
    target: str
    start_ns: int
    end_ns: int = 0
    detail: str = ""


@dataclass
class Nemesis:
    env: Environment
    seed: int
    kinds: tuple[str, ...]
    log_path: Path
    events: list[Event] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _paused: set[int] = field(default_factory=set)
    _stopped: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown nemesis kinds {sorted(unknown)} (known: {', '.join(KINDS)})")
        self.rng = random.Random(f"nemesis-{self.seed}")

    def schedule(self) -> list[str]:
        """The kinds in the order this seed injects them (as many as there is time for)."""
        order: list[str] = []
        for _ in range(20):
            batch = list(self.kinds)
            self.rng.shuffle(batch)
            order += batch
        return order

    def run(self, until: float, stop: threading.Event) -> None:
        """Inject faults one after another until the monotonic time `until` (or `stop`): each
        is held, healed, and followed by a wait until the cluster is ready again and a short
        quiet spell. Problems the nemesis itself meets (the cluster never recovers) are kept
        in `errors`, not raised: the run goes on to check what the clients saw."""
        for kind in self.schedule():
            if stop.is_set() or time.monotonic() >= until - 2:
                break
            hold_s = self.rng.uniform(1.5, 2.5) * max(self.env.session_timeout_s, 1.0)
            hold_s = min(hold_s, max(0.5, until - time.monotonic() - 1))
            try:
                self.inject(kind, hold_s, stop)
            finally:
                self.heal_all()
            try:
                self.env.wait_ready(120)
            except Exception as exc:  # the run reports it; the clients' histories still count
                self.errors.append(f"after {kind}: the cluster did not recover: {exc}")
                break
            stop.wait(self.rng.uniform(0.5, 2.0))

    # ------------------------------------------------------------------ targets

    def _owner_of_container(self, container: int) -> int | None:
        endpoint = self.env.assigned_to(container)
        if endpoint is None:
            return None
        try:
            return self.env.server_index(endpoint)
        except KeyError:
            return None

    def target(self) -> tuple[int, str]:
        """A server to hit, and why: a range owner (etcd keyspace, Oxia shard, SDK range) or
        any server."""
        choice = self.rng.choice(("etcd", "oxia", "sdk", "any"))
        try:
            with grpc.insecure_channel(self.env.server_target(self._live_index())) as channel:
                if choice == "etcd":
                    container = etcd_keyspace_container(channel)
                    owner = self._owner_of_container(container)
                    if owner is not None:
                        return owner, f"owner of the etcd keyspace (container {container})"
                elif choice in ("oxia", "sdk"):
                    ns, table = ("oxia", "default") if choice == "oxia" else self.env.sdk_table
                    router = table_router(channel, ns, table)
                    ranges = sorted(router.ranges, key=lambda r: r.range_id)
                    picked = self.rng.choice(ranges)
                    owner = self._owner_of_container(picked.container_id)
                    if owner is not None:
                        return owner, (
                            f"owner of {ns}/{table} range {picked.range_id} "
                            f"(container {picked.container_id})"
                        )
        except (grpc.RpcError, AssertionError, IndexError) as exc:
            return self._any(f"any server ({choice} owner lookup failed: {exc})")
        return self._any("any server")

    def _live_index(self) -> int:
        for i in range(self.env.server_count()):
            if i not in self._paused and i not in self._stopped:
                return i
        return 0

    def _any(self, why: str) -> tuple[int, str]:
        return self.rng.randrange(self.env.server_count()), why

    # ------------------------------------------------------------------ faults

    def inject(self, kind: str, hold_s: float, stop: threading.Event) -> None:
        if kind == "split":  # not a server's fault: whoever owns the meta range runs it
            victim, name = -1, f"table {'/'.join(self.env.sdk_table)}"
        else:
            victim, why = self.target()
            name = f"server {victim} ({self.env.server_target(victim)}), {why}"
        event = Event(kind, name, now_ns())
        self.events.append(event)
        self._log({"event": "start", "kind": kind, "target": name, "hold_s": round(hold_s, 2)})
        actions: dict[str, Callable[[], str]] = {
            "pause": lambda: self._pause(victim, hold_s, stop),
            "kill": lambda: self._kill(victim, hold_s, stop),
            "partition-zk": lambda: self._cut(victim, ("zk",), hold_s, stop),
            "partition-pulsar": lambda: self._cut(victim, ("pulsar",), hold_s, stop),
            "partition-peers": lambda: self._cut(victim, ("peers",), hold_s, stop),
            "partition-owner": lambda: self._cut(victim, ("zk", "pulsar", "peers"), hold_s, stop),
            "slow-fsync": lambda: self._slow(victim, hold_s, stop),
            "move": lambda: self._move(victim),
            "split": self._split,
        }
        try:
            event.detail = actions[kind]()
        except Exception as exc:  # a fault that could not be injected is reported, not fatal
            event.detail = f"failed: {type(exc).__name__}: {exc}"
            self.errors.append(f"{kind} on {name}: {event.detail}")
        event.end_ns = now_ns()
        self._log({"event": "end", "kind": kind, "target": name, "detail": event.detail})

    def _pause(self, i: int, hold_s: float, stop: threading.Event) -> str:
        pid = self.env.server_pid(i)
        assert pid is not None, f"server {i} is not running"
        os.kill(pid, signal.SIGSTOP)
        self._paused.add(i)
        stop.wait(hold_s)
        return f"SIGSTOP for {hold_s:.1f}s"

    def _kill(self, i: int, hold_s: float, stop: threading.Event) -> str:
        self.env.kill(i)
        self._stopped.add(i)
        stop.wait(min(hold_s, 3.0))
        self.env.restart(i)
        self._stopped.discard(i)
        return "kill -9, restarted"

    def _cut(self, i: int, what: tuple[str, ...], hold_s: float, stop: threading.Event) -> str:
        self.env.cut(i, what)
        stop.wait(hold_s)
        return f"cut from {', '.join(what)} for {hold_s:.1f}s"

    def _slow(self, i: int, hold_s: float, stop: threading.Event) -> str:
        path = self.env.slow_file(i)
        path.touch()
        stop.wait(hold_s * 2)
        path.unlink(missing_ok=True)
        return f"log appends slowed for {hold_s * 2:.1f}s"

    def _move(self, i: int) -> str:
        self.env.stop(i)  # SIGTERM: its containers are handed over, then it exits
        self._stopped.add(i)
        self.env.restart(i)
        self._stopped.discard(i)
        return "SIGTERM (containers handed over), restarted"

    def _split(self) -> str:
        ns, table = self.env.sdk_table
        with Client(self.env.service()) as client:
            done = client.split_range(ns, table)
        children = ", ".join(str(c.range_id) for c in done.children)
        return f"split range {done.parent_range_id} into {children} ({done.keys_copied} keys)"

    def heal_all(self) -> None:
        """SIGCONT every paused server, heal every cut, make every log fast, restart any server
        the nemesis left stopped. Never raises (it runs on every exit path)."""
        for i in sorted(self._paused):
            pid = self.env.server_pid(i)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        self._paused.clear()
        with contextlib.suppress(Exception):
            self.env.heal()
        for i in range(self.env.server_count()):
            with contextlib.suppress(Exception):
                self.env.slow_file(i).unlink(missing_ok=True)
        for i in sorted(self._stopped):
            try:
                self.env.restart(i)
            except Exception as exc:
                self.errors.append(f"restart of server {i} after a fault failed: {exc}")
        self._stopped.clear()

    def _log(self, record: dict[str, Any]) -> None:
        record["t"] = now_ns()
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
