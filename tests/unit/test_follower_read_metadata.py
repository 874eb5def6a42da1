"""What a Range call's metadata asks of a follower, and the refusal of malformed asks."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tablekeeper_server.errors import BadRequestError
from tablekeeper_server.rpc.follower_reads import (
    DEFAULT_MAX_STALENESS_MS,
    FollowerRead,
    report,
    requested,
)

pytestmark = pytest.mark.unit


class Context:
    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)
        self.trailers: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def set_trailing_metadata(self, trailers: tuple[tuple[str, str], ...]) -> None:
        self.trailers = trailers


def test_no_ask_is_a_read_from_the_leader() -> None:
    assert requested(None) is None
    assert requested(Context([("bk-rt-sid-bin", "x")])) is None
    assert requested(Context([("tk-read-from", "leader")])) is None


def test_a_follower_read_with_its_bounds() -> None:
    assert requested(Context([("tk-read-from", "follower")])) == FollowerRead(
        DEFAULT_MAX_STALENESS_MS / 1000, {}
    )
    asked = requested(
        Context(
            [
                ("tk-read-from", "follower"),
                ("tk-max-staleness-ms", "0"),
                ("tk-min-applied", "1025:40,1026:7"),
            ]
        )
    )
    assert asked == FollowerRead(0.0, {1025: 40, 1026: 7})


@pytest.mark.parametrize(
    "metadata",
    [
        [("tk-read-from", "nearest")],
        [("tk-read-from", "follower"), ("tk-max-staleness-ms", "soon")],
        [("tk-read-from", "follower"), ("tk-max-staleness-ms", "-1")],
        [("tk-read-from", "follower"), ("tk-max-staleness-ms", str(10**12))],
        [("tk-read-from", "follower"), ("tk-min-applied", "1025")],
        [("tk-read-from", "follower"), ("tk-min-applied", "a:b")],
    ],
)
def test_malformed_asks_are_refused_clearly(metadata: list[tuple[str, str]]) -> None:
    with pytest.raises(BadRequestError) as refused:
        requested(Context(metadata))
    assert "tk-" in refused.value.message


def test_the_answer_says_who_served_it() -> None:
    context = Context([])
    report(context, "follower", 1025, 41, 0.1234)
    assert dict(context.trailers) == {
        "tk-read-replica": "follower",
        "tk-read-range": "1025",
        "tk-read-applied": "41",
        "tk-read-staleness-ms": "123",
    }
