"""The `tablekeeper` CLI's commands that read a lot or run until stopped: the whole-table scan,
`watch` and `session` (create / keep-alive / close)."""

from __future__ import annotations

import sys
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from tablekeeper._cli_context import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CommandContext
from tablekeeper._cli_output import line
from tablekeeper.bulk import is_marker, scan_range, table_layout
from tablekeeper.errors import SessionExpiredError
from tablekeeper.session import AsyncSession
from tablekeeper.table import KeyValue


def scan_table(ctx: CommandContext, limit: int | None) -> Iterator[KeyValue]:
    """Every key of the table, range after range (TableKeeper's ScanRange, as Spark reads)."""
    namespace, name = ctx.args.table
    client = ctx.client.async_client

    async def pages() -> AsyncGenerator[list[KeyValue], None]:
        layout = await table_layout(client, namespace, name)
        for info in layout.ranges:
            async for page in scan_range(client, layout.table_id, info.range_id):
                yield page

    iterator = pages()

    async def next_page() -> list[KeyValue] | None:
        try:
            return await iterator.__anext__()
        except StopAsyncIteration:
            return None

    printed = 0
    while (page := ctx.run(next_page())) is not None:
        for kv in page:
            if is_marker(kv.lkey):
                continue  # effectively-once bookkeeping of the Spark sink, not data
            yield kv
            printed += 1
            if limit is not None and printed >= limit:
                ctx.run(iterator.aclose())
                return


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key after every key starting with `prefix` (None: no such key)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def watch(ctx: CommandContext) -> int:
    args, out = ctx.args, ctx.out
    if args.prefix and args.pkey is None:
        print("error: --prefix needs --pkey (a prefix of lkeys under one pkey)", file=sys.stderr)
        return EXIT_USAGE
    pkey, key = ctx.pkey_lkey()
    table = ctx.table()
    options: dict[str, Any] = {"start_revision": args.rev or 0, "prev_kv": args.prev_kv}
    if args.prefix:
        # The wire's range end is inclusive: watch [prefix, next prefix] and drop that one key.
        stream = table.watch(pkey, start=key, end=_prefix_end(key), **options)
    else:
        stream = table.watch(pkey, key, **options)
    seen = 0
    with stream:
        target = (
            f"prefix {args.key!r} of pkey {args.pkey!r}" if args.prefix else f"key {args.key!r}"
        )
        if args.pkey is not None and not args.prefix:
            target += f" (pkey {args.pkey!r})"
        since = f"from revision {args.rev}" if args.rev else f"after revision {stream.revision}"
        print(f"watching {target} of {'/'.join(args.table)}, {since}", file=sys.stderr, flush=True)
        if out.table:
            line("TYPE\tREVISION\tLKEY\tVALUE")
        for event in stream:
            if args.prefix and not event.lkey.startswith(key):
                continue
            if out.json:
                out.doc(out.event_doc(event), None)
            elif out.table:
                value = "-" if event.kv is None else out.value_of(event.kv)
                lkey = out.bytes_text(event.lkey)
                line(f"{event.type.upper()}\t{event.revision}\t{lkey}\t{value}")
            else:
                line(out.event_text(event))
                if args.prev_kv and event.prev is not None:
                    line(f"PREV\t{out.bytes_text(event.prev.lkey)}\t{out.value_of(event.prev)}")
            seen += 1
            if args.count is not None and seen >= args.count:
                break
    return EXIT_OK


def session(ctx: CommandContext) -> int:
    args, out = ctx.args, ctx.out
    table = ctx.table()
    pkey = ctx.key(args.pkey)
    if args.action == "create":
        # Created here, kept alive by whoever holds its id (`session keep-alive --id`).
        created = table.session(pkey, ttl_s=args.ttl)
        session_id = created.create()
        doc = {"id": session_id, "ttl_seconds": created.async_session.ttl_s}
        out.doc(doc, str(session_id))
        return EXIT_OK
    found = table.session(pkey, ttl_s=1.0).async_session
    found.id = args.id
    if args.action == "close":
        if not ctx.run(found.close()):
            print(f"session {args.id} not found (closed or expired)", file=sys.stderr)
            return EXIT_NOT_FOUND
        out.doc({"id": args.id, "closed": True}, f"closed session {args.id}")
        return EXIT_OK
    return _keep_alive(ctx, found)


def _keep_alive(ctx: CommandContext, found: AsyncSession) -> int:
    args, out = ctx.args, ctx.out

    async def keep_alive() -> str | None:
        """None when --count answers were printed, else why the session is gone."""
        sent = 0
        answers = found.keep_alive_answers()
        # No `await` in a `finally` here: on Ctrl-C the CLI exits with this task pending, and
        # closing it throws GeneratorExit in while the generator runs (which cancels its stream).
        try:
            async for ttl_s in answers:
                out.doc(
                    {"id": args.id, "ttl_seconds": ttl_s},
                    f"session {args.id} kept alive, ttl {ttl_s:g}s",
                )
                sent += 1
                if args.count is not None and sent >= args.count:
                    await answers.aclose()
                    return None
        except SessionExpiredError as error:
            return str(error)
        return "the server ended the keep-alive stream"

    gone = ctx.run(keep_alive())
    if gone is not None:
        print(f"session {args.id} is gone: {gone}", file=sys.stderr)
        return EXIT_NOT_FOUND
    return EXIT_OK


__all__ = ["scan_table", "session", "watch"]
