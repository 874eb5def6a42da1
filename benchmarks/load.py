#!/usr/bin/env python3
"""Closed-loop load benchmark: TableKeeper vs etcd (the performance anchor).

Runs the same workload (put / get / incr over the same key space, value size,
concurrency and duration) against TableKeeper and against etcd in one invocation
and prints both plus the TableKeeper/etcd ratio. See benchmarks/README.md.

Load model: for each (op, concurrency) cell, N asyncio workers each issue requests
back to back (closed loop, no think time) for --warmup seconds (not recorded) and
then --duration seconds (recorded). Every request's latency is taken with
time.perf_counter_ns(). Cells are interleaved target by target (tk, etcd, tk, ...)
so slow drift on the machine hits both sides alike.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import datetime as dt
import gc
import json
import os
import platform
import random
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from _etcd import etcd_kv_pb2 as epb  # noqa: E402
from _etcd import etcd_kv_pb2_grpc as epb_grpc  # noqa: E402

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for tests.support and benchmarks._common

from benchmarks._common import (  # noqa: E402
    fmt,
    git_info,
    no_nan,
    percentile,
    positive_int,
    proc_cpu_s,
    sigterm_as_interrupt,
    src_env,
)
from tests.support.etcd import EtcdProcess  # noqa: E402
from tests.support.server import ServerProcess, stop_all  # noqa: E402

OPS = ("put", "get", "incr")
TARGETS = ("tablekeeper", "etcd")
OUT_DIR = BENCH_DIR / "out"
COUNTER = struct.Struct(">q")  # 8-byte big-endian signed, like BookKeeper's long values
MAX_CAS_ATTEMPTS = 10_000

INCR_NOTE_ETCD = (
    "etcd has no native increment: etcd 'incr' is a Txn compare-and-swap "
    "read-modify-write (compare mod_revision, put the 8-byte big-endian value + 1, "
    "on conflict read the current value in the same Txn and retry); one op = one "
    "successful increment, its latency includes every retry."
)


class BenchError(RuntimeError):
    """A fatal setup problem (server not reachable, SDK missing, ...)."""


class KeyMissingError(RuntimeError):
    """A get returned no value for a key the preload wrote."""


# --------------------------------------------------------------------------- drivers


class Driver(Protocol):
    """One benchmark target. `slot` picks the client/channel a worker uses."""

    name: str
    channels: int

    async def setup(self, deadline_s: float) -> None: ...
    async def close(self) -> None: ...
    async def put(self, slot: int, key: bytes, value: bytes) -> None: ...
    async def get(self, slot: int, key: bytes) -> None: ...
    async def incr(self, slot: int, key: bytes) -> None: ...
    def reset_counters(self) -> None: ...
    def counters(self) -> dict[str, int]: ...


class EtcdDriver:
    """etcd v3 over grpc.aio, using the small stub in benchmarks/_etcd."""

    name = "etcd"

    def __init__(self, endpoint: str, channels: int, serializable: bool) -> None:
        self.endpoint = endpoint.removeprefix("http://").rstrip("/")
        self.channels = channels
        self.serializable = serializable
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[epb_grpc.KVStub] = []
        # key -> (mod_revision, value) last seen; shared by all workers (one event loop).
        self._cas_cache: dict[bytes, tuple[int, int] | None] = {}
        self._attempts = 0
        self._conflicts = 0

    async def setup(self, deadline_s: float) -> None:
        for _ in range(self.channels):
            # A local subchannel pool gives every channel its own HTTP/2 connection.
            ch = grpc.aio.insecure_channel(
                self.endpoint, options=[("grpc.use_local_subchannel_pool", 1)]
            )
            self._channels.append(ch)
            self._stubs.append(epb_grpc.KVStub(ch))
        last: BaseException | None = None
        while time.monotonic() < deadline_s:
            try:
                await self._stubs[0].Range(epb.RangeRequest(key=b"\0probe"), timeout=2)
                return
            except grpc.aio.AioRpcError as e:
                last = e
                await asyncio.sleep(0.2)
        raise BenchError(f"etcd at {self.endpoint} not reachable: {last}")

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()

    async def put(self, slot: int, key: bytes, value: bytes) -> None:
        await self._stubs[slot].Put(epb.PutRequest(key=key, value=value))

    async def get(self, slot: int, key: bytes) -> None:
        resp = await self._stubs[slot].Range(
            epb.RangeRequest(key=key, serializable=self.serializable)
        )
        if not resp.kvs:
            raise KeyMissingError(key.decode())

    async def incr(self, slot: int, key: bytes) -> None:
        stub = self._stubs[slot]
        cached = self._cas_cache.get(key)
        for _ in range(MAX_CAS_ATTEMPTS):
            self._attempts += 1
            if cached is None:
                cmp = epb.Compare(
                    key=key,
                    target=epb.Compare.VERSION,
                    result=epb.Compare.EQUAL,
                    version=0,
                )
                new = 1
            else:
                mod_rev, cur = cached
                cmp = epb.Compare(
                    key=key,
                    target=epb.Compare.MOD,
                    result=epb.Compare.EQUAL,
                    mod_revision=mod_rev,
                )
                new = cur + 1
            resp = await stub.Txn(
                epb.TxnRequest(
                    compare=[cmp],
                    success=[
                        epb.RequestOp(request_put=epb.PutRequest(key=key, value=COUNTER.pack(new)))
                    ],
                    failure=[epb.RequestOp(request_range=epb.RangeRequest(key=key))],
                )
            )
            if resp.succeeded:
                # A single-put Txn bumps the store revision by one: that is the key's
                # new mod_revision.
                self._cas_cache[key] = (resp.header.revision, new)
                return
            self._conflicts += 1
            kvs = resp.responses[0].response_range.kvs
            if kvs:
                kv = kvs[0]
                if len(kv.value) != COUNTER.size:
                    raise ValueError(f"etcd key {key!r} does not hold an 8-byte counter")
                cached = (kv.mod_revision, COUNTER.unpack(kv.value)[0])
            else:
                cached = None
            self._cas_cache[key] = cached
        raise RuntimeError(f"CAS on {key!r} did not succeed in {MAX_CAS_ATTEMPTS} attempts")

    def reset_counters(self) -> None:
        self._attempts = 0
        self._conflicts = 0

    def counters(self) -> dict[str, int]:
        return {"txn_attempts": self._attempts, "cas_conflicts": self._conflicts}


def import_tablekeeper() -> ModuleType:
    """Import the SDK, falling back to the source tree when it is not installed."""
    try:
        import tablekeeper
    except ImportError:
        for sub in ("client", "proto/gen"):
            p = str(REPO_ROOT / sub)
            if p not in sys.path:
                sys.path.insert(0, p)
        try:
            import tablekeeper
        except ImportError as e:
            raise BenchError(
                f"TableKeeper SDK not importable ({e}); is client/tablekeeper written?"
            ) from e
    return tablekeeper


@contextlib.contextmanager
def own_connection_per_channel() -> Iterator[None]:
    """Make every grpc.aio channel created inside the block use its own connection.

    gRPC shares one connection (subchannel) among channels with identical target and
    arguments, so K AsyncClients would otherwise still be one TCP connection. The SDK
    does not take channel options, so while its clients build their channels we add
    ``grpc.use_local_subchannel_pool`` to the options they pass.
    """
    original = grpc.aio.insecure_channel

    def patched(target: str, options: Any = None, *args: Any, **kwargs: Any) -> Any:
        opts = [*(options or ()), ("grpc.use_local_subchannel_pool", 1)]
        return original(target, opts, *args, **kwargs)

    grpc.aio.insecure_channel = patched
    try:
        yield
    finally:
        grpc.aio.insecure_channel = original


class TableKeeperDriver:
    """TableKeeper through the asyncio SDK; `channels` independent AsyncClients."""

    name = "tablekeeper"

    def __init__(
        self,
        service: str,
        channels: int,
        namespace: str,
        table: str,
        ranges: int,
        empty_lkey: bool,
        coalesce: bool = True,
    ) -> None:
        self.coalesce = coalesce
        self.service = service
        self.channels = channels
        self.namespace = namespace
        self.table_name = table
        self.ranges = ranges
        self.empty_lkey = empty_lkey
        self._clients: list[Any] = []
        self._tables: list[Any] = []

    def _lkey(self, key: bytes) -> bytes:
        return b"" if self.empty_lkey else key

    async def setup(self, deadline_s: float) -> None:
        if self.channels == 1:
            await self._setup(deadline_s)
            return
        with own_connection_per_channel():
            await self._setup(deadline_s)

    async def _setup(self, deadline_s: float) -> None:
        tk = import_tablekeeper()
        self._clients = [
            tk.AsyncClient(self.service, coalesce=self.coalesce) for _ in range(self.channels)
        ]
        first = self._clients[0]
        last: BaseException | None = None
        while True:  # the server may still be booting: retry until the deadline
            try:
                with contextlib.suppress(tk.NamespaceExistsError):
                    await first.create_namespace(self.namespace)
                break
            except Exception as e:  # noqa: BLE001 - any failure means "not ready yet"
                last = e
                if time.monotonic() >= deadline_s:
                    raise BenchError(f"TableKeeper at {self.service} not ready: {last!r}") from e
                await asyncio.sleep(0.3)
        with contextlib.suppress(tk.TableExistsError):
            await first.create_table(self.namespace, self.table_name, ranges=self.ranges)
        while True:  # a freshly created table's ranges may take a moment to be served
            try:
                self._tables = [
                    await c.table(self.namespace, self.table_name) for c in self._clients
                ]
                await self._tables[0].get(b"\0probe", self._lkey(b"\0probe"))
                return
            except Exception as e:  # noqa: BLE001
                if time.monotonic() >= deadline_s:
                    raise BenchError(f"TableKeeper table not usable: {e!r}") from e
                await asyncio.sleep(0.3)

    async def close(self) -> None:
        for c in self._clients:
            with contextlib.suppress(Exception):
                await c.close()

    async def put(self, slot: int, key: bytes, value: bytes) -> None:
        await self._tables[slot].put(key, self._lkey(key), value)

    async def get(self, slot: int, key: bytes) -> None:
        kv = await self._tables[slot].get(key, self._lkey(key))
        if kv is None:
            raise KeyMissingError(key.decode())

    async def incr(self, slot: int, key: bytes) -> None:
        await self._tables[slot].increment(key, self._lkey(key), 1)

    def reset_counters(self) -> None:
        pass

    def counters(self) -> dict[str, int]:
        return {}


# --------------------------------------------------------------------------- measuring


@dataclass
class CellResult:
    target: str
    op: str
    concurrency: int
    channels: int
    ops: int
    elapsed_s: float
    ops_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    mean_ms: float
    errors: int
    first_error: str | None
    server_cpu_pct: float | None
    client_cpu_pct: float
    counters: dict[str, int] = field(default_factory=dict)


async def run_cell(
    driver: Driver,
    op: str,
    concurrency: int,
    keys: Sequence[bytes],
    value: bytes,
    warmup_s: float,
    duration_s: float,
    seed: int,
    server_pid: int | None,
) -> CellResult:
    async def put_fixed_value(slot: int, key: bytes) -> None:
        await driver.put(slot, key, value)

    fn: Callable[[int, bytes], Awaitable[None]]
    if op == "put":
        fn = put_fixed_value
    elif op == "get":
        fn = driver.get
    else:
        fn = driver.incr

    errors = 0
    first_error: str | None = None
    n_keys = len(keys)
    t_start = time.perf_counter_ns()
    measure_start = t_start + int(warmup_s * 1e9)
    t_end = measure_start + int(duration_s * 1e9)
    recording = asyncio.Event()

    async def worker(idx: int) -> array.array[int]:
        nonlocal errors, first_error
        rnd = random.Random(seed * 1_000_003 + idx)
        slot = idx % driver.channels
        samples: array.array[int] = array.array("q")
        perf = time.perf_counter_ns
        while True:
            t0 = perf()
            if t0 >= t_end:
                return samples
            key = keys[rnd.randrange(n_keys)]
            try:
                await fn(slot, key)
            except Exception as e:  # noqa: BLE001 - counted, the run goes on
                if t0 >= measure_start:
                    errors += 1
                    if first_error is None:
                        first_error = f"{type(e).__name__}: {e}"[:500]
                await asyncio.sleep(0.001)  # no hot spin against a failing server
                continue
            if t0 >= measure_start:
                samples.append(perf() - t0)

    async def mark_recording() -> tuple[float | None, float]:
        await asyncio.sleep(max(0.0, (measure_start - time.perf_counter_ns()) / 1e9))
        driver.reset_counters()
        recording.set()
        return proc_cpu_s(server_pid), time.process_time()

    marker = asyncio.create_task(mark_recording())
    per_worker = await asyncio.gather(*(worker(i) for i in range(concurrency)))
    t_done = time.perf_counter_ns()
    srv_cpu_end, cli_cpu_end = proc_cpu_s(server_pid), time.process_time()
    srv_cpu_start, cli_cpu_start = await marker

    merged = sorted(x for s in per_worker for x in s)
    elapsed = max(1e-9, (t_done - measure_start) / 1e9)
    n = len(merged)
    server_cpu = (
        100.0 * (srv_cpu_end - srv_cpu_start) / elapsed
        if srv_cpu_start is not None and srv_cpu_end is not None
        else None
    )
    return CellResult(
        target=driver.name,
        op=op,
        concurrency=concurrency,
        channels=driver.channels,
        ops=n,
        elapsed_s=round(elapsed, 3),
        ops_per_s=n / elapsed,
        p50_ms=percentile(merged, 50) / 1e6,
        p90_ms=percentile(merged, 90) / 1e6,
        p99_ms=percentile(merged, 99) / 1e6,
        p999_ms=percentile(merged, 99.9) / 1e6,
        max_ms=merged[-1] / 1e6 if merged else float("nan"),
        mean_ms=(sum(merged) / n / 1e6) if n else float("nan"),
        errors=errors,
        first_error=first_error,
        server_cpu_pct=server_cpu,
        client_cpu_pct=100.0 * (cli_cpu_end - cli_cpu_start) / elapsed,
        counters=driver.counters(),
    )


async def preload(driver: Driver, keys: Sequence[bytes], value: bytes) -> float:
    """Write every key once (so gets hit); returns seconds taken."""
    t0 = time.perf_counter()
    it = iter(keys)

    async def writer(idx: int) -> None:
        slot = idx % driver.channels
        for key in it:
            await driver.put(slot, key, value)

    await asyncio.gather(*(writer(i) for i in range(min(32, len(keys)))))
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- servers


@dataclass
class ManagedServers:
    """Servers started by --start-servers; stop() tears all of them down."""

    workdir: Path
    keep_data: bool
    tablekeeper: ServerProcess | None = None
    etcd: EtcdProcess | None = None

    def start_tablekeeper(self, startup_timeout_s: float) -> str:
        self.tablekeeper = ServerProcess(
            self.workdir / "tablekeeper", env={"PYTHONPATH": src_env()["PYTHONPATH"]}
        )
        try:
            self.tablekeeper.start(startup_timeout_s)
        except (RuntimeError, TimeoutError) as e:
            raise BenchError(f"TableKeeper: {str(e).splitlines()[0]}") from e
        assert self.tablekeeper.process is not None
        eprint(
            f"started TableKeeper pid {self.tablekeeper.process.pid} on {self.tablekeeper.target} "
            f"(log {self.tablekeeper.log_path})"
        )
        return self.tablekeeper.service

    def start_etcd(self, startup_timeout_s: float) -> str:
        self.etcd = EtcdProcess(self.workdir / "etcd")
        try:
            self.etcd.start(wait_s=int(startup_timeout_s))
        except RuntimeError as e:
            raise BenchError(str(e)) from e
        eprint(f"started etcd pid {self.etcd.pid} on {self.etcd.endpoint}")
        return self.etcd.endpoint

    def stop(self) -> None:
        if self.tablekeeper is not None and self.tablekeeper.running:
            stop_all([self.tablekeeper], 20)
            assert self.tablekeeper.process is not None
            eprint(f"stopped TableKeeper (exit {self.tablekeeper.process.returncode})")
        if self.etcd is not None:
            self.etcd.stop()
            self.etcd = None
        if not self.keep_data:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            eprint(f"kept server data and logs in {self.workdir}")


def etcd_pid_from_deploy(endpoint: str) -> int | None:
    """Pid of an etcd started by deploy/etcd.sh for this endpoint's port, if any."""
    port = endpoint.removeprefix("http://").rstrip("/").rpartition(":")[2]
    base = Path(os.environ.get("ETCD_DEPLOY_DIR", REPO_ROOT / ".deploy" / "etcd"))
    try:
        pid = int((base / port / "etcd.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if proc_cpu_s(pid) is not None else None


# --------------------------------------------------------------------------- reporting


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def render_table(results: Sequence[CellResult]) -> str:
    header = (
        f"{'target':<12} {'op':<5} {'conc':>5} {'chan':>4} {'ops/s':>10} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'errors':>6} "
        f"{'srv cpu%':>8} {'cli cpu%':>8}"
    )
    rows = [header, "-" * len(header)]
    for r in results:
        rows.append(
            f"{r.target:<12} {r.op:<5} {r.concurrency:>5} {r.channels:>4} "
            f"{r.ops_per_s:>10.0f} {fmt(r.p50_ms, 3):>8} {fmt(r.p99_ms, 3):>8} "
            f"{fmt(r.p999_ms, 3):>9} {r.errors:>6} {fmt(r.server_cpu_pct, 0):>8} "
            f"{fmt(r.client_cpu_pct, 0):>8}"
        )
    return "\n".join(rows)


def ratio_rows(results: Sequence[CellResult]) -> list[dict[str, Any]]:
    by_key = {(r.target, r.op, r.concurrency): r for r in results}
    rows: list[dict[str, Any]] = []
    for r in results:
        if r.target != "tablekeeper":
            continue
        e = by_key.get(("etcd", r.op, r.concurrency))
        if e is None:
            continue

        def div(a: float, b: float) -> float | None:
            return a / b if b and a == a and b == b else None

        rows.append(
            {
                "op": r.op,
                "concurrency": r.concurrency,
                "throughput_ratio": div(r.ops_per_s, e.ops_per_s),
                "p50_ratio": div(r.p50_ms, e.p50_ms),
                "p99_ratio": div(r.p99_ms, e.p99_ms),
            }
        )
    return rows


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def render_ratios(rows: Sequence[dict[str, Any]]) -> str:
    out = []
    for x in rows:
        out.append(
            f"ratio TableKeeper/etcd  {x['op']:<5} conc={x['concurrency']:<4} "
            f"ops/s x{fmt_ratio(x['throughput_ratio'])}  p50 x{fmt_ratio(x['p50_ratio'])}  "
            f"p99 x{fmt_ratio(x['p99_ratio'])}"
        )
    return "\n".join(out)


def etcd_version() -> str | None:
    exe = shutil.which("etcd")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.splitlines()[0] if out.stdout else None


# --------------------------------------------------------------------------- main


def csv_list(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            items = [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return items

    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/load.py",
        description=(
            "Closed-loop load benchmark of TableKeeper against etcd (the anchor). "
            "For every op x concurrency cell, N asyncio workers send requests back to "
            "back for --warmup s (discarded) then --duration s (measured); prints "
            "ops/s, p50/p99 latency per target and the TableKeeper/etcd ratio, and "
            "writes JSON to benchmarks/out/."
        ),
        epilog=(
            "examples:\n"
            "  benchmarks/load.py --start-servers                 # default matrix, both\n"
            "  benchmarks/load.py --target etcd --start-servers --ops get --concurrency 64\n"
            "  deploy/etcd.sh start && benchmarks/load.py --target etcd\n"
            "  benchmarks/load.py --ops put,get,incr --concurrency 1,16,64 --duration 10 "
            "--start-servers --tk-channels 4 --etcd-channels 4\n"
            "\n" + INCR_NOTE_ETCD
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w = p.add_argument_group("workload")
    w.add_argument(
        "--ops",
        type=csv_list(str),
        default=list(OPS),
        help="comma list of put,get,incr (default: all three)",
    )
    w.add_argument(
        "--concurrency",
        type=csv_list(positive_int),
        default=[1, 16, 64],
        help="comma list of worker counts (default: 1,16,64)",
    )
    w.add_argument(
        "--duration", type=float, default=5.0, help="measured seconds per cell (default 5)"
    )
    w.add_argument(
        "--warmup", type=float, default=1.0, help="unrecorded seconds per cell (default 1)"
    )
    w.add_argument(
        "--value-size", type=int, default=100, help="put value size in bytes (default 100)"
    )
    w.add_argument(
        "--keys",
        type=positive_int,
        default=10_000,
        help="key space for put/get: k00000.. (default 10000); chosen uniformly at random",
    )
    w.add_argument(
        "--incr-keys",
        type=positive_int,
        default=1_000,
        help="counter key space for incr: c00000.. (default 1000), same for both targets",
    )
    w.add_argument("--seed", type=int, default=1, help="RNG seed for key choice (default 1)")
    w.add_argument(
        "--no-preload",
        action="store_true",
        help="skip writing every key once before the matrix (gets may then miss)",
    )

    t = p.add_argument_group("targets")
    t.add_argument("--target", choices=("both", *TARGETS), default="both", help="(default both)")
    t.add_argument(
        "--start-servers",
        action="store_true",
        help=(
            "start a fresh TableKeeper standalone server and a fresh etcd (deploy/etcd.sh) "
            "on free loopback ports, data under .deploy/bench-<pid>/, stop both at the end"
        ),
    )
    t.add_argument("--keep-data", action="store_true", help="keep .deploy/bench-* data/logs")
    t.add_argument(
        "--startup-timeout", type=float, default=60.0, help="server readiness wait (default 60)"
    )
    t.add_argument("--tk-service", default="bk://127.0.0.1:4181", help="TableKeeper service URI")
    t.add_argument(
        "--tk-channels",
        type=positive_int,
        default=1,
        help="AsyncClients the workers are spread over, round robin (default 1 = one shared)",
    )
    t.add_argument(
        "--tk-unary",
        action="store_true",
        help="one RPC per op, as the BookKeeper client does (default: the SDK coalesces "
        "concurrent ops into Batch RPCs)",
    )
    t.add_argument("--tk-namespace", default="bench")
    t.add_argument("--tk-table", default="t")
    t.add_argument("--tk-ranges", type=positive_int, default=4, help="ranges of the table")
    t.add_argument(
        "--tk-empty-lkey",
        action="store_true",
        help="use lkey=b'' instead of lkey=pkey",
    )
    t.add_argument(
        "--tk-pid", type=int, default=None, help="server pid for CPU%% when not started here"
    )
    t.add_argument("--etcd-endpoint", default="127.0.0.1:2379", help="host:port of etcd")
    t.add_argument(
        "--etcd-channels",
        type=positive_int,
        default=1,
        help="gRPC channels (own connection each) the workers are spread over (default 1)",
    )
    t.add_argument(
        "--etcd-serializable",
        action="store_true",
        help="serializable (member-local) gets instead of etcd's default linearizable",
    )
    t.add_argument(
        "--etcd-pid", type=int, default=None, help="etcd pid for CPU%% when not started here"
    )

    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/out/)")
    args = p.parse_args(argv)
    bad = [x for x in args.ops if x not in OPS]
    if bad:
        p.error(f"unknown op(s) {bad}; choose from {','.join(OPS)}")
    if args.duration <= 0 or args.warmup < 0:
        p.error("--duration must be > 0 and --warmup >= 0")
    if args.value_size < 0:
        p.error("--value-size must be >= 0")
    return args


async def bench(
    args: argparse.Namespace,
    drivers: list[Driver],
    pids: dict[str, int | None],
) -> list[CellResult]:
    deadline = time.monotonic() + args.startup_timeout
    for d in drivers:
        await d.setup(deadline)
        eprint(f"{d.name}: ready ({d.channels} channel(s))")

    keys = [b"k%05d" % i for i in range(args.keys)]
    counter_keys = [b"c%05d" % i for i in range(args.incr_keys)]
    value = random.Random(args.seed).randbytes(args.value_size)
    if not args.no_preload and "get" in args.ops:
        for d in drivers:
            took = await preload(d, keys, value)
            eprint(f"{d.name}: preloaded {len(keys)} keys in {took:.1f}s")

    results: list[CellResult] = []
    for op in args.ops:
        for conc in args.concurrency:
            for d in drivers:
                gc.collect()
                gc.freeze()  # keep setup garbage out of the collector during the cell
                r = await run_cell(
                    d,
                    op,
                    conc,
                    counter_keys if op == "incr" else keys,
                    value,
                    args.warmup,
                    args.duration,
                    args.seed,
                    pids.get(d.name),
                )
                gc.unfreeze()
                results.append(r)
                extra = f" errors={r.errors} ({r.first_error})" if r.errors else ""
                if any(r.counters.values()):
                    extra += " " + " ".join(f"{k}={v}" for k, v in r.counters.items())
                eprint(
                    f"  {r.target:<11} {op:<4} c={conc:<3} {r.ops_per_s:9.0f} ops/s  "
                    f"p50 {fmt(r.p50_ms, 3)} ms  p99 {fmt(r.p99_ms, 3)} ms{extra}"
                )
    return results


async def run_with_cleanup(
    args: argparse.Namespace, drivers: list[Driver], pids: dict[str, int | None]
) -> list[CellResult]:
    try:
        return await bench(args, drivers, pids)
    finally:
        for d in drivers:
            await d.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    targets = list(TARGETS) if args.target == "both" else [args.target]
    started = dt.datetime.now(dt.UTC)
    load_start = os.getloadavg()
    if load_start[0] > 1.0:
        eprint(
            f"warning: load average {load_start[0]:.1f} before start; other work on this "
            "machine will add noise to the figures"
        )
    servers: ManagedServers | None = None
    pids: dict[str, int | None] = {"tablekeeper": args.tk_pid, "etcd": args.etcd_pid}
    tk_service, etcd_endpoint = args.tk_service, args.etcd_endpoint

    with sigterm_as_interrupt():
        try:
            if args.start_servers:
                workdir = REPO_ROOT / ".deploy" / f"bench-{os.getpid()}"
                workdir.mkdir(parents=True, exist_ok=True)
                servers = ManagedServers(workdir=workdir, keep_data=args.keep_data)
                if "tablekeeper" in targets:
                    tk_service = servers.start_tablekeeper(args.startup_timeout)
                    assert servers.tablekeeper is not None and servers.tablekeeper.process
                    pids["tablekeeper"] = servers.tablekeeper.process.pid
                if "etcd" in targets:
                    etcd_endpoint = servers.start_etcd(args.startup_timeout)
                    assert servers.etcd is not None
                    pids["etcd"] = servers.etcd.pid

            if pids["etcd"] is None and "etcd" in targets:
                pids["etcd"] = etcd_pid_from_deploy(etcd_endpoint)

            drivers: list[Driver] = []
            if "tablekeeper" in targets:
                drivers.append(
                    TableKeeperDriver(
                        tk_service,
                        args.tk_channels,
                        args.tk_namespace,
                        args.tk_table,
                        args.tk_ranges,
                        args.tk_empty_lkey,
                        not args.tk_unary,
                    )
                )
            if "etcd" in targets:
                drivers.append(
                    EtcdDriver(etcd_endpoint, args.etcd_channels, args.etcd_serializable)
                )
            results = asyncio.run(run_with_cleanup(args, drivers, pids))
        except BenchError as e:
            eprint(f"error: {e}")
            if servers is not None and servers.tablekeeper is not None:
                eprint(f"TableKeeper log tail:\n{servers.tablekeeper.log_tail(30)}")
            return 1
        except KeyboardInterrupt:
            eprint("interrupted")
            return 130
        finally:
            if servers is not None:
                servers.stop()

    ratios = ratio_rows(results)
    print()
    print(render_table(results))
    if ratios:
        print()
        print(render_ratios(ratios))
    if "incr" in args.ops and "etcd" in targets:
        print()
        print("note: " + INCR_NOTE_ETCD)
        for r in results:
            if r.target == "etcd" and r.op == "incr" and r.ops:
                att = r.counters.get("txn_attempts", 0)
                print(
                    f"      etcd incr c={r.concurrency}: {att / max(1, r.ops):.2f} Txn "
                    f"round trips per increment ({r.counters.get('cas_conflicts', 0)} "
                    "conflicts, warm-up excluded)"
                )

    report = {
        "benchmark": "benchmarks/load.py",
        "started_utc": started.isoformat(timespec="seconds"),
        "git": git_info(),
        "config": {
            "targets": targets,
            "ops": args.ops,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "value_size": args.value_size,
            "keys": args.keys,
            "incr_keys": args.incr_keys,
            "seed": args.seed,
            "preload": not args.no_preload,
            "start_servers": args.start_servers,
            "tablekeeper": {
                "service": tk_service,
                "channels": args.tk_channels,
                "namespace": args.tk_namespace,
                "table": args.tk_table,
                "ranges": args.tk_ranges,
                "lkey": "empty" if args.tk_empty_lkey else "same as pkey",
                "sdk_coalescing": not args.tk_unary,
            },
            "etcd": {
                "endpoint": etcd_endpoint,
                "channels": args.etcd_channels,
                "reads": "serializable" if args.etcd_serializable else "linearizable",
                "incr": INCR_NOTE_ETCD,
            },
        },
        "environment": {
            "python": sys.version.split()[0],
            "grpcio": grpc.__version__,
            "etcd": etcd_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_1m_start": round(load_start[0], 2),
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        },
        "results": [asdict(r) for r in results],
        "ratios_tablekeeper_over_etcd": ratios,
    }
    out = args.out
    if out is None:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        out = OUT_DIR / f"load-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(no_nan(report), indent=2, allow_nan=False, default=str) + "\n")
    print(f"\nJSON: {out}")
    errors = sum(r.errors for r in results)
    return 0 if errors == 0 else 2


if __name__ == "__main__":
    sys.exit(main())
