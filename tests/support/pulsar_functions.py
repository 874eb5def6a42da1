"""A real Pulsar Functions worker whose function state is in TableKeeper.

`start_deployment(base)` runs `deploy/pulsar-functions.sh start` in `base` (TableKeeper,
ZooKeeper, one bookie, Pulsar 4.0.7 with its functions worker, each on a free loopback port)
and stops everything at the end. `FunctionsDeployment.admin` runs one `pulsar-admin` command,
`FunctionsDeployment.shell` several in one JVM (pulsar-shell). `build_readback_jar` compiles
tests/support/java/StateReadbackFunction.java, a function that reads its state back.

When the deployment cannot start the tests are skipped, unless `TABLEKEEPER_REQUIRE_PULSAR=1`
(set by the Makefile): then they fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.pulsar_fixtures import ENV_REQUIRE
from tests.support.server import REPO

SCRIPT = REPO / "deploy" / "pulsar-functions.sh"
READBACK_SOURCE = REPO / "tests" / "support" / "java" / "StateReadbackFunction.java"
READBACK_CLASS = "tablekeeper.functions.StateReadbackFunction"
START_TIMEOUT_S = 900  # a first run downloads Pulsar's jars (~260 MB) and pulsar-admin's
LEADER_NOT_READY = "Leader not yet ready"
_EXECUTING = re.compile(r"^\[(\d+)/(\d+)\] Executing ", re.MULTILINE)


@dataclass
class FunctionsDeployment:
    directory: Path
    service_url: str
    """pulsar://127.0.0.1:PORT"""
    admin_url: str
    """http://127.0.0.1:PORT (broker admin API and the functions worker)"""
    tablekeeper: str
    """bk://127.0.0.1:PORT, where the function state is"""

    @property
    def ports(self) -> dict[str, int]:
        """TK_PORT, PORT, HTTP_PORT, BOOKIE_PORT, ZK_PORT as recorded by the script."""
        values: dict[str, int] = {}
        for line in (self.directory / "ports.env").read_text().splitlines():
            name, _, value = line.partition("=")
            if value.isdigit():
                values[name] = int(value)
        return values

    def pid(self, component: str) -> int:
        """The pid of `broker`, `bookie` or `tablekeeper` (its server)."""
        name = "server" if component == "tablekeeper" else component
        return int((self.directory / component / f"{name}.pid").read_text().strip())

    def broker_log(self) -> str:
        return (self.directory / "broker" / "broker.log").read_text(errors="replace")

    def admin(self, *args: str, timeout_s: float = 180) -> str:
        """One pulsar-admin command; its stdout. Raises with its output if it fails.

        A functions worker answers a change (create, update, delete) with 503 "Leader not yet
        ready. Please retry again" until it has become the leader and read the functions'
        metadata, which can come after its admin API answers (what `start` waits for): such a
        command is sent again, until `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            done = _run([str(SCRIPT), "--dir", str(self.directory), "admin", *args], timeout_s)
            not_led = LEADER_NOT_READY in done.stdout + done.stderr
            if done.returncode == 0 or not not_led or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if done.returncode != 0:
            raise AssertionError(
                f"pulsar-admin {' '.join(args)} exited {done.returncode}:\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )
        return done.stdout

    def shell(self, commands: list[str], timeout_s: float = 240) -> list[str]:
        """Several pulsar-admin commands (without the `pulsar-admin` word) in one JVM; the
        output of each, in order."""
        script = self.directory / "admin-commands.txt"
        script.write_text("".join(f"admin {command}\n" for command in commands))
        done = _run([str(SCRIPT), "--dir", str(self.directory), "shell", str(script)], timeout_s)
        sections = _EXECUTING.split(done.stdout)
        # split() gives: preamble, then (index, total, text) per command
        outputs = [text.split("\n", 1)[1] if "\n" in text else "" for text in sections[3::3]]
        if done.returncode != 0 or len(outputs) != len(commands):
            raise AssertionError(
                f"pulsar-shell ran {len(outputs)} of {len(commands)} commands "
                f"(exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        outputs[-1] = outputs[-1].rsplit("Goodbye!", 1)[0]
        return [output.strip() for output in outputs]


def _run(command: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)


def fetch_paths() -> dict[str, Path]:
    """examples_jar and functions_api_jar (downloads them on a first run)."""
    done = _run([str(SCRIPT), "fetch"], START_TIMEOUT_S)
    if done.returncode != 0:
        raise AssertionError(f"deploy/pulsar-functions.sh fetch failed:\n{done.stderr[-3000:]}")
    paths = dict(line.split("=", 1) for line in done.stdout.split() if "=" in line)
    return {name: Path(value) for name, value in paths.items()}


def build_readback_jar(out_dir: Path, functions_api_jar: Path) -> Path:
    """Compile StateReadbackFunction against pulsar-functions-api; the jar's path."""
    classes = out_dir / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    done = _run(
        [
            "javac",
            "--release",
            "17",
            "-cp",
            str(functions_api_jar),
            "-d",
            str(classes),
            str(READBACK_SOURCE),
        ],
        120,
    )
    if done.returncode != 0:
        raise AssertionError(f"javac failed:\n{done.stderr[-3000:]}")
    jar = out_dir / "state-readback-function.jar"
    with zipfile.ZipFile(jar, "w") as archive:
        for path in sorted(classes.rglob("*.class")):
            archive.write(path, path.relative_to(classes).as_posix())
    return jar


def listening_tcp(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process `pid` holds."""
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found: set[tuple[str, int]] = set()
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:
                continue
            address, port = local.split(":")
            found.add((_address(address), int(port, 16)))
    return found


def _address(hex_address: str) -> str:
    """/proc/net/tcp{,6} little-endian hex words to text (IPv4, or IPv6 as hex words)."""
    words = [bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8)]
    raw = b"".join(words)
    if len(raw) == 4:
        return ".".join(str(b) for b in raw)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:" + ".".join(str(b) for b in raw[12:])
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def start_deployment(base: Path) -> Iterator[FunctionsDeployment]:
    directory = base / "pulsar-functions"
    try:
        done = _run([str(SCRIPT), "start", "--dir", str(directory)], START_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _stop(directory)
        _unavailable(f"deploy/pulsar-functions.sh start did not finish: {exc}")
        raise AssertionError("unreachable") from exc
    if done.returncode != 0:
        _stop(directory)
        _unavailable(f"deploy/pulsar-functions.sh start failed:\n{done.stderr[-3000:]}")
    service_url, admin_url, tablekeeper = done.stdout.split()
    try:
        yield FunctionsDeployment(directory, service_url, admin_url, tablekeeper)
    finally:
        _stop(directory)


def _stop(directory: Path) -> None:
    subprocess.run(
        [str(SCRIPT), "stop", "--dir", str(directory)],
        capture_output=True,
        check=False,
        timeout=300,
        env={**os.environ, "PULSAR_FUNCTIONS_STOP_TIMEOUT": "20"},
    )


def _unavailable(reason: str) -> None:
    if os.environ.get(ENV_REQUIRE, "") not in ("", "0"):
        pytest.fail(f"Pulsar is required ({ENV_REQUIRE}) but unavailable: {reason}")
    pytest.skip(f"no Pulsar Functions deployment: {reason}")
