"""The etcd keyspace: one pkey of one range of a dedicated table, and the operations on it.

etcd promises one revision order over its whole keyspace, so the keyspace cannot be spread over
hash ranges: it is the single range of table `etcd/NAME` (`etcd/keyspace` for `--etcd-port`,
more with `--etcd-keyspaces`; created at start if missing), and
its revisions are that range's log positions. Writes are logged as etcd txns (see `etcd.apply`);
reads run synchronously on the range's applied state, so they are linearizable on the range's
owner. Leases are the range's sessions (a lease id is the revision that created it).

In cluster mode the range lives on whichever server owns its container; the other servers pass
etcd calls through to that server's etcd port (`etcd.server`). The table is then found (or
made) through the root range's owner, in the background: until then calls answer etcd's
"no leader" (retry).
"""

from __future__ import annotations

import asyncio
import logging

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_proto.etcd import apply_pb2, rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.edge.startup import retry_until_done
from tablekeeper_server.etcd.apply import run_read_only_txn
from tablekeeper_server.etcd.errors import EtcdError
from tablekeeper_server.etcd.keys import KEYSPACE_PKEY
from tablekeeper_server.etcd.names import DEFAULT_KEYSPACE
from tablekeeper_server.etcd.state import PastView, StoreView, do_range
from tablekeeper_server.range.apply import failure_of
from tablekeeper_server.range.replica import Range
from tablekeeper_server.rpc.frontends import ensure_table
from tablekeeper_server.rpc.proxy import Forwarder

log = logging.getLogger(__name__)

NAMESPACE = "etcd"
CLUSTER_ID = 0x746B6574636431  # "tketcd1"
MEMBER_ID = 0x746B31  # "tk1"
OPEN_RETRY_S_MAX = 2.0


class Keyspace:
    def __init__(
        self,
        registry: ContainerRegistry,
        forwarder: Forwarder | None = None,
        name: str = DEFAULT_KEYSPACE,
        *,
        clock: Clock,
    ) -> None:
        """`forwarder`: cluster mode (the root range may be on another server). `name`: the
        keyspace's table in namespace `etcd`. `clock`: the server's (retries wait on it)."""
        self.registry = registry
        self._clock = clock
        self.clock = clock
        """The server's clock: the watch streams' progress ticks run on it."""
        self.name = name
        self.stream_id = 0
        self._forwarder = forwarder
        self._opening: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Find (or create) the keyspace's table and open its range, so its leases are timed
        from now on (a range's sessions are timed only while it is open). In cluster mode
        this goes on in the background until the root range's owner answers."""
        if self._forwarder is None:
            await self._open_table()
        else:
            self._opening = asyncio.create_task(self._open_until_done(), name="etcd-keyspace")

    async def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
            await asyncio.gather(self._opening, return_exceptions=True)

    async def _open_table(self) -> None:
        conf = stream_pb2.StreamConfiguration(
            min_num_ranges=1, initial_num_ranges=1, storage_type=stream_pb2.TABLE
        )
        props = await ensure_table(self.registry, self._forwarder, NAMESPACE, self.name, conf)
        self.stream_id = props.stream_id
        log.info("etcd keyspace: table %s/%s (id %d)", NAMESPACE, self.name, self.stream_id)
        if self._forwarder is None:
            await self.range()

    async def _open_until_done(self) -> None:
        what = f"etcd keyspace {self.name}"
        await retry_until_done(what, self._open_table, self._clock, pause_s_max=OPEN_RETRY_S_MAX)

    async def range(self) -> Range:
        if not self.stream_id:
            raise EtcdError("no_leader")  # cluster mode: the table is not found yet
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
        failure = failure_of(result)
        if failure is not None:
            raise failure
        if result.error:
            raise EtcdError(result.error)
        response = result.response
        response.header.CopyFrom(self.header(response.header.revision))
        return response

    async def compact(self, revision: int) -> rpc_pb2.TxnResponse:
        """etcd's Compact: logged, so every later owner of the range refuses what it refused
        (raises `EtcdError` for a future or already compacted revision)."""
        range_ = await self.range()
        result = await range_.execute(wal_pb2.WalCommand(etcd_compact=revision))
        assert isinstance(result, apply_pb2.ApplyResult), result
        failure = failure_of(result)
        if failure is not None:
            raise failure
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
