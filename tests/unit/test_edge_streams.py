"""The registry of open streams every front-end shares (`edge.streams`): counts by front-end and
method, closing one front-end's streams ends those and refuses new ones, and leaves the others."""

from __future__ import annotations

import pytest

from tablekeeper_server.edge.streams import OpenStreams, StreamsClosedError
from tablekeeper_server.errors import UnavailableError


def _nothing() -> None:
    return None


def test_streams_are_counted_while_open_and_closed_per_front_end() -> None:
    streams = OpenStreams()
    ended: list[str] = []
    with streams.opened("etcd", "Watch", lambda: ended.append("etcd watch")):
        with (
            streams.opened("etcd", "LeaseKeepAlive", lambda: ended.append("etcd lease")),
            streams.opened("oxia", "GetNotifications", lambda: ended.append("oxia")),
        ):
            assert streams.counts() == {
                ("etcd", "Watch"): 1,
                ("etcd", "LeaseKeepAlive"): 1,
                ("oxia", "GetNotifications"): 1,
            }
            assert (streams.count("etcd"), streams.count("oxia"), streams.count()) == (2, 1, 3)
            streams.close("etcd")
            assert sorted(ended) == ["etcd lease", "etcd watch"]
            assert streams.closed("etcd") and not streams.closed("oxia")
            # A closed front-end refuses new streams (an UNAVAILABLE: clients go elsewhere).
            with pytest.raises(StreamsClosedError), streams.opened("etcd", "Watch", _nothing):
                raise AssertionError("opened on a closed front-end")
            assert issubclass(StreamsClosedError, UnavailableError)
            # The other front-end's streams go on and open as before.
            with streams.opened("oxia", "GetNotifications", _nothing):
                assert streams.count("oxia") == 2
        assert streams.counts() == {("etcd", "Watch"): 1}
    assert streams.counts() == {} and streams.count() == 0
    streams.close("oxia")
    assert ended.count("oxia") == 0  # closed after it ended: not called


def test_a_stream_ended_by_close_is_not_closed_twice() -> None:
    streams = OpenStreams()
    calls: list[int] = []
    registration = streams.opened("bookkeeper", "WatchMany", lambda: calls.append(1))
    with registration:
        streams.close("bookkeeper")
        streams.close("bookkeeper")  # a second stop: the stream is still winding down
    assert calls == [1]
    assert streams.count() == 0
