"""Named fault points for crash tests.

Production code calls `failpoints.hit("name")` at the steps whose failure matters (between
uploading files and publishing a manifest, say). By default nothing happens. Tests arm a point
through the `TABLEKEEPER_FAILPOINTS` environment variable of a server process, e.g.
`checkpoint.before_manifest=crash` (the process dies at once, as with kill -9) or
`checkpoint.before_manifest=error` (the step raises `FailpointError`), or
`server.before_recovery=wait:/tmp/x/release` (the step waits until that file exists, so a test
can act while the process is held at a known point, then let it go by creating the file).
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
        """Parse `name=action[,name=action…]`; actions are `crash`, `error` and `wait:PATH`."""
        raw = os.environ.get(ENV_VAR, "") if value is None else value
        armed = {}
        for item in filter(None, (part.strip() for part in raw.split(","))):
            name, _, action = item.partition("=")
            if action not in ("crash", "error") and not (
                action.startswith("wait:") and len(action) > len("wait:")
            ):
                raise ValueError(f"{ENV_VAR}: unknown action {action!r} for {name!r}")
            armed[name] = action
        return cls(armed)

    def _release_file(self, name: str) -> str | None:
        action = self._armed.get(name, "")
        if not action.startswith("wait:"):
            return None
        path = action.removeprefix("wait:")
        log.warning("failpoint %s: waiting until %s exists", name, path)
        return path

    def hit(self, name: str) -> None:
        """Act on `name` if it is armed; `wait:` blocks the calling thread."""
        if (path := self._release_file(name)) is not None:
            while not os.path.exists(path):
                time.sleep(_WAIT_POLL_S)
            return
        self._act(name)

    async def hit_async(self, name: str) -> None:
        """`hit` for the event loop: `wait:` suspends only the calling task."""
        if (path := self._release_file(name)) is not None:
            while not os.path.exists(path):
                await asyncio.sleep(_WAIT_POLL_S)
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


NO_FAILPOINTS = Failpoints()
