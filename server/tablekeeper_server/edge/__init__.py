"""The edge kit every protocol front-end (BookKeeper's, etcd's, Oxia's, ZooKeeper's) shares:
the startup retry loop (`startup`), the registry of open streams (`streams`) and the request
limits (`limits`). Errors map in the one table, `errors.ERROR_TABLE` (a column per protocol)."""
