"""Jute, ZooKeeper's binary encoding: readers and writers of the records the protocol uses.

Jute is big-endian: `int` 4 bytes, `long` 8, `boolean` 1, `buffer` and `ustring` a 4-byte length
(-1 for null) then the bytes (UTF-8 for a ustring), `vector` a 4-byte count (-1 for null) then
the items. A record is its fields in order, without tags. On the wire every packet is framed by
a 4-byte length.

Readers take the bytes and an offset and return the value with the next offset; a record that
does not fit in its packet (or a negative length other than -1) raises `JuteError`, which the
server answers as ZooKeeper does a record it cannot read (MARSHALLINGERROR). Strings decode as
Java's `new String(bytes, UTF_8)` does (bad sequences become U+FFFD). Writers return bytes; the
hot ones are `struct` formats compiled once.
"""

from __future__ import annotations

import struct

INT = struct.Struct(">i")
LONG = struct.Struct(">q")
INT_INT = struct.Struct(">ii")
BOOL = struct.Struct(">?")
REPLY_HEADER = struct.Struct(">iqi")
"""xid, zxid, err."""
FRAMED_REPLY_HEADER = struct.Struct(">iiqi")
"""The frame's length, then a reply header."""
STAT = struct.Struct(">qqqqiiiqiiq")
"""czxid, mzxid, ctime, mtime, version, cversion, aversion, ephemeralOwner, dataLength,
numChildren, pzxid."""
STAT_SIZE = STAT.size
MULTI_HEADER = struct.Struct(">i?i")
"""type, done, err."""
CONNECT_REQUEST = struct.Struct(">iqiq")
"""protocolVersion, lastZxidSeen, timeOut, sessionId (then the password, and readOnly)."""
CONNECT_RESPONSE = struct.Struct(">iiiq")
"""The frame's length, protocolVersion, timeOut, sessionId (then the password, readOnly)."""
WATCHER_EVENT = struct.Struct(">iiqiii")
"""A framed notification: length, xid -1, zxid, err 0, then WatcherEvent's type and state
(then its path)."""

_NULL = INT.pack(-1)
_EMPTY_VECTOR = INT.pack(0)


class JuteError(Exception):
    """A record that does not decode (truncated, a bad length)."""


# ---------------------------------------------------------------------------- readers


def read_int(buf: bytes, offset: int) -> tuple[int, int]:
    if offset + 4 > len(buf):
        raise JuteError("int past the end of the packet")
    return INT.unpack_from(buf, offset)[0], offset + 4


def read_long(buf: bytes, offset: int) -> tuple[int, int]:
    if offset + 8 > len(buf):
        raise JuteError("long past the end of the packet")
    return LONG.unpack_from(buf, offset)[0], offset + 8


def read_bool(buf: bytes, offset: int) -> tuple[bool, int]:
    if offset >= len(buf):
        raise JuteError("boolean past the end of the packet")
    return buf[offset] != 0, offset + 1


def read_buffer(buf: bytes, offset: int) -> tuple[bytes | None, int]:
    if offset + 4 > len(buf):
        raise JuteError("buffer length past the end of the packet")
    (length,) = INT.unpack_from(buf, offset)
    offset += 4
    if length == -1:
        return None, offset
    end = offset + length
    if length < 0 or end > len(buf):
        raise JuteError(f"buffer of {length} bytes does not fit in the packet")
    return buf[offset:end], end


def read_string(buf: bytes, offset: int) -> tuple[str | None, int]:
    if offset + 4 > len(buf):
        raise JuteError("string length past the end of the packet")
    (length,) = INT.unpack_from(buf, offset)
    offset += 4
    if length == -1:
        return None, offset
    end = offset + length
    if length < 0 or end > len(buf):
        raise JuteError(f"string of {length} bytes does not fit in the packet")
    return buf[offset:end].decode("utf-8", "replace"), end


def read_path_data(buf: bytes, offset: int) -> tuple[str | None, bytes | None, int]:
    """A path and a buffer (how Create and SetData requests start), in one step: the write
    path's decoding, so its checks are written out here rather than called."""
    size = len(buf)
    if offset + 4 > size:
        raise JuteError("string length past the end of the packet")
    (length,) = INT.unpack_from(buf, offset)
    offset += 4
    path: str | None = None
    if length != -1:
        end = offset + length
        if length < 0 or end > size:
            raise JuteError(f"string of {length} bytes does not fit in the packet")
        path = buf[offset:end].decode("utf-8", "replace")
        offset = end
    if offset + 4 > size:
        raise JuteError("buffer length past the end of the packet")
    (length,) = INT.unpack_from(buf, offset)
    offset += 4
    if length == -1:
        return path, None, offset
    end = offset + length
    if length < 0 or end > size:
        raise JuteError(f"buffer of {length} bytes does not fit in the packet")
    return path, buf[offset:end], end


def read_path_flag(buf: bytes, offset: int) -> tuple[str | None, bool, int]:
    """A path and a boolean (GetData, Exists, GetChildren, GetChildren2 requests)."""
    path, offset = read_string(buf, offset)
    if offset >= len(buf):
        raise JuteError("boolean past the end of the packet")
    return path, buf[offset] != 0, offset + 1


def read_path_int(buf: bytes, offset: int) -> tuple[str | None, int, int]:
    """A path and an int (Delete, CheckVersion, AddWatch, CheckWatches, RemoveWatches)."""
    path, offset = read_string(buf, offset)
    value, offset = read_int(buf, offset)
    return path, value, offset


def read_vector_count(buf: bytes, offset: int) -> tuple[int, int]:
    """A vector's item count (-1, a null vector, is read as 0)."""
    count, offset = read_int(buf, offset)
    if count < -1:
        raise JuteError(f"vector of {count} items")
    if count > len(buf) - offset:  # every item takes at least one byte
        raise JuteError(f"vector of {count} items does not fit in the packet")
    return max(count, 0), offset


def read_strings(buf: bytes, offset: int) -> tuple[list[str], int]:
    count, offset = read_vector_count(buf, offset)
    out: list[str] = []
    for _ in range(count):
        value, offset = read_string(buf, offset)
        out.append(value if value is not None else "")
    return out, offset


Acl = tuple[int, str, str]
"""(perms, scheme, id)."""


def read_acls(buf: bytes, offset: int) -> tuple[list[Acl] | None, int]:
    """A vector of ACL records (None for a null vector)."""
    if offset + 4 > len(buf):
        raise JuteError("vector length past the end of the packet")
    if INT.unpack_from(buf, offset)[0] == -1:
        return None, offset + 4
    count, offset = read_vector_count(buf, offset)
    out: list[Acl] = []
    for _ in range(count):
        perms, offset = read_int(buf, offset)
        scheme, offset = read_string(buf, offset)
        ident, offset = read_string(buf, offset)
        out.append((perms, scheme or "", ident or ""))
    return out, offset


def acl_span(buf: bytes, offset: int) -> int:
    """The offset after a vector of ACL records that starts at `offset` (skipping it)."""
    return read_acls(buf, offset)[1]


# ---------------------------------------------------------------------------- writers


def write_string(value: str | None) -> bytes:
    if value is None:
        return _NULL
    raw = value.encode("utf-8", "surrogatepass")
    return INT.pack(len(raw)) + raw


def write_buffer(value: bytes | None) -> bytes:
    if value is None:
        return _NULL
    return INT.pack(len(value)) + value


def write_strings(values: list[str]) -> bytes:
    if not values:
        return _EMPTY_VECTOR
    parts = [INT.pack(len(values))]
    for value in values:
        raw = value.encode("utf-8", "surrogatepass")
        parts.append(INT.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def write_acls(acls: list[Acl]) -> bytes:
    parts = [INT.pack(len(acls))]
    for perms, scheme, ident in acls:
        parts.append(INT.pack(perms))
        parts.append(write_string(scheme))
        parts.append(write_string(ident))
    return b"".join(parts)


def frame_reply(xid: int, zxid: int, err: int, body: bytes = b"") -> bytes:
    """A whole reply packet: frame length, reply header, body."""
    return FRAMED_REPLY_HEADER.pack(16 + len(body), xid, zxid, err) + body


def notification(event_type: int, path: str, zxid: int) -> bytes:
    """A whole watch-event packet (xid -1)."""
    raw = path.encode("utf-8", "surrogatepass")
    return WATCHER_EVENT.pack(28 + len(raw), -1, zxid, 0, event_type, 3) + INT.pack(len(raw)) + raw
