"""The etcd keyspace: one pkey of one range of a dedicated table, and the operations on it.

etcd promises one revision order over its whole keyspace, so the keyspace cannot be spread over
hash ranges: it is the single range of table `etcd/keyspace` (created at start if missing), and
its revisions are that range's log positions. Writes are logged as etcd txns (see `etcd.apply`);
reads run synchronously on the range's applied state, so they are linearizable on the range's
owner. Leases are the range's sessions (a lease id is the revision that created it).
"""

from __future__ import annotations

import contextlib
import logging

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_proto.etcd import apply_pb2, rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.errors import (
    NamespaceExistsError,
    NamespaceNotFoundError,
    StreamExistsError,
    StreamNotFoundError,
)
from tablekeeper_server.etcd.apply import run_read_only_txn
from tablekeeper_server.etcd.errors import EtcdError
from tablekeeper_server.etcd.keys import KEYSPACE_PKEY
from tablekeeper_server.etcd.state import PastView, StoreView, do_range
from tablekeeper_server.range.replica import Range

log = logging.getLogger(__name__)

NAMESPACE = "etcd"
TABLE = "keyspace"
CLUSTER_ID = 0x746B6574636431  # "tketcd1"
MEMBER_ID = 0x746B31  # "tk1"


class Keyspace:
    def __init__(self, registry: ContainerRegistry) -> None:
        self.registry = registry
        self.stream_id = 0

    async def open(self) -> None:
        """Find (or create) the keyspace's table and open its range, so its leases are timed
        from now on (a range's sessions are timed only while it is open)."""
        root = self.registry.root
        try:
            props = root.get_stream(NAMESPACE, TABLE)
        except (NamespaceNotFoundError, StreamNotFoundError):
            with contextlib.suppress(NamespaceExistsError):
                await root.create_namespace(NAMESPACE, stream_pb2.NamespaceConfiguration())
            conf = stream_pb2.StreamConfiguration(
                min_num_ranges=1, initial_num_ranges=1, storage_type=stream_pb2.TABLE
            )
            try:
                props = await root.create_stream(NAMESPACE, TABLE, conf)
            except StreamExistsError:
                props = root.get_stream(NAMESPACE, TABLE)
        self.stream_id = props.stream_id
        range_ = await self.range()
        log.info("etcd keyspace: table %s/%s, range %s", NAMESPACE, TABLE, range_.name.log_name)

    async def range(self) -> Range:
        return await self.registry.table_range(self.stream_id, KEYSPACE_PKEY)

    @staticmethod
    def header(revision: int) -> rpc_pb2.ResponseHeader:
        return rpc_pb2.ResponseHeader(
            cluster_id=CLUSTER_ID, member_id=MEMBER_ID, revision=revision, raft_term=1
        )

    async def write(self, txn: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """Log and apply one etcd write; raises `EtcdError` if etcd would refuse it."""
        range_ = await self.range()
        result = await range_.execute(wal_pb2.WalCommand(etcd_txn=txn.SerializeToString()))
        assert isinstance(result, apply_pb2.ApplyResult), result
        if result.error:
            raise EtcdError(result.error)
        response = result.response
        response.header.CopyFrom(self.header(response.header.revision))
        return response

    async def read(self, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        range_ = await self.range()
        current = StoreView(range_.applied_state())
        view: StoreView | PastView = current
        if req.revision > current.revision:
            raise EtcdError("future_rev")
        if 0 < req.revision < current.revision:
            view = PastView(current, req.revision)
        response = do_range(view, req)
        response.header.CopyFrom(self.header(current.revision))
        return response

    async def read_txn(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """A txn that writes nothing, on the applied state (not logged, no new revision)."""
        range_ = await self.range()
        response = run_read_only_txn(StoreView(range_.applied_state()), req)
        response.header.CopyFrom(self.header(response.header.revision))
        return response

    async def revision(self) -> int:
        return (await self.range()).applied_sequence
