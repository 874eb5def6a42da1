"""ZooKeeper's numbers: operation codes, error codes, create modes, permissions, watch types.

All as ZooKeeper 3.9 defines them (`ZooDefs.OpCode`, `KeeperException.Code`, `CreateMode`,
`ZooDefs.Perms`, `Watcher.Event`, `EphemeralType`); plain ints, since they are compared on every
request.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------- operation codes

NOTIFICATION = 0
CREATE = 1
DELETE = 2
EXISTS = 3
GET_DATA = 4
SET_DATA = 5
GET_ACL = 6
SET_ACL = 7
GET_CHILDREN = 8
SYNC = 9
PING = 11
GET_CHILDREN2 = 12
CHECK = 13
MULTI = 14
CREATE2 = 15
RECONFIG = 16
CHECK_WATCHES = 17
REMOVE_WATCHES = 18
CREATE_CONTAINER = 19
DELETE_CONTAINER = 20
CREATE_TTL = 21
MULTI_READ = 22
AUTH = 100
SET_WATCHES = 101
SASL = 102
GET_EPHEMERALS = 103
GET_ALL_CHILDREN_NUMBER = 104
SET_WATCHES2 = 105
ADD_WATCH = 106
WHO_AM_I = 107
CREATE_SESSION = -10
CLOSE_SESSION = -11
ERROR = -1
"""The type of a multi's error result (and of the header that ends a multi)."""

CREATES = frozenset({CREATE, CREATE2, CREATE_CONTAINER, CREATE_TTL})
WRITES = frozenset({*CREATES, DELETE, DELETE_CONTAINER, SET_DATA, SET_ACL, MULTI})
"""Operations logged as one command each (their checks run inside the apply)."""
MULTI_WRITE_OPS = frozenset({*CREATES, DELETE, SET_DATA, CHECK})
MULTI_READ_OPS = frozenset({GET_CHILDREN, GET_DATA})

# The xids ZooKeeper's clients and server reserve.
NOTIFICATION_XID = -1
PING_XID = -2
AUTH_XID = -4
SET_WATCHES_XID = -8

# ---------------------------------------------------------------------------- error codes

OK = 0
SYSTEM_ERROR = -1
RUNTIME_INCONSISTENCY = -2
DATA_INCONSISTENCY = -3
CONNECTION_LOSS = -4
MARSHALLING_ERROR = -5
UNIMPLEMENTED = -6
OPERATION_TIMEOUT = -7
BAD_ARGUMENTS = -8
UNKNOWN_SESSION = -12
API_ERROR = -100
NO_NODE = -101
NO_AUTH = -102
BAD_VERSION = -103
NO_CHILDREN_FOR_EPHEMERALS = -108
NODE_EXISTS = -110
NOT_EMPTY = -111
SESSION_EXPIRED = -112
INVALID_CALLBACK = -113
INVALID_ACL = -114
AUTH_FAILED = -115
SESSION_MOVED = -118
NOT_READ_ONLY = -119
EPHEMERAL_ON_LOCAL_SESSION = -120
NO_WATCHER = -121
REQUEST_TIMEOUT = -122
RECONFIG_DISABLED = -123
SESSION_CLOSED_REQUIRE_SASL_AUTH = -124
QUOTA_EXCEEDED = -125
THROTTLED_OP = -127

# ---------------------------------------------------------------------------- create modes

PERSISTENT = 0
EPHEMERAL = 1
PERSISTENT_SEQUENTIAL = 2
EPHEMERAL_SEQUENTIAL = 3
CONTAINER = 4
PERSISTENT_WITH_TTL = 5
PERSISTENT_SEQUENTIAL_WITH_TTL = 6
MODES = frozenset(range(7))
SEQUENTIAL_MODES = frozenset(
    {PERSISTENT_SEQUENTIAL, EPHEMERAL_SEQUENTIAL, PERSISTENT_SEQUENTIAL_WITH_TTL}
)
EPHEMERAL_MODES = frozenset({EPHEMERAL, EPHEMERAL_SEQUENTIAL})
TTL_MODES = frozenset({PERSISTENT_WITH_TTL, PERSISTENT_SEQUENTIAL_WITH_TTL})

# ---------------------------------------------------------------------------- ephemeral owners

CONTAINER_OWNER = -(2**63)
"""`EphemeralType.CONTAINER_EPHEMERAL_OWNER` (Long.MIN_VALUE)."""
_EXTENDED_MASK = 0xFF00000000000000
_RESERVED_MASK = 0x00FFFF0000000000
TTL_MAX_MS = ~(_EXTENDED_MASK | _RESERVED_MASK) & 0xFFFFFFFFFFFFFFFF
"""The longest TTL a node may have (about 34 years), as ZooKeeper's `EphemeralType.TTL`."""


def ttl_owner(ttl_ms: int) -> int:
    """The ephemeral owner ZooKeeper stores for a TTL node (extended types on), signed."""
    raw = _EXTENDED_MASK | ttl_ms
    return raw - 2**64


def is_ttl_owner(owner: int) -> bool:
    raw = owner & 0xFFFFFFFFFFFFFFFF
    return raw & _EXTENDED_MASK == _EXTENDED_MASK and raw & _RESERVED_MASK == 0


def ttl_of(owner: int) -> int:
    return owner & TTL_MAX_MS


def is_session_owner(owner: int) -> bool:
    """An ephemeral node's owner (a session), as opposed to none, a container or a TTL."""
    return owner != 0 and owner != CONTAINER_OWNER and not is_ttl_owner(owner)


def client_owner(owner: int) -> int:
    """What a client sees as `ephemeralOwner`: the session, or 0 (containers and TTL nodes
    too, as ZooKeeper's `DataNode.copyStat` shows them)."""
    return owner if is_session_owner(owner) else 0


# ---------------------------------------------------------------------------- permissions

READ = 1
WRITE = 2
CREATE_PERM = 4
DELETE_PERM = 8
ADMIN = 16
ALL = 31

# ---------------------------------------------------------------------------- watches

EVENT_NONE = -1
NODE_CREATED = 1
NODE_DELETED = 2
NODE_DATA_CHANGED = 3
NODE_CHILDREN_CHANGED = 4
SYNC_CONNECTED = 3
"""`KeeperState.SyncConnected`, the state every watch event carries."""

# `WatcherType` of checkWatches / removeWatches.
WATCHER_CHILDREN = 1
WATCHER_DATA = 2
WATCHER_ANY = 3
WATCHER_PERSISTENT = 4
WATCHER_PERSISTENT_RECURSIVE = 5

# `AddWatchMode`.
ADD_WATCH_PERSISTENT = 0
ADD_WATCH_PERSISTENT_RECURSIVE = 1

# ---------------------------------------------------------------------------- special nodes

ROOT = "/"
SYSTEM_NODE = "/zookeeper"
QUOTA_NODE = "/zookeeper/quota"
CONFIG_NODE = "/zookeeper/config"
SPECIAL_PATHS = frozenset({ROOT, SYSTEM_NODE, QUOTA_NODE, CONFIG_NODE})
"""Nodes no client may delete (`DataTree.isSpecialPath`)."""

VERSION = "3.9.3-tablekeeper"
"""What the four-letter words report as the server's ZooKeeper version."""
