"""Recipes built only on the public client API: a PIP-45 shaped metadata store and coordination
primitives (locks with fencing tokens, unique counters), group membership, leader election, a
batching counter and a shared map. All of them are asyncio; `tablekeeper.recipes.sync` has their
blocking twins for the synchronous `Client`."""

from tablekeeper.recipes.coordination import CoordinationService, DistributedLock, Lock
from tablekeeper.recipes.groups import (
    DistributedCounter,
    GroupMembership,
    LeaderElection,
    SharedMap,
)
from tablekeeper.recipes.metadata_store import (
    MetadataCache,
    MetadataStore,
    Notification,
    Stat,
    split_path,
)

__all__ = [
    "CoordinationService",
    "DistributedCounter",
    "DistributedLock",
    "GroupMembership",
    "LeaderElection",
    "Lock",
    "MetadataCache",
    "MetadataStore",
    "Notification",
    "SharedMap",
    "Stat",
    "split_path",
]
