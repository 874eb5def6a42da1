"""`LogBackend.follow` for backends that can read a log again cheaply (`memory`, `local`): each
poll is a fresh `read` from the next sequence due. (Pulsar keeps one reader open instead.)"""

from __future__ import annotations

from tablekeeper_server.log.api import FollowedRecords, LogBackend, LogRecord


class RereadingFollower:
    """A `LogFollower` over `backend.read`."""

    def __init__(self, backend: LogBackend, log_name: str, from_sequence: int) -> None:
        self._backend = backend
        self._log_name = log_name
        self._next = max(1, from_sequence)

    def poll(self, max_records: int) -> FollowedRecords:
        out: list[LogRecord] = []
        for record in self._backend.read(self._log_name, self._next):
            if len(out) >= max_records:
                return FollowedRecords(out, at_end=False)
            out.append(record)
            self._next = record.sequence + 1
        return FollowedRecords(out, at_end=True)

    def close(self) -> None:
        pass
