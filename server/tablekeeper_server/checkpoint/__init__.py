"""Checkpoint stores: where a range's RocksDB checkpoints (files plus a manifest) are kept so the
range can be rebuilt on an empty data directory. Backends sit behind `checkpoint.api`."""
