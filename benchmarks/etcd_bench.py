"""etcd's own benchmark tool against etcd and against TableKeeper's etcd API, in one invocation.

Builds `go.etcd.io/etcd/v3/tools/benchmark` (pinned in benchmarks/etcd_tool, from the Go module
proxy; offline once cached), starts a fresh etcd (deploy/etcd.sh, Debian's etcd-server, fsync on)
and a fresh standalone TableKeeper server with `--etcd-port`, both on 127.0.0.1, runs the same
benchmark commands with identical flags against each, and prints requests/s, mean and p99 latency
and the TableKeeper/etcd ratio per command. JSON goes to benchmarks/out/.

    .venv/bin/python benchmarks/etcd_bench.py                  # put, range, txn-put, watch-latency
    .venv/bin/python benchmarks/etcd_bench.py --clients 1,64 --total 5000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "proto" / "gen"))
sys.path.insert(0, str(REPO))
from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc  # noqa: E402
from tests.support.etcd import EtcdProcess  # noqa: E402
from tests.support.server import ServerProcess, free_port  # noqa: E402

OUT_DIR = REPO / "benchmarks" / "out"
TOOL_MODULE = REPO / "benchmarks" / "etcd_tool"
RANGE_KEY = b"bench/range"


def build_tool() -> Path:
    go = shutil.which("go")
    if go is None:
        raise SystemExit("go is not installed")
    binary = OUT_DIR / "bin" / "etcd-benchmark"
    binary.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [go, "build", "-o", str(binary), "go.etcd.io/etcd/v3/tools/benchmark"],
        cwd=TOOL_MODULE,
        check=True,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
        timeout=900,
    )
    return binary


def wait_ready(endpoint: str, timeout_s: float = 60.0) -> None:
    """Until the endpoint answers etcd's Status (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with grpc.insecure_channel(endpoint) as channel:
                rpc_pb2_grpc.MaintenanceStub(channel).Status(rpc_pb2.StatusRequest(), timeout=2)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def etcd_server() -> Iterator[str]:
    with EtcdProcess().start() as etcd:
        wait_ready(etcd.endpoint)
        yield etcd.endpoint


@contextlib.contextmanager
def tablekeeper_server() -> Iterator[str]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tk-etcd-bench-") as work:
        server = ServerProcess(
            Path(work) / "data", metrics_port=0, extra_args=["--etcd-port", str(port)]
        ).start(60)
        try:
            endpoint = f"127.0.0.1:{port}"
            wait_ready(endpoint)
            yield endpoint
        finally:
            server.stop(30)


def seed_range_key(endpoint: str, value_size: int) -> None:
    with grpc.insecure_channel(endpoint) as channel:
        rpc_pb2_grpc.KVStub(channel).Put(
            rpc_pb2.PutRequest(key=RANGE_KEY, value=b"v" * value_size), timeout=10
        )


_NUMBER = r"([0-9.]+)"


def parse(output: str) -> dict[str, float]:
    """Requests/s and latencies (ms) from the tool's summary; for watch-latency, the summary of
    the watch events (put to event delivered), not of its puts."""
    marker = "Watch events summary:"
    if marker in output:
        output = output[output.index(marker) :]
    result: dict[str, float] = {}
    for name, pattern in (
        ("requests_per_s", rf"Requests/sec:\s+{_NUMBER}"),
        ("mean_ms", rf"Average:\s+{_NUMBER} secs"),
        ("p50_ms", rf"50% in {_NUMBER} secs"),
        ("p99_ms", rf"\n\s*99% in {_NUMBER} secs"),
    ):
        match = re.search(pattern, output)
        if match:
            value = float(match.group(1))
            result[name] = value if name == "requests_per_s" else value * 1000
    return result


def commands(args: argparse.Namespace, clients: int) -> dict[str, list[str]]:
    conns = str(min(clients, args.conns))
    common = ["--conns", conns, "--clients", str(clients), "--precise"]
    size = str(args.value_size)
    return {
        "put": [*common, "put", "--total", str(args.total), "--val-size", size]
        + ["--key-space-size", str(args.keys)],
        "range": [*common, "range", RANGE_KEY.decode(), "--total", str(args.total)],
        "txn-put": [*common, "txn-put", "--total", str(args.total), "--val-size", size]
        + ["--key-space-size", str(args.keys)],
        "watch-latency": [
            *["--conns", "1", "--clients", "1", "--precise"],
            "watch-latency",
            *["--put-total", str(args.watch_puts), "--put-rate", str(args.watch_rate)],
            *["--streams", "10", "--watchers-per-stream", "10", "--val-size", size],
        ],
    }


def run(tool: Path, endpoint: str, argv: list[str]) -> tuple[dict[str, float], str]:
    done = subprocess.run(
        [str(tool), f"--endpoints={endpoint}", *argv],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark {' '.join(argv)} failed: {done.stderr[-2000:]}")
    return parse(done.stdout), done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="put,range,txn-put,watch-latency")
    parser.add_argument("--clients", default="1,64", help="comma list (watch-latency: 1)")
    parser.add_argument("--conns", type=int, default=8, help="gRPC connections (at most clients)")
    parser.add_argument("--total", type=int, default=5000, help="requests per put/range/txn run")
    parser.add_argument("--keys", type=int, default=10000, help="key space of put and txn-put")
    parser.add_argument("--value-size", type=int, default=256)
    parser.add_argument("--watch-puts", type=int, default=500)
    parser.add_argument("--watch-rate", type=int, default=100)
    args = parser.parse_args()
    ops = args.ops.split(",")
    client_counts = [int(c) for c in args.clients.split(",")]
    tool = build_tool()
    started = datetime.now(UTC)
    rows: list[dict[str, object]] = []
    with etcd_server() as etcd, tablekeeper_server() as tablekeeper:
        for endpoint in (etcd, tablekeeper):
            seed_range_key(endpoint, args.value_size)
        for op in ops:
            for clients in client_counts if op != "watch-latency" else [1]:
                argv = commands(args, clients)[op]
                etcd_result, _ = run(tool, etcd, argv)
                tk_result, _ = run(tool, tablekeeper, argv)
                if op == "watch-latency":  # latency: etcd's over ours (> 1: we are faster)
                    ratio = etcd_result.get("mean_ms", 0) / max(tk_result.get("mean_ms", 0), 1e-9)
                else:  # throughput: ours over etcd's
                    ratio = tk_result.get("requests_per_s", 0) / max(
                        etcd_result.get("requests_per_s", 0), 1e-9
                    )
                row = {
                    "op": op,
                    "clients": clients,
                    "argv": argv,
                    "etcd": etcd_result,
                    "tablekeeper": tk_result,
                    "ratio": round(ratio, 2),
                }
                rows.append(row)
                print(_format(row), flush=True)
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / f"etcd-bench-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(
        json.dumps(
            {"started": started.isoformat(), "git": sha, "args": vars(args), "rows": rows},
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


def _format(row: dict[str, object]) -> str:
    def cell(result: object) -> str:
        assert isinstance(result, dict)
        return (
            f"{result.get('requests_per_s', 0):8.0f}/s  mean {result.get('mean_ms', 0):6.2f}"
            f"  p99 {result.get('p99_ms', 0):7.2f} ms"
        )

    return (
        f"| {row['op']} | {row['clients']} | {cell(row['tablekeeper'])} | {cell(row['etcd'])} "
        f"| {row['ratio']} |"
    )


if __name__ == "__main__":
    sys.exit(main())
