"""`Limits`: what one request, one range and one server may hold or cost (`range.validation`
checks requests against them). A module of its own, without the request messages, so that the
server's settings (`config`) can name them without loading protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request, one range and one server may hold or cost. Each has a server flag
    (`tablekeeper server --help`); a request over a limit is refused before anything is logged."""

    key_bytes_max: int = 64 * 1024
    value_bytes_max: int = 4 * _MIB
    txn_ops_max: int = 1024
    """Compares plus ops of one txn (`--max-txn-ops`)."""
    batch_ops_max: int = 10_000
    """Ops of one Batch RPC (`--max-batch-ops`)."""
    response_bytes_max: int = 16 * _MIB
    """Keys and values one response may carry; a scan pages below it (`--max-response-bytes`)."""
    history_bytes_max: int = 16 * _MIB
    """Change events one range keeps in memory for watches, in bytes (`--max-history-bytes`)."""
    history_bytes_total_max: int = 256 * _MIB
    """The same over all ranges of the server (`--max-history-bytes-total`)."""
    watcher_queue_bytes_max: int = 16 * _MIB
    """Undelivered events one watcher may have queued before it is cancelled as too slow
    (`--max-watcher-queue-bytes`)."""
    name_bytes_max: int = 255
    """Length of a namespace or table name."""
    table_ranges_max: int = 1024
    """`initial_num_ranges` of one table (`--max-table-ranges`)."""

    def check(self) -> None:
        """Raise ValueError naming the first limit that is not a positive number."""
        for name in self.__slots__:
            if getattr(self, name) < 1:
                raise ValueError(f"limit {name} must be at least 1")
