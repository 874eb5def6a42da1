"""The session applier: creating and ending a range's sessions (`WalCommand.session`), for every
front-end (BookKeeper's sessions, etcd's leases, Oxia's sessions). See `range.apply` for the
applier contract and `range.session_keys` for where sessions are kept.

A session's id is its create command's revision, or the id a client chose (etcd's LeaseGrant
ID). Ending a session (close, or expiry found by `range.sessions.SessionManager`) deletes its
ephemeral keys at the end command's revision, with their change events. Keep-alives are never
logged: a session's deadline lives in memory only.

A split moves a session with the pkey it was created for: `refuse_split` refuses a seal that
would divide a session's pkey and ephemeral keys between children.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tablekeeper_proto.v1 import session_pb2, wal_pb2
from tablekeeper_server.core.keys import prefix_end, split_store_key
from tablekeeper_server.core.routing import RangeRouter
from tablekeeper_server.errors import Code
from tablekeeper_server.range.apply import ApplyContext, Rejected, Response, number_record
from tablekeeper_server.range.bookkeeper_reads import header
from tablekeeper_server.range.records import StoredRecord
from tablekeeper_server.range.session_keys import (
    SESSION_PREFIX,
    members_prefix,
    owner_key,
    session_home_key,
    session_id_of,
    session_key,
    session_role_key,
)

NAME = "sessions"
SESSION_ID_STEP = 1 << 48
"""A session's id is its command's revision, or (if a client chose that id before) the first
free one of revision + k * step (deterministic, so replay agrees)."""
_SUCCESS = Code.SUCCESS


SessionEnding = Callable[[ApplyContext, int], Callable[[], None] | None]
"""Another applier's part in ending a session: called with the context and the session's id once
the batch's settled changes are written (`ctx.scan` works) and before anything of the command
is staged; returns what to stage once the session's own keys are (or None: nothing to do). How
an applier that keeps ephemeral state of its own (the ZooKeeper front-end's ephemeral nodes,
whose parents' counters change with them) ends it in the command that ends the session."""


class SessionApplier:
    """Applies `WalCommand.session`: create a session, or end one and delete its keys."""

    name = NAME
    ops = ("session",)
    keeps_history = True

    def __init__(self, session_ending: Sequence[SessionEnding] = ()) -> None:
        """`session_ending`: the other appliers' parts in ending a session, in order."""
        self._session_ending = tuple(session_ending)

    def apply(self, ctx: ApplyContext, command: wal_pb2.WalCommand) -> Response | Rejected:
        session = command.session
        if session.WhichOneof("op") == "create_ttl_ms":
            return self._create(ctx, session)
        return self._end(ctx, session.close_id)

    def error_response(self, command: wal_pb2.WalCommand, code: int) -> Response:
        return session_pb2.SessionResponse(header=header(code))

    def check(self, command: wal_pb2.WalCommand, context: Callable[[], ApplyContext]) -> None:
        return None

    def refuse_split(self, ctx: ApplyContext, seal: wal_pb2.RangeSeal) -> str | None:
        """Why the range's sessions cannot move with their pkeys to the children of `seal`, or
        None: each session goes to the child holding the pkey it was created for, so that
        pkey and every ephemeral key of the session must fall to the same child."""
        sessions = ctx.scan(SESSION_PREFIX, prefix_end(SESSION_PREFIX))
        if next(sessions, None) is None:
            return None
        if len(seal.start_hashes) != len(seal.children):
            return "this range holds sessions, and the split did not say where its children begin"
        router = RangeRouter(list(seal.start_hashes), list(range(len(seal.children))))
        for key, _ in ctx.scan(SESSION_PREFIX, prefix_end(SESSION_PREFIX)):
            session_id = session_id_of(key)
            home = ctx.get(session_home_key(session_id))
            if home is None:
                return (
                    f"session {session_id} was created without its pkey (by an etcd or Oxia "
                    "client, or an older server): it cannot move with a split"
                )
            child = router.route(home.value)
            members = members_prefix(session_id)
            for member, _ in ctx.scan(members, prefix_end(members)):
                pkey = split_store_key(member[len(members) :])[0]
                if router.route(pkey) != child:
                    return (
                        f"session {session_id} has ephemeral keys on pkeys that the split "
                        "divides (a session and its keys move to one child)"
                    )
        return None

    @staticmethod
    def _create(ctx: ApplyContext, command: wal_pb2.SessionCommand) -> Response:
        revision = ctx.revision
        session_id = command.create_id
        if session_id:
            if session_id < 0 or ctx.session_exists(session_id):
                return session_pb2.SessionResponse(header=header(Code.KEY_EXISTS))
        else:
            session_id = revision
            while ctx.session_exists(session_id):  # a chosen id took it
                session_id += SESSION_ID_STEP
        ctx.put(session_key(session_id), number_record(revision, command.create_ttl_ms))
        if command.pkey:
            home = StoredRecord(0, revision, 0, False, 0, command.pkey)
            ctx.put(session_home_key(session_id), home)
        if command.role:
            role = StoredRecord(0, revision, 0, False, 0, command.role.encode())
            ctx.put(session_role_key(session_id), role)
        ctx.sessions += 1
        return session_pb2.SessionResponse(
            header=header(_SUCCESS), session_id=session_id, ttl_ms=command.create_ttl_ms
        )

    def _end(self, ctx: ApplyContext, session_id: int) -> Response:
        skey = session_key(session_id)
        if ctx.get(skey) is None:
            return session_pb2.SessionResponse(header=header(Code.KEY_NOT_FOUND))
        ctx.write_settled()
        finishing = [
            finish
            for finish in (ending(ctx, session_id) for ending in self._session_ending)
            if finish is not None
        ]
        members = members_prefix(session_id)
        writes: dict[bytes, StoredRecord | None] = {}
        for member, _ in ctx.scan(members, prefix_end(members)):
            key = member[len(members) :]
            if ctx.get(key) is not None:
                writes[key] = None
            else:  # defensive: an index entry whose key is gone
                ctx.delete(member)
                ctx.delete(owner_key(key))
        ctx.stage_writes(writes)  # also drops the keys' index entries
        for finish in finishing:
            finish()
        ctx.delete(skey)
        ctx.delete(session_role_key(session_id))
        ctx.delete(session_home_key(session_id))
        ctx.sessions -= 1
        return session_pb2.SessionResponse(header=header(_SUCCESS), session_id=session_id)
