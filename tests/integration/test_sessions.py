"""Sessions and ephemeral keys against real server processes: keys vanish within TTL + 1 s after
their client process is killed -9; they survive a server restart while the client keeps the
session alive; closing a session deletes them (and watchers see the deletes)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tablekeeper import AsyncClient, Client, IllegalOpError, SessionExpiredError
from tests.support.server import REPO, ServerProcess

pytestmark = pytest.mark.integration

_HOLDER = """
import sys, time
from tablekeeper import Client
service, ns, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
client = Client(service)
table = client.table(ns, "t")
session = table.session("members", ttl).start()
table.put("members", "m1", "alive", session=session)
print(table.put_sequential("members", "seq-", "alive", session=session).decode(), flush=True)
while True:
    time.sleep(60)
"""


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data").start()
    yield server
    assert server.process is not None
    if server.process.poll() is None:
        server.stop()


def _namespace(service: str) -> str:
    ns = "s" + uuid.uuid4().hex[:8]
    with Client(service) as client:
        client.create_namespace(ns)
        client.create_table(ns, "t", ranges=2)
    return ns


def test_ephemeral_keys_vanish_after_client_kill_9(server: ServerProcess) -> None:
    ttl = 2.0
    ns = _namespace(server.service)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, server.service, ns, str(ttl)],
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        assert holder.stdout is not None
        seq_key = holder.stdout.readline().decode().strip()
        assert seq_key == "seq-" + "0" * 20
        with Client(server.service) as client:
            table = client.table(ns, "t")
            time.sleep(2 * ttl)  # kept alive well past its TTL
            assert table.get("members", "m1") is not None
            assert table.get("members", seq_key) is not None
            holder.kill()
            holder.wait()
            # Gone once the server expires the session (how soon is a benchmark's business,
            # benchmarks/watch_sessions.py; the deadline here only guards against a hang).
            deadline = time.monotonic() + 60
            while table.get("members", "m1") is not None:
                assert time.monotonic() < deadline, "ephemeral key never expired"
                time.sleep(0.05)
            assert table.get("members", seq_key) is None
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


async def test_ephemeral_keys_survive_a_server_restart_while_kept_alive(
    server: ServerProcess,
) -> None:
    ttl = 4.0
    ns = _namespace(server.service)
    async with AsyncClient(server.service) as client:
        table = await client.table(ns, "t")
        session = await table.session("members", ttl).start()
        await table.put("members", "m1", "alive", session=session)
        await table.put("members", "durable", "stays")
        # In threads: the client goes on (keeping the session alive) while the server restarts.
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(server.start)
        await asyncio.sleep(2 * ttl)
        assert not session.expired.is_set()
        assert await table.get("members", "m1") is not None
        async with table.watch("members", start=b"") as watch:
            await session.close()
            event = await asyncio.wait_for(watch.__anext__(), 60)
            assert (event.type, event.lkey) == ("delete", b"m1")
        assert await table.get("members", "m1") is None
        assert await table.get("members", "durable") is not None
        with pytest.raises(IllegalOpError):
            await table.put("members", "late", "x", session=session)


async def test_closing_keep_alive_streams_logs_no_error(server: ServerProcess) -> None:
    """A client that closes its sessions' keep-alive streams is a normal event: the server logs
    no error for it (it used to log an unretrieved task exception per stream)."""
    ns = _namespace(server.service)
    for _ in range(3):
        async with AsyncClient(server.service) as client:
            table = await client.table(ns, "t")
            session = await table.session("members", 5).start()
            await table.put("members", "m", "alive", session=session)
            assert session.id
    assert server.stop() == 0
    log = server.log_path.read_text(errors="replace")
    assert "never retrieved" not in log and " ERROR " not in log, server.log_tail()


async def test_a_session_created_in_one_client_is_kept_alive_and_closed_by_another(
    server: ServerProcess,
) -> None:
    """`create()` makes a session no keep-alive task holds; another client that knows its id
    keeps it alive (`keep_alive_answers`) and closes it; `close()` says whether the server
    knew the session, and keep-alives for a closed one raise `SessionExpiredError`."""
    ns = _namespace(server.service)
    async with AsyncClient(server.service) as creator, AsyncClient(server.service) as other:
        mine, theirs = await creator.table(ns, "t"), await other.table(ns, "t")
        created = mine.session("members", ttl_s=30)
        session_id = await created.create()
        assert session_id > 0 and created.ttl_s == 30
        await mine.put("members", "m1", "alive", session=created)

        found = theirs.session("members", ttl_s=1)
        found.id = session_id
        answers = found.keep_alive_answers()
        granted = await anext(answers)  # the next would come a third of the TTL later
        await answers.aclose()
        assert granted == 30.0

        assert await found.close() is True
        assert await theirs.get("members", "m1") is None
        again = theirs.session("members", ttl_s=1)
        again.id = session_id
        assert await again.close() is False
        gone = theirs.session("members", ttl_s=1)
        gone.id = session_id
        with pytest.raises(SessionExpiredError):
            async for _ in gone.keep_alive_answers():
                pass
