"""What TLS and token checks cost per call: one server in plaintext without authentication, one
with TLS, bearer tokens and per-namespace permissions, driven alike by ghz in one invocation.

    make ghz
    .venv/bin/python benchmarks/security.py [--duration 10] [--concurrency 1,16,64]

Prints ops/s, p50/p99 and server CPU per call of each, and the secure/plain ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.native import (  # noqa: E402
    GHZ_DEFAULT,
    Cell,
    prefill,
    run_cell,
    tablekeeper_target,
)
from tablekeeper import Client, TlsConfig  # noqa: E402
from tablekeeper_server.security.certs import write_authority  # noqa: E402
from tablekeeper_server.security.tokens import create_token  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--ops", default="put,get")
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--ranges", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--connections", type=int, default=4, help="ghz connections at most")
    parser.add_argument("--ghz", type=Path, default=GHZ_DEFAULT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tk-security-") as tmp:
        args.work = Path(tmp)
        args.certs = args.work / "certs"
        write_authority(args.certs, hosts=["127.0.0.1"], clients=[])
        secret = (args.certs / "secret.key").read_bytes().strip()
        args.token = create_token(secret, "bench")
        plain = ServerProcess(args.work / "plain").start()
        secure = ServerProcess(
            args.work / "secure",
            extra_args=[
                *("--tls-cert", str(args.certs / "server.pem")),
                *("--tls-key", str(args.certs / "server-key.pem")),
                *("--auth-secret-key", str(args.certs / "secret.key")),
                *("--superuser-roles", "admin"),
            ],
            tls_files=(args.certs / "ca.pem", None, None),
        ).start()
        try:
            with Client(
                secure.service,
                tls=TlsConfig(ca=args.certs / "ca.pem"),
                token=create_token(secret, "admin"),
            ) as admin:
                admin.create_namespace("bench")
            targets = {"plain": tablekeeper_target(plain, args.work, args)}
            secure_target = tablekeeper_target(
                secure, args.work, args, create_namespace=False, client_options={
                    "tls": TlsConfig(ca=args.certs / "ca.pem"),
                    "token": create_token(secret, "admin"),
                },
            )  # fmt: skip
            targets["secure"] = replace(
                secure_target,
                name="secure",
                transport=(
                    *("--cacert", str(args.certs / "ca.pem")),
                    *("--metadata", json.dumps({"authorization": f"Bearer {args.token}"})),
                ),
            )
            with Client(
                secure.service,
                tls=TlsConfig(ca=args.certs / "ca.pem"),
                token=create_token(secret, "admin"),
            ) as admin:
                admin.grant("bench", "bench", ["read", "write"])
            for target in targets.values():  # prefill (the secure one warms its caches)
                prefill(args, target)
            cells: list[Cell] = []
            for op in args.ops.split(","):
                for c in (int(x) for x in args.concurrency.split(",")):
                    for name, target in targets.items():
                        result = run_cell(args, target, op, c)
                        cells.append(replace(result, target=name))
                        print(
                            f"{name:>7} {op} c={c:<3} {result.ops_per_s:>8,.0f} ops/s "
                            f"p50 {result.p50_ms:.2f} ms p99 {result.p99_ms:.2f} ms "
                            f"cpu {result.cpu_us_per_op or 0:.0f} µs/op errors {result.errors}",
                            flush=True,
                        )
        finally:
            plain.stop()
            secure.stop()
    print("\n| op | in flight | plain ops/s | TLS+token ops/s | ratio | CPU µs/op plain | secure |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    by = {(c.target, c.op, c.concurrency): c for c in cells}
    for (name, op, c), plain_cell in by.items():
        if name != "plain":
            continue
        sec = by[("secure", op, c)]
        print(
            f"| {op} | {c} | {plain_cell.ops_per_s:,.0f} | {sec.ops_per_s:,.0f} | "
            f"{sec.ops_per_s / plain_cell.ops_per_s:.2f}× | {plain_cell.cpu_us_per_op or 0:.0f} | "
            f"{sec.cpu_us_per_op or 0:.0f} |"
        )
    return 1 if any(c.errors for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
