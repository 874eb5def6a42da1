"""Cluster mode end to end: real ZooKeeper, real Pulsar, several `tablekeeper server` processes.

Load comes from the crash-test workers (tests/support/crash_worker.py): client processes that
journal every put / increment / txn before sending it and again when it resolves, so afterwards
`_check_state` can prove that every acknowledged write is readable, that counters lie within
[acknowledged, attempted], and that nothing was applied twice. Workers are given every server
(`bk://a,b,c`) and a long retry deadline: a moving container must cost them retries, not errors.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from tablekeeper import Client, RetryPolicy
from tablekeeper.routing import RangeInfo, RangeRouter
from tablekeeper_proto.bookkeeper import storage_pb2, storage_pb2_grpc
from tests.integration.test_crash import NS, TABLE, _check_state, _stop_workers, _workers
from tests.support.cluster import TestCluster
from tests.support.crash_worker import JournalSummary, WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

CONTAINERS = 6
WORKERS = 3
TASKS = 16
PATIENT = RetryPolicy(deadline_s=60.0, call_timeout_s=10.0)


# --------------------------------------------------------------------------- helpers


def _create_table(cluster: TestCluster, ranges: int = 6) -> int:
    with Client(cluster.service(0), retry=PATIENT) as client:
        client.create_namespace(NS)
        return client.create_table(NS, TABLE, ranges=ranges).table_id


def _router(cluster: TestCluster, table_id: int) -> RangeRouter:
    with grpc.insecure_channel(cluster.endpoint(0)) as channel:
        stub = storage_pb2_grpc.MetaRangeServiceStub(channel)
        response = stub.GetActiveRanges(
            storage_pb2.GetActiveRangesRequest(stream_id=table_id), timeout=30
        )
    assert response.code == 0, response
    return RangeRouter(
        [
            RangeInfo(
                r.props.range_id,
                r.props.start_hash_key,
                r.props.end_hash_key,
                r.props.storage_container_id,
            )
            for r in response.ranges
        ]
    )


def _pkey_on(router: RangeRouter, containers: frozenset[int]) -> str:
    """A pkey whose range lives on one of `containers`."""
    for i in range(10_000):
        if router.route(f"probe-{i}".encode()).container_id in containers:
            return f"probe-{i}"
    raise AssertionError(f"no pkey routes to containers {sorted(containers)}")


@contextmanager
def _load(cluster: TestCluster, journal_dir: Path, round_: int) -> Iterator[list[WorkerProcess]]:
    """Crash-test workers given every server and a long retry deadline, already under way."""
    with _workers(
        cluster.service_all(), journal_dir, round_, WORKERS, tasks=TASKS, retry_deadline_s=60.0
    ) as workers:
        for worker in workers:
            worker.wait_acked(20, timeout_s=60)
        yield workers


def _errors(journals: list[JournalSummary]) -> list[str]:
    return [
        f"{op.kind} {op.id}: {op.error}"
        for journal in journals
        for op in journal.ops.values()
        if op.outcome == "err"
    ]


def _only_in_flight_errors(journals: list[JournalSummary], victims: int) -> None:
    """A killed server takes the writes it was carrying with it: their outcome is unknown, so
    the SDK reports them (OutcomeUnknownError, an UnavailableError) instead of retrying them
    blindly. Nothing else may fail: every other op was retried until it succeeded."""
    errors = _errors(journals)
    for error in errors:
        assert any(
            s in error for s in ("UnavailableError", "OutcomeUnknownError", "UNAVAILABLE")
        ), error
    assert len(errors) <= victims * WORKERS * TASKS, errors


def _first_write_after(
    cluster: TestCluster, pkey: str, since: float, timeout_s: float = 60.0
) -> float:
    """Seconds from `since` until a put to `pkey` (sent after `since`) succeeds."""
    with Client(cluster.service_all(), retry=PATIENT) as client:
        table = client.table(NS, TABLE)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                table.put(pkey, "failover", str(time.monotonic()))
                return time.monotonic() - since
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def _check(cluster: TestCluster, journals: list[JournalSummary]) -> None:
    with Client(cluster.service_all(), retry=PATIENT) as client:
        checked = _check_state(client, journals)
    assert checked.acked > 0


# --------------------------------------------------------------------------- tests


def test_kill_9_under_load_moves_containers_and_loses_nothing(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(containers=CONTAINERS).start(3)
    table_id = _create_table(cluster)
    router = _router(cluster, table_id)
    controller = cluster.controller()
    victim = next(i for i in range(3) if cluster.endpoint(i) != controller)
    moved = cluster.assignment()[cluster.endpoint(victim)]
    probe = _pkey_on(router, moved)
    with _load(cluster, tmp_path, 0) as workers:
        killed_at = time.monotonic()
        cluster.kill(victim)
        failover_s = _first_write_after(cluster, probe, killed_at)
        cluster.wait_ready(60)
        assert cluster.endpoint(victim) not in cluster.assignment()
        for worker in workers:  # the load goes on after the move
            worker.wait_acked(worker.summary().acked + 20, timeout_s=60)
        journals = _stop_workers(workers)
    print(f"\nfailover: kill -9 -> first write on moved container {failover_s:.2f}s")
    _only_in_flight_errors(journals, victims=1)
    _check(cluster, journals)
    # The killed server comes back empty-handed and gets containers again.
    cluster.restart(victim)
    cluster.wait_ready(60)
    assert cluster.assignment().get(cluster.endpoint(victim))


def test_killed_controller_is_replaced_and_the_cluster_serves(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(containers=CONTAINERS).start(3)
    _create_table(cluster)
    controller = cluster.controller()
    assert controller is not None
    old = cluster.index(controller)
    cluster.kill(old)
    cluster.wait_ready(60)
    successor = cluster.controller()
    assert successor is not None and successor != controller
    assert controller not in cluster.live_servers()
    assert set().union(*cluster.assignment().values()) == set(range(CONTAINERS))
    survivor = cluster.index(successor)
    with Client(cluster.service(survivor), retry=PATIENT) as client:
        table = client.table(NS, TABLE)
        for i in range(50):
            table.put(f"p{i}", "k", f"v{i}")
        assert [table.get(f"p{i}", "k").value for i in range(50)] == [  # type: ignore[union-attr]
            f"v{i}".encode() for i in range(50)
        ]


def test_a_fourth_server_takes_containers_without_failed_requests(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(containers=8).start(3)
    _create_table(cluster)
    with _load(cluster, tmp_path, 0) as workers:
        before = cluster.assignment()
        cluster.add_server()
        cluster.wait_ready(60)
        after = cluster.assignment()
        assert len(after[cluster.endpoint(3)]) == 2, after
        moved = sum(len(before[s] - after.get(s, frozenset())) for s in before)
        assert moved == 2, (before, after)  # only what the new server takes moves
        for worker in workers:
            worker.wait_acked(worker.summary().acked + 20, timeout_s=60)
        journals = _stop_workers(workers)
    assert _errors(journals) == []
    _check(cluster, journals)


def test_rolling_restart_under_load_loses_nothing(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(containers=CONTAINERS).start(3)
    _create_table(cluster)
    epochs_before = {c: cluster.owner(c) for c in range(CONTAINERS)}
    with _load(cluster, tmp_path, 0) as workers:
        for i in range(3):
            assert cluster.stop(i) == 0, cluster.servers[i].log_tail()
            cluster.wait_ready(60)
            cluster.restart(i)
            cluster.wait_ready(60)
            for worker in workers:
                worker.wait_acked(worker.summary().acked + 10, timeout_s=60)
        journals = _stop_workers(workers)
    # Every server went away once: every container changed owner at least once.
    for c in range(CONTAINERS):
        before, after = epochs_before[c], cluster.owner(c)
        assert before is not None and after is not None and after.epoch > before.epoch
    # Each server hands its containers over before it exits, so ops are retried, not failed; a
    # write that reaches a server in the instant its gRPC server stops can still be cut off
    # (CANCELLED: outcome unknown, reported, never retried blindly). Nothing may be lost.
    _only_in_flight_errors(journals, victims=1)
    _check(cluster, journals)


def test_zookeeper_restart_under_load_recovers_without_restarting_servers(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(containers=CONTAINERS).start(3)
    _create_table(cluster)
    pids = [s.process.pid for s in cluster.servers if s.process is not None]
    with _load(cluster, tmp_path, 0) as workers:
        cluster.zk_restart(down_s=1.0)
        cluster.wait_ready(90)
        for worker in workers:
            worker.wait_acked(worker.summary().acked + 20, timeout_s=90)
        journals = _stop_workers(workers)
    assert [s.process.pid for s in cluster.servers if s.process is not None] == pids
    assert all(cluster.alive(i) for i in range(3))
    _only_in_flight_errors(journals, victims=0)
    _check(cluster, journals)


def test_any_server_forwards_to_the_owner(make_cluster: Callable[..., TestCluster]) -> None:
    """Through each server, with the SDK's own routing off (as the BookKeeper client does), a
    key whose container another server owns: the request is forwarded to the owner."""
    cluster = make_cluster(containers=CONTAINERS).start(3)
    table_id = _create_table(cluster)
    router = _router(cluster, table_id)
    assignment = cluster.assignment()
    for i in range(3):
        others = frozenset(range(CONTAINERS)) - assignment[cluster.endpoint(i)]
        pkey = _pkey_on(router, others)
        with Client(cluster.service(i), retry=PATIENT, direct_routing=False) as client:
            table = client.table(NS, TABLE)
            table.put(pkey, "k", f"via {i}")
            assert table.get(pkey, "k").value == f"via {i}".encode()  # type: ignore[union-attr]
        metrics = cluster.servers[i].metrics()
        assert re.search(r'tablekeeper_forwarded_requests_total\{method="Put"\} [1-9]', metrics)


def test_watch_through_a_server_that_does_not_own_the_range(
    make_cluster: Callable[..., TestCluster],
) -> None:
    """A watch opened on a non-owner is relayed from the owner: events and the stream's end."""
    cluster = make_cluster(containers=CONTAINERS).start(3)
    table_id = _create_table(cluster)
    router = _router(cluster, table_id)
    elsewhere = frozenset(range(CONTAINERS)) - cluster.assignment()[cluster.endpoint(0)]
    pkey = _pkey_on(router, elsewhere)
    with Client(cluster.service(0), retry=PATIENT, direct_routing=False) as client:
        table = client.table(NS, TABLE)
        with table.watch(pkey, "a", prev_kv=True) as watch:
            table.put(pkey, "a", "1")
            table.put(pkey, "a", "2")
            events = [next(watch), next(watch)]
        assert [e.kv and e.kv.value for e in events] == [b"1", b"2"]
        assert events[1].prev is not None and events[1].prev.value == b"1"
