"""SessionManager: fresh TTLs on open, keep-alives renew without logging, expiry closes through
the log (the command executor)."""

from __future__ import annotations

import asyncio

import pytest

from tablekeeper_proto.v1 import session_pb2, wal_pb2
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.errors import BadRequestError, KeyNotFoundError
from tablekeeper_server.range.apply import Response
from tablekeeper_server.range.sessions import SessionManager

pytestmark = pytest.mark.unit


class Log:
    def __init__(self) -> None:
        self.commands: list[wal_pb2.WalCommand] = []

    async def execute(self, command: wal_pb2.WalCommand) -> Response:
        self.commands.append(command)
        session_id = len(self.commands) + 100
        if command.session.WhichOneof("op") == "close_id":
            session_id = command.session.close_id
        return session_pb2.SessionResponse(session_id=session_id)


async def test_expiry_goes_through_the_log_and_keep_alive_does_not() -> None:
    log = Log()
    clock = ManualClock()  # moved by hand: no test step depends on real time
    manager = SessionManager("r", log.execute, clock=clock)
    manager.start([(7, 300), (8, 300)])  # stored sessions get a fresh TTL now
    created = await manager.create(200)
    assert created.session_id == 101 and len(manager) == 3
    for _ in range(6):
        clock.advance(0.1)
        assert manager.keep_alive(8) == 300
    # 101 (deadline 0.2 s) and 7 (0.3 s) are past their deadlines, 8 (0.9 s) is not; the timer
    # woke when the clock passed them, and closes them within a few loop turns.
    for _ in range(2000):
        if len(manager) == 1:
            break
        await asyncio.sleep(0.01)
    closes = [c.session for c in log.commands if c.session.WhichOneof("op") == "close_id"]
    assert sorted(c.close_id for c in closes) == [7, 101]
    assert all(c.reason == "expired" for c in closes)
    assert len(manager) == 1
    with pytest.raises(KeyNotFoundError):
        manager.keep_alive(7)
    await manager.close(8, "closed")
    assert len(manager) == 0
    with pytest.raises(BadRequestError):
        await manager.create(1)
    await manager.stop()
