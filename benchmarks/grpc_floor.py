"""The Python gRPC floor: a grpc.aio server on uvloop (as `tablekeeper server` runs) whose
`TableService.Put` / `Range` and `TableKeeper.Batch` answer an empty response at once.

`benchmarks/native.py` starts it beside TableKeeper and etcd and sends it the same ghz calls, so
each invocation shows how much of a TableKeeper call is the gRPC runtime itself (the C core,
its Cython glue, the event loop) and how much is TableKeeper's own path. Not a server to use.

    .venv/bin/python benchmarks/grpc_floor.py --port 7777
"""

from __future__ import annotations

import argparse
import asyncio

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port))
    else:
        uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
