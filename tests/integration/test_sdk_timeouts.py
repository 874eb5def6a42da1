"""Per-call `timeout=` and `OutcomeUnknownError` against a real server, frozen with SIGSTOP so
that calls hang: a write cut off by its gRPC deadline is an `OutcomeUnknownError` (not
retryable), a read is retried until the policy's deadline; `timeout=` bounds a whole call,
retries included, and raises `DeadlineExceededError` / `WriteTimeoutError`."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from tablekeeper import (
    AsyncClient,
    Client,
    DeadlineExceededError,
    OutcomeUnknownError,
    RetryPolicy,
    UnavailableError,
    WriteTimeoutError,
)
from tests.support.server import ServerProcess, wait_all_threads_stopped

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("timeouts") / "data").start()
    yield server
    server.stop()


@pytest.fixture()
def namespace(server: ServerProcess) -> str:
    ns = "t" + uuid.uuid4().hex[:8]
    with Client(server.service) as client:
        client.create_namespace(ns)
        client.create_table(ns, "t", ranges=2)
    return ns


@contextlib.contextmanager
def frozen(server: ServerProcess) -> Iterator[None]:
    """The server process stopped (SIGSTOP): connections stay open, calls get no answer. Entered
    once every thread of the process has stopped: `kill` returns before they do (each stops on
    its way back to user mode, one in a system call only when that returns), and a call made
    meanwhile could still be answered."""
    assert server.process is not None
    pid = server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_all_threads_stopped(pid)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def warm_up(step: Callable[[], object], patience_s: float = 120.0) -> None:
    """Run a set-up `step` until it succeeds once. The client under test gives every call
    0.3 s, and on a busy machine the first calls on a new table (connections, the route
    lookup, the new range's first group commit) may take longer: set-up is not the step under
    test, so it gets all the attempts it needs (each warm one is a put of the same value)."""
    give_up = time.monotonic() + patience_s
    while True:
        try:
            step()
            return
        except UnavailableError:  # DEADLINE_EXCEEDED (outcome unknown) or a retryable miss
            if time.monotonic() > give_up:
                raise


@pytest.mark.parametrize("coalesce", [True, False])
def test_a_write_cut_off_by_its_deadline_is_outcome_unknown(
    server: ServerProcess, namespace: str, coalesce: bool
) -> None:
    policy = RetryPolicy(deadline_s=1.0, call_timeout_s=0.3)
    with Client(server.service, retry=policy, coalesce=coalesce) as client:
        warm_up(lambda: client.table(namespace, "t"))
        table = client.table(namespace, "t")
        warm_up(lambda: table.put("p", "warm", "up"))  # routes and connections in place
        with frozen(server):
            with pytest.raises(OutcomeUnknownError) as cut_off:
                table.put("p", "k", "v")
            # Reads are retried (until the policy's deadline): a plain, retryable Unavailable.
            with pytest.raises(UnavailableError) as read:
                table.get("p", "k")
    error = cut_off.value
    assert type(error) is OutcomeUnknownError and isinstance(error, UnavailableError)
    assert error.outcome_unknown and not error.retryable
    assert "DEADLINE_EXCEEDED" in str(error)
    assert type(read.value) is UnavailableError
    assert read.value.retryable and not read.value.outcome_unknown


def test_timeout_bounds_the_whole_call_retries_included(
    server: ServerProcess, namespace: str
) -> None:
    # The policy alone would wait 30 s per attempt and retry reads for 60 s.
    policy = RetryPolicy(deadline_s=60.0, call_timeout_s=30.0)
    with Client(server.service, retry=policy) as client:
        table = client.table(namespace, "t")
        assert table.put("p", "a", "1", timeout=10) is None
        assert table.get("p", "a", timeout=10) is not None
        with frozen(server):
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError) as read:
                table.get("p", "a", timeout=0.5)
            with pytest.raises(WriteTimeoutError) as write:
                table.put("p", "b", "2", timeout=0.5)
            with pytest.raises(DeadlineExceededError):
                list(table.scan("p", timeout=0.5))
            with pytest.raises(WriteTimeoutError):
                table.txn("p").if_absent("c").then_put("c", "3").commit(timeout=0.5)
            elapsed = time.monotonic() - started
        # Without `timeout=` the first of these calls alone would wait out the policy's 30 s.
        assert elapsed < policy.call_timeout_s, elapsed
        assert isinstance(read.value, TimeoutError) and isinstance(read.value, UnavailableError)
        assert read.value.retryable and not read.value.outcome_unknown
        assert "timeout=0.5s" in str(read.value)
        assert isinstance(write.value, OutcomeUnknownError) and write.value.outcome_unknown
        assert not write.value.retryable and isinstance(write.value, TimeoutError)
        # Thawed, the same client works again (the timed-out put may or may not be there).
        assert table.get("p", "a", timeout=30) is not None
        with pytest.raises(ValueError):
            table.get("p", "a", timeout=0)


async def test_async_timeout(server: ServerProcess, namespace: str) -> None:
    async with AsyncClient(server.service) as client:
        table = await client.table(namespace, "t")
        assert await table.increment("p", "n", 2, get_total=True, timeout=10) == 2
        with frozen(server):
            with pytest.raises(WriteTimeoutError):
                await table.increment("p", "n", 1, timeout=0.3)
            with pytest.raises(DeadlineExceededError):
                await table.count("p", timeout=0.3)
            with pytest.raises(WriteTimeoutError):
                await table.batch_put([("p", "x", "1")], timeout=0.3)
        assert await table.count("p", timeout=30) >= 1


def test_namespace_table_and_permission_calls_take_a_timeout(
    server: ServerProcess, namespace: str
) -> None:
    policy = RetryPolicy(deadline_s=60.0, call_timeout_s=30.0)
    with Client(server.service, retry=policy) as client:
        assert client.get_table(namespace, "t", timeout=10).name == "t"
        assert namespace in [ns.name for ns in client.list_namespaces(timeout=10)]
        with frozen(server):
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError) as read:
                client.get_namespace(namespace, timeout=0.5)
            with pytest.raises(DeadlineExceededError):
                client.list_tables(namespace, timeout=0.5)
            with pytest.raises(DeadlineExceededError):
                client.table(namespace, "t", timeout=0.5)
            with pytest.raises(WriteTimeoutError) as write:
                client.create_table(namespace, "u", ranges=2, timeout=0.5)
            with pytest.raises(WriteTimeoutError):
                client.grant(namespace, "reader", ["read"], timeout=0.5)
            elapsed = time.monotonic() - started
        # Without `timeout=` the first of these calls alone would wait out the policy's 30 s.
        assert elapsed < policy.call_timeout_s, elapsed
        assert "timeout=0.5s" in str(read.value) and not read.value.outcome_unknown
        assert write.value.outcome_unknown and not write.value.retryable
        assert client.get_namespace(namespace, timeout=30) > 0
        with pytest.raises(ValueError):
            client.list_namespaces(timeout=-1)


async def test_async_namespace_calls_take_a_timeout(server: ServerProcess, namespace: str) -> None:
    async with AsyncClient(server.service) as client:
        assert (await client.get_table(namespace, "t", timeout=10)).name == "t"
        with frozen(server):
            with pytest.raises(WriteTimeoutError):
                await client.create_namespace("n" + uuid.uuid4().hex[:8], timeout=0.3)
            with pytest.raises(DeadlineExceededError):
                await client.list_permissions(namespace, timeout=0.3)
