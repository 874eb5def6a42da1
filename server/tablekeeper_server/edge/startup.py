"""A front-end's startup work that needs the root range, retried until it is done.

In cluster mode a front-end's own table (etcd's keyspace, Oxia's `default` namespace) is found
or made through the root range's owner, which may not be reachable yet when the server starts:
the front-end serves meanwhile (answering "retry" to its clients) and retries in the background.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from tablekeeper_server.core.clock import Clock

log = logging.getLogger(__name__)

RETRY_PAUSE_S_FIRST = 0.1
RETRY_PAUSE_S_MAX = 2.0


async def retry_until_done(
    what: str,
    attempt: Callable[[], Awaitable[None]],
    clock: Clock,
    *,
    pause_s_max: float = RETRY_PAUSE_S_MAX,
) -> None:
    """Await `attempt()` until it returns, pausing on `clock` after each failure (doubling from
    0.1 s up to `pause_s_max`), and log each failure once at INFO (`what` names the work).
    Runs until done or cancelled: cancel the task to stop it."""
    pause_s = RETRY_PAUSE_S_FIRST
    while True:
        try:
            await attempt()
            return
        except Exception as exc:  # the root range has no owner yet, or it is starting
            log.info("%s not reachable yet (%s); retrying", what, exc)
        await clock.sleep(pause_s)
        pause_s = min(pause_s * 2, pause_s_max)
