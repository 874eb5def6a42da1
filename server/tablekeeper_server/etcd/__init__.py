"""The etcd v3 API front-end: etcd's KV, Watch and Lease services (and the Cluster/Maintenance
calls clients make on connect) over one range of TableKeeper (see `etcd.keyspace`)."""
