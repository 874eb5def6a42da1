"""How a Range request asks to be served by a follower, and how the answer says who served it.

Request metadata (all optional; without `tk-read-from` a read goes to the range's owner):
- `tk-read-from: follower` — this server may answer from its follower of the range when another
  server owns it (a server owning the range answers from the range itself);
- `tk-max-staleness-ms: N` — the answer must include every write acknowledged more than N ms
  before the read; 0 makes the read linearizable (default `DEFAULT_MAX_STALENESS_MS`);
- `tk-min-applied: R:P,...` — for range id R, the answer must reflect at least log position P
  (the highest position the client saw for that range: its reads never go backwards).

Trailing metadata of such a read: `tk-read-replica` (`follower` or `leader`), `tk-read-range`
(the range id), `tk-read-applied` (its log position the answer reflects) and
`tk-read-staleness-ms` (see `range.follower`; 0 from the owner).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tablekeeper_server.errors import BadRequestError

READ_FROM_KEY = "tk-read-from"
MAX_STALENESS_KEY = "tk-max-staleness-ms"
MIN_APPLIED_KEY = "tk-min-applied"
REPLICA_KEY = "tk-read-replica"
RANGE_KEY = "tk-read-range"
APPLIED_KEY = "tk-read-applied"
STALENESS_KEY = "tk-read-staleness-ms"
DEFAULT_MAX_STALENESS_MS = 5000
MAX_STALENESS_MS_MAX = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class FollowerRead:
    """What a read asked of a follower."""

    max_staleness_s: float = DEFAULT_MAX_STALENESS_MS / 1000
    min_applied: dict[int, int] = field(default_factory=dict)


def requested(context: Any) -> FollowerRead | None:
    """The follower read the call asks for, or None (a read from the owner). Raises
    `BadRequestError` for malformed values."""
    if context is None:
        return None
    metadata = context.invocation_metadata() or ()
    if not any(key == READ_FROM_KEY for key, _ in metadata):
        return None  # (every Range call asks: the common case looks at the keys once)
    values = dict(metadata)
    mode = values.get(READ_FROM_KEY)
    if mode == "leader":
        return None
    if mode != "follower":
        raise BadRequestError(f"{READ_FROM_KEY} must be 'leader' or 'follower', not {mode!r}")
    staleness_ms = DEFAULT_MAX_STALENESS_MS
    raw = values.get(MAX_STALENESS_KEY)
    if raw is not None:
        try:
            staleness_ms = int(raw)
        except ValueError:
            raise BadRequestError(f"{MAX_STALENESS_KEY} must be an integer, not {raw!r}") from None
        if not 0 <= staleness_ms <= MAX_STALENESS_MS_MAX:
            raise BadRequestError(
                f"{MAX_STALENESS_KEY} must be within 0..{MAX_STALENESS_MS_MAX}, not {staleness_ms}"
            )
    return FollowerRead(staleness_ms / 1000, _positions(values.get(MIN_APPLIED_KEY, "")))


def _positions(raw: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for part in filter(None, raw.split(",")):
        range_id, _, position = part.partition(":")
        try:
            out[int(range_id)] = int(position)
        except ValueError:
            raise BadRequestError(
                f"{MIN_APPLIED_KEY} must be 'range:position,...', not {raw!r}"
            ) from None
    return out


def report(context: Any, replica: str, range_id: int, applied: int, staleness_s: float) -> None:
    """Say in the call's trailing metadata who served the read and how fresh it is."""
    if context is None:
        return
    context.set_trailing_metadata(
        (
            (REPLICA_KEY, replica),
            (RANGE_KEY, str(range_id)),
            (APPLIED_KEY, str(applied)),
            (STALENESS_KEY, str(round(staleness_s * 1000))),
        )
    )
