#!/usr/bin/env python3
"""Follower reads (issue 16): what a read costs when the server a client talks to does not own
the range, answered by its follower versus forwarded to the owner, against reading from the owner.

A cluster of `--servers` servers (default 2) and `--containers` containers (real ZooKeeper and
Pulsar, as in benchmarks/cluster.py: started here, or reused with `--zk`,
`--pulsar-url/--pulsar-admin-url`). One table; `--keys` pkeys, all on a container server 0 owns,
hold a `--value-size`-byte value each; a writer keeps rewriting them at `--write-rate` puts/s
through server 0, so followers have a log to follow. Then, one mode after the other, each for
`--duration` s after `--warmup` s, `--concurrency` asyncio tasks in this process get random keys
(closed loop, one Range call per get):

- `leader`: the SDK routes each get to the owner, server 0 (the anchor);
- `forwarded`: every get goes to server 1 (SDK routing off), which forwards it to the owner;
- `follower`: every get goes to server 1 with `read_from="follower"` (at most 5 s stale);
- `follower-linearizable`: the same with `max_staleness_s=0`.

Printed per mode: ops/s, p50/p99 latency, ops/s relative to `leader`, and for the follower
modes the staleness the answers reported (p50/p99). The client and every server share this
machine's cores: read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks._common import (  # noqa: E402
    fmt,
    percentile,
    positive_int,
)
from benchmarks.cluster import (  # noqa: E402
    BenchError,
    Infra,
    add_infra_args,
    eprint,
    harness_errors,
    run_on_infra,
    wait_balanced,
)
from tablekeeper import AsyncClient  # noqa: E402
from tablekeeper.bulk import table_layout  # noqa: E402
from tablekeeper.routing import routing_hash  # noqa: E402

OUT_DIR = BENCH_DIR / "out"
NAMESPACE = "bench"
TABLE = "t"
LKEY = b"v"
MODES = ("leader", "forwarded", "follower", "follower-linearizable")


async def run(args: argparse.Namespace, infra: Infra) -> dict[str, Any]:
    cluster = infra.new_cluster(f"fr-{os.getpid()}", args)
    with harness_errors("cluster"):
        for _ in range(args.servers):
            cluster.add_server()
    await wait_balanced(cluster, args.ready_timeout, "cluster ready")
    owner, other = cluster.servers[0], cluster.servers[1]
    assignment = await asyncio.to_thread(cluster.assignment)
    mine = assignment[owner.target]
    async with AsyncClient(cluster.service_all()) as admin:
        await admin.create_namespace(NAMESPACE)
        await admin.create_table(NAMESPACE, TABLE, ranges=max(2, args.containers))
        layout = await table_layout(admin, NAMESPACE, TABLE)
    ranges = [r for r in layout.ranges if r.container_id in mine]
    if not ranges:
        raise BenchError(f"no range of the table is on server 0's containers {sorted(mine)}")
    keys: list[bytes] = []
    i = 0
    while len(keys) < args.keys:
        pkey = b"k%07d" % i
        h = routing_hash(pkey)
        if any(r.start_hash <= h < r.end_hash for r in ranges):
            keys.append(pkey)
        i += 1
    value = random.Random(1).randbytes(args.value_size)
    async with AsyncClient(f"bk://{owner.target}") as writer_client:
        table = await writer_client.table(NAMESPACE, TABLE)
        for start in range(0, len(keys), 500):
            await asyncio.gather(*(table.put(k, LKEY, value) for k in keys[start : start + 500]))
        eprint(f"loaded {len(keys)} keys on {len(ranges)} range(s) of server 0")
        stop = asyncio.Event()

        async def write() -> None:
            interval = 1.0 / args.write_rate if args.write_rate > 0 else None
            while interval is not None and not stop.is_set():
                await table.put(random.choice(keys), LKEY, value)
                await asyncio.sleep(interval)

        writing = asyncio.create_task(write())
        try:
            results = {}
            for mode in MODES:
                results[mode] = await one_mode(args, mode, owner.target, other.target, keys)
                eprint(render_row(mode, results[mode], results.get("leader")))
        finally:
            stop.set()
            await writing
    return {"modes": results, "keys": len(keys), "write_rate": args.write_rate}


async def one_mode(
    args: argparse.Namespace, mode: str, owner: str, other: str, keys: list[bytes]
) -> dict[str, Any]:
    service = f"bk://{owner if mode == 'leader' else other}"
    direct = mode == "leader"
    latencies: list[float] = []
    staleness: list[float] = []
    replicas: dict[str, int] = {}
    errors = 0
    async with AsyncClient(service, direct_routing=direct, coalesce=False) as client:
        table = await client.table(NAMESPACE, TABLE)
        measuring = False
        stop = False

        async def reader() -> None:
            nonlocal errors
            rng = random.Random()
            while not stop:
                key = rng.choice(keys)
                t0 = time.perf_counter()
                try:
                    if mode.startswith("follower"):
                        bound = 0.0 if mode == "follower-linearizable" else None
                        _, info = await table.get_with_info(key, LKEY, max_staleness_s=bound)
                    else:
                        await table.get(key, LKEY)
                        info = None
                except Exception:  # noqa: BLE001 - counted
                    errors += 1
                    continue
                if measuring:
                    latencies.append(time.perf_counter() - t0)
                    if info is not None:
                        staleness.append(info.staleness_s)
                        replicas[info.replica] = replicas.get(info.replica, 0) + 1

        tasks = [asyncio.create_task(reader()) for _ in range(args.concurrency)]
        await asyncio.sleep(args.warmup)
        measuring = True
        started = time.perf_counter()
        await asyncio.sleep(args.duration)
        measuring = False
        elapsed = time.perf_counter() - started
        stop = True
        await asyncio.gather(*tasks)
    ms = sorted(x * 1000 for x in latencies)
    return {
        "ops": len(ms),
        "ops_per_s": len(ms) / elapsed,
        "p50_ms": percentile(ms, 50) if ms else None,
        "p99_ms": percentile(ms, 99) if ms else None,
        "staleness_p50_ms": statistics.median(staleness) * 1000 if staleness else None,
        "staleness_p99_ms": percentile(sorted(s * 1000 for s in staleness), 99)
        if staleness
        else None,
        "replicas": replicas,
        "errors": errors,
    }


def render_row(mode: str, r: dict[str, Any], anchor: dict[str, Any] | None) -> str:
    ratio = r["ops_per_s"] / anchor["ops_per_s"] if anchor and anchor["ops_per_s"] else 1.0
    stale = (
        f"staleness p50/p99 {fmt(r['staleness_p50_ms'], 1)}/{fmt(r['staleness_p99_ms'], 1)} ms"
        if r["staleness_p50_ms"] is not None
        else ""
    )
    return (
        f"{mode:<22} {r['ops_per_s']:>9.0f} ops/s  p50 {fmt(r['p50_ms'], 2):>7} ms  "
        f"p99 {fmt(r['p99_ms'], 2):>7} ms  x{ratio:.2f} leader  {stale}  "
        f"errors {r['errors']} {r['replicas'] or ''}"
    )


def render(result: dict[str, Any]) -> str:
    modes = result["modes"]
    rows = [
        f"follower reads: {result['keys']} keys, writer at {result['write_rate']} puts/s",
        *(render_row(m, modes[m], modes.get("leader")) for m in MODES if m in modes),
    ]
    return "\n".join(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/follower_reads.py",
        description="Reads through a server that does not own the range: by its follower, "
        "or forwarded to the owner, against reading from the owner.",
        epilog="example:\n  benchmarks/follower_reads.py --zk 127.0.0.1:2181 --pulsar-url "
        "pulsar://127.0.0.1:6650 --pulsar-admin-url http://127.0.0.1:8080",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--servers", type=positive_int, default=2, help="server processes (2)")
    p.add_argument("--containers", type=positive_int, default=2, help="containers (2)")
    p.add_argument("--concurrency", type=positive_int, default=16, help="reader tasks (16)")
    p.add_argument("--keys", type=positive_int, default=2000, help="keys read (2000)")
    p.add_argument("--value-size", type=positive_int, default=100, help="value bytes (100)")
    p.add_argument("--write-rate", type=float, default=200.0, help="puts/s meanwhile (200)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before each mode (2)")
    p.add_argument("--duration", type=float, default=8.0, help="seconds per mode (8)")
    add_infra_args(p)
    args = p.parse_args(argv)
    if bool(args.pulsar_url) != bool(args.pulsar_admin_url):
        p.error("--pulsar-url and --pulsar-admin-url go together")
    if args.servers < 2:
        p.error("--servers must be at least 2 (one owns the keys, another reads them)")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_on_infra(parse_args(argv), "follower_reads", run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
