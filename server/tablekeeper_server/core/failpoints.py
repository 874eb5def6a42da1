"""Named fault points for crash tests.

Production code calls `failpoints.hit("name")` at the steps whose failure matters (between
uploading files and publishing a manifest, say). By default nothing happens. Tests arm a point
through the `TABLEKEEPER_FAILPOINTS` environment variable of a server process, e.g.
`checkpoint.before_manifest=crash` (the process dies at once, as with kill -9) or
`checkpoint.before_manifest=error` (the step raises `FailpointError`), or
`server.before_recovery=wait:/tmp/x/release` (the step waits until that file exists, so a test
can act while the process is held at a known point, then let it go by creating the file), or
`wal.sync=delay:0.2` (the step takes 0.2 s longer each time: a slow disk) and
`wal.sync=delay:0.2:/tmp/x/slow` (only while that file exists, so a test can make the disk slow
and fast again while the server runs).

The points named so far: `wal.sync` (the local WAL's sync of a group, on whichever thread syncs
it), `wal.append` (the Pulsar WAL's acknowledgement of a group), `server.before_recovery`,
`checkpoint.*`, `restore.*`, `split.*` (see where each is hit). Nothing is armed unless the
environment variable names it: production servers never set it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

log = logging.getLogger(__name__)
ENV_VAR = "TABLEKEEPER_FAILPOINTS"
CRASH_EXIT_CODE = 137
_WAIT_POLL_S = 0.02


class FailpointError(RuntimeError):
    pass


class Failpoints:
    def __init__(self, armed: dict[str, str] | None = None) -> None:
        self._armed = dict(armed or {})

    @classmethod
    def from_env(cls, value: str | None = None) -> Failpoints:
        """Parse `name=action[,name=action…]`; actions are `crash`, `error`, `wait:PATH` and
        `delay:SECONDS[:PATH]`."""
        raw = os.environ.get(ENV_VAR, "") if value is None else value
        armed = {}
        for item in filter(None, (part.strip() for part in raw.split(","))):
            name, _, action = item.partition("=")
            if action.startswith("delay:"):
                _parse_delay(action, name)
            elif action not in ("crash", "error") and not (
                action.startswith("wait:") and len(action) > len("wait:")
            ):
                raise ValueError(f"{ENV_VAR}: unknown action {action!r} for {name!r}")
            armed[name] = action
        return cls(armed)

    def _delay_s(self, name: str) -> float | None:
        """The delay `name` is armed with now (None: not a delay; 0: its file is absent)."""
        action = self._armed.get(name, "")
        if not action.startswith("delay:"):
            return None
        seconds, path = _parse_delay(action, name)
        if path is not None and not os.path.exists(path):
            return 0.0
        return seconds

    def _release_file(self, name: str) -> str | None:
        action = self._armed.get(name, "")
        if not action.startswith("wait:"):
            return None
        path = action.removeprefix("wait:")
        log.warning("failpoint %s: waiting until %s exists", name, path)
        return path

    def hit(self, name: str) -> None:
        """Act on `name` if it is armed; `wait:` and `delay:` block the calling thread."""
        if (path := self._release_file(name)) is not None:
            while not os.path.exists(path):
                time.sleep(_WAIT_POLL_S)
            return
        if (delay_s := self._delay_s(name)) is not None:
            if delay_s > 0:
                time.sleep(delay_s)
            return
        self._act(name)

    async def hit_async(self, name: str) -> None:
        """`hit` for the event loop: `wait:` and `delay:` suspend only the calling task."""
        if (path := self._release_file(name)) is not None:
            while not os.path.exists(path):
                await asyncio.sleep(_WAIT_POLL_S)
            return
        if (delay_s := self._delay_s(name)) is not None:
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            return
        self._act(name)

    def _act(self, name: str) -> None:
        action = self._armed.get(name)
        if action is None:
            return
        if action == "crash":
            log.critical("failpoint %s: crashing the process", name)
            sys.stderr.flush()
            os._exit(CRASH_EXIT_CODE)
        raise FailpointError(f"failpoint {name}")


def _parse_delay(action: str, name: str) -> tuple[float, str | None]:
    """`delay:SECONDS[:PATH]` -> (seconds, path or None); ValueError naming `name` if bad."""
    seconds_text, _, path = action.removeprefix("delay:").partition(":")
    try:
        seconds = float(seconds_text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 3600:
        raise ValueError(f"{ENV_VAR}: bad delay {action!r} for {name!r} (0 to 3600 seconds)")
    return seconds, path or None


NO_FAILPOINTS = Failpoints()
