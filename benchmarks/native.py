"""TableKeeper against etcd, driven by one native load generator (ghz, Go) in one invocation.

Both servers get identical work from the same client: unary puts and linearizable gets of
`--value-size`-byte values over `--keys` keys, at each concurrency, plus batched writes (one
TableKeeper `Batch` RPC or one etcd `Txn` carrying `--batch` puts). The client's language and
our SDK are out of the picture: what is measured is each server's per-call path.

For every cell it prints ops/s, p50/p99 latency, the longest stall (the longest time in which
no call completed: with calls in flight, far above the usual gap it is a server that answered
nothing for that long), server CPU per op (from /proc of the server process), the errors, and
the TableKeeper/etcd ratio of ops/s. A third target, the *gRPC floor*
(benchmarks/grpc_floor.py: the same Python gRPC server runtime answering empty responses), gets
the same calls: what a TableKeeper call costs beyond it is TableKeeper's own path
(`--no-floor` leaves it out). The first TableKeeper runs `--runtime grpc-aio` (grpcio's server)
unless `--server-args` names a runtime; `--envoy` adds one with `--runtime envoy` (the main
port's HTTP/2 in Envoy: the server's default where pyvoy is installed) and that runtime's
no-op floor, so both runtimes meet in one run.

    make ghz                                   # go install of ghz into .deploy/bin (once)
    .venv/bin/python benchmarks/native.py      # starts both servers on free loopback ports
    .venv/bin/python benchmarks/native.py --envoy --concurrency 1,16,64 --duration 4

Requests come from `ghz --data-file` arrays, which ghz sends round-robin, one element per call.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import longest_stall_ms  # noqa: E402
from tests.support.etcd import EtcdProcess  # noqa: E402
from tests.support.server import ServerProcess, free_port  # noqa: E402

GHZ_DEFAULT = REPO / ".deploy" / "bin" / "ghz"
TABLE_NAMESPACE, TABLE_NAME = "bench", "native"


@dataclass
class Target:
    name: str
    address: str
    pid: int
    protoset: Path
    calls: dict[str, str]
    """op -> fully qualified method"""
    messages: dict[str, list[dict[str, Any]]]
    """op -> request messages (JSON), sent round-robin"""
    ops_per_call: dict[str, int]
    transport: tuple[str, ...] = ("--insecure",)
    """ghz flags for reaching it (plaintext; or a CA and credentials, see security.py)"""


@dataclass
class Cell:
    target: str
    op: str
    concurrency: int
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_op: float | None
    errors: int
    stall_ms: float | None = None
    """The longest time in which no call completed (`_common.longest_stall_ms`)."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its reaped children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def protoset(out: Path, proto_root: Path, proto: str) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{proto_root}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            proto,
        ],
        check=True,
        cwd=REPO,
    )
    return out


def tablekeeper_target(
    server: ServerProcess,
    work: Path,
    args: argparse.Namespace,
    *,
    create_namespace: bool = True,
    client_options: dict[str, Any] | None = None,
) -> Target:
    from tablekeeper import Client

    with Client(server.service, **(client_options or {})) as client:
        if create_namespace:
            client.create_namespace(TABLE_NAMESPACE)
        info = client.create_table(TABLE_NAMESPACE, TABLE_NAME, ranges=args.ranges)
    keys = [b"key-%06d" % i for i in range(args.keys)]
    value = b64(b"v" * args.value_size)

    def header(key: bytes) -> dict[str, Any]:
        return {"stream_id": info.table_id, "r_key": b64(key)}

    puts = [{"header": header(k), "key": b64(k), "value": value} for k in keys]
    gets = [{"header": header(k), "key": b64(k)} for k in keys]
    batches = [
        {"ops": [{"put": puts[(i * args.batch + j) % len(puts)]} for j in range(args.batch)]}
        for i in range(max(1, len(keys) // args.batch))
    ]
    assert server.process is not None
    return Target(
        name="tablekeeper",
        address=server.target,
        pid=server.process.pid,
        protoset=protoset(
            work / "tablekeeper.protoset", REPO / "proto", "tablekeeper_proto/v1/tablekeeper.proto"
        ),
        calls={
            "put": "bookkeeper.proto.kv.rpc.TableService.Put",
            "get": "bookkeeper.proto.kv.rpc.TableService.Range",
            "batch-put": "tablekeeper.v1.TableKeeper.Batch",
        },
        messages={"put": puts, "get": gets, "batch-put": batches},
        ops_per_call={"put": 1, "get": 1, "batch-put": args.batch},
    )


def etcd_target(etcd: EtcdProcess, work: Path, args: argparse.Namespace) -> Target:
    keys = [b"key-%06d" % i for i in range(args.keys)]
    value = b64(b"v" * args.value_size)
    puts = [{"key": b64(k), "value": value} for k in keys]
    gets = [{"key": b64(k), "serializable": False} for k in keys]
    batches = [
        {
            "success": [
                {"request_put": puts[(i * args.batch + j) % len(puts)]} for j in range(args.batch)
            ]
        }
        for i in range(max(1, len(keys) // args.batch))
    ]
    assert etcd.pid is not None, "etcd is not running"
    return Target(
        name="etcd",
        address=etcd.endpoint,
        pid=etcd.pid,
        protoset=protoset(work / "etcd.protoset", REPO / "benchmarks" / "_etcd", "etcd_kv.proto"),
        calls={
            "put": "etcdserverpb.KV.Put",
            "get": "etcdserverpb.KV.Range",
            "batch-put": "etcdserverpb.KV.Txn",
        },
        messages={"put": puts, "get": gets, "batch-put": batches},
        ops_per_call={"put": 1, "get": 1, "batch-put": args.batch},
    )


def ghz(
    args: argparse.Namespace,
    target: Target,
    op: str,
    concurrency: int,
    data: Path,
    *,
    total: int | None = None,
    duration_s: float | None = None,
) -> dict[str, Any]:
    argv = [
        str(args.ghz),
        *target.transport,
        "--protoset",
        str(target.protoset),
        "--call",
        target.calls[op],
        "--data-file",
        str(data),
        "--concurrency",
        str(concurrency),
        "--connections",
        str(min(concurrency, args.connections)),
        "--timeout",
        "30s",
        "--format",
        "json",
    ]
    if total is not None:
        argv += ["--total", str(total)]
    else:  # calls in flight at the end finish and count (not cut off as errors)
        argv += ["--duration", f"{duration_s}s", "--duration-stop", "wait"]
    out = subprocess.run(
        [*argv, target.address], capture_output=True, text=True, check=False, timeout=600
    )
    if out.returncode != 0 and not out.stdout:
        raise RuntimeError(f"ghz failed ({out.returncode}): {out.stderr.strip()}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def served_by(pid: int) -> int:
    """The process whose CPU a server costs: `pid`, or the Envoy that pyvoy (`pid`) started."""
    if b"pyvoy" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        return pid
    deadline = time.monotonic() + 30
    while not (children := Path(f"/proc/{pid}/task/{pid}/children").read_text().split()):
        if time.monotonic() > deadline:
            raise RuntimeError("pyvoy started no Envoy process")
        time.sleep(0.05)
    return int(children[0])


@contextlib.contextmanager
def envoy_tablekeeper(work: Path, args: argparse.Namespace) -> Iterator[Target]:
    """A second TableKeeper, `--runtime envoy` (the main port on Envoy's HTTP/2), its table
    made as for the first."""
    extra = [*args.server_args.split(), "--runtime", "envoy"]
    server = ServerProcess(work / "tk-envoy", extra_args=extra)
    server.start(timeout_s=60)
    try:
        target = tablekeeper_target(server, work, args)
        yield dataclasses.replace(target, name="tk-envoy")
    finally:
        server.stop()


@contextlib.contextmanager
def grpc_floor(work: Path, tablekeeper: Target, runtime: str = "grpc-aio") -> Iterator[Target]:
    """Start benchmarks/grpc_floor.py; the target takes TableKeeper's calls and messages."""
    port = free_port()
    name = "grpc-floor" if runtime == "grpc-aio" else f"{runtime}-floor"
    log = (work / f"{name}.log").open("wb")
    floor = str(REPO / "benchmarks" / "grpc_floor.py")
    process = subprocess.Popen(
        [sys.executable, floor, "--port", str(port), "--runtime", runtime],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gRPC floor server did not start: see {log.name}")
            time.sleep(0.05)
        yield dataclasses.replace(
            tablekeeper, name=name, address=f"127.0.0.1:{port}", pid=served_by(process.pid)
        )
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def run_cell(args: argparse.Namespace, target: Target, op: str, concurrency: int) -> Cell:
    data = args.work / f"{target.name}-{op}.json"
    data.write_text(json.dumps(target.messages[op]))
    ghz(args, target, op, concurrency, data, total=max(200, concurrency * 20))  # warm-up
    cpu_before = cpu_s(target.pid)
    result = ghz(args, target, op, concurrency, data, duration_s=args.duration)
    cpu_used = cpu_s(target.pid) - cpu_before
    per_call = target.ops_per_call[op]
    latencies = {
        int(item["percentage"]): item["latency"] / 1e6
        for item in result.get("latencyDistribution") or []
    }
    codes = result.get("statusCodeDistribution") or {}
    ok_calls = int(codes.get("OK", 0))
    errors = sum(int(n) for code, n in codes.items() if code != "OK")
    ops = ok_calls * per_call
    return Cell(
        target=target.name,
        op=op,
        concurrency=concurrency,
        ops_per_s=float(result["rps"]) * per_call * (ok_calls / max(1, result["count"])),
        p50_ms=latencies.get(50, float("nan")),
        p99_ms=latencies.get(99, float("nan")),
        cpu_us_per_op=cpu_used / ops * 1e6 if ops else None,
        errors=errors,
        stall_ms=longest_stall_ms(result.get("details") or []),
    )


def prefill(args: argparse.Namespace, target: Target) -> None:
    data = args.work / f"{target.name}-prefill.json"
    data.write_text(json.dumps(target.messages["put"]))
    result = ghz(args, target, "put", 16, data, total=len(target.messages["put"]))
    if (result.get("statusCodeDistribution") or {}).get("OK", 0) != len(target.messages["put"]):
        raise RuntimeError(f"prefill of {target.name} failed: {result.get('errorDistribution')}")


def cell_rows(cells: list[Cell]) -> list[str]:
    """The cells as a Markdown table, one row each."""
    rows = [
        "| op | in flight | target | ops/s | p50 ms | p99 ms | longest stall ms "
        "| server CPU µs/op | errors |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        cpu = f"{c.cpu_us_per_op:.0f}" if c.cpu_us_per_op is not None else "-"
        stall = f"{c.stall_ms:.1f}" if c.stall_ms is not None else "-"
        rows.append(
            f"| {c.op} | {c.concurrency} | {c.target} | {c.ops_per_s:,.0f} | {c.p50_ms:.2f} | "
            f"{c.p99_ms:.2f} | {stall} | {cpu} | {c.errors} |"
        )
    return rows


# Each TableKeeper target and the no-op floor of its runtime.
FLOOR_OF = {"tablekeeper": "grpc-floor", "tk-envoy": "envoy-floor"}


def render(cells: list[Cell]) -> str:
    rows = cell_rows(cells)
    rows += [
        "",
        "| server | op | in flight | / etcd ops/s | CPU µs/op over its runtime's floor |",
        "|---|---|---:|---:|---:|",
    ]
    by_key = {(c.target, c.op, c.concurrency): c for c in cells}
    for c in cells:
        if c.target not in FLOOR_OF:
            continue
        anchor = by_key.get(("etcd", c.op, c.concurrency))
        ratio = f"{c.ops_per_s / anchor.ops_per_s:.2f}×" if anchor and anchor.ops_per_s else "-"
        floor = by_key.get((FLOOR_OF[c.target], c.op, c.concurrency))
        beyond = "-"
        if floor and floor.cpu_us_per_op is not None and c.cpu_us_per_op is not None:
            beyond = f"{c.cpu_us_per_op - floor.cpu_us_per_op:.0f}"
        rows.append(f"| {c.target} | {c.op} | {c.concurrency} | {ratio} | {beyond} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="put,get,batch-put", help="put,get,batch-put")
    parser.add_argument("--concurrency", default="1,16,64", help="calls in flight per cell")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per cell")
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100, help="puts per batched call")
    parser.add_argument("--ranges", type=int, default=4, help="ranges of the TableKeeper table")
    parser.add_argument("--connections", type=int, default=4, help="ghz connections at most")
    parser.add_argument("--server-args", default="", help="extra `tablekeeper server` flags")
    parser.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also drive the gRPC floor (benchmarks/grpc_floor.py) with TableKeeper's calls",
    )
    parser.add_argument(
        "--envoy",
        action="store_true",
        help="also a TableKeeper with `--runtime envoy` and the no-op floor on Envoy's HTTP/2 "
        "(pyvoy) beside grpc.aio's",
    )
    parser.add_argument("--ghz", type=Path, default=Path(os.environ.get("GHZ", GHZ_DEFAULT)))
    parser.add_argument("--out", type=Path, help="also write the cells as JSON lines here")
    args = parser.parse_args(argv)
    if not args.ghz.exists() and shutil.which(str(args.ghz)) is None:
        parser.error(f"ghz not found at {args.ghz}: run `make ghz` (or pass --ghz)")
    ops = args.ops.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="tk-native-") as tmp:
        args.work = Path(tmp)
        extra = args.server_args.split()
        if "--runtime" not in extra:
            extra += ["--runtime", "grpc-aio"]
        server = ServerProcess(args.work / "tk", extra_args=extra)
        server.start(timeout_s=60)
        try:
            with contextlib.ExitStack() as stack:
                etcd = stack.enter_context(EtcdProcess(args.work / "etcd").start())
                tablekeeper = tablekeeper_target(server, args.work, args)
                targets = [tablekeeper, etcd_target(etcd, args.work, args)]
                if args.envoy:
                    targets.append(stack.enter_context(envoy_tablekeeper(args.work, args)))
                if args.floor:
                    targets.append(stack.enter_context(grpc_floor(args.work, tablekeeper)))
                if args.floor and args.envoy:
                    floor = grpc_floor(args.work, tablekeeper, "envoy")
                    targets.append(stack.enter_context(floor))
                for target in targets:
                    prefill(args, target)
                for op in ops:
                    for concurrency in levels:
                        for target in targets:  # interleaved: drift hits both alike
                            cell = run_cell(args, target, op, concurrency)
                            cells.append(cell)
                            print(
                                f"{cell.target:>11} {op:>9} c={concurrency:<3} "
                                f"{cell.ops_per_s:>9,.0f} ops/s  p50 {cell.p50_ms:.2f} ms  "
                                f"p99 {cell.p99_ms:.2f} ms  errors {cell.errors}",
                                flush=True,
                            )
        finally:
            server.stop()
    print()
    print(render(cells))
    if args.out:
        with args.out.open("a") as out:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            for cell in cells:
                out.write(json.dumps({"at": stamp, **cell.__dict__}) + "\n")
    return 1 if any(c.errors for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
