"""A small key/value view of a metadata range (no routing key), written through txn commands."""

from __future__ import annotations

from collections.abc import Sequence

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.errors import Code, TableKeeperError
from tablekeeper_server.range.replica import Range


class MetadataKv:
    def __init__(self, range_: Range) -> None:
        self.range = range_

    def get(self, key: bytes) -> bytes | None:
        response = self.range.read(kv_rpc_pb2.RangeRequest(key=key))
        return response.kvs[0].value if response.kvs else None

    def scan(self, start: bytes, end_inclusive: bytes) -> list[tuple[bytes, bytes]]:
        rows: list[tuple[bytes, bytes]] = []
        key = start
        while True:
            response = self.range.read(kv_rpc_pb2.RangeRequest(key=key, range_end=end_inclusive))
            rows.extend((kv.key, kv.value) for kv in response.kvs)
            if not response.more or not response.kvs:
                return rows
            key = response.kvs[-1].key + b"\x00"

    async def commit(
        self,
        *,
        absent: Sequence[bytes] = (),
        puts: Sequence[tuple[bytes, bytes]] = (),
        deletes: Sequence[bytes] = (),
        delete_ranges: Sequence[tuple[bytes, bytes]] = (),
    ) -> bool:
        """Atomically apply the writes if every key in `absent` is absent. False if one exists."""
        txn = kv_rpc_pb2.TxnRequest()
        for key in absent:
            txn.compare.add(
                result=kv_rpc_pb2.Compare.EQUAL, target=kv_rpc_pb2.Compare.VALUE, key=key, value=b""
            )
        for key, value in puts:
            txn.success.add().request_put.CopyFrom(kv_rpc_pb2.PutRequest(key=key, value=value))
        for key in deletes:
            txn.success.add().request_delete_range.CopyFrom(kv_rpc_pb2.DeleteRangeRequest(key=key))
        for start, end in delete_ranges:
            txn.success.add().request_delete_range.CopyFrom(
                kv_rpc_pb2.DeleteRangeRequest(key=start, range_end=end)
            )
        response = await self.range.execute(wal_pb2.WalCommand(txn=txn))
        assert isinstance(response, kv_rpc_pb2.TxnResponse)
        if response.header.code != Code.SUCCESS:
            raise TableKeeperError(f"metadata txn failed with status {response.header.code}")
        if not response.succeeded:
            return False
        for op in response.responses:
            kind = op.WhichOneof("response")
            code = getattr(op, str(kind)).header.code
            if code != Code.SUCCESS:
                raise TableKeeperError(f"metadata txn op failed with status {code}")
        return True
