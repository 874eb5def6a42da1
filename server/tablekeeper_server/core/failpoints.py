"""Named fault points for crash tests.

Production code calls `failpoints.hit("name")` at the steps whose failure matters (between
uploading files and publishing a manifest, say). By default nothing happens. Tests arm a point
through the `TABLEKEEPER_FAILPOINTS` environment variable of a server process, e.g.
`checkpoint.before_manifest=crash` (the process dies at once, as with kill -9) or
`checkpoint.before_manifest=error` (the step raises `FailpointError`).
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)
ENV_VAR = "TABLEKEEPER_FAILPOINTS"
CRASH_EXIT_CODE = 137


class FailpointError(RuntimeError):
    pass


class Failpoints:
    def __init__(self, armed: dict[str, str] | None = None) -> None:
        self._armed = dict(armed or {})

    @classmethod
    def from_env(cls, value: str | None = None) -> Failpoints:
        """Parse `name=action[,name=action…]`; actions are `crash` and `error`."""
        raw = os.environ.get(ENV_VAR, "") if value is None else value
        armed = {}
        for item in filter(None, (part.strip() for part in raw.split(","))):
            name, _, action = item.partition("=")
            if action not in ("crash", "error"):
                raise ValueError(f"{ENV_VAR}: unknown action {action!r} for {name!r}")
            armed[name] = action
        return cls(armed)

    def hit(self, name: str) -> None:
        action = self._armed.get(name)
        if action is None:
            return
        if action == "crash":
            log.critical("failpoint %s: crashing the process", name)
            sys.stderr.flush()
            os._exit(CRASH_EXIT_CODE)
        raise FailpointError(f"failpoint {name}")


NO_FAILPOINTS = Failpoints()
