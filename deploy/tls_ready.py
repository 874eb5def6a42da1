"""Is a TLS cluster ready? For `deploy/cluster.sh start --tls`.

    tablekeeper cluster status -o json --wait 0 | python deploy/tls_ready.py --ca CA.pem \
        [--expect HOST:PORT ...]

`tablekeeper cluster status` asks every live server what it serves over plaintext, which a TLS
server refuses ("ServerInfo failed"). This reads that report, asks those servers again over TLS
(trusting `--ca`, with `TABLEKEEPER_TOKEN` if set), and prints what is not ready yet, one problem
a line: exit 0 when every container is served by its assigned server and every `--expect`ed
server is live.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc

from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc

TIMEOUT_S = 2.0


def serving(endpoint: str, credentials: grpc.ChannelCredentials) -> list[int] | str:
    """The containers the server at `endpoint` says it serves, or why it could not say."""
    token = os.environ.get("TABLEKEEPER_TOKEN")
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    options = [("grpc.use_local_subchannel_pool", 1)]
    try:
        with grpc.secure_channel(endpoint, credentials, options=options) as channel:
            stub = tablekeeper_pb2_grpc.TableKeeperStub(channel)
            info = stub.ServerInfo(
                tablekeeper_pb2.ServerInfoRequest(), metadata=metadata, timeout=TIMEOUT_S
            )
    except grpc.RpcError as exc:
        return f"ServerInfo over TLS failed: {exc.code().name}"
    return sorted(int(c) for c in info.containers)


def problems(report: dict[str, Any], ca: Path, expected: list[str]) -> list[str]:
    credentials = grpc.ssl_channel_credentials(ca.read_bytes())
    found = [p for p in report.get("problems", []) if "ServerInfo failed" not in p]
    servers = list(report.get("servers", []))
    found += [f"{e} is not registered in ZooKeeper" for e in expected if e not in servers]
    assignment = report.get("assignment", {})
    for server in servers:
        if isinstance(report.get("serving", {}).get(server), list):
            continue  # answered over plaintext: `cluster status` judged it already
        got = serving(server, credentials)
        wanted = sorted(assignment.get(server, []))
        if isinstance(got, str):
            found.append(f"{server}: {got}")
        elif got != wanted:
            found.append(f"{server} serves {got}, assigned {wanted}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ca", type=Path, required=True, help="PEM CA of the servers")
    parser.add_argument("--expect", action="append", default=[], metavar="HOST:PORT")
    args = parser.parse_args(argv)
    text = sys.stdin.read()
    try:
        report = json.loads(text)
    except json.JSONDecodeError:
        print(f"cluster status did not answer: {text.strip()[:2000]}")
        return 1
    found = problems(report, args.ca, args.expect)
    for problem in found:
        print(problem)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
