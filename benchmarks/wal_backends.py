"""WAL append throughput and latency, local vs Pulsar, with group commit as a range does it.

For each backend and each number of concurrent writers (default 1, 16, 128) on ONE log, every
writer loops: submit a record (100-byte payload by default), wait until it is durable. One
commit task does what a range's writer task does (`range/replica.py`): take everything queued
(up to 1024 records), append it as one group, resolve every writer. Reported per cell: records/s
(acknowledged), appends/s and the mean group size, and the p50/p99 latency a writer sees from
submit to acknowledgement.

Then, per backend, a log of `--reopen-records` records (default 100,000, appended 100 at a time)
is opened by a new owner three times (a fresh backend each time, as on another server: for Pulsar,
fence and read the log to its end) and read whole: the time of each open and the records/s of
each read, which is what a takeover pays for a log's tail.

    .venv/bin/python benchmarks/wal_backends.py --start-pulsar          # starts its own Pulsar
    .venv/bin/python benchmarks/wal_backends.py --pulsar-url pulsar://127.0.0.1:6650 \\
        --pulsar-admin-url http://127.0.0.1:8080
    .venv/bin/python benchmarks/wal_backends.py --backends local        # no Pulsar

`local` syncs every group (fdatasync) in `--dir` (default: a temporary directory under
benchmarks/out, i.e. on the repository's disk). `pulsar` is acknowledged once BookKeeper has
persisted the group (the deploy script's bookie does not fsync its journal: `journalSyncData=false`
in deploy/pulsar.sh, which is what makes the numbers comparable to a fast local disk, not to a
replicated production ensemble). Prints a table and writes JSON to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from tablekeeper_server.log.api import LogBackend
from tablekeeper_server.log.local import LocalLogBackend

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks._common import percentile  # noqa: E402
from tests.support.pulsar import PulsarService  # noqa: E402

OUT_DIR = REPO / "benchmarks" / "out"
GROUP_RECORDS_MAX = 1024  # as in range/replica.py


@dataclass
class Cell:
    backend: str
    writers: int
    seconds: float
    records: int
    appends: int
    records_per_s: float
    appends_per_s: float
    mean_group: float
    p50_ms: float
    p99_ms: float
    max_ms: float


async def run_cell(
    backend: LogBackend, name: str, log_name: str, writers: int, seconds: float, payload: bytes
) -> Cell:
    writer = await asyncio.to_thread(backend.open_writer, log_name)
    queue: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()
    appends = 0
    stop = asyncio.Event()

    async def commit() -> None:
        nonlocal appends
        while True:
            first = await queue.get()
            group = [first]
            while len(group) < GROUP_RECORDS_MAX and not queue.empty():
                group.append(queue.get_nowait())
            await writer.append([payload] * len(group))
            appends += 1
            for future in group:
                future.set_result(None)

    latencies: list[float] = []

    async def write() -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            future: asyncio.Future[None] = loop.create_future()
            started = time.perf_counter()
            queue.put_nowait(future)
            await future
            latencies.append(time.perf_counter() - started)

    committer = asyncio.create_task(commit())
    # Warm up (connections, first batches), then measure.
    tasks = [asyncio.create_task(write()) for _ in range(writers)]
    await asyncio.sleep(min(1.0, seconds / 4))
    latencies.clear()
    appends = 0
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - started
    records, appends_done = len(latencies), appends
    measured = sorted(latencies)
    stop.set()
    await asyncio.gather(*tasks)
    committer.cancel()
    with suppress(asyncio.CancelledError):
        await committer
    await writer.close()
    return Cell(
        backend=name,
        writers=writers,
        seconds=round(elapsed, 3),
        records=records,
        appends=appends_done,
        records_per_s=round(records / elapsed, 1),
        appends_per_s=round(appends_done / elapsed, 1),
        mean_group=round(records / max(1, appends_done), 2),
        p50_ms=round(percentile(measured, 50) * 1e3, 3),
        p99_ms=round(percentile(measured, 99) * 1e3, 3),
        max_ms=round(measured[-1] * 1e3, 3),
    )


@dataclass
class Reopen:
    backend: str
    records: int
    open_s: list[float]
    read_records_per_s: list[float]


def run_reopen(
    make: Callable[[], tuple[LogBackend, Callable[[], None]]], name: str, count: int, payload: bytes
) -> Reopen:
    backend, close = make()
    try:
        writer = backend.open_writer("reopen")

        async def fill() -> None:
            for first in range(0, count, 100):
                await writer.append([payload] * min(100, count - first))

        asyncio.run(fill())
        writer.close_sync()
    finally:
        close()
    opens: list[float] = []
    reads: list[float] = []
    for _ in range(3):
        backend, close = make()
        try:
            started = time.perf_counter()
            backend.open_writer("reopen").close_sync()
            opens.append(round(time.perf_counter() - started, 3))
        finally:
            close()
        backend, close = make()
        try:
            started = time.perf_counter()
            read = sum(1 for _ in backend.read("reopen", 1))
            reads.append(round(read / (time.perf_counter() - started), 1))
        finally:
            close()
    return Reopen(name, count, opens, reads)


@contextmanager
def own_pulsar() -> Iterator[tuple[str, str]]:
    """Start a Pulsar standalone through deploy/pulsar.sh on free ports; stop it afterwards."""
    state = Path(tempfile.mkdtemp(prefix="wal-bench-pulsar-"))
    print("starting Pulsar through deploy/pulsar.sh ...", file=sys.stderr)
    try:
        pulsar = PulsarService.launch(state)
    except RuntimeError as e:
        shutil.rmtree(state, ignore_errors=True)
        sys.exit(str(e))
    try:
        yield pulsar.service_url, pulsar.admin_url
    finally:
        pulsar.close()
        shutil.rmtree(state, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default="local,pulsar", help="default local,pulsar")
    parser.add_argument("--writers", default="1,16,128", help="concurrent writers per log")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per cell")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--dir", type=Path, default=None, help="where `local` writes its logs")
    parser.add_argument("--pulsar-url", default=None)
    parser.add_argument("--pulsar-admin-url", default=None)
    parser.add_argument(
        "--start-pulsar", action="store_true", help="start (and stop) a Pulsar for the run"
    )
    parser.add_argument(
        "--reopen-records",
        type=int,
        default=100_000,
        help="records of the log a new owner opens and reads (default 100000; 0: skip)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON path (default benchmarks/out/)"
    )
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    counts = [int(w) for w in args.writers.split(",")]
    payload = os.urandom(args.payload_bytes)
    if "pulsar" in backends and not args.start_pulsar and not args.pulsar_url:
        parser.error("pulsar needs --pulsar-url and --pulsar-admin-url, or --start-pulsar")

    started_at = datetime.now(UTC)
    load_start = os.getloadavg()
    cells: list[Cell] = []
    reopens: list[Reopen] = []
    pulsar_context: AbstractContextManager[tuple[str, str] | None] = (
        own_pulsar() if args.start_pulsar else nullcontext(None)
    )
    with pulsar_context as own:
        service_url, admin_url = own if own else (args.pulsar_url, args.pulsar_admin_url)
        makers: dict[str, Callable[[], tuple[LogBackend, Callable[[], None]]]] = {}
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        local_root = Path(tempfile.mkdtemp(prefix="wal-bench-", dir=args.dir or OUT_DIR))

        def make_local() -> tuple[LogBackend, Callable[[], None]]:
            return LocalLogBackend(local_root), lambda: None

        namespace = f"wal-bench-{uuid.uuid4().hex[:8]}"

        def make_pulsar() -> tuple[LogBackend, Callable[[], None]]:
            from tablekeeper_server.log.pulsar import PulsarLogBackend

            backend = PulsarLogBackend(service_url, admin_url, namespace=namespace)
            return backend, backend.close

        makers["local"], makers["pulsar"] = make_local, make_pulsar
        print(
            f"WAL append, {args.payload_bytes}-byte records, group commit (<= {GROUP_RECORDS_MAX} "
            f"records per append), {args.seconds:.0f} s per cell"
        )
        header = (
            f"{'backend':<8} {'writers':>7} {'records/s':>10} {'appends/s':>10} "
            f"{'mean group':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
        )
        print(header)
        try:
            for name in backends:
                backend, close = makers[name]()
                try:
                    for writers in counts:
                        cell = asyncio.run(
                            run_cell(
                                backend, name, f"bench-{writers}", writers, args.seconds, payload
                            )
                        )
                        cells.append(cell)
                        print(
                            f"{cell.backend:<8} {cell.writers:>7} {cell.records_per_s:>10.0f} "
                            f"{cell.appends_per_s:>10.0f} {cell.mean_group:>10.1f} "
                            f"{cell.p50_ms:>8.2f} {cell.p99_ms:>8.2f} {cell.max_ms:>8.1f}",
                            flush=True,
                        )
                finally:
                    close()
            if args.reopen_records > 0:
                print(f"\nA new owner opens a log of {args.reopen_records} records, then reads it")
                print(f"{'backend':<8} {'open s (3 runs)':>24} {'read records/s (3 runs)':>30}")
                for name in backends:
                    reopen = run_reopen(makers[name], name, args.reopen_records, payload)
                    reopens.append(reopen)
                    opens = ", ".join(f"{x:.2f}" for x in reopen.open_s)
                    reads = ", ".join(f"{x:,.0f}" for x in reopen.read_records_per_s)
                    print(f"{name:<8} {opens:>24} {reads:>30}", flush=True)
        finally:
            shutil.rmtree(local_root, ignore_errors=True)

    report = {
        "benchmark": "wal_backends",
        "started_at": started_at.isoformat(),
        "payload_bytes": args.payload_bytes,
        "seconds_per_cell": args.seconds,
        "group_records_max": GROUP_RECORDS_MAX,
        "pulsar": {"service_url": service_url, "admin_url": admin_url}
        if "pulsar" in backends
        else None,
        "cpus": os.cpu_count(),
        "loadavg_1m_start": round(load_start[0], 2),
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
        "cells": [asdict(cell) for cell in cells],
        "reopen": [asdict(r) for r in reopens],
    }
    out = args.out or OUT_DIR / f"wal-backends-{started_at.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
