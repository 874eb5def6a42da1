"""Validation of namespace and table names: BookKeeper's `validateStreamName`, a length bound, and
no `/` in new names."""

from __future__ import annotations

NAME_BYTES_MAX = 255
"""The default bound on a name's UTF-8 length (`Limits.name_bytes_max`)."""
_SHOWN_CHARS = 64


def shown(name: str) -> str:
    """`name` for a message: quoted, and cut if long (a refused name may be megabytes)."""
    if len(name) <= _SHOWN_CHARS:
        return repr(name)
    return f"{name[:_SHOWN_CHARS]!r}… ({len(name)} characters)"


def invalid_name_reason(name: str, bytes_max: int = NAME_BYTES_MAX) -> str | None:
    """Why `name` cannot name a namespace or table, or None if it can.

    Rejected: the empty string, names over `bytes_max` bytes of UTF-8, NUL, space, `<`, `>`, and
    characters strictly inside the intervals (0x00, 0x1f), (0x7f, 0x9f), (0xd800, 0xf8ff) and
    (0xfff0, 0xffff) (BookKeeper's rule). `/` is allowed here, so that a table created with
    one before it was refused can still be read and deleted; see `invalid_new_name_reason`.
    """
    if not name:
        return "name is empty"
    if len(name) > bytes_max or len(name.encode("utf-8", "surrogatepass")) > bytes_max:
        size = len(name.encode("utf-8", "surrogatepass"))
        return f"name is {size} bytes of UTF-8; the limit is {bytes_max}"
    for ch in name:
        c = ord(ch)
        if ch in "\0 <>":
            return f"name contains the character {ch!r}"
        if 0x00 < c < 0x1F or 0x7F < c < 0x9F or 0xD800 < c < 0xF8FF or 0xFFF0 < c < 0xFFFF:
            return f"name contains the disallowed character U+{c:04X}"
    return None


def invalid_new_name_reason(name: str, bytes_max: int = NAME_BYTES_MAX) -> str | None:
    """Why a namespace or table cannot be created with `name`: `invalid_name_reason`, and `/`,
    which the CLI and every `NAMESPACE/TABLE` path use as the separator."""
    if reason := invalid_name_reason(name, bytes_max):
        return reason
    if "/" in name:
        return "name contains '/', the separator of NAMESPACE/TABLE paths"
    return None
