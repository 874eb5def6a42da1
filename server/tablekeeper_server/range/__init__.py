"""One table range: a state machine over a write-ahead log, materialized in a KvStore."""
