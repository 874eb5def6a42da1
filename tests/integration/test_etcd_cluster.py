"""The etcd port in cluster mode: every server runs one (and one per further keyspace); a server
that does not own the keyspace range's container passes each etcd call (unary and streaming)
through to the owner's etcd port.
Three real servers, ZooKeeper and Pulsar; the owner is killed with SIGKILL mid-test."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
import pytest

from tablekeeper_proto.etcd import kv_pb2, rpc_pb2, rpc_pb2_grpc
from tests.support.cluster import TestCluster
from tests.support.routes import etcd_keyspace_container
from tests.support.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

CONTAINERS = 4
CALL_TIMEOUT_S = 10.0
WAIT_S = 90.0
T = TypeVar("T")
ETCDCTL = shutil.which("etcdctl")


class Etcd:
    """Stubs of one server's etcd port."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.kv = rpc_pb2_grpc.KVStub(self.channel)
        self.lease = rpc_pb2_grpc.LeaseStub(self.channel)
        self.watch = rpc_pb2_grpc.WatchStub(self.channel)
        self.cluster = rpc_pb2_grpc.ClusterStub(self.channel)

    def put(self, key: str, value: str, lease: int = 0) -> rpc_pb2.PutResponse:
        response: rpc_pb2.PutResponse = self.kv.Put(
            rpc_pb2.PutRequest(key=key.encode(), value=value.encode(), lease=lease),
            timeout=CALL_TIMEOUT_S,
        )
        return response

    def get(self, key: str, *, prefix: bool = False) -> rpc_pb2.RangeResponse:
        end = key[:-1] + chr(ord(key[-1]) + 1) if prefix else ""
        response: rpc_pb2.RangeResponse = self.kv.Range(
            rpc_pb2.RangeRequest(key=key.encode(), range_end=end.encode()),
            timeout=CALL_TIMEOUT_S,
        )
        return response

    def close(self) -> None:
        self.channel.close()


def retry_unavailable(call: Callable[[], T], timeout_s: float = WAIT_S) -> T:
    """`call()` until it succeeds; every failure meanwhile must be etcd's "unavailable" (retry),
    or a deadline (the call waited on a server that is gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), (
                code,
                details,
            )
            if code == grpc.StatusCode.UNAVAILABLE:
                assert details.startswith("etcdserver:"), details
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


class WatchStream:
    """One Watch call: requests through a queue, responses read one by one."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self._requests: queue.Queue[rpc_pb2.WatchRequest | None] = queue.Queue()
        self.responses: Iterator[rpc_pb2.WatchResponse] = etcd.watch.Watch(
            iter(self._requests.get, None), timeout=WAIT_S
        )
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        self._requests.put(
            rpc_pb2.WatchRequest(
                create_request=rpc_pb2.WatchCreateRequest(
                    key=prefix.encode(), range_end=end.encode()
                )
            )
        )
        created = next(self.responses)
        assert created.created and not created.canceled, created

    def next_events(self) -> list[kv_pb2.Event]:
        while True:
            response = next(self.responses)
            if response.events:
                return list(response.events)

    def close(self) -> None:
        self._requests.put(None)
        cancel = getattr(self.responses, "cancel", None)
        if cancel is not None:
            cancel()


def test_etcd_through_a_non_owner_and_after_the_owner_dies(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(containers=CONTAINERS).init()
    addresses, apps_addresses = [], []
    for _ in range(3):
        port, apps_port = free_port(), free_port()
        cluster.add_server(["--etcd-port", str(port), "--etcd-keyspaces", f"apps={apps_port}"])
        addresses.append(f"127.0.0.1:{port}")
        apps_addresses.append(f"127.0.0.1:{apps_port}")
    cluster.wait_ready(WAIT_S)
    etcds = [Etcd(address) for address in addresses]
    apps = [Etcd(address) for address in apps_addresses]
    watches: list[WatchStream] = []
    try:
        for etcd in etcds + apps:  # each server has found each keyspace (or its owner)
            retry_unavailable(lambda etcd=etcd: etcd.get("probe"))  # type: ignore[misc]

        # A second keyspace (--etcd-keyspaces) is served through every server too, apart.
        for i, etcd in enumerate(apps):
            etcd.put(f"apps/{i}", str(i))
        for etcd in apps:
            in_apps = etcd.get("apps/", prefix=True)
            assert [kv.value for kv in in_apps.kvs] == [b"0", b"1", b"2"]
        assert etcds[0].get("apps/", prefix=True).count == 0
        with grpc.insecure_channel(cluster.endpoint(0)) as channel:
            container = etcd_keyspace_container(channel)
        owner = cluster.index(cluster.assigned_to(container) or "")
        others = [i for i in range(3) if i != owner]
        via, third = etcds[others[0]], etcds[others[1]]

        # Unary KV calls through a server that does not own the keyspace.
        assert via.put("kv/a", "1").header.revision > 0
        got = via.get("kv/a")
        assert [(kv.key, kv.value) for kv in got.kvs] == [(b"kv/a", b"1")]
        txn = via.kv.Txn(
            rpc_pb2.TxnRequest(
                compare=[
                    rpc_pb2.Compare(
                        key=b"kv/a",
                        target=rpc_pb2.Compare.VALUE,
                        result=rpc_pb2.Compare.EQUAL,
                        value=b"1",
                    )
                ],
                success=[
                    rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"kv/b", value=b"2"))
                ],
            ),
            timeout=CALL_TIMEOUT_S,
        )
        assert txn.succeeded
        assert [kv.value for kv in third.get("kv/b").kvs] == [b"2"]

        # A lease, kept alive over a stream, with an ephemeral key, all through the non-owner.
        lease = via.lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), timeout=CALL_TIMEOUT_S)
        assert lease.ID > 0
        via.put("eph/x", "here", lease=lease.ID)
        keep_alive = via.lease.LeaseKeepAlive(
            iter([rpc_pb2.LeaseKeepAliveRequest(ID=lease.ID)]), timeout=CALL_TIMEOUT_S
        )
        answers = list(keep_alive)
        assert [(a.ID, a.TTL > 0) for a in answers] == [(lease.ID, True)]
        alive = via.lease.LeaseTimeToLive(
            rpc_pb2.LeaseTimeToLiveRequest(ID=lease.ID, keys=True), timeout=CALL_TIMEOUT_S
        )
        assert list(alive.keys) == [b"eph/x"]

        # A watch opened through the non-owner sees a put made through another server.
        watch = WatchStream(via, "w/")
        watches.append(watch)
        third.put("w/1", "one")
        assert [(e.type, e.kv.key, e.kv.value) for e in watch.next_events()] == [
            (kv_pb2.Event.PUT, b"w/1", b"one")
        ]

        # MemberList (endpoint discovery) names every server's etcd port.
        members = via.cluster.MemberList(rpc_pb2.MemberListRequest(), timeout=CALL_TIMEOUT_S)
        urls = sorted(url for member in members.members for url in member.clientURLs)
        assert urls == sorted(f"http://{address}" for address in addresses)
        assert len({member.ID for member in members.members}) == 3

        # etcd's own command-line client, through the non-owner.
        if ETCDCTL is not None:
            env = {**os.environ, "ETCDCTL_API": "3"}

            def etcdctl(*args: str) -> str:
                done = subprocess.run(
                    [ETCDCTL, f"--endpoints={via.address}", *args],
                    capture_output=True,
                    text=True,
                    timeout=CALL_TIMEOUT_S * 3,
                    env=env,
                )
                assert done.returncode == 0, f"etcdctl {' '.join(args)}: {done.stderr}"
                return done.stdout

            assert etcdctl("put", "ctl/a", "from-etcdctl").strip() == "OK"
            assert etcdctl("get", "ctl/a", "--print-value-only").strip() == "from-etcdctl"
            listed = etcdctl("member", "list")
            assert all(f"http://{address}" in listed for address in addresses), listed

        acknowledged = {f"ack/{i:02d}": str(i) for i in range(20)}
        revision = 0
        for key, value in acknowledged.items():
            revision = via.put(key, value).header.revision

        cluster.kill(owner)
        # The relayed watch ends as etcd's "unavailable" (clients re-open it elsewhere).
        with pytest.raises(grpc.RpcError) as ended:
            watch.next_events()
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (ended.value.details() or "").startswith("etcdserver:")
        cluster.wait_ready(WAIT_S)
        new_owner = cluster.index(cluster.assigned_to(container) or "")
        assert new_owner != owner
        survivor = etcds[next(i for i in others if i != new_owner)]

        after = retry_unavailable(lambda: survivor.get("ack/", prefix=True))
        assert {kv.key.decode(): kv.value.decode() for kv in after.kvs} == acknowledged
        assert after.header.revision >= revision
        assert retry_unavailable(lambda: survivor.put("kv/c", "3")).header.revision > revision

        # A new watch through a non-owner sees events after the failover too.
        watch = WatchStream(survivor, "w/")
        watches.append(watch)
        retry_unavailable(lambda: etcds[new_owner].put("w/2", "two"))
        assert [(e.kv.key, e.kv.value) for e in watch.next_events()] == [(b"w/2", b"two")]
        survivor_apps = apps[next(i for i in others if i != new_owner)]
        kept = retry_unavailable(lambda: survivor_apps.get("apps/", prefix=True))
        assert [kv.value for kv in kept.kvs] == [b"0", b"1", b"2"]
    finally:
        for watch in watches:
            watch.close()
        for etcd in etcds + apps:
            etcd.close()
