"""The ZooKeeper client protocol front-end (`--zookeeper-port`): jute over TCP, as ZooKeeper 3.9
serves it, over one range.

A ZooKeeper keyspace keeps ZooKeeper's single total order (the zxid), so it is the one range of
table `zookeeper/keyspace`, and a zxid is that range's revision. Znodes are keys of the range
(`paths`, `znode`); every write is one logged command applied by `apply`; reads run on the
applied state (`reads`); sessions are the range's sessions, timed by its session timer and
ended (with their ephemeral nodes) through its log; watch events come from the range's change
events (`watches`). `server` serves the port: the connect handshake, the per-connection order
of replies and events, the four-letter words, and in cluster mode the relay to the server that
owns the range.
"""

FRONT_END = "zookeeper"
"""The name this front-end's address is published under in cluster membership (and a worker's
port of it): here, so that naming it does not load the front-end."""
