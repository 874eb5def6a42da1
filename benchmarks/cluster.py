#!/usr/bin/env python3
"""Cluster-mode benchmark (issue 5): failover time, and the aggregate throughput of 1, 2 and 3
server processes.

Everything it needs is started here, on free 127.0.0.1 ports, in a temporary directory, and
stopped at the end, with the tests' process harness (tests/support): a ZooKeeper
(`ZooKeeperProcess`, deploy/zookeeper.sh), a Pulsar standalone (`PulsarService`,
deploy/pulsar.sh) and the `tablekeeper server` processes (`ServerProcess`; a cluster is a
`TestCluster`: `--zk --log pulsar --checkpoint-store pulsar`). `--zk` and
`--pulsar-url/--pulsar-admin-url` reuse running ones instead.

Part 1, failover. A cluster of `--servers` servers (default 3) and `--containers` containers
(default 6), ZooKeeper session timeout `--zk-session-timeout` (default 2 s). One table with a
range per container; `--keys-per-container` keys (100-byte values) are written into each
container, every server checkpoints what it hosts (admin Checkpoint), then a tail of
`--tail-keys-per-container` overwrites per container is written, so that a takeover restores a
checkpoint and replays only the tail. Writer tasks keep putting to pkeys of every container (the
pkeys are routed client-side with the SDK's routing hash over GetActiveRanges); then a server is
killed with SIGKILL: one that is not the controller, then the controller (`--victims`). Measured:
the time from the kill to the first successful write, issued after the kill, on the lowest
container the victim owned (and on all of them), and from the servers' logs: assignment
rewritten, container serving ("container N serving (epoch E) after X s"), range restored from
the checkpoint and its tail replayed. The victim is restarted and the cluster rebalanced between
rounds (`--rounds`, median quoted). Anchor: the ZooKeeper session timeout, the floor of failure
detection; the ratio failover / session timeout is printed. `--followers on` (or `both`: each
kill once without, once with): before the kill every server reads a key of each container it
does not own with `read_from="follower"`, so it keeps a follower of that range; the new owner
then opens the range on its follower's store instead of restoring the checkpoint ("taking over
its follower's store" in its log). `--followers standby` runs the servers with `--standby`
instead: they follow every range (catalog ranges too) by themselves.

Part 2, throughput. The same fixed mixed load (`--mix`, default get 50 % / put 30 % / increment
20 %, 100-byte values) from `--client-procs` client processes with `--concurrency` asyncio
workers each (closed loop, the SDK coalescing concurrent ops into Batch RPCs), for `--warmup` +
`--duration` seconds, against: the standalone server on the same Pulsar (the anchor: `tablekeeper
server --log pulsar --checkpoint-store pulsar`, no ZooKeeper), then clusters of 1, 2 and 3 server
processes with the same number of containers. Client process i talks to server i mod n. Prints
ops/s, p50/p99 per configuration and the ratios to the anchor and to 1 server.

All timings come from this machine's wall clock; client, servers, ZooKeeper and Pulsar share its
cores, so read the ratios and medians. Raw JSON goes to benchmarks/out/ (gitignored).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import base64
import contextlib
import datetime as dt
import inspect
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for tests.support and benchmarks._common

from benchmarks._common import (  # noqa: E402
    SRC_PATHS,
    fmt,
    git_info,
    no_nan,
    percentile,
    positive_int,
    proc_cpu_s,
    sigterm_as_interrupt,
    src_env,
)

# This tree's SDK and server, also when run from a copy of the repository (PYTHONPATH is set
# the same way for every process started here: `src_env`).
for _path in reversed(SRC_PATHS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import grpc  # noqa: E402

from tablekeeper import AsyncClient  # noqa: E402
from tablekeeper._transport import RetryPolicy  # noqa: E402
from tablekeeper.bulk import table_layout  # noqa: E402
from tablekeeper.routing import RangeRouter  # noqa: E402
from tests.support.cluster import TestCluster, server_info_containers  # noqa: E402
from tests.support.pulsar import PulsarService  # noqa: E402
from tests.support.server import ServerProcess, stop_all  # noqa: E402
from tests.support.zookeeper import ZooKeeperProcess  # noqa: E402

OUT_DIR = BENCH_DIR / "out"
OPS = ("get", "put", "incr")
NAMESPACE = "bench"
TABLE = "t"
LOAD_LKEY = b"v"
WRITER_LKEY = b"w"


class BenchError(RuntimeError):
    """A fatal setup problem (a process did not start, the cluster never became ready, ...)."""


# --------------------------------------------------------------------------- small helpers

_T0 = time.monotonic()


def eprint(*args: object) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s]", *args, file=sys.stderr, flush=True)


def median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or a != a or b != b:
        return None
    return a / b


def client_kwargs(routing: str) -> dict[str, Any]:
    """`direct_routing` for AsyncClient when this SDK has it (`--routing`)."""
    has_direct = "direct_routing" in inspect.signature(AsyncClient.__init__).parameters
    if routing == "forward":
        if not has_direct:
            return {}  # this SDK always sends to the service, whose servers forward
        return {"direct_routing": False}
    if routing == "direct":
        if not has_direct:
            raise BenchError("--routing direct: this SDK has no direct_routing option")
        return {"direct_routing": True}
    return {}


def sdk_routing_description(routing: str) -> str:
    has_direct = "direct_routing" in inspect.signature(AsyncClient.__init__).parameters
    if not has_direct:
        return "SDK without direct routing: ops go to the client's server, which forwards"
    if routing == "forward":
        return "direct_routing=False: ops go to the client's server, which forwards"
    return "direct routing: ops go straight to the owner of their range"


# --------------------------------------------------------------------------- processes


SERVER_ENV = {"PYTHONPATH": src_env()["PYTHONPATH"]}
"""What the servers get on top of this environment: this tree's sources first."""


def script_env() -> dict[str, str]:
    """Environment of the deploy scripts: they use this Python (kazoo, pulsar-client)."""
    return {"TK_PYTHON": os.environ.get("TK_PYTHON", sys.executable)}


@contextlib.contextmanager
def harness_errors(what: str) -> Iterator[None]:
    """The harness's failures (a process exited or did not start, a cluster not ready in
    time) as `BenchError`, with the first line of their message (main prints the logs)."""
    try:
        yield
    except (RuntimeError, TimeoutError) as e:
        raise BenchError(f"{what}: {(str(e).splitlines() or [type(e).__name__])[0]}") from e


@dataclass
class Infra:
    """ZooKeeper and Pulsar (started here unless given by flags; `stop` stops only those) and
    every server started on them, for the cleanup and the log tails of any exit."""

    workdir: Path
    zk_hosts: str = ""
    pulsar: PulsarService | None = None
    zookeeper: ZooKeeperProcess | None = None
    clusters: list[TestCluster] = field(default_factory=list)
    standalones: list[ServerProcess] = field(default_factory=list)
    checkpoint_args: list[str] = field(default_factory=list)
    """Given to every server (`--checkpoint-records`)."""

    def start_zookeeper(self, timeout_s: int) -> None:
        self.zookeeper = ZooKeeperProcess(self.workdir / "zk", env=script_env())
        with harness_errors("deploy/zookeeper.sh start"):
            self.zookeeper.start(timeout_s)
        self.zk_hosts = self.zookeeper.hosts
        eprint(f"ZooKeeper on {self.zk_hosts} (dir {self.zookeeper.state_dir})")

    def start_pulsar(self, timeout_s: int) -> None:
        eprint("starting Pulsar standalone (deploy/pulsar.sh; 15-60 s) ...")
        with harness_errors("Pulsar"):
            self.pulsar = PulsarService.launch(
                self.workdir / "pulsar", timeout_s=timeout_s, env=script_env()
            )
        eprint(
            f"Pulsar on {self.pulsar.service_url} / {self.pulsar.admin_url} (pid {self.pulsar.pid})"
        )

    def use_or_start(
        self, zk: str | None, pulsar_url: str | None, pulsar_admin_url: str | None
    ) -> None:
        """Use the running ZooKeeper and Pulsar given (`--zk`, `--pulsar-url/--pulsar-admin-url`),
        start the others."""
        if zk:
            self.zk_hosts = zk
        else:
            self.start_zookeeper(120)
        if pulsar_url:
            self.pulsar = PulsarService(pulsar_url, pulsar_admin_url, None)
        else:
            self.start_pulsar(300)

    def new_cluster(
        self, name: str, args: argparse.Namespace, extra_args: Sequence[str] = ()
    ) -> TestCluster:
        """A cluster `name` (`--containers`, `--zk-session-timeout`, no periodic checkpoints)
        on this ZooKeeper and in Pulsar namespace public/<name>, initialised, no server yet;
        `extra_args` go to every server."""
        assert self.pulsar is not None
        extra_args = [*extra_args, *self.checkpoint_args]
        cluster = TestCluster(
            self.workdir / name,
            self.pulsar,
            containers=args.containers,
            name=name,
            zk_session_timeout_s=args.zk_session_timeout,
            checkpoint_interval_s=0,
            pulsar_namespace=f"public/{name}",
            env=SERVER_ENV,
            start_timeout_s=args.ready_timeout,
            zk_hosts=self.zk_hosts,
            extra_args=extra_args,
        )
        self.clusters.append(cluster)
        with harness_errors(f"cluster {name}"):
            cluster.init()
        return cluster

    def new_standalone(self, name: str, containers: int) -> ServerProcess:
        """A standalone server (no ZooKeeper) on this Pulsar, namespace public/<name>."""
        assert self.pulsar is not None
        server = ServerProcess(
            self.workdir / name / "data",
            extra_args=[
                *self.pulsar.server_args(f"public/{name}"),
                f"--containers={containers}",
                "--checkpoint-interval=0",
                *self.checkpoint_args,
            ],
            env=SERVER_ENV,
        )
        self.standalones.append(server)
        return server

    def servers(self) -> list[ServerProcess]:
        return [s for c in self.clusters for s in c.servers] + self.standalones

    def stop(self) -> None:
        for cluster in self.clusters:
            cluster.close()
        stop_all(self.standalones, 30)
        if self.pulsar is not None and self.pulsar.deploy_dir is not None:
            eprint("stopping Pulsar")
            self.pulsar.close()
        if self.zookeeper is not None:
            eprint("stopping ZooKeeper")
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.zookeeper.stop()
            self.zookeeper = None


async def wait_balanced(cluster: TestCluster, timeout_s: float, what: str) -> None:
    """Until every container is served by exactly its assigned live server and the servers'
    loads differ by at most one (`TestCluster.wait_ready(balanced=True)`)."""
    with harness_errors(what):
        await asyncio.to_thread(cluster.wait_ready, timeout_s, balanced=True)


async def start_cluster(cluster: TestCluster, n: int, timeout_s: float, what: str) -> None:
    """Start `n` servers one at a time, each once the previous ones serve a balanced
    assignment (one assignment change at a time, as an operator adding servers would)."""
    for i in range(n):
        with harness_errors(f"{what}: server {i}"):
            await asyncio.to_thread(cluster.add_server)
        await wait_balanced(cluster, timeout_s, f"{what}: server {i}")


async def start_standalone(server: ServerProcess, containers: int, timeout_s: float) -> None:
    """Start it and wait until it serves every container."""
    every = frozenset(range(containers))

    def serves_every_container() -> bool:
        with contextlib.suppress(grpc.RpcError):
            return server_info_containers(server.target, 1.0) == every
        return False

    with harness_errors("standalone"):
        await asyncio.to_thread(server.start, timeout_s)
        await asyncio.to_thread(
            server.wait_for, serves_every_container, "every container served", timeout_s
        )


# --------------------------------------------------------------------------- data


def keys_by_container(
    router: RangeRouter, per_container: int, prefix: bytes
) -> dict[int, list[bytes]]:
    """`per_container` pkeys routed to each container that holds a range of the table."""
    out: dict[int, list[bytes]] = {r.container_id: [] for r in router.ranges}
    missing = len(out)
    i = 0
    while missing:
        key = b"%s%09d" % (prefix, i)
        i += 1
        bucket = out[router.route(key).container_id]
        if len(bucket) < per_container:
            bucket.append(key)
            if len(bucket) == per_container:
                missing -= 1
    return out


async def batch_load(
    client: AsyncClient,
    keys: Sequence[bytes],
    *,
    value_size: int,
    batch: int,
    inflight: int,
    what: str,
) -> float:
    """Put every key once (lkey `LOAD_LKEY`, random values) with `batch_put` calls of `batch`
    keys, `inflight` at a time; returns seconds taken."""
    table = await client.table(NAMESPACE, TABLE)
    chunks = [keys[i : i + batch] for i in range(0, len(keys), batch)]
    it = iter(chunks)
    done = 0
    started = last_report = time.monotonic()

    async def worker() -> None:
        nonlocal done, last_report
        for chunk in it:
            items: list[tuple[bytes, bytes, bytes]] = [
                (k, LOAD_LKEY, random.randbytes(value_size)) for k in chunk
            ]
            for _attempt in range(20):
                errors = await table.batch_put(items)
                items = [item for item, err in zip(items, errors, strict=True) if err is not None]
                if not items:
                    break
                await asyncio.sleep(0.2)
            else:
                raise BenchError(f"{what}: {len(items)} keys could not be written")
            done += len(chunk)
            now = time.monotonic()
            if now - last_report >= 10:
                last_report = now
                eprint(f"  {what}: {done}/{len(keys)} keys, {done / (now - started):.0f} keys/s")

    await asyncio.gather(*(worker() for _ in range(inflight)))
    return time.monotonic() - started


CHECKPOINT_RETRY_S = 10.0
"""How long an admin Checkpoint through a server is retried while the server is unreachable."""


async def checkpoint_servers(endpoints: Sequence[str]) -> tuple[dict[str, float], list[str]]:
    """Admin Checkpoint through each server (every range open there); seconds per server, and
    the errors (a failed checkpoint is reported, not fatal: the takeover then replays more)."""
    took: dict[str, float] = {}
    errors: list[str] = []
    for ep in endpoints:
        async with AsyncClient(f"bk://{ep}") as client:
            t0 = time.monotonic()
            deadline = t0 + CHECKPOINT_RETRY_S
            while True:
                try:
                    response = await client.checkpoint()
                except grpc.aio.AioRpcError as e:
                    # A server restarted on the same address can be refused for a while: gRPC
                    # shares a connection's reconnect backoff with every new channel to it.
                    if e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline:
                        await asyncio.sleep(0.2)
                        continue
                    errors.append(f"{ep}: {e.code().name}: {e.details()}")
                    eprint(f"  WARNING: checkpoint through {ep} failed: {errors[-1]}")
                    break
                took[ep] = time.monotonic() - t0
                errors += [f"{ep}: {r.error}" for r in response.ranges if r.error]
                break
    return took, errors


# --------------------------------------------------------------------------- failover


LOG_TS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
SERVING_RE = re.compile(r"container (\d+) serving \(epoch (\d+)\) after ([\d.]+)s")
RESTORED_RE = re.compile(
    r"range (\d{5})-(\d{12})-(\d{12}): restored checkpoint at (\d+) \((\d+) files\) in ([\d.]+)s"
)
HANDED_OVER_RE = re.compile(
    r"range (\d{5})-(\d{12})-(\d{12}): taking over its follower's store \(at (\d+)\)"
)
OPENED_RE = re.compile(
    r"range (\d{5})-(\d{12})-(\d{12}): restored in [\d.]+s while opening the log "
    r"\(opened at \d+ in ([\d.]+)s\)(?:; (\d+) records applied meanwhile)?"
)
REPLAYED_RE = re.compile(
    r"range (\d{5})-(\d{12})-(\d{12}): replayed (\d+) commands up to (\d+) in ([\d.]+)s"
)


def log_events(server: ServerProcess, offset: int) -> list[tuple[float, str]]:
    """(wall-clock time, line) of the log lines written after byte `offset`."""
    events = []
    for line in server.log_since(offset).splitlines():
        m = LOG_TS.match(line)
        if m:
            ts = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
            events.append((ts + int(m.group(2)) / 1000, line))
    return events


@dataclass
class FailoverRound:
    round: int
    victim_kind: str
    victim: str
    controller_before: str | None
    followers: bool
    """Every server kept a follower of each range it did not own before the kill."""
    moved: list[int]
    chosen: int
    new_owner: str | None = None
    first_write_s: float | None = None
    """Kill → first successful put (issued after the kill) on the chosen container."""
    all_moved_s: float | None = None
    """Kill → every moved container has taken a put."""
    per_container_s: dict[int, float | None] = field(default_factory=dict)
    failed_writes: int = 0
    first_errors: list[str] = field(default_factory=list)
    controller_elected_s: float | None = None
    assignment_s: float | None = None
    serving_s: float | None = None
    """Kill → the new owner logged "container <chosen> serving"."""
    claim_open_s: float | None = None
    """The X of that line: claim in ZooKeeper + open the container (root/meta ranges)."""
    range_open_s: float | None = None
    """Kill → the chosen container's table range restored and replayed (its last log line)."""
    restore_s: float | None = None
    restore_logged_s: float | None = None
    replay_commands: int | None = None
    replay_s: float | None = None
    replay_logged_s: float | None = None
    log_open_s: float | None = None
    """The log's open (fencing it, reading its tail) beside the restore."""
    applied_ahead: int | None = None
    """Tail records applied while the log's open was still reading (before the replay)."""
    opened_logged_s: float | None = None
    follower_store: bool = False
    """The new owner opened the chosen container's range on its follower's store."""
    standby: bool = False
    """The servers ran with --standby (following every range of the others by themselves)."""
    checkpoint_s: dict[str, float] = field(default_factory=dict)
    checkpoint_errors: list[str] = field(default_factory=list)
    tail_s: float | None = None
    rejoin_ready_s: float | None = None


class Writers:
    """Tasks putting, back to back, to pkeys of every container; records each success."""

    def __init__(
        self,
        client: AsyncClient,
        pkeys: dict[int, list[bytes]],
        per_container: int,
        value: bytes,
    ) -> None:
        self._client = client
        self._pkeys = pkeys
        self._per_container = per_container
        self._value = value
        self.ok: dict[int, list[tuple[float, float]]] = {c: [] for c in pkeys}
        self.failed: dict[int, list[tuple[float, str]]] = {c: [] for c in pkeys}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        table = await self._client.table(NAMESPACE, TABLE)
        for container, keys in self._pkeys.items():
            for i in range(self._per_container):
                self._tasks.append(asyncio.create_task(self._run(table, container, keys, i)))

    async def _run(self, table: Any, container: int, keys: list[bytes], idx: int) -> None:
        n = idx
        while not self._stop.is_set():
            pkey = keys[n % len(keys)]
            n += self._per_container
            t0 = time.time()
            try:
                await table.put(pkey, WRITER_LKEY, self._value)
            except Exception as e:  # noqa: BLE001 - recorded; writing goes on
                self.failed[container].append((t0, f"{type(e).__name__}: {e}"[:300]))
                await asyncio.sleep(0.005)
                continue
            self.ok[container].append((t0, time.time()))

    def first_ok_after(self, container: int, t: float) -> float | None:
        """Completion time of the first successful put issued at or after `t`."""
        done = [t1 for t0, t1 in self.ok[container] if t0 >= t]
        return min(done) if done else None

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def open_followers(
    servers: Sequence[ServerProcess],
    owners: dict[str, frozenset[int]],
    per_container: dict[int, list[bytes]],
    kwargs: dict[str, Any],
) -> None:
    """Make every server follow the range of each container it does not own: one linearizable
    follower read there (the table has one range per container)."""
    for server in servers:
        mine = owners.get(server.target, frozenset())
        async with AsyncClient(server.service, **kwargs) as client:
            table = await client.table(NAMESPACE, TABLE)
            for container, keys in per_container.items():
                if container in mine:
                    continue
                _, info = await table.get_with_info(keys[0], LOAD_LKEY, max_staleness_s=0)
                if info.replica != "follower":
                    eprint(f"  warning: {server.target} read container {container} as {info}")


async def failover_part(args: argparse.Namespace, infra: Infra) -> dict[str, Any]:
    standby = ["--standby"] if args.followers == "standby" else []
    cluster = infra.new_cluster(f"fo{os.getpid()}", args, standby)
    try:
        eprint(
            f"failover: cluster {cluster.name}: {args.servers} servers, "
            f"{args.containers} containers"
        )
        await start_cluster(cluster, args.servers, args.ready_timeout, "start")
        return await _failover_rounds(args, cluster)
    finally:
        cluster.close()


async def _failover_rounds(args: argparse.Namespace, cluster: TestCluster) -> dict[str, Any]:
    containers = args.containers
    all_service = cluster.service_all()
    kwargs = client_kwargs(args.routing)
    ranges = max(args.ranges or containers, containers)
    async with AsyncClient(all_service, **kwargs) as client:
        await client.create_namespace(NAMESPACE)
        await client.create_table(NAMESPACE, TABLE, ranges=ranges)
        layout = await table_layout(client, NAMESPACE, TABLE)
        router = RangeRouter(layout.ranges)
        per_container = keys_by_container(router, args.keys_per_container, b"k")
        keys = [k for c in sorted(per_container) for k in per_container[c]]
        eprint(
            f"failover: table {NAMESPACE}/{TABLE} (id {layout.table_id}), {len(layout.ranges)} "
            f"ranges over containers {sorted(per_container)}; loading {len(keys)} keys"
        )
        random.shuffle(keys)
        load_s = await batch_load(
            client,
            keys,
            value_size=args.value_size,
            batch=args.load_batch,
            inflight=args.load_inflight,
            what="load",
        )
        eprint(f"failover: loaded {len(keys)} keys in {load_s:.1f}s ({len(keys) / load_s:.0f}/s)")

    value = random.Random(7).randbytes(args.value_size)
    writer_pkeys = {c: ks[: args.writer_keys] for c, ks in per_container.items()}
    rounds: list[FailoverRound] = []
    modes = {"off": [False], "on": [True], "both": [False, True], "standby": [False]}
    modes_now = modes[args.followers]
    for rnd in range(args.rounds):
        for kind in args.victims:
            for followers in modes_now:
                r = await _one_failover(
                    args,
                    cluster,
                    rnd + 1,
                    kind,
                    per_container,
                    writer_pkeys,
                    value,
                    layout.table_id,
                    followers=followers,
                )
                rounds.append(r)
                print_failover_round(r, args.zk_session_timeout)
    return {
        "cluster": cluster.name,
        "table_id": layout.table_id,
        "ranges": len(layout.ranges),
        "keys_loaded": len(keys),
        "load_s": load_s,
        "rounds": [asdict(r) for r in rounds],
        "summary": failover_summary(rounds, args.zk_session_timeout),
    }


async def _one_failover(
    args: argparse.Namespace,
    cluster: TestCluster,
    rnd: int,
    kind: str,
    per_container: dict[int, list[bytes]],
    writer_pkeys: dict[int, list[bytes]],
    value: bytes,
    table_id: int,
    *,
    followers: bool,
) -> FailoverRound:
    servers = cluster.servers
    endpoints = [s.target for s in servers]
    kwargs = client_kwargs(args.routing)
    await wait_balanced(cluster, args.ready_timeout, "before the round")
    owners = await asyncio.to_thread(cluster.assignment)
    all_service = cluster.service_all()

    # Every data range open (a table range opens on first use), then checkpointed, then a tail.
    async with AsyncClient(all_service, **kwargs) as client:
        table = await client.table(NAMESPACE, TABLE)
        await asyncio.gather(*(table.get(ks[0], LOAD_LKEY) for ks in per_container.values()))
        checkpoint_s, checkpoint_errors = await checkpoint_servers(endpoints)
        tail = [k for ks in per_container.values() for k in ks[: args.tail_keys_per_container]]
        tail_s = 0.0
        if tail:
            tail_s = await batch_load(
                client,
                tail,
                value_size=args.value_size,
                batch=args.load_batch,
                inflight=args.load_inflight,
                what="tail",
            )
    if followers:
        await open_followers(servers, owners, per_container, kwargs)
    controller = await asyncio.to_thread(cluster.controller)
    victim_index = next(
        i for i, s in enumerate(servers) if (s.target == controller) == (kind == "controller")
    )
    victim = servers[victim_index]
    moved = sorted(owners[victim.target])
    r = FailoverRound(
        round=rnd,
        victim_kind=kind,
        victim=victim.target,
        controller_before=controller,
        followers=followers,
        standby=args.followers == "standby",
        moved=moved,
        chosen=moved[0],
        checkpoint_s=checkpoint_s,
        checkpoint_errors=checkpoint_errors,
        tail_s=tail_s,
    )
    eprint(
        f"round {rnd} ({kind}): checkpoints {', '.join(f'{v:.1f}s' for v in checkpoint_s.values())}"
        f"; tail {len(tail)} puts in {tail_s:.1f}s; followers {'on' if followers else 'off'}; "
        f"killing server {victim_index} {victim.target} "
        f"(containers {moved}; controller {controller})"
    )

    survivors = [s for s in servers if s is not victim]
    writer_client = AsyncClient(
        "bk://" + ",".join(s.target for s in survivors),
        retry=RetryPolicy(
            deadline_s=1.0, initial_backoff_s=0.005, max_backoff_s=0.05, call_timeout_s=10.0
        ),
        coalesce=False,
        **kwargs,
    )
    writers = Writers(writer_client, writer_pkeys, args.writers_per_container, value)
    offsets = {s.target: s.log_offset() for s in servers}
    try:
        await writers.start()
        await asyncio.sleep(args.pre_kill_s)
        before = time.time()
        silent = [c for c in writer_pkeys if writers.first_ok_after(c, before - 1.0) is None]
        if silent:
            eprint(f"  warning: no successful put in the last second before the kill on {silent}")
        t_kill = cluster.kill(victim_index)
        t_dead = time.time()
        deadline = time.monotonic() + args.failover_timeout
        while time.monotonic() < deadline:
            if all(writers.first_ok_after(c, t_dead) is not None for c in moved):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
    finally:
        await writers.stop()
        await writer_client.close()

    for c in writer_pkeys:
        t = writers.first_ok_after(c, t_dead)
        r.per_container_s[c] = None if t is None else t - t_kill
    r.first_write_s = r.per_container_s.get(r.chosen)
    moved_times = [r.per_container_s.get(c) for c in moved]
    r.all_moved_s = None if None in moved_times else max(t for t in moved_times if t is not None)
    failed = [(t, e) for c in writer_pkeys for t, e in writers.failed[c] if t >= t_kill]
    r.failed_writes = len(failed)
    seen: list[str] = []
    for _, e in sorted(failed):
        short = re.sub(r"\d+", "N", e)[:160]
        if short not in seen:
            seen.append(short)
    r.first_errors = seen[:5]
    if r.all_moved_s is None:
        eprint(f"  WARNING: moved containers still not writable after {args.failover_timeout}s")
        for s in survivors:
            eprint(f"  --- {s.target} log tail:\n{s.log_tail(25)}")

    _failover_breakdown(r, survivors, offsets, t_kill, table_id)

    # Bring the victim back and wait for the rebalanced cluster.
    t_restart = time.monotonic()
    victim.launch()
    await wait_balanced(cluster, args.ready_timeout, "after restarting the victim")
    r.rejoin_ready_s = time.monotonic() - t_restart
    return r


def _failover_breakdown(
    r: FailoverRound,
    survivors: Sequence[ServerProcess],
    offsets: dict[str, int],
    t_kill: float,
    table_id: int,
) -> None:
    """Fill the server-side timeline of the round from the survivors' logs."""
    for s in survivors:
        for ts, line in log_events(s, offsets[s.target]):
            if ts < t_kill - 0.01:
                continue
            rel = max(0.0, ts - t_kill)
            if "this server is the controller now" in line and r.controller_elected_s is None:
                r.controller_elected_s = rel
            if "controller: new assignment" in line and r.assignment_s is None:
                r.assignment_s = rel
            m = SERVING_RE.search(line)
            if m and int(m.group(1)) == r.chosen and r.serving_s is None:
                r.serving_s, r.claim_open_s, r.new_owner = rel, float(m.group(3)), s.target
            m = RESTORED_RE.search(line)
            if m and int(m.group(1)) == r.chosen and int(m.group(2)) == table_id:
                r.restore_s, r.restore_logged_s = float(m.group(6)), rel
            m = HANDED_OVER_RE.search(line)
            if m and int(m.group(1)) == r.chosen and int(m.group(2)) == table_id:
                r.follower_store = True
            m = OPENED_RE.search(line)
            if m and int(m.group(1)) == r.chosen and int(m.group(2)) == table_id:
                r.log_open_s, r.opened_logged_s = float(m.group(4)), rel
                r.applied_ahead = int(m.group(5)) if m.group(5) else None
            m = REPLAYED_RE.search(line)
            if m and int(m.group(1)) == r.chosen and int(m.group(2)) == table_id:
                r.replay_commands, r.replay_s = int(m.group(4)), float(m.group(6))
                r.replay_logged_s = rel
    logged = [
        t for t in (r.restore_logged_s, r.opened_logged_s, r.replay_logged_s) if t is not None
    ]
    r.range_open_s = max(logged) if logged else None


def print_failover_round(r: FailoverRound, session_timeout_s: float) -> None:
    eprint(
        f"round {r.round} ({r.victim_kind} {r.victim}): first write on container {r.chosen} "
        f"after {fmt(r.first_write_s, 3)}s (x{fmt(ratio(r.first_write_s, session_timeout_s))} "
        f"the session timeout), all of {r.moved} after {fmt(r.all_moved_s, 3)}s; "
        f"assignment {fmt(r.assignment_s, 3)}s, serving {fmt(r.serving_s, 3)}s "
        f"(claim+open {fmt(r.claim_open_s, 3)}s), restore {fmt(r.restore_s, 3)}s, log open "
        f"{fmt(r.log_open_s, 3)}s ({r.applied_ahead or 0} records applied meanwhile), replay "
        f"{r.replay_commands or 0} cmds {fmt(r.replay_s, 3)}s, range open "
        f"{fmt(r.range_open_s, 3)}s"
        f"{'; opened on its follower' + chr(39) + 's store' if r.follower_store else ''}; "
        f"{r.failed_writes} failed puts; "
        f"rejoin+rebalance {fmt(r.rejoin_ready_s, 1)}s"
    )
    if r.first_errors:
        eprint("  errors seen by the writers: " + " | ".join(r.first_errors))


def _round_kind(r: FailoverRound) -> str:
    return r.victim_kind + ("+followers" if r.followers else "+standby" if r.standby else "")


def failover_summary(rounds: Sequence[FailoverRound], session_timeout_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in sorted({_round_kind(r) for r in rounds}):
        rs = [r for r in rounds if _round_kind(r) == kind]
        first = median_or_none([r.first_write_s for r in rs])
        out[kind] = {
            "rounds": len(rs),
            "first_write_s_median": first,
            "first_write_s_all": [r.first_write_s for r in rs],
            "all_moved_s_median": median_or_none([r.all_moved_s for r in rs]),
            "ratio_to_session_timeout": ratio(first, session_timeout_s),
            "controller_elected_s_median": median_or_none([r.controller_elected_s for r in rs]),
            "assignment_s_median": median_or_none([r.assignment_s for r in rs]),
            "serving_s_median": median_or_none([r.serving_s for r in rs]),
            "claim_open_s_median": median_or_none([r.claim_open_s for r in rs]),
            "range_open_s_median": median_or_none([r.range_open_s for r in rs]),
            "restore_s_median": median_or_none([r.restore_s for r in rs]),
            "replay_s_median": median_or_none([r.replay_s for r in rs]),
            "log_open_s_median": median_or_none([r.log_open_s for r in rs]),
            "follower_store_rounds": sum(r.follower_store for r in rs),
            "replay_commands_median": median_or_none(
                [float(r.replay_commands) if r.replay_commands is not None else None for r in rs]
            ),
        }
    return out


def _kind_of(r: dict[str, Any]) -> str:
    extra = "+followers" if r.get("followers") else "+standby" if r.get("standby") else ""
    return str(r["victim_kind"]) + extra


def render_failover(result: dict[str, Any], session_timeout_s: float) -> str:
    header = (
        f"{'round':>5} {'victim':<18} {'moved':<8} {'first write s':>13} {'all moved s':>11} "
        f"{'ctl elected':>11} {'assignment':>10} {'serving':>8} {'claim+open':>10} "
        f"{'range open':>10} {'restore':>8} {'replay':>14} {'failed':>6} {'/ ZK timeout':>12}"
    )
    rows = ["failover (seconds from SIGKILL)", header, "-" * len(header)]
    for r in result["rounds"]:
        replay = (
            f"{r['replay_commands']} in {fmt(r['replay_s'], 2)}"
            if r["replay_commands"] is not None
            else "-"
        )
        rows.append(
            f"{r['round']:>5} {_kind_of(r):<18} {','.join(map(str, r['moved'])):<8} "
            f"{fmt(r['first_write_s'], 3):>13} {fmt(r['all_moved_s'], 3):>11} "
            f"{fmt(r['controller_elected_s'], 3):>11} {fmt(r['assignment_s'], 3):>10} "
            f"{fmt(r['serving_s'], 3):>8} {fmt(r['claim_open_s'], 3):>10} "
            f"{fmt(r['range_open_s'], 3):>10} "
            f"{fmt(r['restore_s'], 3):>8} {replay:>14} {r['failed_writes']:>6} "
            f"{'x' + fmt(ratio(r['first_write_s'], session_timeout_s)):>12}"
        )
    for kind, s in result["summary"].items():
        rows.append(
            f"{'med':>5} {kind:<18} {'':<8} {fmt(s['first_write_s_median'], 3):>13} "
            f"{fmt(s['all_moved_s_median'], 3):>11} {fmt(s['controller_elected_s_median'], 3):>11} "
            f"{fmt(s['assignment_s_median'], 3):>10} {fmt(s['serving_s_median'], 3):>8} "
            f"{fmt(s['claim_open_s_median'], 3):>10} {fmt(s['range_open_s_median'], 3):>10} "
            f"{fmt(s['restore_s_median'], 3):>8} "
            f"{fmt(s['replay_s_median'], 2):>14} {'':>6} "
            f"{'x' + fmt(s['ratio_to_session_timeout']):>12}"
        )
    rows.append(
        f"anchor: ZooKeeper session timeout {session_timeout_s:g}s (the floor of failure "
        "detection); goal: first write < 3 s"
    )
    return "\n".join(rows)


# --------------------------------------------------------------------------- throughput


@dataclass
class ThroughputRun:
    config: str
    servers: int
    repeat: int
    ops: int
    elapsed_s: float
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    per_op: dict[str, dict[str, float]]
    errors: int
    first_error: str | None
    misses: int
    server_cpu_pct: float | None
    pulsar_cpu_pct: float | None
    client_cpu_pct: float
    loadavg_1m: float
    preload_s: float


def worker_config(args: argparse.Namespace, service: str, index: int) -> dict[str, Any]:
    return {
        "service": service,
        "index": index,
        "concurrency": args.concurrency,
        "warmup": args.warmup,
        "duration": args.duration,
        "value_size": args.value_size,
        "keys": args.keys,
        "incr_keys": args.incr_keys,
        "mix": args.mix,
        "seed": args.seed,
        "routing": args.routing,
    }


async def worker_main(cfg: dict[str, Any]) -> dict[str, Any]:
    """One client process of the throughput part (started with --worker-config)."""
    client = AsyncClient(cfg["service"], **client_kwargs(cfg["routing"]))
    table = await client.table(NAMESPACE, TABLE)
    keys = [b"k%06d" % i for i in range(cfg["keys"])]
    counters = [b"c%05d" % i for i in range(cfg["incr_keys"])]
    rnd0 = random.Random(cfg["seed"] * 7919 + cfg["index"])
    value = rnd0.randbytes(cfg["value_size"])
    await table.get(keys[0], keys[0])
    print("READY", flush=True)
    start = float(await asyncio.to_thread(sys.stdin.readline))
    measure_start = start + cfg["warmup"]
    end = measure_start + cfg["duration"]
    await asyncio.sleep(max(0.0, start - time.time()))
    ops = list(cfg["mix"])
    weights = [cfg["mix"][op] for op in ops]
    samples: dict[str, array.array[int]] = {op: array.array("q") for op in OPS}
    errors = misses = 0
    first_error: str | None = None
    cpu0: float | None = None

    async def worker(idx: int) -> None:
        nonlocal errors, misses, first_error
        rnd = random.Random(cfg["seed"] * 1_000_003 + cfg["index"] * 1009 + idx)
        perf = time.perf_counter_ns
        while True:
            now = time.time()
            if now >= end:
                return
            op = rnd.choices(ops, weights)[0]
            t0 = perf()
            try:
                if op == "get":
                    k = keys[rnd.randrange(len(keys))]
                    if await table.get(k, k) is None and now >= measure_start:
                        misses += 1
                elif op == "put":
                    k = keys[rnd.randrange(len(keys))]
                    await table.put(k, k, value)
                else:
                    c = counters[rnd.randrange(len(counters))]
                    await table.increment(c, c, 1)
            except Exception as e:  # noqa: BLE001 - counted, the run goes on
                if now >= measure_start:
                    errors += 1
                    if first_error is None:
                        first_error = f"{type(e).__name__}: {e}"[:300]
                await asyncio.sleep(0.001)
                continue
            if now >= measure_start:
                samples[op].append(perf() - t0)

    async def mark() -> None:
        nonlocal cpu0
        await asyncio.sleep(max(0.0, measure_start - time.time()))
        cpu0 = time.process_time()

    marker = asyncio.create_task(mark())
    await asyncio.gather(*(worker(i) for i in range(cfg["concurrency"])))
    await marker
    cpu = time.process_time() - (cpu0 if cpu0 is not None else 0.0)
    await client.close()
    return {
        "samples": {op: base64.b64encode(s.tobytes()).decode() for op, s in samples.items()},
        "errors": errors,
        "misses": misses,
        "first_error": first_error,
        "cpu_s": cpu,
    }


def run_worker_process(config_json: str) -> int:
    cfg = json.loads(config_json)
    result = asyncio.run(worker_main(cfg))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _read_line(proc: subprocess.Popen[str], prefix: str, what: str) -> str:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise BenchError(f"{what} exited (code {proc.wait()}) before printing {prefix}")
        if line.startswith(prefix):
            return line[len(prefix) :].strip()


async def run_load(
    args: argparse.Namespace,
    endpoints: Sequence[str],
    server_pids: Sequence[int | None],
    pulsar_pid: int | None,
) -> tuple[dict[str, Any], float | None, float | None]:
    """Run the client processes against `endpoints`; returns merged results and the server and
    Pulsar CPU % over the measured window."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for i in range(args.client_procs):
            service = f"bk://{endpoints[i % len(endpoints)]}"
            cfg = worker_config(args, service, i)
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "--worker-config"]
                    + [json.dumps(cfg)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=src_env(),
                    text=True,
                    cwd=str(REPO_ROOT),
                )
            )
        for i, p in enumerate(procs):
            await asyncio.to_thread(_read_line, p, "READY", f"client process {i}")
        start = time.time() + 0.3
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{start}\n")
            p.stdin.flush()
        measure_start = start + args.warmup
        await asyncio.sleep(max(0.0, measure_start - time.time()))
        srv0 = [proc_cpu_s(pid) for pid in server_pids]
        pul0 = proc_cpu_s(pulsar_pid)
        t0 = time.time()
        await asyncio.sleep(max(0.0, measure_start + args.duration - time.time()))
        srv1 = [proc_cpu_s(pid) for pid in server_pids]
        pul1 = proc_cpu_s(pulsar_pid)
        window = max(1e-9, time.time() - t0)
        results = [
            json.loads(await asyncio.to_thread(_read_line, p, "RESULT ", f"client process {i}"))
            for i, p in enumerate(procs)
        ]
        for p in procs:
            p.wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    server_cpu = None
    deltas = [b - a for a, b in zip(srv0, srv1, strict=True) if a is not None and b is not None]
    if len(deltas) == len(server_pids):
        server_cpu = 100.0 * sum(deltas) / window
    pulsar_cpu = 100.0 * (pul1 - pul0) / window if pul0 is not None and pul1 is not None else None
    return {"workers": results}, server_cpu, pulsar_cpu


def merge_results(
    raw: dict[str, Any], duration: float
) -> tuple[dict[str, array.array[int]], int, int, str | None, float]:
    per_op: dict[str, array.array[int]] = {op: array.array("q") for op in OPS}
    errors = misses = 0
    first_error: str | None = None
    cpu = 0.0
    for w in raw["workers"]:
        for op, b64 in w["samples"].items():
            per_op[op].frombytes(base64.b64decode(b64))
        errors += w["errors"]
        misses += w["misses"]
        first_error = first_error or w["first_error"]
        cpu += w["cpu_s"]
    return per_op, errors, misses, first_error, 100.0 * cpu / duration


async def throughput_config(
    args: argparse.Namespace, infra: Infra, config: str, n: int, rep: int
) -> ThroughputRun:
    tag = f"tp{os.getpid()}-{config}-{rep}"
    cluster: TestCluster | None = None
    if config == "standalone":
        servers = [infra.new_standalone(tag, args.containers)]
    else:
        cluster = infra.new_cluster(tag, args)
        servers = cluster.servers
    try:
        if cluster is None:
            await start_standalone(servers[0], args.containers, args.ready_timeout)
        else:
            await start_cluster(cluster, n, args.ready_timeout, f"{config} start")
        endpoints = [s.target for s in servers]
        async with AsyncClient("bk://" + ",".join(endpoints), **client_kwargs(args.routing)) as c:
            await c.create_namespace(NAMESPACE)
            await c.create_table(NAMESPACE, TABLE, ranges=args.ranges or args.containers)
            t0 = time.monotonic()
            table = await c.table(NAMESPACE, TABLE)
            keys = [b"k%06d" % i for i in range(args.keys)]
            value = random.Random(args.seed).randbytes(args.value_size)
            for i in range(0, len(keys), args.load_batch):
                items = [(k, k, value) for k in keys[i : i + args.load_batch]]
                errs = await table.batch_put(items)
                if any(errs):
                    raise BenchError(f"preload: {next(e for e in errs if e)}")
            preload_s = time.monotonic() - t0
        load0 = os.getloadavg()[0]
        eprint(f"throughput {config} (repeat {rep}): preloaded {len(keys)} keys; running")
        assert infra.pulsar is not None
        raw, server_cpu, pulsar_cpu = await run_load(
            args,
            endpoints,
            [s.process.pid if s.process else None for s in servers],
            infra.pulsar.pid,
        )
        dead = [s.target for s in servers if not s.running]
        if dead:
            raise BenchError(f"{config}: server(s) {dead} exited during the run")
    finally:
        if cluster is None:
            stop_all(servers, 30)
        else:
            cluster.close()
    per_op, errors, misses, first_error, client_cpu = merge_results(raw, args.duration)
    merged = sorted(x for s in per_op.values() for x in s)
    total = len(merged)
    op_stats = {}
    for op, op_samples in per_op.items():
        ss = sorted(op_samples)
        op_stats[op] = {
            "ops_per_s": len(ss) / args.duration,
            "p50_ms": percentile(ss, 50) / 1e6,
            "p99_ms": percentile(ss, 99) / 1e6,
        }
    return ThroughputRun(
        config=config,
        servers=n,
        repeat=rep,
        ops=total,
        elapsed_s=args.duration,
        ops_per_s=total / args.duration,
        p50_ms=percentile(merged, 50) / 1e6,
        p99_ms=percentile(merged, 99) / 1e6,
        per_op=op_stats,
        errors=errors,
        first_error=first_error,
        misses=misses,
        server_cpu_pct=server_cpu,
        pulsar_cpu_pct=pulsar_cpu,
        client_cpu_pct=client_cpu,
        loadavg_1m=round((load0 + os.getloadavg()[0]) / 2, 2),
        preload_s=preload_s,
    )


def config_servers(config: str) -> int:
    return 1 if config == "standalone" else int(config)


async def throughput_part(args: argparse.Namespace, infra: Infra) -> dict[str, Any]:
    runs: list[ThroughputRun] = []
    for rep in range(1, args.repeats + 1):
        for config in args.configs:
            r = await throughput_config(args, infra, config, config_servers(config), rep)
            runs.append(r)
            extra = f" errors={r.errors} ({r.first_error})" if r.errors else ""
            eprint(
                f"  {config:<10} rep {rep}: {r.ops_per_s:8.0f} ops/s  p50 {fmt(r.p50_ms, 2)} ms  "
                f"p99 {fmt(r.p99_ms, 2)} ms  servers cpu {fmt(r.server_cpu_pct, 0)}%  "
                f"pulsar cpu {fmt(r.pulsar_cpu_pct, 0)}%  clients cpu "
                f"{fmt(r.client_cpu_pct, 0)}%{extra}"
            )
    summary = {}
    for config in args.configs:
        rs = [r for r in runs if r.config == config]
        summary[config] = {
            "servers": config_servers(config),
            "ops_per_s": statistics.median(r.ops_per_s for r in rs),
            "p50_ms": statistics.median(r.p50_ms for r in rs),
            "p99_ms": statistics.median(r.p99_ms for r in rs),
            "errors": sum(r.errors for r in rs),
            "server_cpu_pct": median_or_none([r.server_cpu_pct for r in rs]),
            "pulsar_cpu_pct": median_or_none([r.pulsar_cpu_pct for r in rs]),
            "client_cpu_pct": statistics.median(r.client_cpu_pct for r in rs),
        }
    anchor = summary.get("standalone")
    one = summary.get("1")
    for s in summary.values():
        s["ratio_vs_standalone"] = ratio(s["ops_per_s"], anchor["ops_per_s"]) if anchor else None
        s["ratio_vs_1_server"] = ratio(s["ops_per_s"], one["ops_per_s"]) if one else None
    return {"runs": [asdict(r) for r in runs], "summary": summary}


def render_throughput(result: dict[str, Any], args: argparse.Namespace) -> str:
    header = (
        f"{'config':<12} {'rep':>3} {'ops/s':>8} {'p50 ms':>7} {'p99 ms':>8} "
        f"{'get p50/p99':>14} {'put p50/p99':>14} {'incr p50/p99':>14} {'errors':>6} "
        f"{'srv cpu%':>8} {'pulsar%':>7} {'cli cpu%':>8} {'load':>5}"
    )
    rows = [
        f"throughput: mix {args.mix}, {args.client_procs} client processes x "
        f"{args.concurrency} concurrent, {args.duration:g}s measured after {args.warmup:g}s",
        header,
        "-" * len(header),
    ]
    for r in result["runs"]:
        cells = []
        for op in OPS:
            s = r["per_op"][op]
            cells.append(f"{fmt(s['p50_ms'], 1)}/{fmt(s['p99_ms'], 1)}")
        rows.append(
            f"{label(r['config']):<12} {r['repeat']:>3} {r['ops_per_s']:>8.0f} "
            f"{fmt(r['p50_ms'], 2):>7} {fmt(r['p99_ms'], 2):>8} {cells[0]:>14} {cells[1]:>14} "
            f"{cells[2]:>14} {r['errors']:>6} {fmt(r['server_cpu_pct'], 0):>8} "
            f"{fmt(r['pulsar_cpu_pct'], 0):>7} {fmt(r['client_cpu_pct'], 0):>8} "
            f"{r['loadavg_1m']:>5.1f}"
        )
    rows.append("")
    header2 = (
        f"{'median':<12} {'ops/s':>8} {'p50 ms':>7} {'p99 ms':>8} "
        f"{'x standalone':>12} {'x 1 server':>10}"
    )
    rows += [header2, "-" * len(header2)]
    for config, s in result["summary"].items():
        rows.append(
            f"{label(config):<12} {s['ops_per_s']:>8.0f} {fmt(s['p50_ms'], 2):>7} "
            f"{fmt(s['p99_ms'], 2):>8} {fmt(s['ratio_vs_standalone'], 2):>12} "
            f"{fmt(s['ratio_vs_1_server'], 2):>10}"
        )
    rows.append("anchor: the standalone server (no ZooKeeper) on the same Pulsar log")
    return "\n".join(rows)


def label(config: str) -> str:
    if config == "standalone":
        return "standalone"
    return f"{config} server" + ("s" if config != "1" else "")


# --------------------------------------------------------------------------- main


def non_negative_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def csv_list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError("empty list")
    return items


def parse_mix(text: str) -> dict[str, int]:
    mix: dict[str, int] = {}
    for part in csv_list(text):
        op, _, weight = part.partition("=")
        if op not in OPS or not weight.isdigit():
            raise argparse.ArgumentTypeError(f"bad mix item {part!r}: use get=N,put=N,incr=N")
        mix[op] = int(weight)
    if not any(mix.values()):
        raise argparse.ArgumentTypeError("the mix needs a positive weight")
    return mix


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/cluster.py",
        description=(
            "Cluster-mode benchmark: (1) failover time after SIGKILL of a server, against the "
            "ZooKeeper session timeout; (2) aggregate throughput of 1, 2 and 3 server processes, "
            "against the standalone server on the same Pulsar. Starts ZooKeeper, Pulsar and the "
            "servers on free 127.0.0.1 ports in a temporary directory and stops them at the end. "
            "Prints both tables and writes JSON to benchmarks/out/."
        ),
        epilog=(
            "examples:\n"
            "  benchmarks/cluster.py                              # both parts, defaults\n"
            "  benchmarks/cluster.py --part failover --keys-per-container 20000 --rounds 1\n"
            "  benchmarks/cluster.py --part throughput --duration 5 --configs standalone,1,3\n"
            "  benchmarks/cluster.py --zk 127.0.0.1:2181 --pulsar-url pulsar://127.0.0.1:6650 \\\n"
            "      --pulsar-admin-url http://127.0.0.1:8080      # reuse running ones\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--part",
        type=csv_list,
        default=["failover", "throughput"],
        help="comma list of failover,throughput (default both)",
    )
    c = p.add_argument_group("cluster")
    c.add_argument("--containers", type=positive_int, default=6, help="storage containers (6)")
    c.add_argument(
        "--ranges",
        type=non_negative_int,
        default=0,
        help="ranges of the benchmark table (default: one per container)",
    )
    c.add_argument(
        "--zk-session-timeout",
        type=float,
        default=2.0,
        help="servers' ZooKeeper session timeout, seconds (default 2)",
    )
    c.add_argument(
        "--routing",
        choices=("default", "forward", "direct"),
        default="default",
        help="SDK routing: the SDK's default, 'forward' (ops to the client's server, which "
        "forwards) or 'direct' (to the range's owner; needs an SDK with direct_routing)",
    )
    c.add_argument("--value-size", type=int, default=100, help="value bytes (default 100)")
    c.add_argument(
        "--checkpoint-records",
        type=non_negative_int,
        default=None,
        help="every server's --checkpoint-records (default: theirs); periodic checkpoints "
        "are off (--checkpoint-interval 0), so 0 leaves only the failover rounds' checkpoints",
    )
    c.add_argument("--seed", type=int, default=1)
    c.add_argument(
        "--ready-timeout",
        type=float,
        default=180.0,
        help="seconds to wait for a cluster to serve every container (default 180)",
    )

    f = p.add_argument_group("failover")
    f.add_argument("--servers", type=positive_int, default=3, help="servers (default 3)")
    f.add_argument(
        "--keys-per-container",
        type=positive_int,
        default=100_000,
        help="keys loaded into each container before the rounds (default 100000)",
    )
    f.add_argument(
        "--tail-keys-per-container",
        type=non_negative_int,
        default=10_000,
        help="keys per container rewritten after each round's checkpoint: the log tail a "
        "takeover replays (default 10000)",
    )
    f.add_argument("--rounds", type=positive_int, default=3, help="kills per victim kind (3)")
    f.add_argument(
        "--victims",
        type=csv_list,
        default=["member", "controller"],
        help="comma list of member (a server that is not the controller), controller "
        "(default both, alternating)",
    )
    f.add_argument(
        "--followers",
        choices=("off", "on", "both", "standby"),
        default="off",
        help="keep followers of every range on the servers not owning it before each kill: "
        "off, on (made by a follower read of each range), both (each kill once without, "
        "once with), or standby (the servers run with --standby; default off)",
    )
    f.add_argument(
        "--writers-per-container",
        type=positive_int,
        default=2,
        help="concurrent writer tasks per container during the kill (default 2)",
    )
    f.add_argument(
        "--writer-keys", type=positive_int, default=8, help="pkeys per container they cycle (8)"
    )
    f.add_argument(
        "--pre-kill-s", type=float, default=1.0, help="writing before the kill (default 1)"
    )
    f.add_argument(
        "--failover-timeout",
        type=float,
        default=60.0,
        help="give up waiting for the moved containers after this long (default 60)",
    )
    f.add_argument(
        "--load-batch", type=positive_int, default=1000, help="keys per batch_put (1000)"
    )
    f.add_argument(
        "--load-inflight", type=positive_int, default=8, help="batch_put calls in flight (8)"
    )

    t = p.add_argument_group("throughput")
    t.add_argument(
        "--configs",
        type=csv_list,
        default=["standalone", "1", "2", "3"],
        help="comma list of standalone and server counts (default standalone,1,2,3)",
    )
    t.add_argument(
        "--client-procs", type=positive_int, default=4, help="client processes (default 4)"
    )
    t.add_argument(
        "--concurrency", type=positive_int, default=64, help="asyncio workers per process (64)"
    )
    t.add_argument("--duration", type=float, default=10.0, help="measured seconds (default 10)")
    t.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds first (3)")
    t.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        help="passes over --configs, interleaved; medians are reported (default 1)",
    )
    t.add_argument(
        "--mix",
        type=parse_mix,
        default={"get": 50, "put": 30, "incr": 20},
        help="op weights (default get=50,put=30,incr=20)",
    )
    t.add_argument(
        "--keys", type=positive_int, default=10_000, help="put/get keys, preloaded (10000)"
    )
    t.add_argument("--incr-keys", type=positive_int, default=1_000, help="counter keys (1000)")

    i = p.add_argument_group("infrastructure")
    i.add_argument("--zk", default=None, help="use this ZooKeeper (host:port) instead of one here")
    i.add_argument("--pulsar-url", default=None, help="use this Pulsar instead of starting one")
    i.add_argument("--pulsar-admin-url", default=None, help="its admin URL (with --pulsar-url)")
    i.add_argument("--workdir", type=Path, default=None, help="(default: a new temp directory)")
    i.add_argument("--keep-data", action="store_true", help="keep the work directory and logs")
    i.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/out/)")
    i.add_argument("--worker-config", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [x for x in args.part if x not in ("failover", "throughput")]
    if bad:
        p.error(f"unknown part(s) {bad}")
    bad = [x for x in args.victims if x not in ("member", "controller")]
    if bad:
        p.error(f"unknown victim kind(s) {bad}")
    bad = [x for x in args.configs if x != "standalone" and not x.isdigit()]
    if bad or any(x == "0" for x in args.configs):
        p.error("--configs: standalone or positive server counts")
    if bool(args.pulsar_url) != bool(args.pulsar_admin_url):
        p.error("--pulsar-url and --pulsar-admin-url go together")
    if "failover" in args.part and args.servers < 2:
        p.error("failover needs --servers >= 2")
    if args.duration <= 0 or args.warmup < 0:
        p.error("--duration must be > 0 and --warmup >= 0")
    return args


async def run_parts(args: argparse.Namespace, infra: Infra) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if "failover" in args.part:
        results["failover"] = await failover_part(args, infra)
        print()
        print(render_failover(results["failover"], args.zk_session_timeout), flush=True)
    if "throughput" in args.part:
        results["throughput"] = await throughput_part(args, infra)
        print()
        print(render_throughput(results["throughput"], args), flush=True)
    return results


def add_infra_args(p: argparse.ArgumentParser) -> None:
    """The options of a benchmark that runs one cluster through `run_on_infra`."""
    p.add_argument("--zk", help="a running ZooKeeper HOST:PORT (default: start one)")
    p.add_argument("--pulsar-url", help="a running Pulsar (default: start one)")
    p.add_argument("--pulsar-admin-url", help="its admin URL (with --pulsar-url)")
    p.add_argument("--zk-session-timeout", type=float, default=2.0, help=argparse.SUPPRESS)
    p.add_argument("--ready-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    p.add_argument("--workdir", type=Path, help="keep everything here (default: a temp dir)")
    p.add_argument("--out", type=Path, help="JSON result file (default: benchmarks/out/)")


def run_on_infra(
    args: argparse.Namespace,
    name: str,
    run: Callable[[argparse.Namespace, Infra], Awaitable[dict[str, Any]]],
    render: Callable[[dict[str, Any]], str],
    argv: Sequence[str] | None,
) -> int:
    """Run a benchmark `name` (benchmarks/<name>.py) on a ZooKeeper and Pulsar started here or
    given (`add_infra_args`), print what `render` makes of its result and write the JSON
    report; the exit status."""
    started = dt.datetime.now(dt.UTC)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"tk-{name}-bench-"))
    infra = Infra(workdir=workdir)
    result: dict[str, Any] = {}
    with sigterm_as_interrupt():
        try:
            infra.use_or_start(args.zk, args.pulsar_url, args.pulsar_admin_url)
            result = asyncio.run(run(args, infra))
        except BenchError as e:
            eprint(f"error: {e}")
        except KeyboardInterrupt:
            eprint("interrupted")
        finally:
            infra.stop()
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
    if not result:
        return 1
    print(render(result))
    report = {
        "benchmark": f"benchmarks/{name}.py",
        "started_utc": started.isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "git": git_info(),
        "cpus": os.cpu_count(),
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
        "results": result,
    }
    stamp = started.strftime("%Y%m%dT%H%M%S")
    out = args.out or OUT_DIR / f"{name.replace('_', '-')}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    eprint(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker_config is not None:
        return run_worker_process(args.worker_config)
    started = dt.datetime.now(dt.UTC)
    load_start = os.getloadavg()
    if load_start[0] > 1.0:
        eprint(f"warning: load average {load_start[0]:.1f} before start; expect noise")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-cluster-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    infra = Infra(workdir=workdir)
    if args.checkpoint_records is not None:
        infra.checkpoint_args = [f"--checkpoint-records={args.checkpoint_records}"]
    failed = False
    results: dict[str, Any] = {}
    with sigterm_as_interrupt():
        try:
            infra.use_or_start(args.zk, args.pulsar_url, args.pulsar_admin_url)
            eprint(f"work directory {workdir}; {sdk_routing_description(args.routing)}")
            results = asyncio.run(run_parts(args, infra))
        except BenchError as e:
            failed = True
            eprint(f"error: {e}")
            for s in infra.servers():
                if s.log_path.exists():
                    eprint(f"--- {s.log_path} (tail):\n{s.log_tail(25)}")
        except KeyboardInterrupt:
            eprint("interrupted")
            failed = True
        finally:
            infra.stop()
            if args.keep_data or failed:
                eprint(f"kept the work directory (logs) {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    if not results:
        return 1
    report = {
        "benchmark": "benchmarks/cluster.py",
        "started_utc": started.isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "git": git_info(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "sdk_routing": sdk_routing_description(args.routing),
        "environment": {
            "python": sys.version.split()[0],
            "grpcio": grpc.__version__,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_1m_start": round(load_start[0], 2),
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        },
        "results": results,
    }
    out = args.out
    if out is None:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        out = OUT_DIR / f"cluster-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(no_nan(report), indent=2, default=str) + "\n")
    print(f"\nJSON: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
