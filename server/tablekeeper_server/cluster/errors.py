"""The cluster's errors, in a module of their own: the composition root catches them whether or
not kazoo (cluster mode's package, the `cluster` extra) is installed."""

from __future__ import annotations


class ClusterError(Exception):
    """Cluster mode cannot go on: ZooKeeper unreachable, the cluster not initialised, or its
    metadata contradicts this server's configuration."""
