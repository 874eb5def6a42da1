"""A streaming method abandoned mid-stream closes cleanly when the event loop finalizes it.

At shutdown (and when a stream's generator is collected) asyncio closes every async generator
still open, all at once and in any order. The error wrappers the streaming servicers yield
inside (Oxia's `_oxia_errors`, TableKeeper's `stream_errors`) must survive that: a wrapper that
is itself an async generator, closed before the stream's generator, made the stream's close fail
("generator didn't stop after athrow()", logged by the loop; seen when Pulsar's Oxia
notification streams were open as the server stopped).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from tablekeeper_server.errors import UnavailableError
from tablekeeper_server.oxia.errors import OxiaError
from tablekeeper_server.oxia.servicer import _oxia_errors
from tablekeeper_server.rpc.status import stream_errors


class _Context:
    """The part of a servicer context the wrappers use."""

    def __init__(self) -> None:
        self.aborted: tuple[Any, str] | None = None

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass

    async def abort(self, code: Any, message: str) -> None:
        self.aborted = (code, message)
        raise grpc.aio.AbortError()


WRAPPERS: dict[str, Callable[[_Context], Any]] = {
    "oxia": _oxia_errors,
    "tablekeeper": lambda context: stream_errors("Watch", context),
}


async def _stream(wrapper: Callable[[_Context], Any], context: _Context) -> AsyncIterator[int]:
    async with wrapper(context):
        yield 1
        await asyncio.Event().wait()  # a stream waiting for its next event
        yield 2


@pytest.mark.parametrize("name", WRAPPERS)
async def test_a_stream_open_at_loop_shutdown_closes_without_error(name: str) -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, error: errors.append(error))
    try:
        stream = _stream(WRAPPERS[name], _Context())
        assert await stream.__anext__() == 1
        await loop.shutdown_asyncgens()
    finally:
        loop.set_exception_handler(previous)
    assert [(e.get("message"), repr(e.get("exception"))) for e in errors] == []


@pytest.mark.parametrize(
    ("name", "error", "code"),
    [
        ("oxia", OxiaError.unavailable("gone"), grpc.StatusCode.UNAVAILABLE),
        ("oxia", UnavailableError("stopping"), None),
        ("tablekeeper", UnavailableError("stopping"), grpc.StatusCode.UNAVAILABLE),
        ("tablekeeper", ValueError("bug"), grpc.StatusCode.INTERNAL),
    ],
)
async def test_an_error_inside_the_stream_aborts_with_its_status(
    name: str, error: Exception, code: grpc.StatusCode | None
) -> None:
    context = _Context()

    async def failing() -> AsyncIterator[int]:
        async with WRAPPERS[name](context):
            yield 1
            raise error

    stream = failing()
    assert await stream.__anext__() == 1
    with pytest.raises(grpc.aio.AbortError):
        await stream.__anext__()
    assert context.aborted is not None
    if code is not None:
        assert context.aborted[0] == code
