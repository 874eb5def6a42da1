"""Debian's ZooKeeper command line (`zkCli.sh`, package `zookeeper`, the one deploy/zookeeper.sh
installs) against TableKeeper's ZooKeeper port, beside the same commands against a real ZooKeeper:
the transcripts must be the same, once what differs between any two servers is taken out (times,
session ids, the zxids' values: they are compared by their order).

One TableKeeper and one ZooKeeper for the module; each test under a base path of its own.
"""

from __future__ import annotations

import difflib
import re
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.compat.zookeeper_compat import (
    RUNTIME_REASON,
    STANDALONE_REASON,
    ZooKeeperPair,
    start_pair,
)

pytestmark = [
    pytest.mark.standalone_only(STANDALONE_REASON),
    pytest.mark.default_runtime_only(RUNTIME_REASON),
]

ZKCLI = Path("/usr/share/zookeeper/bin/zkCli.sh")
RUN_TIMEOUT_S = 300.0  # a hang guard: a script takes a few seconds

# Lines of the client's own (its logging, its connection's states: asynchronous, so their place
# among the answers is not the server's doing).
NOISE = re.compile(
    r"^(SLF4J: .*|Connecting to .*|Welcome to ZooKeeper!|JLine support is .*|WATCHER::"
    r"|WatchedEvent state:.*|)$"
)
ZXID = re.compile(r"^(cZxid|mZxid|pZxid) = (0x[0-9a-f]+)$")
TIME = re.compile(r"^(ctime|mtime) = .*$")
OWNER = re.compile(r"^ephemeralOwner = 0x0*[1-9a-f][0-9a-f]*$")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperPair]:
    started = start_pair(tmp_path_factory.mktemp("zookeeper-cli"))  # installs it if missing
    try:
        assert ZKCLI.exists(), f"{ZKCLI} missing after deploy/zookeeper.sh installed zookeeper"
        yield started
    finally:
        started.stop()


def zkcli(hosts: str, *args: str, script: str | None = None) -> tuple[int, str]:
    """Run zkCli.sh against `hosts` (`args` a command, or `script` its standard input): its
    exit status and its output, standard error merged in order."""
    done = subprocess.run(
        [str(ZKCLI), "-server", hosts, *args],
        input=script,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    return done.returncode, done.stdout


def normalized(output: str) -> list[str]:
    """The transcript without the client's own lines; times and session ids named, zxids
    numbered by their order among the transcript's zxids, lists (which ZooKeeper answers in no
    promised order) sorted."""
    lines = [line for line in output.splitlines() if not NOISE.match(line)]
    zxids = sorted({int(m.group(2), 16) for line in lines if (m := ZXID.match(line))})
    rank = {zxid: i for i, zxid in enumerate(zxids)}
    out = []
    for line in lines:
        if m := ZXID.match(line):
            line = f"{m.group(1)} = zxid#{rank[int(m.group(2), 16)]}"
        elif m := TIME.match(line):
            line = f"{m.group(1)} = <time>"
        elif OWNER.match(line):
            line = "ephemeralOwner = <session>"
        elif line.startswith("[") and line.endswith("]"):  # children, ephemerals: in no order
            line = str(sorted(line[1:-1].split(", ")))
        out.append(line)
    return out


def on_both(pair: ZooKeeperPair, *args: str, script: str | None = None) -> tuple[
    tuple[int, list[str]], tuple[int, list[str]]
]:  # fmt: skip
    """(exit status, normalized transcript) against the real ZooKeeper, then TableKeeper."""
    with ThreadPoolExecutor(2) as pool:
        real, ours = (
            pool.submit(zkcli, hosts, *args, script=script)
            for hosts in (pair.zookeeper_hosts, pair.tablekeeper_hosts)
        )
        (real_rc, real_out), (our_rc, our_out) = real.result(), ours.result()
    return (real_rc, normalized(real_out)), (our_rc, normalized(our_out))


def script_for(base: str) -> str:
    """Every command of zkCli's that reads or changes znodes, with the errors each can meet.
    (No container is emptied: when a server sweeps it is its own timer's business.)"""
    return f"""\
create {base}
create {base}/a v1
create {base}/a again
create {base}/missing/child x
get {base}/a
get -s {base}/a
set {base}/a v2
set -s {base}/a v3
set -v 0 {base}/a v4
set -v 2 {base}/a v4
set {base}/nope x
get {base}/nope
stat {base}/a
stat {base}/nope
create -s {base}/a/seq- s
create -s {base}/a/seq- s
create -e {base}/eph e
create -e -s {base}/a/eseq- e
stat {base}/eph
create -c {base}/container
create {base}/container/c1
ls {base}
ls -s {base}/a
ls -R {base}
ls {base}/nope
getAllChildrenNumber {base}
getEphemerals {base}
delete {base}/a
delete -v 7 {base}/a/seq-0000000001
delete -v 0 {base}/a/seq-0000000001
delete {base}/nope
create {base}/a/seq-0000000000/deep d
ls -s {base}/a
deleteall {base}/a
ls {base}
sync {base}
getAcl {base}
addauth digest alice:pw
create {base}/secret s auth::cdrwa
getAcl {base}/secret
setAcl {base}/secret world:anyone:r
getAcl -s {base}/secret
set {base}/secret forbidden
setAcl -v 0 {base}/secret world:anyone:cdrwa
create {base}/bad-acl x nosuch:x:cdrwa
create {base}/eph/child x
create {base}/bad/ x
deleteall {base}
stat {base}
quit
"""


def test_a_zkcli_session_reads_as_on_a_real_zookeeper(pair: ZooKeeperPair) -> None:
    base = f"/zkcli-{uuid.uuid4().hex[:8]}"
    (real_rc, real), (our_rc, ours) = on_both(pair, script=script_for(base))
    # The script's answers are there (it ran: no connection or start-up failure on either side).
    for line in (
        f"Created {base}/a",
        f"Node already exists: {base}/a",
        f"Node does not exist: {base}/missing/child",
        f"version No is not valid : {base}/a",
        f"Node not empty: {base}/a",
        "Sync is OK",
        f"Insufficient permission : {base}/secret",
        f"Ephemerals cannot have children: {base}/eph/child",
        f"Node does not exist: {base}",
    ):
        assert line in real, f"{line!r} not in the real ZooKeeper's transcript:\n{real}"
    diff = "\n".join(difflib.unified_diff(real, ours, "zookeeper", "tablekeeper", lineterm=""))
    assert (our_rc, ours) == (real_rc, real), diff


def state(hosts: str, base: str, create: bool = False) -> tuple[bool, bool]:
    """Whether `base` and `base/new` exist (after creating `base/child/grandchild`)."""
    client = KazooClient(hosts=hosts, timeout=30)
    client.start(timeout=120)
    try:
        if create:
            client.create(f"{base}/child/grandchild", b"x", makepath=True)
        return client.exists(base) is not None, client.exists(f"{base}/new") is not None
    finally:
        client.stop()
        client.close()


# Each command, and whether `base` and `base/new` exist after it.
COMMANDS = {
    "create": (["create", "{base}/new", "x"], (True, True)),
    "get-missing": (["get", "{base}/missing"], (True, False)),
    "deleteall": (["deleteall", "{base}"], (False, False)),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_on_zkclis_command_line_answers_as_on_a_real_zookeeper(
    pair: ZooKeeperPair, name: str
) -> None:
    """A shell script's usual form: one command in the arguments (its exit status tells)."""
    command, after = COMMANDS[name]
    base = f"/zkcli-args-{uuid.uuid4().hex[:8]}"
    for hosts in (pair.zookeeper_hosts, pair.tablekeeper_hosts):
        state(hosts, base, create=True)
    args = [part.format(base=base) for part in command]
    (real_rc, real), (our_rc, ours) = on_both(pair, *args)
    assert state(pair.zookeeper_hosts, base) == after
    assert state(pair.tablekeeper_hosts, base) == after
    assert (our_rc, ours) == (real_rc, real)
