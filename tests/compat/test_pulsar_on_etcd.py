"""Pulsar 4.0.7 with its metadata in TableKeeper through the etcd API (issue 14): Pulsar's own
etcd metadata store (jetcd), `metadataStoreUrl=etcd:http://…`, pointed at `--etcd-port`, started
by `deploy/pulsar.sh start --metadata etcd:…`. Tenants, namespaces, topics, subscriptions and the
bookie's registration live in the etcd keyspace; Pulsar produces and consumes while the
TableKeeper server is killed with -9 and restarted, and its metadata writes work again after."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pulsar as pulsar_client
import pytest

from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc
from tests.support.server import ServerProcess, free_port

pytestmark = pytest.mark.standalone_only("a server of its own, with --etcd-port")

REPO = Path(__file__).resolve().parents[2]
PULSAR_SH = REPO / "deploy" / "pulsar.sh"
TIMEOUT_S = 120.0
MESSAGES = 2_000
KILL_AFTER = 600


class Pulsar:
    def __init__(self, directory: Path, metadata_url: str) -> None:
        self.http_port = free_port()
        self.args = [
            "--dir",
            str(directory),
            "--port",
            str(free_port()),
            "--http-port",
            str(self.http_port),
            "--bookie-port",
            str(free_port()),
            "--metadata",
            metadata_url,
            "--timeout",
            "240",
        ]
        self.directory = directory
        self.service_url = ""

    def start(self) -> None:
        out = subprocess.run(
            [str(PULSAR_SH), "start", *self.args], capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, out.stderr[-4000:]
        self.service_url = out.stdout.split()[0]

    def stop(self) -> None:
        subprocess.run(
            [str(PULSAR_SH), "stop", "--dir", str(self.directory)], timeout=180, check=False
        )

    def admin(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def admin_succeeds(self, method: str, path: str) -> bool:
        try:
            self.admin(method, path)
        except urllib.error.HTTPError as error:
            if error.code == 409:  # an earlier attempt got through after all
                return True
            if error.code < 500:
                raise
            return False
        except OSError:
            return False
        return True


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S  # a hang guard, not a performance bound
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.5)


@pytest.fixture
def etcd_server(tmp_path: Path, server_factory: list[ServerProcess]) -> Iterator[ServerProcess]:
    port = free_port()
    server = ServerProcess(tmp_path / "tk", extra_args=["--etcd-port", str(port)])
    server.etcd_port = port  # type: ignore[attr-defined]
    server_factory.append(server)
    yield server.start()


def _keys(server: ServerProcess, prefix: bytes) -> list[bytes]:
    port = server.etcd_port  # type: ignore[attr-defined]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        response = kv.Range(
            rpc_pb2.RangeRequest(key=prefix, range_end=end, keys_only=True), timeout=30
        )
    return sorted(item.key for item in response.kvs)


def test_pulsar_keeps_its_metadata_in_tablekeeper_through_the_etcd_api(
    etcd_server: ServerProcess, tmp_path: Path
) -> None:
    port = etcd_server.etcd_port  # type: ignore[attr-defined]
    pulsar = Pulsar(tmp_path / "pulsar", f"etcd:http://127.0.0.1:{port}")
    topic = "persistent://etcd/ns/t"
    try:
        pulsar.start()  # its own produce/consume check passed
        # Pulsar's cluster and its bookie are registered in the etcd keyspace.
        assert _keys(etcd_server, b"/admin/clusters/") == [b"/admin/clusters/standalone"]
        assert _keys(etcd_server, b"/ledgers/available/"), "no bookie registered"
        pulsar.admin("PUT", "/admin/v2/tenants/etcd", {"allowedClusters": ["standalone"]})
        pulsar.admin("PUT", "/admin/v2/namespaces/etcd/ns")
        pulsar.admin("PUT", "/admin/v2/persistent/etcd/ns/t")
        client = pulsar_client.Client(pulsar.service_url, operation_timeout_seconds=60)
        try:
            consumer = client.subscribe(topic, "sub")
            producer = client.create_producer(
                topic, send_timeout_millis=120_000, block_if_queue_full=True
            )
            acked: set[str] = set()
            failed: list[str] = []
            done = threading.Semaphore(0)

            def sent(body: str) -> Callable[[Any, Any], None]:
                def callback(result: Any, _: Any) -> None:
                    if result == pulsar_client.Result.Ok:
                        acked.add(body)
                    else:
                        failed.append(f"{body}: {result}")
                    done.release()

                return callback

            for i in range(MESSAGES):
                producer.send_async(f"m{i}".encode(), sent(f"m{i}"))
                if i == KILL_AFTER:
                    etcd_server.kill()  # the metadata store is gone with messages in flight
                    etcd_server.start()
            for _ in range(MESSAGES):
                assert done.acquire(timeout=TIMEOUT_S), "a send never completed"
            assert not failed, failed[:5]
            received: set[str] = set()
            while len(received) < len(acked):
                message = consumer.receive(timeout_millis=int(TIMEOUT_S * 1000))
                received.add(message.data().decode())
                consumer.acknowledge(message)
            assert acked == received == {f"m{i}" for i in range(MESSAGES)}
        finally:
            client.close()
        # Metadata writes work again after the kill (Pulsar's etcd client reconnected, its
        # lease kept alive): a new namespace, and it is in TableKeeper.
        _wait_until(
            lambda: pulsar.admin_succeeds("PUT", "/admin/v2/namespaces/etcd/after"),
            "a namespace created after the restart",
        )
        assert pulsar.admin("GET", "/admin/v2/namespaces/etcd") == ["etcd/after", "etcd/ns"]
        assert any(b"etcd/after" in k for k in _keys(etcd_server, b"/admin/policies/"))
    except BaseException:
        log = pulsar.directory / "pulsar.log"
        if log.exists():
            print("\n".join(log.read_text(errors="replace").splitlines()[-80:]))
        raise
    finally:
        pulsar.stop()
