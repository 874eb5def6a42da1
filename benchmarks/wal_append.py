"""Micro-benchmark of the local write-ahead log.

For append groups of 1, 16 and 128 records of 100-byte payloads, prints appends/s, records/s and
the p50/p99 latency of `LocalLogWriter.append` (each call = one write + one fdatasync) and of the
fdatasync alone, then the rate at which the log is read back and recovered on open.

    .venv/bin/python benchmarks/wal_append.py [--dir PATH] [--seconds 4]

`--preallocate 0,1048576 --rounds 5` compares segment space reservation (`preallocate_bytes`)
settings in one invocation: the settings take turns, `--seconds` each per round, in a fresh log
each time (so a slow minute of a shared machine hits all of them), and the table gives the
median over the rounds of each round's p50 (and of its mean sync time).

Use --dir to measure a particular disk; the default temporary directory may be on tmpfs on some
machines, where syncs cost nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tablekeeper_server.log.local import DEFAULT_PREALLOCATE_BYTES, LocalLogBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import percentile  # noqa: E402

PAYLOAD = b"v" * 100
GROUP_SIZES = (1, 16, 128)


class TimedSync:
    """The backend's sync, timed."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, fd: int) -> None:
        started = time.perf_counter()
        os.fdatasync(fd)
        self.times.append(time.perf_counter() - started)


async def bench_group(
    root: Path, name: str, group: int, seconds: float, preallocate: int
) -> tuple[int, list[float], list[float]]:
    sync = TimedSync()
    backend = LocalLogBackend(root, sync=sync, preallocate_bytes=preallocate)
    writer = backend.open_writer(name)
    batch = [PAYLOAD] * group
    latencies: list[float] = []
    sync.times.clear()  # the segment's creation is not an append
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        await writer.append(batch)
        latencies.append(time.perf_counter() - started)
    await writer.close()
    return writer.last_sequence, latencies, sync.times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, default=None, help="where to create the logs")
    parser.add_argument("--seconds", type=float, default=4.0, help="time per group size")
    parser.add_argument(
        "--preallocate",
        default=str(DEFAULT_PREALLOCATE_BYTES),
        help="comma-separated preallocate_bytes settings to compare (0: no reservation)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds of all settings")
    parser.add_argument(
        "--groups", default=",".join(map(str, GROUP_SIZES)), help="comma-separated group sizes"
    )
    args = parser.parse_args()
    settings = [int(x) for x in args.preallocate.split(",")]
    groups = [int(x) for x in args.groups.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="wal-bench-") as tmp:
        root = Path(tmp)
        print(f"local WAL append, 100-byte payloads, dir {root}, load {os.getloadavg()[0]:.1f}")
        # (setting, group) -> per round: (appends/s, records/s, p50, p99, sync p50, sync mean)
        cells: dict[tuple[int, int], list[tuple[float, ...]]] = {}
        last_log: dict[int, tuple[str, int]] = {}
        for round_ in range(args.rounds):
            for group in groups:
                for setting in settings:
                    name = f"bench-r{round_}-g{group}-p{setting}"
                    records, latencies, syncs = asyncio.run(
                        bench_group(root, name, group, args.seconds, setting)
                    )
                    last_log[group] = (name, records)
                    elapsed = sum(latencies)
                    latencies.sort()
                    syncs.sort()
                    cells.setdefault((setting, group), []).append(
                        (
                            len(latencies) / elapsed,
                            records / elapsed,
                            percentile(latencies, 50) * 1e3,
                            percentile(latencies, 99) * 1e3,
                            percentile(syncs, 50) * 1e3,
                            statistics.fmean(syncs) * 1e3,
                        )
                    )
        print(
            f"{'prealloc':>9} {'group':>6} {'appends/s':>10} {'records/s':>10} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'sync p50':>9} {'sync mean':>10}   (medians of {args.rounds} rounds)"
        )
        for group in groups:
            for setting in settings:
                rows = cells[(setting, group)]
                med = [statistics.median(column) for column in zip(*rows, strict=True)]
                print(
                    f"{setting:>9} {group:>6} {med[0]:>10.0f} {med[1]:>10.0f} {med[2]:>8.3f} "
                    f"{med[3]:>8.3f} {med[4]:>9.3f} {med[5]:>10.3f}"
                )
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
        group = max(last_log, key=lambda g: last_log[g][1])
        name = last_log[group][0]
        backend = LocalLogBackend(root)
        started = time.perf_counter()
        count = sum(1 for _ in backend.read(name, 1))
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        writer = backend.open_writer(name)
        open_s = time.perf_counter() - started
        writer.close_sync()
        print(
            f"read back {count} records in {read_s:.2f} s ({count / read_s:.0f} records/s); "
            f"open_writer (full recovery scan) {open_s:.2f} s"
        )


if __name__ == "__main__":
    main()
