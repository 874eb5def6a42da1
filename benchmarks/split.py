#!/usr/bin/env python3
"""Range split benchmark (issue 16): a table that outgrows one range, split 1 -> 2 -> 4 ranges
across the servers of a cluster while client processes keep writing to it.

A cluster of `--servers` servers and `--containers` containers (real ZooKeeper and Pulsar, as in
benchmarks/cluster.py: started here, or reused with `--zk`, `--pulsar-url/--pulsar-admin-url`).
The benchmark table has two ranges (BookKeeper's minimum); every pkey the load uses hashes into
the first one, so at first ONE range takes the whole load. `--client-procs` client processes with
`--concurrency` asyncio tasks each put `--value-size`-byte values to `--keys` such pkeys (closed
loop, the SDK's default routing and coalescing) and record when each op ended and its latency.

Timeline: warm-up, phase "1 range" (`--duration` s), split that range (`tablekeeper table split`
through the Admin service), phase "2 ranges", split both children, phase "4 ranges". Printed per
phase: ops/s, p50/p99 latency and the ratio of ops/s to the 1-range phase (the anchor, measured in
the same invocation); per split: the pause the server reports (from the seal to the switch), the
keys copied, and the p99 and max latency of the ops that ended during the split, with the ops/s
then. Client, servers, ZooKeeper and Pulsar share this machine's cores: read ratios and medians.

Failover with and without a follower: `benchmarks/cluster.py --part failover --followers both`.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import base64
import json
import os
import random
import subprocess
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
    no_nan,
    percentile,
    positive_int,
    src_env,
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
from tablekeeper.routing import routing_hash  # noqa: E402

OUT_DIR = BENCH_DIR / "out"
NAMESPACE = "bench"
TABLE = "t"


def hot_pkeys(count: int) -> list[bytes]:
    """`count` pkeys that all hash into the table's first range (the negative hashes)."""
    found: list[bytes] = []
    i = 0
    while len(found) < count:
        pkey = b"p%07d" % i
        if routing_hash(pkey) < 0:
            found.append(pkey)
        i += 1
    return found


# --------------------------------------------------------------------------- client processes


async def worker_main(cfg: dict[str, Any]) -> dict[str, Any]:
    """One client process: puts until told to stop on stdin; (end time ns, latency ns) of each."""
    async with AsyncClient(cfg["service"]) as client:
        table = await client.table(NAMESPACE, TABLE)
        pkeys = hot_pkeys(cfg["keys"])
        value = random.Random(cfg["index"]).randbytes(cfg["value_size"])
        await table.put(pkeys[0], b"k", value)
        print("READY", flush=True)
        ended = array.array("q")
        latency = array.array("q")
        errors = 0
        first_error: str | None = None
        stopping = False

        async def worker(idx: int) -> None:
            nonlocal errors, first_error
            rnd = random.Random(cfg["index"] * 1009 + idx)
            while not stopping:
                pkey = pkeys[rnd.randrange(len(pkeys))]
                t0 = time.perf_counter_ns()
                try:
                    await table.put(pkey, b"k", value)
                except Exception as e:  # noqa: BLE001 - counted; the run goes on
                    errors += 1
                    first_error = first_error or f"{type(e).__name__}: {e}"[:300]
                    continue
                latency.append(time.perf_counter_ns() - t0)
                ended.append(time.time_ns())

        tasks = [asyncio.create_task(worker(i)) for i in range(cfg["concurrency"])]
        await asyncio.to_thread(sys.stdin.readline)
        stopping = True
        await asyncio.gather(*tasks)
    return {
        "ended": base64.b64encode(ended.tobytes()).decode(),
        "latency": base64.b64encode(latency.tobytes()).decode(),
        "errors": errors,
        "first_error": first_error,
    }


def run_worker_process(config_json: str) -> int:
    result = asyncio.run(worker_main(json.loads(config_json)))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _read_line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise BenchError(f"a client process exited (code {proc.wait()}) before {prefix}")
        if line.startswith(prefix):
            return line[len(prefix) :].strip()


# --------------------------------------------------------------------------- the run


async def run(args: argparse.Namespace, infra: Infra) -> dict[str, Any]:
    cluster = infra.new_cluster(f"split-{os.getpid()}", args)
    with harness_errors("cluster"):
        for _ in range(args.servers):
            cluster.add_server()
    await wait_balanced(cluster, args.ready_timeout, "cluster ready")
    service = cluster.service_all()
    admin = AsyncClient(service)
    await admin.create_namespace(NAMESPACE)
    await admin.create_table(NAMESPACE, TABLE, ranges=2)
    procs: list[subprocess.Popen[str]] = []
    phases: list[dict[str, Any]] = []
    splits: list[dict[str, Any]] = []
    try:
        for i in range(args.client_procs):
            cfg = {
                "service": f"bk://{cluster.servers[i % len(cluster.servers)].target}",
                "index": i,
                "concurrency": args.concurrency,
                "keys": args.keys,
                "value_size": args.value_size,
            }
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
        for p in procs:
            await asyncio.to_thread(_read_line, p, "READY")
        eprint(f"{args.client_procs} client processes x {args.concurrency} tasks writing")
        await asyncio.sleep(args.warmup)

        async def phase(name: str, ranges: int) -> None:
            start = time.time_ns()
            await asyncio.sleep(args.duration)
            phases.append({"phase": name, "ranges": ranges, "start": start, "end": time.time_ns()})
            eprint(f"phase {name} done")

        async def split(range_id: int) -> list[int]:
            start = time.time_ns()
            response = await admin.split_range(NAMESPACE, TABLE, range_id)
            end = time.time_ns()
            children = [c.range_id for c in response.children]
            splits.append(
                {
                    "range_id": range_id,
                    "children": children,
                    "containers": [c.storage_container_id for c in response.children],
                    "keys_copied": response.keys_copied,
                    "paused_s": response.paused_seconds,
                    "start": start,
                    "end": end,
                }
            )
            eprint(f"split {range_id} -> {children}: paused {response.paused_seconds:.3f}s")
            return children

        await phase("1 range", 1)
        children = await split(1024)
        await asyncio.sleep(args.settle)
        await phase("2 ranges", 2)
        for child in children:
            await split(child)
        await asyncio.sleep(args.settle)
        await phase("4 ranges", 4)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("stop\n")
            p.stdin.flush()
        results = [json.loads(await asyncio.to_thread(_read_line, p, "RESULT ")) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        await admin.close()
    return summarize(results, phases, splits)


def summarize(
    results: list[dict[str, Any]], phases: list[dict[str, Any]], splits: list[dict[str, Any]]
) -> dict[str, Any]:
    ended = array.array("q")
    latency = array.array("q")
    errors = 0
    first_error = None
    for r in results:
        ended.frombytes(base64.b64decode(r["ended"]))
        latency.frombytes(base64.b64decode(r["latency"]))
        errors += r["errors"]
        first_error = first_error or r["first_error"]

    def window(start: int, end: int) -> dict[str, Any]:
        lat = sorted(latency[i] / 1e6 for i in range(len(ended)) if start <= ended[i] < end)
        seconds = max(1e-9, (end - start) / 1e9)
        return {
            "ops": len(lat),
            "seconds": seconds,
            "ops_per_s": len(lat) / seconds,
            "p50_ms": percentile(lat, 50),
            "p99_ms": percentile(lat, 99),
            "max_ms": lat[-1] if lat else float("nan"),
        }

    out_phases = [{**p, **window(p["start"], p["end"])} for p in phases]
    anchor = out_phases[0]["ops_per_s"] if out_phases else None
    for p in out_phases:
        p["ratio_to_1_range"] = p["ops_per_s"] / anchor if anchor else None
    out_splits = [{**s, **window(s["start"], s["end"])} for s in splits]
    return no_nan(
        {"phases": out_phases, "splits": out_splits, "errors": errors, "first_error": first_error}
    )


def render(result: dict[str, Any]) -> str:
    lines = [
        "phase       ops/s      p50 ms   p99 ms   x 1 range",
    ]
    for p in result["phases"]:
        lines.append(
            f"{p['phase']:<10} {p['ops_per_s']:>8.0f}   {fmt(p['p50_ms']):>7}  "
            f"{fmt(p['p99_ms']):>7}   {fmt(p['ratio_to_1_range'])}"
        )
    lines.append("")
    lines.append("split            paused s  keys   ops/s during  p99 ms  max ms  (children)")
    for s in result["splits"]:
        lines.append(
            f"{s['range_id']:<6} -> {s['children'][0]},{s['children'][1]}  "
            f"{s['paused_s']:>7.3f}  {s['keys_copied']:>6}  {s['ops_per_s']:>10.0f}  "
            f"{fmt(s['p99_ms']):>7} {fmt(s['max_ms']):>7}  containers {s['containers']}"
        )
    lines.append(
        f"errors: {result['errors']}"
        + (f" ({result['first_error']})" if result["first_error"] else "")
    )
    lines.append("failover with/without a follower: not measured (read replicas not built)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/split.py",
        description="A table that outgrows one range: throughput and latency with 1, 2 and 4 "
        "ranges (split online under the load), and the write pause of each split.",
        epilog="example:\n  benchmarks/split.py --zk 127.0.0.1:2181 --pulsar-url "
        "pulsar://127.0.0.1:6650 --pulsar-admin-url http://127.0.0.1:8080",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--servers", type=positive_int, default=2, help="server processes (2)")
    p.add_argument("--containers", type=positive_int, default=4, help="containers (4)")
    p.add_argument("--client-procs", type=positive_int, default=2, help="client processes (2)")
    p.add_argument("--concurrency", type=positive_int, default=32, help="tasks per client (32)")
    p.add_argument("--keys", type=positive_int, default=2000, help="pkeys written (2000)")
    p.add_argument("--value-size", type=positive_int, default=100, help="value bytes (100)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds before phase 1 (3)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per phase (10)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after splits (2)")
    add_infra_args(p)
    p.add_argument("--worker-config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if bool(args.pulsar_url) != bool(args.pulsar_admin_url):
        p.error("--pulsar-url and --pulsar-admin-url go together")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker_config is not None:
        return run_worker_process(args.worker_config)
    return run_on_infra(args, "split", run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
