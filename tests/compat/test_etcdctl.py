"""etcd's own command-line client (Debian `etcd-client`, etcdctl v3) against TableKeeper's etcd
API (`--etcd-port`): keys and prefixes, txn, watch from a past revision, leases, status.

One standalone server for the module; each test uses keys of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import ServerProcess, free_port

ETCDCTL = shutil.which("etcdctl")
pytestmark = [
    pytest.mark.standalone_only("a server of its own, with --etcd-port"),
    pytest.mark.skipif(ETCDCTL is None, reason="etcdctl missing: apt-get install etcd-client"),
]
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    port = free_port()
    server = ServerProcess(
        tmp_path_factory.mktemp("etcdctl") / "data", extra_args=["--etcd-port", str(port)]
    )
    try:
        server.start()  # inside: a start that times out leaves no server behind
        yield server, port
    finally:
        server.stop()


@pytest.fixture(scope="module")
def endpoint(etcd_server: tuple[ServerProcess, int]) -> str:
    return f"127.0.0.1:{etcd_server[1]}"


def _env() -> dict[str, str]:
    return {**os.environ, "ETCDCTL_API": "3"}


def etcdctl(
    endpoint: str, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    assert ETCDCTL is not None
    done = subprocess.run(
        [ETCDCTL, f"--endpoints={endpoint}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=_env(),
    )
    if check:
        assert done.returncode == 0, f"etcdctl {' '.join(args)}: {done.stderr}"
    return done


def get_json(endpoint: str, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(etcdctl(endpoint, "get", "-w", "json", *args).stdout)
    return out


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


@pytest.mark.on_grpc_aio("plain calls")
def test_put_get_delete_with_prefixes_and_key_metadata(endpoint: str) -> None:
    assert etcdctl(endpoint, "put", "kv/a", "1").stdout.strip() == "OK"
    first = get_json(endpoint, "kv/a")
    rev_a = first["kvs"][0]["create_revision"]
    assert first["kvs"][0]["version"] == 1 and first["kvs"][0]["mod_revision"] == rev_a
    etcdctl(endpoint, "put", "kv/a", "2")
    etcdctl(endpoint, "put", "kv/b", "3")
    etcdctl(endpoint, "put", "kvx", "outside")
    again = get_json(endpoint, "kv/a")["kvs"][0]
    assert again["version"] == 2 and again["create_revision"] == rev_a
    assert again["mod_revision"] > rev_a

    listing = etcdctl(endpoint, "get", "--prefix", "kv/").stdout.split()
    assert listing == ["kv/a", "2", "kv/b", "3"]
    assert etcdctl(endpoint, "get", "--prefix", "kv/", "--keys-only").stdout.split() == [
        "kv/a",
        "kv/b",
    ]
    limited = get_json(endpoint, "--prefix", "kv", "--limit", "1")
    assert limited["more"] and limited["count"] == 3 and len(limited["kvs"]) == 1
    descending = etcdctl(endpoint, "get", "--prefix", "kv", "--sort-by=KEY", "--order=DESCEND")
    assert descending.stdout.split()[::2] == ["kvx", "kv/b", "kv/a"]
    header_rev = get_json(endpoint, "kv/a")["header"]["revision"]
    assert header_rev >= again["mod_revision"]

    # A read at an earlier revision sees the value of that time.
    assert etcdctl(endpoint, "get", "kv/a", f"--rev={rev_a}").stdout.split() == ["kv/a", "1"]

    assert etcdctl(endpoint, "del", "--prefix", "kv/").stdout.strip() == "2"
    assert etcdctl(endpoint, "get", "--prefix", "kv/").stdout == ""
    # Re-created after a delete: version starts again at 1, with a new create revision.
    etcdctl(endpoint, "put", "kv/a", "new")
    recreated = get_json(endpoint, "kv/a")["kvs"][0]
    assert recreated["version"] == 1 and recreated["create_revision"] > again["mod_revision"]
    prev = etcdctl(endpoint, "del", "kv/a", "--prev-kv").stdout.split()
    assert prev == ["1", "kv/a", "new"]


@pytest.mark.on_grpc_aio("txn calls")
def test_txn_compares_and_branches(endpoint: str) -> None:
    etcdctl(endpoint, "put", "txn/k", "v1")
    script = 'value("txn/k") = "v1"\n\nput txn/k v2\nput txn/other x\n\nput txn/k failed\n\n'
    done = etcdctl(endpoint, "txn", stdin=script)
    assert done.stdout.split()[0] == "SUCCESS"
    assert etcdctl(endpoint, "get", "txn/k", "--print-value-only").stdout.strip() == "v2"
    assert etcdctl(endpoint, "get", "txn/other", "--print-value-only").stdout.strip() == "x"

    done = etcdctl(endpoint, "txn", stdin=script)  # the compare no longer holds
    assert done.stdout.split()[0] == "FAILURE"
    assert etcdctl(endpoint, "get", "txn/k", "--print-value-only").stdout.strip() == "failed"

    # Compares on a missing key: its version and create revision are 0.
    script = 'version("txn/missing") = "0"\ncreate("txn/missing") = "0"\n\nput txn/missing c\n\n\n'
    assert etcdctl(endpoint, "txn", stdin=script).stdout.split()[0] == "SUCCESS"
    mod = get_json(endpoint, "txn/missing")["kvs"][0]["mod_revision"]
    script = f'mod("txn/missing") = "{mod}"\n\nget txn/missing\n\n\n'
    assert etcdctl(endpoint, "txn", stdin=script).stdout.split() == [
        "SUCCESS",
        "txn/missing",
        "c",
    ]


class _Lines:
    """Reads a process's stdout lines on a thread; `wait_for` blocks until a condition on
    everything read so far holds (a hang guard, not a timing assertion)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, expected: list[str]) -> None:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: self.lines[: len(expected)] == expected, timeout=TIMEOUT_S
            )
        assert ok, f"watch printed {self.lines}, expected {expected}"


def _watch(endpoint: str, *args: str) -> subprocess.Popen[str]:
    assert ETCDCTL is not None
    return subprocess.Popen(
        [ETCDCTL, f"--endpoints={endpoint}", "watch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
    )


@pytest.mark.on_grpc_aio("a watch stream")
def test_watch_from_a_past_revision_then_live(endpoint: str) -> None:
    etcdctl(endpoint, "put", "w/1", "a")
    start = get_json(endpoint, "w/1")["kvs"][0]["mod_revision"]
    etcdctl(endpoint, "put", "w/2", "b")
    process = _watch(endpoint, "--prefix", "w/", f"--rev={start}", "--prev-kv")
    try:
        lines = _Lines(process)
        lines.wait_for(["PUT", "w/1", "a", "PUT", "w/2", "b"])
        etcdctl(endpoint, "del", "w/1")
        etcdctl(endpoint, "put", "w/2", "c")
        lines.wait_for(
            ["PUT", "w/1", "a", "PUT", "w/2", "b"]
            # With --prev-kv etcdctl prints the previous pair, then the event's.
            + ["DELETE", "w/1", "a", "w/1", "", "PUT", "w/2", "b", "w/2", "c"]
        )
    finally:
        process.kill()
        process.wait()


@pytest.mark.on_grpc_aio("a keep-alive stream")
def test_lease_grant_attach_keep_alive_revoke_and_expiry(endpoint: str) -> None:
    granted = etcdctl(endpoint, "lease", "grant", "60").stdout.split()
    assert granted[0] == "lease" and granted[-1] == "granted" or "granted" in granted
    lease = granted[1]
    etcdctl(endpoint, "put", "--lease", lease, "lease/k", "v")
    assert get_json(endpoint, "lease/k")["kvs"][0]["lease"] == int(lease, 16)
    ttl = etcdctl(endpoint, "lease", "timetolive", lease, "--keys").stdout
    assert "granted with TTL(60s)" in ttl and "lease/k" in ttl
    assert lease in etcdctl(endpoint, "lease", "list").stdout
    kept = etcdctl(endpoint, "lease", "keep-alive", "--once", lease).stdout
    assert "keepalived with TTL(60)" in kept
    etcdctl(endpoint, "lease", "revoke", lease)
    assert etcdctl(endpoint, "get", "lease/k").stdout == ""
    again = etcdctl(endpoint, "lease", "revoke", lease, check=False)
    assert again.returncode != 0 and "etcdserver: requested lease not found" in again.stderr
    bad = etcdctl(endpoint, "put", "--lease", lease, "lease/k", "v", check=False)
    assert bad.returncode != 0 and "requested lease not found" in bad.stderr

    # Expiry deletes the lease's keys through the log: a watcher sees each as a DELETE. (The
    # TTL outlasts the two etcdctl runs below on a busy machine: the put must find the lease.)
    short = etcdctl(endpoint, "lease", "grant", "5").stdout.split()[1]
    etcdctl(endpoint, "put", "--lease", short, "lease/short", "v")
    start = get_json(endpoint, "lease/short")["kvs"][0]["mod_revision"]
    process = _watch(endpoint, "lease/short", f"--rev={start}")
    try:
        _Lines(process).wait_for(["PUT", "lease/short", "v", "DELETE", "lease/short"])
    finally:
        process.kill()
        process.wait()
    assert "expired" in etcdctl(endpoint, "lease", "timetolive", short).stdout


@pytest.mark.on_grpc_aio("status codes and messages")
def test_endpoint_status_health_member_list_and_errors(endpoint: str) -> None:
    # A key of this test's own, so the status has a revision to report whatever ran before
    # (on a server at revision 0, etcdctl's JSON leaves the field out).
    etcdctl(endpoint, "put", "status/k", "v")
    written = get_json(endpoint, "status/k")["kvs"][0]["mod_revision"]
    status = json.loads(etcdctl(endpoint, "endpoint", "status", "-w", "json").stdout)
    assert status[0]["Status"]["header"]["revision"] >= written
    assert status[0]["Status"]["leader"] == status[0]["Status"]["header"]["member_id"]
    assert "is healthy" in etcdctl(endpoint, "endpoint", "health").stderr
    members = etcdctl(endpoint, "member", "list").stdout
    assert f"http://{endpoint}" in members
    future = etcdctl(endpoint, "get", "x", "--rev=999999999", check=False)
    assert "required revision is a future revision" in future.stderr


@pytest.mark.on_grpc_aio("the :authority each HTTP/2 server takes")
def test_endpoints_written_as_urls(etcd_server: tuple[ServerProcess, int]) -> None:
    """etcd documents endpoints as `http://host:port`. etcdctl 3.4's own client takes them so,
    but its per-endpoint calls (`endpoint status`, `endpoint health`) send the whole URL as the
    HTTP/2 `:authority`, which RFC 9113 does not allow: Go's, Java's and grpcio's servers take
    it, Envoy's HTTP/2 refuses it. On grpc.aio they work. On Envoy the call fails at once, with
    the reason (its stream reset, PROTOCOL_ERROR): Envoy used to close the connection instead,
    and etcdctl retried "transport is closing" until its deadline."""
    server, port = etcd_server
    url = f"http://127.0.0.1:{port}"
    assert etcdctl(url, "put", "url/a", "1").stdout.strip() == "OK"
    assert etcdctl(url, "get", "url/a", "--print-value-only").stdout.strip() == "1"
    status = etcdctl(url, "endpoint", "status", "--command-timeout=20s", check=False)
    if "served by Envoy" in server.log_path.read_text():
        assert status.returncode != 0
        assert "PROTOCOL_ERROR" in status.stderr, status.stderr
        assert "transport is closing" not in status.stderr, status.stderr
    else:
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith(url), status.stdout
    # Written without the scheme, as the README shows, every call works on either runtime.
    plain = etcdctl(f"127.0.0.1:{port}", "endpoint", "status", "--command-timeout=20s")
    assert plain.stdout.startswith(f"127.0.0.1:{port}")


def test_data_and_revisions_survive_a_restart(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(tmp_path / "data", extra_args=["--etcd-port", str(port)]).start()
    ep = f"127.0.0.1:{port}"
    try:
        etcdctl(ep, "put", "r/k", "v")
        before = get_json(ep, "r/k")
        assert server.stop() == 0
        server.start()
        after = get_json(ep, "r/k")
        assert after["kvs"] == before["kvs"]
        assert after["header"]["revision"] >= before["header"]["revision"]
        etcdctl(ep, "put", "r/k", "w")
        assert get_json(ep, "r/k")["kvs"][0]["version"] == 2
    finally:
        server.stop()


def test_compact_refuses_reads_and_watches_from_before_it_even_after_a_restart(
    tmp_path: Path,
) -> None:
    """A server of its own: compaction is keyspace-wide."""
    port = free_port()
    server = ServerProcess(tmp_path / "data", extra_args=["--etcd-port", str(port)]).start()
    ep = f"127.0.0.1:{port}"
    try:
        revisions = []
        for value in ("1", "2", "3"):
            etcdctl(ep, "put", "c/k", value)
            revisions.append(get_json(ep, "c/k")["kvs"][0]["mod_revision"])
        r1, r2, _ = revisions
        assert etcdctl(ep, "compact", str(r2), "--physical").stdout.strip() == (
            f"compacted revision {r2}"
        )
        defrag = etcdctl(ep, "defrag")  # the keyspace range's RocksDB compacted
        assert "Finished defragmenting etcd member" in defrag.stdout + defrag.stderr
        hashes = []
        for attempt in range(2):  # before and after a restart (the compaction is logged)
            hashes.append(hashkv(ep, r2))
            old = etcdctl(ep, "get", "c/k", f"--rev={r1}", check=False)
            assert old.returncode != 0 and "required revision has been compacted" in old.stderr
            at = etcdctl(ep, "get", "c/k", f"--rev={r2}", "--print-value-only")
            assert at.stdout.strip() == "2"
            again = etcdctl(ep, "compact", str(r1), check=False)
            assert again.returncode != 0 and "required revision has been compacted" in (
                again.stderr
            )
            watch = subprocess.run(
                [ETCDCTL or "etcdctl", f"--endpoints={ep}", "watch", "c/k", f"--rev={r1}"],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                env=_env(),
            )
            # etcdctl ends a watch the server cancelled, printing why.
            assert "required revision has been compacted" in watch.stdout + watch.stderr
            if attempt == 0:
                assert server.stop() == 0
                server.start()
        # `endpoint hashkv`: the same keys at the same revision hash the same, after a restart
        # too; a change moves the current hash, not the old one.
        assert hashes[0] == hashes[1] == hashkv(ep, r2)
        current = hashkv(ep, 0)
        etcdctl(ep, "put", "c/other", "x")
        assert hashkv(ep, 0) != current and hashkv(ep, r2) == hashes[0]
        old_hash = etcdctl(ep, "endpoint", "hashkv", f"--rev={r1}", check=False)
        assert "required revision has been compacted" in old_hash.stderr
        future = etcdctl(ep, "compact", "1000000", check=False)
        assert future.returncode != 0 and "required revision is a future revision" in (
            future.stderr
        )
    finally:
        server.stop()


def hashkv(endpoint: str, revision: int) -> int:
    """`etcdctl endpoint hashkv --rev=REVISION` (0: the current revision): the hash."""
    done = etcdctl(endpoint, "endpoint", "hashkv", f"--rev={revision}", "-w", "json")
    (member,) = json.loads(done.stdout)
    return int(member["HashKV"]["hash"])


@pytest.mark.on_grpc_aio("several etcd ports on one server")
def test_keyspaces_on_ports_of_their_own_are_independent(tmp_path: Path) -> None:
    """`--etcd-keyspaces`: each keyspace its own table, revisions, watches and leases."""
    main_port, apps_port = free_port(), free_port()
    server = ServerProcess(
        tmp_path / "data",
        extra_args=["--etcd-port", str(main_port), "--etcd-keyspaces", f"apps={apps_port}"],
    ).start()
    main, apps = f"127.0.0.1:{main_port}", f"127.0.0.1:{apps_port}"
    try:
        for _ in range(3):
            etcdctl(main, "put", "shared/k", "main")
        etcdctl(apps, "put", "shared/k", "apps")
        in_main, in_apps = get_json(main, "shared/k"), get_json(apps, "shared/k")
        assert _b64("main") == in_main["kvs"][0]["value"]
        assert _b64("apps") == in_apps["kvs"][0]["value"]
        assert in_main["kvs"][0]["version"] == 3 and in_apps["kvs"][0]["version"] == 1
        assert in_apps["header"]["revision"] < in_main["header"]["revision"]
        # A watch on one keyspace never sees the other's changes: the main keyspace's put comes
        # first, so had it leaked it would be the first event printed. (From the next revision
        # on, so that the watch need not be registered before the puts.)
        next_revision = str(in_apps["header"]["revision"] + 1)
        process = _watch(apps, "shared/k", f"--rev={next_revision}")
        try:
            lines = _Lines(process)
            etcdctl(main, "put", "shared/k", "main-2")
            etcdctl(apps, "put", "shared/k", "apps-2")
            lines.wait_for(["PUT", "shared/k", "apps-2"])
        finally:
            process.kill()
            process.wait()
        # Leases too: one granted in apps is unknown to the main keyspace (which has none).
        lease = etcdctl(apps, "lease", "grant", "60").stdout.split()[1]
        etcdctl(apps, "put", "leased", "v", f"--lease={lease}")
        refused = etcdctl(main, "put", "leased", "v", f"--lease={lease}", check=False)
        assert refused.returncode != 0 and "requested lease not found" in refused.stderr
        assert server.stop() == 0
        server.start()
        assert get_json(apps, "shared/k")["kvs"][0]["value"] == _b64("apps-2")
        assert get_json(main, "shared/k")["kvs"][0]["value"] == _b64("main-2")
    finally:
        server.stop()
