"""Pulsar 4.0.7 standalone (its broker and one bookie, from `deploy/pulsar.sh fetch`'s jars) with
its metadata store on TableKeeper's Oxia front-end: `--metadata-url oxia://HOST:PORT`.

Everything Pulsar keeps in its metadata store (tenants, namespaces, topics, subscriptions'
cursors, ledgers, the bookie's registration and BookKeeper's ledger metadata) goes to
TableKeeper; only the bookie's journal and ledger files stay in the given directory.

Shared by tests/compat/test_oxia_pulsar.py (a standalone server) and
tests/integration/test_pulsar_on_oxia_cluster.py (a 3-server cluster). This module imports no
protos (the compat tests' process must not load `tablekeeper_proto`'s BookKeeper modules).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.server import REPO, free_port

MAIN_CLASS = "org.apache.pulsar.PulsarStandaloneStarter"
_JAVA_OPENS = [
    "java.base/java.io",
    "java.base/java.util.zip",
    "java.base/java.nio",
    "java.base/jdk.internal.misc",
    "java.base/sun.net",
    "java.base/java.lang",
    "java.management/sun.management",
    "jdk.management/com.sun.management.internal",
    "java.base/jdk.internal.platform",
]


def class_data_flags() -> list[str]:
    """The JVM flag of the class-data archive of Pulsar's jars that `deploy/pulsar.sh` starts
    make (deploy/lib/common.sh: a start 31 -> 15 CPU-seconds here), if one has been made."""
    done = subprocess.run(
        [str(REPO / "deploy" / "pulsar.sh"), "cds-flag"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.stdout.split() if done.returncode == 0 else []


class PulsarOnOxia:
    def __init__(self, directory: Path, oxia_url: str, classpath: str) -> None:
        self.directory = directory
        self.oxia_url = oxia_url
        self.classpath = classpath
        self.port = free_port()
        self.http_port = free_port()
        self.bookie_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "pulsar.log"

    def _write_config(self) -> Path:
        conf = self.directory / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (self.directory / "tmp").mkdir(exist_ok=True)
        (conf / "standalone.conf").write_text(
            f"""clusterName=standalone
brokerServicePort={self.port}
webServicePort={self.http_port}
bindAddress=127.0.0.1
advertisedAddress=127.0.0.1
metadataStoreUrl={self.oxia_url}
configurationMetadataStoreUrl={self.oxia_url}
functionsWorkerEnabled=false
webSocketServiceEnabled=false
transactionCoordinatorEnabled=false
allowAutoTopicCreation=true
allowAutoTopicCreationType=non-partitioned
brokerShutdownTimeoutMs=5000
managedLedgerDefaultEnsembleSize=1
managedLedgerDefaultWriteQuorum=1
managedLedgerDefaultAckQuorum=1
managedLedgerCacheSizeMB=32
bookkeeperClientRackawarePolicyEnabled=false
narExtractionDirectory={self.directory}/tmp
brokerClient_dnsLookupBindAddress=127.0.0.1
bookiePort={self.bookie_port}
allowEphemeralPorts=true
listeningInterface=lo
allowLoopback=true
httpServerEnabled=false
journalSyncData=false
# a disk 95 % full (the default threshold) would turn the bookie read-only and stop every write:
# a developer's machine may well be that full (1 % of this machine's disk is 2.5 GB)
diskUsageThreshold=0.99
diskUsageWarnThreshold=0.98
dbStorage_writeCacheMaxSizeMb=16
dbStorage_readAheadCacheMaxSizeMb=16
dbStorage_rocksDB_blockCacheSize=8388608
"""
        )
        (conf / "log4j2.properties").write_text(
            """status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} [%t] %-5level %c{1.} - %msg%n
rootLogger.level = info
rootLogger.appenderRef.stdout.ref = STDOUT
"""
        )
        return conf

    def start(self, timeout_s: float = 240.0) -> PulsarOnOxia:
        conf = self._write_config()
        command = [
            "java",
            "-Xms128m",
            "-Xmx512m",
            "-XX:MaxDirectMemorySize=256m",
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseG1GC",
            *class_data_flags(),
            "-Djava.net.preferIPv4Stack=true",
            f"-Djava.io.tmpdir={self.directory}/tmp",
            "-Dio.netty.tryReflectionSetAccessible=true",
            *[arg for module in _JAVA_OPENS for arg in ("--add-opens", f"{module}=ALL-UNNAMED")],
            f"-Dlog4j.configurationFile={conf}/log4j2.properties",
            "-Dlog4j2.is.webapp=false",
            "-Dbookkeeper.metadata.bookie.drivers="
            "org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver",
            "-Dbookkeeper.metadata.client.drivers="
            "org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver",
            "-cp",  # the jars first, as the class-data archive has them
            f"{self.classpath}:{conf}",
            MAIN_CLASS,
            "--config",
            str(conf / "standalone.conf"),
            "--no-functions-worker",
            "--no-stream-storage",
            "--metadata-url",
            self.oxia_url,
            "--bookkeeper-dir",
            str(self.directory / "bookkeeper"),
            "--bookkeeper-port",
            str(self.bookie_port),
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"Pulsar exited ({self.process.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Pulsar not ready in {timeout_s}s:\n{self.log_tail()}")
            time.sleep(0.5)
        return self

    def _ready(self) -> bool:
        try:
            clusters = self.admin("GET", "/admin/v2/clusters")
            namespaces = self.admin("GET", "/admin/v2/namespaces/public")
        except (OSError, urllib.error.URLError):
            return False
        # A broker still starting may answer with an empty body (None): not ready yet.
        return "standalone" in (clusters or []) and "public/default" in (namespaces or [])

    def admin(self, method: str, path: str, body: object = None) -> Any:
        """One call of Pulsar's admin REST API; its JSON answer (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}", data=data, method=method
        )
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def stop(self, timeout_s: float = 60.0) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def restart(self, timeout_s: float = 240.0) -> PulsarOnOxia:
        """Stop and start again on the same ports and directory (the bookie's id is its
        address: the ledgers it holds are found again only under the same port)."""
        self.stop()
        return self.start(timeout_s)

    def log_offset(self) -> int:
        """The log's size now: `log_since` it reads what Pulsar logged after."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
