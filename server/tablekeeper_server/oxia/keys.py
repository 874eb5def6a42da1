"""Oxia keys in a range's store: an order-preserving encoding of Oxia's key order.

Oxia orders keys level by level along `/`: at the first level where two keys differ, a key that
ends at that level sorts before any key that goes deeper, and two segments compare as bytes. So
`a/z` < `a/b/c` (`a/z` ends at level 2, `a/b/c` goes on), `b` < `a/b`, and listing `[p/, p//)`
yields exactly the children of `p`. The store orders plain bytes, so each key is
stored encoded: every segment but the last as `0x02`, the segment with `0x00` escaped as
`0x00 0xff`, then `0x00 0x00`; the last segment as `0x01` and its raw bytes. A final segment
(`0x01`) thus sorts before a deeper one (`0x02`) at the same level, a segment that is a prefix
of another sorts first (its `0x00 0x00` end is below every escaped byte), and the encoding is
injective, so it can be decoded back.

All Oxia keys of a range live under one pkey (`OXIA_PKEY`); the range's other keys never mix in.
"""

from __future__ import annotations

from tablekeeper_server.core.keys import pkey_prefix, prefix_end

FRONT_END = "oxia"
"""The name this front-end's address is published under in cluster membership."""
OXIA_PKEY = b"oxia"
PREFIX = pkey_prefix(OXIA_PKEY)
END = prefix_end(PREFIX)

_FINAL = 0x01
_INNER = 0x02
_SEGMENT_END = b"\x00\x00"


def encode(key: str) -> bytes:
    """The store form (without the pkey prefix) of an Oxia key."""
    raw = key.encode("utf-8", "surrogatepass")
    if b"\x00" in raw:
        return _encode_escaped(raw)
    # No NUL to escape: every `/` but the last ends an inner segment and starts the next.
    cut = raw.rfind(b"/")
    if cut < 0:
        return b"\x01" + raw
    return b"\x02" + raw[:cut].replace(b"/", b"\x00\x00\x02") + b"\x00\x00\x01" + raw[cut + 1 :]


def _encode_escaped(raw: bytes) -> bytes:
    """`encode` segment by segment: for keys holding NUL bytes."""
    parts = raw.split(b"/")
    out = bytearray()
    for segment in parts[:-1]:
        out.append(_INNER)
        out += segment.replace(b"\x00", b"\x00\xff")
        out += _SEGMENT_END
    out.append(_FINAL)
    out += parts[-1]
    return bytes(out)


def decode(encoded: bytes) -> str:
    """The Oxia key of `encode`'s output; raises ValueError on anything else."""
    segments: list[bytes] = []
    i = 0
    n = len(encoded)
    while i < n:
        marker = encoded[i]
        if marker == _FINAL:
            segments.append(encoded[i + 1 :])
            return b"/".join(segments).decode("utf-8", "surrogatepass")
        if marker != _INNER:
            break
        j = encoded.find(_SEGMENT_END, i + 1)
        if j < 0:
            break
        segment = encoded[i + 1 : j]
        if 0 in segment:  # escaped NULs (0x00 0xff), or a segment end found inside an escape
            return _decode_escaped(encoded)
        segments.append(segment)
        i = j + 2
    raise ValueError(f"not an encoded Oxia key: {encoded[:32]!r}")


def _decode_escaped(encoded: bytes) -> str:
    """`decode`, byte by byte: for keys whose inner segments hold NUL bytes."""
    out = bytearray()
    i = 0
    n = len(encoded)
    while i < n:
        marker = encoded[i]
        i += 1
        if marker == _FINAL:
            out += encoded[i:]
            return out.decode("utf-8", "surrogatepass")
        if marker != _INNER:
            raise ValueError(f"not an encoded Oxia key: {encoded[:32]!r}")
        while True:
            j = encoded.index(b"\x00", i)
            out += encoded[i:j]
            if encoded[j + 1 : j + 2] == b"\xff":
                out.append(0)
                i = j + 2
                continue
            if encoded[j + 1 : j + 2] != b"\x00":
                raise ValueError(f"not an encoded Oxia key: {encoded[:32]!r}")
            i = j + 2
            break
        out.append(ord("/"))
    raise ValueError(f"not an encoded Oxia key: {encoded[:32]!r}")


def decode_children(store_keys: list[bytes], start: str) -> list[str]:
    """The Oxia keys of `store_keys` (store form, pkey prefix included), read from a span that
    starts at `start`. A listing of one directory, `[p/, p//)` as Pulsar asks, holds exactly
    the keys that begin with the store form of `p/` (its inner segments then the final
    marker), and each is `p/` plus the bytes after that: decoded in one step, not segment by
    segment. Other keys are decoded in full."""
    directory = start[: start.rfind("/") + 1]
    base = store_key(directory)
    skip = len(base)
    out: list[str] = []
    append = out.append
    for key in store_keys:
        if key.startswith(base):
            append(directory + key[skip:].decode("utf-8", "surrogatepass"))
        else:
            append(from_store_key(key))
    return out


def store_key(key: str) -> bytes:
    return PREFIX + encode(key)


def from_store_key(key: bytes) -> str:
    return decode(key[len(PREFIX) :])


def store_span(start_inclusive: str, end_exclusive: str) -> tuple[bytes, bytes]:
    """The store interval holding the Oxia keys in [start, end)."""
    return store_key(start_inclusive), store_key(end_exclusive)


def compare(a: str, b: str) -> int:
    """Oxia's key order, directly (-1, 0, 1); `encode` preserves it. For tests and merging."""
    x, y = a.encode(), b.encode()
    while x and y:
        i, j = x.find(b"/"), y.find(b"/")
        if i < 0 and j < 0:
            return (x > y) - (x < y)
        if i < 0:
            return -1
        if j < 0:
            return 1
        if x[:i] != y[:j]:
            return -1 if x[:i] < y[:j] else 1
        x, y = x[i + 1 :], y[j + 1 :]
    return (len(x) > len(y)) - (len(x) < len(y))
