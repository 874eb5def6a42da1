"""`tablekeeper server --workers N`: how the per-call path scales with worker processes.

For each `--workers` count it starts a fresh standalone TableKeeper with that many workers and
drives it the way a routing client does: each key goes to the worker hosting its range (routing
hash, the table's ranges from the meta range, and each container's endpoint from
GetStorageContainerEndpoint), with one ghz per worker sending that worker's keys and the calls in
flight split between them. etcd, driven by one ghz with all calls in flight, is the anchor in the
same invocation. Server CPU per op sums every worker process.

    make ghz                                          # once
    .venv/bin/python benchmarks/workers.py --workers 1,2 --ops put,get,batch-put --concurrency 16,64

A Batch (`batch-put`, `--batch` puts each) holds only keys of the worker it is sent to, as the
SDK's `batch_put` splits its writes. Prints ops/s, p50/p99 (the worst of the per-worker ghz
runs), server CPU per op, each count's ratio to etcd, and the ratio of the largest worker count
to one worker.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from benchmarks.native import (  # noqa: E402
    GHZ_DEFAULT,
    Cell,
    Target,
    cell_rows,
    cpu_s,
    etcd_target,
    ghz,
    prefill,
    run_cell,
    tablekeeper_target,
)
from tablekeeper.routing import RangeInfo, RangeRouter  # noqa: E402
from tablekeeper_proto.bookkeeper import storage_pb2, storage_pb2_grpc  # noqa: E402
from tests.support.etcd import EtcdProcess  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return sorted(int(p) for p in text.split())


def _worker_of_key(server: ServerProcess, table_id: int) -> tuple[RangeRouter, dict[int, str]]:
    """The table's router and each container's endpoint."""
    with grpc.insecure_channel(server.target) as channel:
        meta = storage_pb2_grpc.MetaRangeServiceStub(channel)
        response = meta.GetActiveRanges(
            storage_pb2.GetActiveRangesRequest(stream_id=table_id), timeout=30
        )
        ranges = [
            RangeInfo(
                range_id=r.props.range_id,
                start_hash=r.props.start_hash_key,
                end_hash=r.props.end_hash_key,
                container_id=r.props.storage_container_id,
            )
            for r in response.ranges
        ]
        containers = sorted({r.container_id for r in ranges})
        stub = storage_pb2_grpc.StorageContainerServiceStub(channel)
        answer = stub.GetStorageContainerEndpoint(
            storage_pb2.GetStorageContainerEndpointRequest(
                requests=[
                    storage_pb2.OneStorageContainerEndpointRequest(storage_container=c)
                    for c in containers
                ]
            ),
            timeout=30,
        )
    endpoints = {}
    for cid, one in zip(containers, answer.responses, strict=True):
        endpoint = one.endpoint.rw_endpoint
        endpoints[cid] = f"{endpoint.hostname}:{endpoint.port}"
    return RangeRouter(ranges), endpoints


def _split_by_worker(whole: Target, server: ServerProcess) -> list[Target]:
    """One target per worker: its endpoint, and the messages whose keys it hosts."""
    table_id = int(whole.messages["put"][0]["header"]["stream_id"])
    router, endpoints = _worker_of_key(server, table_id)
    by_endpoint: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def endpoint_of(message: dict[str, Any]) -> str:
        import base64

        pkey = base64.b64decode(message["header"]["r_key"])
        return endpoints[router.route(pkey).container_id]

    for op in ("put", "get"):
        for message in whole.messages[op]:
            by_endpoint.setdefault(endpoint_of(message), {}).setdefault(op, []).append(message)
    for messages in by_endpoint.values():  # a worker's Batches hold only the keys it hosts
        puts = messages.get("put", [])
        size = whole.ops_per_call["batch-put"]
        messages["batch-put"] = [
            {"ops": [{"put": puts[(i * size + j) % len(puts)]} for j in range(size)]}
            for i in range(max(1, len(puts) // size))
        ]
    return [
        replace(whole, name=f"tablekeeper@{endpoint}", address=endpoint, messages=messages)
        for endpoint, messages in sorted(by_endpoint.items())
    ]


def _routed_cell(
    args: argparse.Namespace, parts: list[Target], pids: list[int], op: str, concurrency: int
) -> Cell:
    """One cell against every worker at once: the calls in flight split between them."""
    shares = [concurrency // len(parts)] * len(parts)
    for part in parts:  # warm-up, and the data files
        data = args.work / f"{part.name}-{op}.json"
        data.write_text(json.dumps(part.messages[op]))
        ghz(args, part, op, shares[0], data, total=200)
    before = sum(cpu_s(pid) for pid in pids)
    with ThreadPoolExecutor(len(parts)) as pool:
        results = list(
            pool.map(
                lambda item: ghz(
                    args,
                    item[0],
                    op,
                    item[1],
                    args.work / f"{item[0].name}-{op}.json",
                    duration_s=args.duration,
                ),
                zip(parts, shares, strict=True),
            )
        )
    used = sum(cpu_s(pid) for pid in pids) - before
    per_call = parts[0].ops_per_call[op]  # a Batch counts its puts, as native.py's cells do
    ok = per_call * sum(int((r.get("statusCodeDistribution") or {}).get("OK", 0)) for r in results)
    errors = sum(
        int(n)
        for r in results
        for code, n in (r.get("statusCodeDistribution") or {}).items()
        if code != "OK"
    )
    rate = sum(
        float(r["rps"])
        * per_call
        * int((r.get("statusCodeDistribution") or {}).get("OK", 0))
        / max(1, int(r["count"]))
        for r in results
    )

    def worst(percent: int) -> float:
        return max(
            (
                item["latency"] / 1e6
                for r in results
                for item in r.get("latencyDistribution") or []
                if int(item["percentage"]) == percent
            ),
            default=float("nan"),
        )

    return Cell(
        target=f"tablekeeper x{len(pids)}",
        op=op,
        concurrency=concurrency,
        ops_per_s=rate,
        p50_ms=worst(50),
        p99_ms=worst(99),
        cpu_us_per_op=used / ok * 1e6 if ok else None,
        errors=errors,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="worker counts to compare")
    parser.add_argument("--ops", default="put,get", help="put,get,batch-put")
    parser.add_argument("--concurrency", default="16,64", help="calls in flight per cell")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per cell")
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--ranges", type=int, default=8, help="ranges of the TableKeeper table")
    parser.add_argument("--connections", type=int, default=4, help="ghz connections at most")
    parser.add_argument("--ghz", type=Path, default=Path(os.environ.get("GHZ", GHZ_DEFAULT)))
    parser.add_argument("--server-args", default="", help="extra `tablekeeper server` flags")
    args = parser.parse_args(argv)
    if not args.ghz.exists() and shutil.which(str(args.ghz)) is None:
        parser.error(f"ghz not found at {args.ghz}: run `make ghz` (or pass --ghz)")
    counts = [int(w) for w in args.workers.split(",")]
    ops = args.ops.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    uneven = [c for c in levels if any(c % n for n in counts)]
    if uneven:
        # Each worker gets its own generator and an equal share of the calls in flight; a
        # level that does not divide would compare more calls in flight against fewer.
        parser.error(
            f"--concurrency {','.join(map(str, uneven))}: each level must divide by every "
            f"--workers count ({args.workers})"
        )
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="tk-workers-") as tmp:
        args.work = Path(tmp)
        with EtcdProcess(args.work / "etcd").start() as etcd:
            anchor = etcd_target(etcd, args.work, args)
            prefill(args, anchor)
            for count in counts:
                server = ServerProcess(
                    args.work / f"tk{count}",
                    extra_args=["--workers", str(count), *args.server_args.split()],
                )
                server.start(timeout_s=60)
                try:
                    assert server.process is not None
                    pids = _children(server.process.pid) if count > 1 else [server.process.pid]
                    whole = tablekeeper_target(server, args.work, args)
                    parts = _split_by_worker(whole, server)
                    for part in parts:
                        prefill(args, part)
                    for op in ops:
                        for concurrency in levels:
                            cell = _routed_cell(args, parts, pids, op, concurrency)
                            cells.append(cell)
                            print(_line(cell), flush=True)
                            if count == counts[-1]:
                                cell = run_cell(args, anchor, op, concurrency)
                                cells.append(cell)
                                print(_line(cell), flush=True)
                finally:
                    server.stop()
    print()
    print(_render(cells, counts))
    return 1 if any(c.errors for c in cells) else 0


def _line(cell: Cell) -> str:
    cpu = f"{cell.cpu_us_per_op:.0f}" if cell.cpu_us_per_op is not None else "-"
    return (
        f"{cell.target:>15} {cell.op:>4} c={cell.concurrency:<3} {cell.ops_per_s:>9,.0f} ops/s  "
        f"p50 {cell.p50_ms:.2f} ms  p99 {cell.p99_ms:.2f} ms  CPU {cpu} µs/op  "
        f"errors {cell.errors}"
    )


def _render(cells: list[Cell], counts: list[int]) -> str:
    rows = cell_rows(cells)
    by_key = {(c.target, c.op, c.concurrency): c for c in cells}
    most, one = f"tablekeeper x{counts[-1]}", f"tablekeeper x{counts[0]}"
    rows += [
        "",
        f"| op | in flight | {one} / etcd | {most} / etcd | {most} / {one} |",
        "|---|---:|---:|---:|---:|",
    ]
    for (target, op, concurrency), cell in by_key.items():
        if target != "etcd":
            continue
        first, last = by_key.get((one, op, concurrency)), by_key.get((most, op, concurrency))
        if first is None or last is None or not cell.ops_per_s or not first.ops_per_s:
            continue
        rows.append(
            f"| {op} | {concurrency} | {first.ops_per_s / cell.ops_per_s:.2f}× | "
            f"{last.ops_per_s / cell.ops_per_s:.2f}× | {last.ops_per_s / first.ops_per_s:.2f}× |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
