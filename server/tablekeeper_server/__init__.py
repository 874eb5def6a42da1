"""TableKeeper server: storage containers hosting table ranges (a WAL plus a RocksDB index)."""
