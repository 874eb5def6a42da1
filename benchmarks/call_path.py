"""The server's own Python per call, without a gRPC runtime or a network: a standalone server
runs in this process and unary calls go straight into its handlers, through its interceptors,
as `--runtime envoy` hands them over (`rpc.asgi.GrpcAsgi`), from closed-loop tasks on the
server's event loop.

    .venv/bin/python benchmarks/call_path.py                       # put,get,batch-put at 1,16,64
    .venv/bin/python benchmarks/call_path.py --ops put --concurrency 16 --calls 20000
    .venv/bin/python benchmarks/call_path.py --ops oxia-get,oxia-list,oxia-put --children 300

For each (op, in flight) it prints calls/s, CPU µs per op of the whole process (the event
loop's thread, the WAL's append thread, fdatasync's system time) and of the loop's thread
alone, and the calls' p50 / p99 latency. Against `native.py`'s CPU per op for the same cell,
the difference is what the runtime (grpc.aio, or Envoy and the crossing into Python) costs per
call; what is here is ours.
The requests are `native.py`'s: 100-byte values over 2,000 keys in a table of 4 ranges, a
batch-put is one `Batch` of 100 puts. The `oxia-*` ops are the calls Pulsar's Oxia metadata
store makes most, on the Oxia port (`--oxia-port`, namespace `default`): `oxia-get` a Read of one
key, `oxia-list` a List of one directory holding `--children` keys (Pulsar lists a namespace's
topics, one per topic, again after every topic it creates), `oxia-put` a unary Write of one key.
Raw figures go to benchmarks/out/call_path-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import SRC_PATHS, git_info, percentile  # noqa: E402

sys.path[:0] = [str(path) for path in SRC_PATHS]  # this tree's server, in this process

OUT = REPO / "benchmarks" / "out"
PATHS = {
    "put": "/bookkeeper.proto.kv.rpc.TableService/Put",
    "get": "/bookkeeper.proto.kv.rpc.TableService/Range",
    "batch-put": "/tablekeeper.v1.TableKeeper/Batch",
    "oxia-get": "/io.streamnative.oxia.proto.OxiaClient/Read",
    "oxia-list": "/io.streamnative.oxia.proto.OxiaClient/List",
    "oxia-put": "/io.streamnative.oxia.proto.OxiaClient/Write",
}
OXIA_DIRECTORY = "/managed-ledgers/bench/c16/persistent"
BATCH = 100
OK = (b"grpc-status", b"0")

App = Callable[[dict[str, Any], Any, Any], Any]


def frame(message: bytes) -> bytes:
    return struct.pack(">BI", 0, len(message)) + message


async def call(app: App, path: str, body: bytes, *, stream: bool = False) -> list[dict[str, Any]]:
    """One call as the runtime hands it over: the whole request body, then the events the
    server sends back. `stream`: a stream that does not end by itself, left by the client as
    soon as its first message has come."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        if stream and any(event.get("body") for event in sent):
            return {"type": "http.disconnect"}
        # After the body, as pyvoy does: an empty body at once (the client is still there).
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)

    scope = {
        "type": "http",
        "path": path,
        "headers": [(b"content-type", b"application/grpc")],
        "client": ("127.0.0.1", 1),
    }
    await app(scope, receive, send)
    return sent


def bodies(op: str, table_id: int, keys: list[bytes], value: bytes) -> list[bytes]:
    from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
    from tablekeeper_proto.v1 import tablekeeper_pb2 as tk

    def header(key: bytes) -> Any:
        return kv.RoutingHeader(stream_id=table_id, r_key=key)

    if op == "put":
        return [
            frame(kv.PutRequest(header=header(k), key=k, value=value).SerializeToString())
            for k in keys
        ]
    if op == "get":
        return [frame(kv.RangeRequest(header=header(k), key=k).SerializeToString()) for k in keys]
    batches = []
    for i in range(max(1, len(keys) // BATCH)):
        ops = [
            tk.BatchOp(put=kv.PutRequest(header=header(k), key=k, value=value))
            for k in (keys[(i * BATCH + j) % len(keys)] for j in range(BATCH))
        ]
        batches.append(frame(tk.BatchRequest(ops=ops).SerializeToString()))
    return batches


def oxia_bodies(op: str, shard: int, children: int, value: bytes) -> list[bytes]:
    """Requests for the Oxia port: each call is on `shard`, keys are the directory's children."""
    from tablekeeper_proto.oxia import client_pb2 as ox

    names = [f"{OXIA_DIRECTORY}/t{i:05d}" for i in range(children)]
    if op == "oxia-get":
        return [
            frame(
                ox.ReadRequest(
                    shard=shard, gets=[ox.GetRequest(key=k, include_value=True)]
                ).SerializeToString()
            )
            for k in names
        ]
    if op == "oxia-list":
        start = OXIA_DIRECTORY + "/"
        request = ox.ListRequest(shard=shard, start_inclusive=start, end_exclusive=start + "/")
        return [frame(request.SerializeToString())]
    return [
        frame(
            ox.WriteRequest(
                shard=shard, puts=[ox.PutRequest(key=k, value=value)]
            ).SerializeToString()
        )
        for k in names
    ]


def thread_cpu_s(thread_id: int) -> float:
    fields = Path(f"/proc/self/task/{thread_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_cell(
    app_of: Callable[[str], App], op: str, requests: list[bytes], in_flight: int, calls: int
) -> dict[str, Any]:
    path = PATHS[op]
    left = calls

    latencies: list[float] = []

    async def worker(start: int) -> None:
        nonlocal left
        i = start
        clock = time.perf_counter
        while left > 0:
            left -= 1
            began = clock()
            sent = await call(app_of(op), path, requests[i % len(requests)])
            latencies.append(clock() - began)
            if OK not in sent[-1].get("headers", ()):
                raise RuntimeError(f"{op} failed: {sent[-1]}")
            i += in_flight

    await asyncio.gather(*(worker(w) for w in range(in_flight)))  # warm up: as many calls
    left = calls
    latencies.clear()
    loop_thread = threading.get_native_id()
    cpu0, loop0, t0 = time.process_time(), thread_cpu_s(loop_thread), time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(in_flight)))
    seconds = time.perf_counter() - t0
    cpu, loop_cpu = time.process_time() - cpu0, thread_cpu_s(loop_thread) - loop0
    ops = calls * (BATCH if op == "batch-put" else 1)
    return {
        "op": op,
        "in_flight": in_flight,
        "calls": calls,
        "ops_per_s": ops / seconds,
        "cpu_us_per_op": cpu / ops * 1e6,
        "loop_cpu_us_per_op": loop_cpu / ops * 1e6,
        "p50_ms": percentile(sorted(latencies), 50) * 1e3,
        "p99_ms": percentile(sorted(latencies), 99) * 1e3,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    from tablekeeper_server.config import (
        add_server_arguments,
        config_from_settings,
        resolve_settings,
    )
    from tablekeeper_server.main import serve
    from tablekeeper_server.rpc.listen import GrpcPort

    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    flags = ["--data-dir", args.data_dir, "--port", str(free_port()), "--log-level", "warning"]
    flags += ["--runtime", "grpc-aio"]  # listening, for the SDK that makes the table
    oxia = any(op.startswith("oxia-") for op in args.ops)
    if oxia:
        flags += ["--oxia-port", str(free_port())]
    config = config_from_settings(resolve_settings(parser.parse_args(flags), {}), None)
    # The write path as on Envoy, where local logs sync on the loop while syncs are fast.
    config = dataclasses.replace(config, wal_syncs_on_loop=True)
    ports: list[GrpcPort] = []
    listening = asyncio.Event()

    def on_port(port: GrpcPort) -> None:
        ports.append(port)
        listening.set()

    stop = asyncio.Event()
    server = asyncio.create_task(serve(config, stop=stop, on_port=on_port))
    try:
        await asyncio.wait(
            [server, asyncio.ensure_future(listening.wait())], return_when="FIRST_COMPLETED"
        )
        if server.done():
            server.result()
        app = ports[0].asgi()
        if oxia:  # the Oxia port opens once its namespace `default` is served
            while len(ports) < 2 and not server.done():
                await asyncio.sleep(0.05)
            if server.done():
                server.result()
        oxia_app = ports[-1].asgi()

        def app_of(op: str) -> App:
            return oxia_app if op.startswith("oxia-") else app

        def create_table() -> int:  # through the port, as any client: it waits for recovery
            from tablekeeper import Client

            with Client(f"127.0.0.1:{config.port}") as client:
                client.create_namespace("bench")
                return int(client.create_table("bench", "t", ranges=4).table_id)

        table_id = await asyncio.to_thread(create_table)
        keys = [b"key-%06d" % i for i in range(args.keys)]
        value = b"v" * args.value_size
        requests = {
            op: bodies(op, table_id, keys, value) for op in args.ops if not op.startswith("oxia-")
        }
        if oxia:
            requests.update(await oxia_requests(oxia_app, args, value))
        # Every key written once (the gets find values), each put retried while its range's
        # container is still recovering: the cells start on a served table.
        deadline = time.monotonic() + 60
        for body in bodies("put", table_id, keys, value):
            while OK not in (await call(app, PATHS["put"], body))[-1].get("headers", ()):
                if time.monotonic() > deadline:
                    raise RuntimeError("the table's ranges were not served within 60 s")
                await asyncio.sleep(0.05)
        cells = []
        for op in args.ops:
            for in_flight in args.concurrency:
                calls = max(in_flight, args.calls // (BATCH if op == "batch-put" else 1))
                cell = await run_cell(app_of, op, requests[op], in_flight, calls)
                print(
                    f"{op:>9} {in_flight:>4} in flight: {cell['ops_per_s']:>9,.0f} ops/s  "
                    f"CPU {cell['cpu_us_per_op']:6.1f} µs/op  "
                    f"(event loop's thread {cell['loop_cpu_us_per_op']:5.1f})  "
                    f"p50 / p99 {cell['p50_ms']:.2f} / {cell['p99_ms']:.2f} ms",
                    flush=True,
                )
                cells.append(cell)
        return cells
    finally:
        stop.set()
        await server


async def oxia_requests(app: App, args: argparse.Namespace, value: bytes) -> dict[str, Any]:
    """The `oxia-*` requests, on the shard that holds the directory's first child, after every
    child is written once (gets find values, the list finds them all)."""
    from tablekeeper_proto.oxia import client_pb2 as ox

    sent = await call(
        app,
        "/io.streamnative.oxia.proto.OxiaClient/GetShardAssignments",
        frame(ox.ShardAssignmentsRequest(namespace="default").SerializeToString()),
        stream=True,
    )
    body = next(e["body"] for e in sent if e.get("body"))
    assignments = ox.ShardAssignments.FromString(body[5 : 5 + struct.unpack(">I", body[1:5])[0]])
    shard = assignments.namespaces["default"].assignments[0].shard
    requests = {
        op: oxia_bodies(op, shard, args.children, value)
        for op in args.ops
        if op.startswith("oxia-")
    }
    for put in oxia_bodies("oxia-put", shard, args.children, value):
        if OK not in (await call(app, PATHS["oxia-put"], put))[-1].get("headers", ()):
            raise RuntimeError("an Oxia put failed while filling the directory")
    return requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="put,get,batch-put", help=f"of {','.join(PATHS)}")
    parser.add_argument("--concurrency", default="1,16,64", help="calls in flight, per cell")
    parser.add_argument(
        "--calls", type=int, default=20000, help="ops per cell (and as many to warm up)"
    )
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument(
        "--children", type=int, default=300, help="keys in the directory oxia-list lists"
    )
    parser.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="uvloop")
    args = parser.parse_args()
    args.ops = [op for op in args.ops.split(",") if op]
    if unknown := set(args.ops) - set(PATHS):
        parser.error(f"unknown ops: {', '.join(sorted(unknown))}")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="call-path-") as data_dir:
        args.data_dir = data_dir
        if args.event_loop == "uvloop":
            import uvloop

            cells = uvloop.run(main_async(args))
        else:
            cells = asyncio.run(main_async(args))
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"call_path-{time.strftime('%Y%m%d-%H%M%S')}.json"
    config = {k: v for k, v in vars(args).items() if k != "data_dir"}
    out.write_text(json.dumps({"config": config, "git": git_info(), "cells": cells}, indent=2))
    print(f"raw: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
