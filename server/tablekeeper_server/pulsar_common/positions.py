"""Message positions: a Pulsar message id as a (ledger id, entry id, batch index) tuple."""

from __future__ import annotations

from typing import Any

import pulsar

Position = tuple[int, int, int]
"""(ledger id, entry id, batch index); batch index -1 for a message sent outside a batch."""


def message_position(message_id: Any) -> Position:
    return (int(message_id.ledger_id()), int(message_id.entry_id()), int(message_id.batch_index()))


def entry_message_id(ledger: int, entry: int) -> Any:
    """The id of the start of entry (ledger, entry), for `create_reader(..., inclusive=True)`."""
    return pulsar.MessageId(-1, ledger, entry, -1)
