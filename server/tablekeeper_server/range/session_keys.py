"""Where a range keeps its sessions: the system keys of the session applier
(`range.session_apply`) and of the ephemeral-key index every applier's writes keep
(`ApplyContext.stage_writes`).

A session's id is the revision of the command that created it (or one a client chose). For each
live session the range holds its TTL (`session_key`), optionally the role that created it and
the pkey it was created for; for each ephemeral key, two index entries: the key's owner (by key)
and the session's member (by session, then key), so closing a session finds its keys by a scan.
"""

from __future__ import annotations

import struct

from tablekeeper_server.core.keys import system_key

_SEQ = struct.Struct(">q")

SESSION_PREFIX = system_key(b"ss/")
"""A live session: a number record holding its TTL in ms."""
SESSION_ROLE_PREFIX = system_key(b"sr/")
SESSION_HOME_PREFIX = system_key(b"sh/")
MEMBER_PREFIX = system_key(b"se/")
"""A session's ephemeral keys: member prefix + session id + the key (an empty record)."""
OWNER_PREFIX = system_key(b"sk/")
"""An ephemeral key's session: owner prefix + the key (a number record: the session id)."""
SESSION_KEY_PREFIXES = (
    SESSION_PREFIX,
    SESSION_ROLE_PREFIX,
    SESSION_HOME_PREFIX,
    MEMBER_PREFIX,
    OWNER_PREFIX,
)
"""Every system key a session and its ephemeral keys keep (a split moves them together)."""


def session_key(session_id: int) -> bytes:
    """Holds a live session (a number record: its TTL in ms)."""
    return SESSION_PREFIX + _SEQ.pack(session_id)


def session_id_of(key: bytes, prefix: bytes = SESSION_PREFIX) -> int:
    """The session id of a `session_key` (or of another key named `prefix` + session id)."""
    return int(_SEQ.unpack_from(key, len(prefix))[0])


def session_role_key(session_id: int) -> bytes:
    """Holds the role that created a session (only when authentication named one)."""
    return SESSION_ROLE_PREFIX + _SEQ.pack(session_id)


def session_home_key(session_id: int) -> bytes:
    """Holds the pkey a session was created for (where its keep-alives are routed)."""
    return SESSION_HOME_PREFIX + _SEQ.pack(session_id)


def members_prefix(session_id: int) -> bytes:
    """The prefix of the index entries naming a session's ephemeral keys."""
    return MEMBER_PREFIX + _SEQ.pack(session_id)


def owner_key(key: bytes) -> bytes:
    """The index entry naming the session of the ephemeral key `key` (a store key)."""
    return OWNER_PREFIX + key


def session_of_key(key: bytes) -> int | None:
    """The session id a session-bookkeeping key (`SESSION_KEY_PREFIXES`) belongs to, for the
    keys named by session id; None for an owner key (named by the ephemeral key instead)."""
    for prefix in (SESSION_PREFIX, SESSION_ROLE_PREFIX, SESSION_HOME_PREFIX, MEMBER_PREFIX):
        if key.startswith(prefix):
            (session_id,) = _SEQ.unpack_from(key, len(prefix))
            return int(session_id)
    return None


def member_store_key(key: bytes) -> bytes | None:
    """The ephemeral key (store key) a member or owner index key names; None for other keys."""
    if key.startswith(MEMBER_PREFIX):
        return key[len(MEMBER_PREFIX) + _SEQ.size :]
    if key.startswith(OWNER_PREFIX):
        return key[len(OWNER_PREFIX) :]
    return None
