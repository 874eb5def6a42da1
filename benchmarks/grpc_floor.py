"""The Python gRPC floor: a grpc.aio server on uvloop (as `tablekeeper server` runs) whose
`TableService.Put` / `Range` and `TableKeeper.Batch` answer an empty response at once.

`benchmarks/native.py` starts it beside TableKeeper and etcd and sends it the same ghz calls, so
each invocation shows how much of a TableKeeper call is the gRPC runtime itself (the C core,
its Cython glue, the event loop) and how much is TableKeeper's own path. Not a server to use.

`--runtime envoy` is the same no-op under another runtime: the ASGI function `app` below, hosted
by Envoy's HTTP/2 through pyvoy (on uvloop, Envoy's one ASGI worker thread), answering every
call with an empty message and status OK. What the two floors differ by is what grpc.aio costs
a Python server per call beyond a runtime that leaves HTTP/2 to C++.

    .venv/bin/python benchmarks/grpc_floor.py --port 7777 [--runtime envoy]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from tablekeeper_proto.bookkeeper import kv_rpc_pb2, kv_rpc_pb2_grpc
from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc


class _NoOpTable(kv_rpc_pb2_grpc.TableServiceServicer):
    async def Put(  # noqa: N802 (gRPC method name)
        self, request: kv_rpc_pb2.PutRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> kv_rpc_pb2.PutResponse:
        return kv_rpc_pb2.PutResponse()

    async def Range(  # noqa: N802
        self, request: kv_rpc_pb2.RangeRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> kv_rpc_pb2.RangeResponse:
        return kv_rpc_pb2.RangeResponse()


class _NoOpBatch(tablekeeper_pb2_grpc.TableKeeperServicer):
    async def Batch(  # noqa: N802
        self,
        request: tablekeeper_pb2.BatchRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> tablekeeper_pb2.BatchResponse:
        return tablekeeper_pb2.BatchResponse()


async def serve(port: int) -> None:
    server = grpc.aio.server()
    kv_rpc_pb2_grpc.add_TableServiceServicer_to_server(_NoOpTable(), server)
    tablekeeper_pb2_grpc.add_TableKeeperServicer_to_server(_NoOpBatch(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


_EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"  # not compressed, length 0


async def app(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """The no-op as an ASGI application (`--runtime envoy`): whatever the method, an empty
    message and grpc-status 0 in the trailers."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    start = {"type": "http.response.start", "status": 200, "trailers": True}
    await send({**start, "headers": [(b"content-type", b"application/grpc")]})
    await send({"type": "http.response.body", "body": _EMPTY_MESSAGE, "more_body": False})
    trailers = [(b"grpc-status", b"0")]
    await send({"type": "http.response.trailers", "headers": trailers, "more_trailers": False})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--runtime", choices=("grpc-aio", "envoy"), default="grpc-aio")
    args = parser.parse_args()
    if args.runtime == "envoy":
        pyvoy = str(Path(sys.executable).parent / "pyvoy")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        )
        os.execv(pyvoy, [pyvoy, "--port", str(args.port), "--loop", "uvloop", "grpc_floor:app"])
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port))
    else:
        uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
