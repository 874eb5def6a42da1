"""Where a table's ranges live, as the BookKeeper protocol tells clients (GetStream, then
GetActiveRanges), for tests that need to know which container (server, worker) holds a key."""

from __future__ import annotations

import grpc

from tablekeeper.routing import RangeInfo, RangeRouter
from tablekeeper_proto.bookkeeper import storage_pb2, storage_pb2_grpc, stream_pb2
from tablekeeper_server.etcd.keys import KEYSPACE_PKEY
from tablekeeper_server.etcd.names import DEFAULT_KEYSPACE

Metadata = tuple[tuple[str, str], ...]
TIMEOUT_S = 30.0


def table_router(
    channel: grpc.Channel, namespace: str, table: str, metadata: Metadata = ()
) -> RangeRouter:
    """The router of table `namespace/table` (its active ranges), asked over `channel`."""
    found = storage_pb2_grpc.RootRangeServiceStub(channel).GetStream(
        storage_pb2.GetStreamRequest(
            stream_name=stream_pb2.StreamName(namespace_name=namespace, stream_name=table)
        ),
        metadata=metadata,
        timeout=TIMEOUT_S,
    )
    assert found.code == storage_pb2.SUCCESS, found
    ranges = storage_pb2_grpc.MetaRangeServiceStub(channel).GetActiveRanges(
        storage_pb2.GetActiveRangesRequest(stream_id=found.stream_props.stream_id),
        metadata=metadata,
        timeout=TIMEOUT_S,
    )
    assert ranges.code == storage_pb2.SUCCESS, ranges
    return RangeRouter(
        [
            RangeInfo(
                r.props.range_id,
                r.props.start_hash_key,
                r.props.end_hash_key,
                r.props.storage_container_id,
            )
            for r in ranges.ranges
        ]
    )


def etcd_keyspace_container(
    channel: grpc.Channel, keyspace: str = DEFAULT_KEYSPACE, metadata: Metadata = ()
) -> int:
    """The container of the range of table etcd/KEYSPACE that holds the etcd keyspace."""
    return table_router(channel, "etcd", keyspace, metadata).route(KEYSPACE_PKEY).container_id
