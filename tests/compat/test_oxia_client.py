"""The real Oxia Java client (io.github.oxia-db:oxia-client 0.6.2, the one Pulsar 4.0.7 ships)
against TableKeeper's Oxia front-end (`--oxia-port`), through a small Java driver
(tests/compat/oxia/OxiaDriver.java, compiled against Pulsar's jars from `deploy/pulsar.sh
fetch`); Oxia's error codes for bad input, through the generated Python stubs. (A real Pulsar
on TableKeeper's Oxia port: test_oxia_pulsar.py.)

One standalone server for the module; each scenario uses keys of its own.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest

from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc
from tests.compat.oxia.harness import RUN_TIMEOUT_S, Oxia, oxia_server

pytestmark = pytest.mark.standalone_only("a server of its own, with --oxia-port")

# Scenarios that need nothing from the test while they run: one JVM for all of them.
PLAIN = ("versions", "ranges", "comparisons", "ephemeral-close", "notifications", "sequences")


@pytest.fixture(scope="module")
def oxia(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oxia]:
    with oxia_server(tmp_path_factory, driver=True) as started:
        yield started


@pytest.fixture(scope="module")
def plain_results(oxia: Oxia) -> dict[str, str]:
    process = oxia.driver("+".join(PLAIN))
    out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    results = {}
    for line in out.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("PASS", "FAIL"):
            scenario = rest.split(":")[0]
            results[scenario] = line if verdict == "FAIL" else "PASS"
            if verdict == "FAIL":
                results[scenario] += "\n" + err[-6000:]
    return results


@pytest.mark.on_grpc_aio("the Oxia Java client (grpc-java): write and read streams, notifications")
@pytest.mark.parametrize("scenario", PLAIN)
def test_java_client_scenario(plain_results: dict[str, str], scenario: str) -> None:
    """versions: put/get/delete with version ids, modification counts, timestamps, expected
    versions (-1 and N), refusals that change nothing; ranges: list/rangeScan/deleteRange in
    Oxia's key order over all shards; comparisons: FLOOR/CEILING/LOWER/HIGHER; ephemeral-close:
    an ephemeral record with its session id and owner goes when the session closes;
    notifications: created/modified/deleted in order; sequences: sequence keys (one and two
    parts), partition keys, sequence updates."""
    result = plain_results.get(scenario, "never ran (an earlier scenario failed)")
    assert result == "PASS", result


def test_ephemeral_record_goes_when_its_session_expires(oxia: Oxia) -> None:
    key = f"/ephemeral/crash-{uuid.uuid4().hex}"
    assert "PASS ephemeral-crash" in oxia.run("ephemeral-crash", key)
    oxia.run("wait-gone", key)  # the session (10 s) expires on the server: the key goes


def test_ephemeral_record_of_a_dead_client_goes_after_a_server_restart(oxia: Oxia) -> None:
    """The server restarts before the dead client's session expired: the session is timed again
    from the start (a fresh TTL) and its record goes. (The server opens every shard of `default`
    at start, so this happens even if nobody reads; this test reads, so it cannot tell.)"""
    key = f"/ephemeral/restart-{uuid.uuid4().hex}"
    assert "PASS ephemeral-crash" in oxia.run("ephemeral-crash", key)
    oxia.server.restart()
    oxia.run("wait-gone", key)


def _cli(oxia: Oxia, *args: str) -> None:
    command = "import sys; from tablekeeper.cli import main; sys.exit(main())"
    subprocess.run(
        [sys.executable, "-c", command, "--service", oxia.server.service, *args],
        check=True,
        timeout=60,
    )


@pytest.mark.on_grpc_aio("the namespace in the call's metadata")
def test_other_namespace_and_unknown_namespace(oxia: Oxia) -> None:
    name = f"ns{uuid.uuid4().hex[:8]}"
    _cli(oxia, "table", "create", f"oxia/{name}", "--ranges", "2")
    oxia.run("namespace", name)


@pytest.mark.on_grpc_aio("streams reconnect through the server's own shutdown")
def test_notifications_continue_across_a_server_restart(oxia: Oxia) -> None:
    process = oxia.driver("notifications-restart")
    assert process.stdout is not None and process.stdin is not None
    try:
        line = process.stdout.readline()
        while line and line.strip() != "RESTART":
            line = process.stdout.readline()
        assert line.strip() == "RESTART", "driver ended before the restart"
        oxia.server.restart()
        process.stdin.write("go\n")
        process.stdin.flush()
        out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, f"{out}\n{err[-6000:]}"


@pytest.fixture
def stub(oxia: Oxia) -> Iterator[client_pb2_grpc.OxiaClientStub]:
    with grpc.insecure_channel(oxia.address) as channel:
        yield client_pb2_grpc.OxiaClientStub(channel)


def _shards(stub: client_pb2_grpc.OxiaClientStub) -> list[int]:
    stream = stub.GetShardAssignments(client_pb2.ShardAssignmentsRequest(namespace="default"))
    first = next(iter(stream))
    stream.cancel()
    assignment = first.namespaces["default"]
    assert assignment.shard_key_router == client_pb2.XXHASH3
    ranges = [
        (a.int32_hash_range.min_hash_inclusive, a.int32_hash_range.max_hash_inclusive)
        for a in assignment.assignments
    ]
    # The shards' hash ranges cover the 32-bit space exactly, without overlap.
    ranges.sort()
    assert ranges[0][0] == 0 and ranges[-1][1] == 2**32 - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    return [a.shard for a in assignment.assignments]


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failure:
        call()
    code: grpc.StatusCode = failure.value.code()
    return code


@pytest.mark.on_grpc_aio("status codes and messages")
def test_bad_input_gets_oxia_codes_and_writes_nothing(
    stub: client_pb2_grpc.OxiaClientStub,
) -> None:
    shard = _shards(stub)[0]
    key = f"/bad/{uuid.uuid4().hex}"
    good = client_pb2.PutRequest(key=key + "-good", value=b"v")
    bad_requests = [
        # A sequence key without a partition key, or with an expected version, or a first
        # delta of 0: refused as a whole, the good put with it is not applied either.
        client_pb2.PutRequest(key=key, value=b"v", sequence_key_delta=[1]),
        client_pb2.PutRequest(
            key=key, value=b"v", partition_key="p", sequence_key_delta=[1], expected_version_id=-1
        ),
        client_pb2.PutRequest(key=key, value=b"v", partition_key="p", sequence_key_delta=[0]),
        client_pb2.PutRequest(key=key, value=b"v", expected_version_id=-2),
        client_pb2.PutRequest(key="k" * 70_000, value=b"v"),
    ]
    for bad in bad_requests:
        request = client_pb2.WriteRequest(shard=shard, puts=[good, bad])
        assert _code(functools.partial(stub.Write, request)) == grpc.StatusCode.INVALID_ARGUMENT
    # A value over the server's --max-value-bytes (4 MiB): RESOURCE_EXHAUSTED, as Oxia answers a
    # request over its gRPC frame; the good put with it is not applied either.
    big = client_pb2.PutRequest(key=key + "-big", value=b"v" * (4 * 1024 * 1024 + 1))
    request = client_pb2.WriteRequest(shard=shard, puts=[good, big])
    with pytest.raises(grpc.RpcError) as refused:
        stub.Write(request)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (refused.value.details() or "").startswith("oxia: value is 4194305 bytes")
    read = client_pb2.ReadRequest(shard=shard, gets=[client_pb2.GetRequest(key=key + "-good")])
    (response,) = list(stub.Read(read))
    assert response.gets[0].status == client_pb2.KEY_NOT_FOUND

    # An ephemeral put naming a session that does not exist: SESSION_DOES_NOT_EXIST, no record.
    write = client_pb2.WriteRequest(
        shard=shard, puts=[client_pb2.PutRequest(key=key, value=b"v", session_id=999_999_999)]
    )
    assert stub.Write(write).puts[0].status == client_pb2.SESSION_DOES_NOT_EXIST
    (response,) = list(
        stub.Read(client_pb2.ReadRequest(shard=shard, gets=[client_pb2.GetRequest(key=key)]))
    )
    assert response.gets[0].status == client_pb2.KEY_NOT_FOUND

    # Unknown shard, session, namespace.
    unknown = client_pb2.WriteRequest(shard=shard + 12345, puts=[good])
    assert _code(lambda: stub.Write(unknown)) == grpc.StatusCode.NOT_FOUND
    heartbeat = client_pb2.SessionHeartbeat(shard=shard, session_id=999_999_999)
    assert _code(lambda: stub.KeepAlive(heartbeat)) == grpc.StatusCode.NOT_FOUND
    close = client_pb2.CloseSessionRequest(shard=shard, session_id=999_999_999)
    assert _code(lambda: stub.CloseSession(close)) == grpc.StatusCode.NOT_FOUND
    missing = client_pb2.ShardAssignmentsRequest(namespace="no-such-namespace")
    with pytest.raises(grpc.RpcError) as failure:
        next(iter(stub.GetShardAssignments(missing)))
    assert failure.value.code() == grpc.StatusCode.UNKNOWN
    assert failure.value.details() == "oxia: namespace not found"
    bad_timeout = client_pb2.CreateSessionRequest(shard=shard, session_timeout_ms=1)
    assert _code(lambda: stub.CreateSession(bad_timeout)) == grpc.StatusCode.INVALID_ARGUMENT


def test_a_deleted_namespace_takes_nothing_and_comes_back_empty(
    stub: client_pb2_grpc.OxiaClientStub, oxia: Oxia
) -> None:
    """Deleting the table of a namespace: its shards answer "shard not found" and nothing is
    written; created again, the namespace has new shards and none of the old keys."""
    name = f"gone{uuid.uuid4().hex[:8]}"
    _cli(oxia, "table", "create", f"oxia/{name}", "--ranges", "2")

    def shards() -> list[int]:
        stream = stub.GetShardAssignments(client_pb2.ShardAssignmentsRequest(namespace=name))
        first = next(iter(stream))
        stream.cancel()
        return [a.shard for a in first.namespaces[name].assignments]

    old = shards()
    put = client_pb2.PutRequest(key="/k", value=b"v")
    for shard in old:
        assert stub.Write(client_pb2.WriteRequest(shard=shard, puts=[put])).puts[0].status == 0
    _cli(oxia, "table", "delete", f"oxia/{name}")
    for shard in old:
        write = client_pb2.WriteRequest(shard=shard, puts=[put])
        assert _code(functools.partial(stub.Write, write)) == grpc.StatusCode.NOT_FOUND
    _cli(oxia, "table", "create", f"oxia/{name}", "--ranges", "2")
    new = shards()
    assert not set(new) & set(old)
    for shard in new:
        read = client_pb2.ReadRequest(shard=shard, gets=[client_pb2.GetRequest(key="/k")])
        (response,) = list(stub.Read(read))
        assert response.gets[0].status == client_pb2.KEY_NOT_FOUND
