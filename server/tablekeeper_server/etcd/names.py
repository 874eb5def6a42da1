"""The names of etcd keyspaces and of their ports in cluster membership (no protobuf: the
server's settings use them before anything else is loaded)."""

from __future__ import annotations

DEFAULT_KEYSPACE = "keyspace"
"""The keyspace on `--etcd-port`; more are named by `--etcd-keyspaces` (table `etcd/NAME`)."""

FRONT_END = "etcd"
"""The name this front-end's address is published under in cluster membership (for the default
keyspace; see `front_end_name`)."""


def front_end_name(keyspace: str) -> str:
    """What a server publishes its port of `keyspace` under in cluster membership."""
    return FRONT_END if keyspace == DEFAULT_KEYSPACE else f"{FRONT_END}/{keyspace}"
