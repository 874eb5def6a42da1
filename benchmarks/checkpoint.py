#!/usr/bin/env python3
"""Checkpoint benchmark (issue 3): checkpoint cost, incremental checkpoints, restore vs replay.

One fresh standalone server over three directories (data, WAL, checkpoints), one table:

  load       N keys (default 1,000,000; pkey = lkey = k0000000..., random incompressible values
             of --value-size bytes) with the SDK's AsyncClient: `batch_put` requests of --batch
             keys, --concurrency of them in flight.
  baseline   the server is stopped and its WAL copied aside (the whole, untruncated log).
  (a)        `tablekeeper admin checkpoint --table bench/t`: wall time, bytes and files uploaded
             (summed over the table's ranges, from the command's per-range report).
  (b)        --incremental-pct % more writes (new keys), then a second checkpoint: bytes uploaded
             as a fraction of (a).
  tail       another --tail-pct % of new keys that only the WAL holds (a restore replays them).
  (c)        stop, delete the data directory, start again: time from process start to the health
             check's SERVING, to the first successful read of the table, and to one successful
             read in every range (ranges open, and restore, on first use); the server log's
             'restored checkpoint ... in Xs' and 'replayed N commands ... in Xs' lines.
             Then the same on the baseline: a server with an empty data directory, the copied
             WAL and no checkpoints, which must replay the whole log.
  (d)        disk usage (apparent bytes) of the WAL, RocksDB and checkpoint directories after
             load, after each checkpoint and after the restore.

Every restore is checked: --verify-sample random keys (and one per range) are read back and
compared. Prints a table; writes JSON to benchmarks/out/checkpoint-<UTC timestamp>.json (or
--out). The issue's goal: restore of 1M keys in under 5 s on the dev machine.

    .venv/bin/python benchmarks/checkpoint.py                 # the full 1M-key run
    .venv/bin/python benchmarks/checkpoint.py --keys 100000   # a quick one
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tablekeeper import AsyncClient, Client, RetryPolicy
from tablekeeper_server.core.routing import routing_hash, split_hash_space

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for tests.support and benchmarks._common

from tests.support.server import ServerProcess, stop_all  # noqa: E402

OUT_DIR = BENCH_DIR / "out"
TABLEKEEPER = Path(sys.executable).parent / "tablekeeper"
NS, TABLE = "bench", "t"
CONTAINERS = 8
MIN_DATA_RANGE_ID = 1024


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def tree_bytes(path: Path) -> int:
    """Apparent size of the files under `path` (0 if it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def mib(n: float) -> str:
    return f"{n / (1024 * 1024):,.1f} MiB"


# --------------------------------------------------------------------------- data


class Values:
    """Deterministic, incompressible values: slices of one random pool."""

    def __init__(self, size: int, seed: int = 42) -> None:
        self.size = size
        self._pool = random.Random(seed).randbytes(1 << 22)

    def __call__(self, i: int) -> bytes:
        offset = (i * 7919) % (len(self._pool) - self.size)
        return self._pool[offset : offset + self.size]


def key(i: int) -> str:
    return f"k{i:07d}"


def range_index(pkey: str, ranges: int) -> int:
    h = routing_hash(pkey.encode())
    return max(i for i, r in enumerate(split_hash_space(ranges)) if r.start <= h)


def one_key_per_range(first: int, count: int, ranges: int) -> list[int]:
    found: dict[int, int] = {}
    for i in range(first, first + count):
        found.setdefault(range_index(key(i), ranges), i)
        if len(found) == ranges:
            break
    return sorted(found.values())


# --------------------------------------------------------------------------- server


@dataclass
class Server:
    """A standalone server over three directories (data, WAL, checkpoints); its log goes
    next to the data directory."""

    data: Path
    wal: Path
    checkpoints: Path
    wal_segment_bytes: int = 8 * 1024 * 1024
    process: ServerProcess = field(init=False)

    def __post_init__(self) -> None:
        self.process = ServerProcess(
            self.data,
            metrics_port=0,
            extra_args=[
                *("--wal-dir", str(self.wal)),
                *("--checkpoint-dir", str(self.checkpoints)),
                *("--checkpoint-interval", "0"),
                *("--wal-segment-bytes", str(self.wal_segment_bytes)),
            ],
        )

    @property
    def service(self) -> str:
        return self.process.service

    def start(self, timeout_s: float = 600.0) -> float:
        """Start and wait until the health check says SERVING; returns the seconds it took."""
        started = time.monotonic()
        self.process.start(timeout_s, poll_s=0.02)
        return time.monotonic() - started

    def stop(self) -> None:
        stop_all([self.process], 300)

    def disk(self) -> dict[str, int]:
        return {
            "wal_bytes": tree_bytes(self.wal),
            "rocksdb_bytes": tree_bytes(self.data / "db"),
            "checkpoint_bytes": tree_bytes(self.checkpoints),
        }


# --------------------------------------------------------------------------- steps


async def load(
    service: str, first: int, count: int, values: Values, batch: int, concurrency: int
) -> float:
    """Put keys [first, first + count); returns seconds. Fails on any per-key error."""
    started = time.monotonic()
    retry = RetryPolicy(deadline_s=120.0, call_timeout_s=120.0)
    async with AsyncClient(service, retry=retry) as client:
        table = await client.table(NS, TABLE)
        next_start = first
        end = first + count
        done = 0
        last_report = started

        async def worker() -> None:
            nonlocal next_start, done, last_report
            while next_start < end:
                lo = next_start
                hi = min(end, lo + batch)
                next_start = hi
                items = [(key(i), key(i), values(i)) for i in range(lo, hi)]
                results = await table.batch_put(items)
                failed = [r for r in results if r is not None]
                if failed:
                    raise RuntimeError(f"{len(failed)} puts failed, first: {failed[0]!r}")
                done += hi - lo
                now = time.monotonic()
                if now - last_report > 10:
                    last_report = now
                    eprint(f"  loaded {done:,}/{count:,} ({done / (now - started):,.0f} keys/s)")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started


def checkpoint(server: Server) -> dict[str, Any]:
    """`tablekeeper admin checkpoint --table bench/t`, timed; per-range figures summed."""
    started = time.monotonic()
    result = subprocess.run(
        [
            str(TABLEKEEPER),
            "--service",
            server.service,
            "admin",
            "checkpoint",
            "--table",
            f"{NS}/{TABLE}",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise RuntimeError(f"admin checkpoint failed: {result.stdout}\n{result.stderr}")
    with Client(server.service) as client:  # the same figures, typed (the CLI prints them)
        ranges = [r for r in client.status().ranges if r.stream_id >= MIN_DATA_RANGE_ID]
    return {
        "wall_s": wall,
        "ranges": len(ranges),
        "server_s_sum": sum(r.checkpoint_seconds for r in ranges),
        "bytes_uploaded": sum(r.checkpoint_bytes_uploaded for r in ranges),
        "files_uploaded": sum(r.checkpoint_files_uploaded for r in ranges),
        "files_reused": sum(r.checkpoint_files_reused for r in ranges),
        "cli_output": result.stdout,
    }


async def first_reads(
    service: str, probe_keys: list[int], values: Values, started: float
) -> tuple[float, float]:
    """Seconds from `started` to the first successful read of the table and to a successful
    read of one key in every range (all issued at once)."""
    retry = RetryPolicy(deadline_s=600.0, call_timeout_s=600.0)
    first_ok: list[float] = []
    async with AsyncClient(service, retry=retry) as client:
        table = await client.table(NS, TABLE)

        async def read(i: int) -> float:
            kv = await table.get(key(i), key(i))
            if kv is None or kv.value != values(i):
                raise RuntimeError(f"key {key(i)} missing or wrong after restore")
            done = time.monotonic() - started
            first_ok.append(done)
            return done

        times = await asyncio.gather(*(read(i) for i in probe_keys))
    return min(first_ok), max(times)


async def verify_sample(service: str, total: int, values: Values, sample: int) -> int:
    rnd = random.Random(7)
    keys = [rnd.randrange(total) for _ in range(sample)]
    async with AsyncClient(service) as client:
        table = await client.table(NS, TABLE)
        sem = asyncio.Semaphore(64)

        async def check(i: int) -> None:
            async with sem:
                kv = await table.get(key(i), key(i))
            if kv is None or kv.value != values(i):
                raise RuntimeError(f"key {key(i)} missing or wrong after restore")

        await asyncio.gather(*(check(i) for i in keys))
    return len(keys)


RESTORED = re.compile(r"range (\S+): restored checkpoint at (\d+) \((\d+) files\) in ([\d.]+)s")
REPLAYED = re.compile(r"range (\S+): replayed (\d+) commands up to (\d+) in ([\d.]+)s")


def recovery_lines(log: str, table_id: int) -> dict[str, Any]:
    marker = f"-{table_id:012d}-"
    restored = [m.groups() for m in RESTORED.finditer(log) if marker in m.group(1)]
    replayed = [m.groups() for m in REPLAYED.finditer(log) if marker in m.group(1)]
    return {
        "restored": [
            {"range": r, "position": int(p), "files": int(f), "seconds": float(s)}
            for r, p, f, s in restored
        ],
        "replayed": [
            {"range": r, "commands": int(n), "position": int(p), "seconds": float(s)}
            for r, n, p, s in replayed
        ],
        "restore_s_max": max((float(s) for *_, s in restored), default=0.0),
        "replay_s_max": max((float(s) for *_, s in replayed), default=0.0),
        "replayed_commands": sum(int(n) for _, n, *_ in replayed),
    }


def timed_recovery(
    server: Server, table_id: int, probe: list[int], values: Values, total: int, sample: int
) -> dict[str, Any]:
    offset = server.process.log_offset()
    started = time.monotonic()
    serving_s = server.start()
    first_read_s, all_ranges_s = asyncio.run(first_reads(server.service, probe, values, started))
    checked = asyncio.run(verify_sample(server.service, total, values, sample))
    log = server.process.log_since(offset)
    return {
        "serving_s": serving_s,
        "first_read_s": first_read_s,
        "all_ranges_read_s": all_ranges_s,
        "verified_keys": checked + len(probe),
        **recovery_lines(log, table_id),
        "disk": server.disk(),
    }


# --------------------------------------------------------------------------- main


def git_info() -> dict[str, Any]:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
        return out.stdout.strip()

    return {"sha": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


@dataclass
class Report:
    config: dict[str, Any]
    load: dict[str, Any] = field(default_factory=dict)
    disk_after_load: dict[str, int] = field(default_factory=dict)
    checkpoint_full: dict[str, Any] = field(default_factory=dict)
    disk_after_full: dict[str, int] = field(default_factory=dict)
    checkpoint_incremental: dict[str, Any] = field(default_factory=dict)
    disk_after_incremental: dict[str, int] = field(default_factory=dict)
    restore: dict[str, Any] = field(default_factory=dict)
    replay: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)


def rows(report: Report) -> Iterator[tuple[str, str]]:
    c, load_, full, inc = (
        report.config,
        report.load,
        report.checkpoint_full,
        report.checkpoint_incremental,
    )
    yield (
        "keys loaded",
        f"{load_['keys']:,} x {c['value_size']} B in {load_['seconds']:.1f}s "
        f"({load_['keys'] / load_['seconds']:,.0f} keys/s)",
    )
    for label, disk in (
        ("disk after load", report.disk_after_load),
        ("disk after checkpoint (a)", report.disk_after_full),
        ("disk after checkpoint (b)", report.disk_after_incremental),
        ("disk after restore", report.restore["disk"]),
    ):
        yield (
            label,
            (
                f"WAL {mib(disk['wal_bytes'])}, RocksDB {mib(disk['rocksdb_bytes'])}, "
                f"checkpoints {mib(disk['checkpoint_bytes'])}"
            ),
        )
    yield (
        "(a) checkpoint",
        (
            f"{full['wall_s']:.2f}s wall ({full['server_s_sum']:.2f}s in ranges), "
            f"{mib(full['bytes_uploaded'])} uploaded, {full['files_uploaded']} files, "
            f"{full['files_reused']} reused"
        ),
    )
    fraction = inc["bytes_uploaded"] / full["bytes_uploaded"] if full["bytes_uploaded"] else 0
    yield (
        f"(b) checkpoint after +{c['incremental_pct']}%",
        (
            f"{inc['wall_s']:.2f}s wall ({inc['server_s_sum']:.2f}s in ranges), "
            f"{mib(inc['bytes_uploaded'])} uploaded ({fraction:.1%} of (a)), "
            f"{inc['files_uploaded']} files, {inc['files_reused']} reused"
        ),
    )
    for label, r in (
        ("(c) restore (checkpoint + tail)", report.restore),
        ("(c) replay of the whole WAL", report.replay),
    ):
        yield (
            label,
            (
                f"serving {r['serving_s']:.2f}s, first read {r['first_read_s']:.2f}s, "
                f"every range read {r['all_ranges_read_s']:.2f}s; per range: restore <= "
                f"{r['restore_s_max']:.2f}s, replay <= {r['replay_s_max']:.2f}s "
                f"({r['replayed_commands']:,} commands)"
            ),
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--ranges", type=int, default=4, help="table ranges (default 4)")
    parser.add_argument("--batch", type=int, default=1000, help="keys per batch_put")
    parser.add_argument("--concurrency", type=int, default=8, help="batch_puts in flight")
    parser.add_argument("--incremental-pct", type=float, default=1.0)
    parser.add_argument("--tail-pct", type=float, default=1.0)
    parser.add_argument("--verify-sample", type=int, default=2000)
    parser.add_argument(
        "--wal-segment-bytes",
        type=int,
        default=8 * 1024 * 1024,
        help="WAL segment size (default 8 MiB, so truncation shows at this scale; the "
        "server's default is 64 MiB)",
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tk-checkpoint-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    eprint(f"work directory {work}")
    values = Values(args.value_size)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report = Report(config=config)
    main_server = Server(work / "data", work / "wal", work / "checkpoints", args.wal_segment_bytes)
    baseline = Server(
        work / "baseline-data",
        work / "baseline-wal",
        work / "baseline-checkpoints",
        args.wal_segment_bytes,
    )
    try:
        main_server.start()
        with Client(main_server.service) as client:
            client.create_namespace(NS)
            table_id = client.create_table(NS, TABLE, ranges=args.ranges).table_id
        eprint(f"loading {args.keys:,} keys ...")
        seconds = asyncio.run(
            load(main_server.service, 0, args.keys, values, args.batch, args.concurrency)
        )
        report.load = {"keys": args.keys, "seconds": seconds}
        eprint(f"  loaded in {seconds:.1f}s")

        # The whole, untruncated WAL, for the replay baseline.
        main_server.stop()
        shutil.copytree(main_server.wal, baseline.wal)
        main_server.start()
        report.disk_after_load = main_server.disk()

        eprint("(a) checkpoint ...")
        report.checkpoint_full = checkpoint(main_server)
        report.disk_after_full = main_server.disk()

        extra = int(args.keys * args.incremental_pct / 100)
        eprint(f"(b) {extra:,} more keys, checkpoint ...")
        asyncio.run(
            load(main_server.service, args.keys, extra, values, args.batch, args.concurrency)
        )
        report.checkpoint_incremental = checkpoint(main_server)
        report.disk_after_incremental = main_server.disk()

        tail = int(args.keys * args.tail_pct / 100)
        asyncio.run(
            load(main_server.service, args.keys + extra, tail, values, args.batch, args.concurrency)
        )
        total = args.keys + extra + tail
        probe = one_key_per_range(0, args.keys, args.ranges)

        eprint("(c) restore onto an empty data directory ...")
        main_server.stop()
        shutil.rmtree(main_server.data)
        report.restore = timed_recovery(
            main_server, table_id, probe, values, total, args.verify_sample
        )
        report.restore["keys"] = total
        main_server.stop()

        eprint("(c) baseline: replay the whole WAL onto an empty data directory ...")
        report.replay = timed_recovery(
            baseline, table_id, probe, values, args.keys, args.verify_sample
        )
        report.replay["keys"] = args.keys
        baseline.stop()
    finally:
        main_server.stop()
        baseline.stop()

    report.environment = {
        "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "git": git_info(),
        "work_dir": str(work),
    }
    width = max(len(label) for label, _ in rows(report))
    print()
    for label, text in rows(report):
        print(f"{label:<{width}}  {text}")
    goal = report.restore["all_ranges_read_s"]
    print(
        f"\ngoal: restore of {report.restore['keys']:,} keys in under 5 s: "
        f"{'met' if goal < 5 else 'NOT met'} ({goal:.2f}s to every range readable)"
    )

    out = args.out or OUT_DIR / f"checkpoint-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(report)
    for step in ("checkpoint_full", "checkpoint_incremental"):
        data[step].pop("cli_output", None)
    out.write_text(json.dumps(data, indent=2))
    print(f"wrote {out}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
