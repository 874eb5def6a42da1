"""Oxia reads on a range's applied state: get with a key comparison, list and range scan.

They run synchronously on the range's event loop against exactly what has been applied (and so
acknowledged), which is what Oxia's leader serves too. Keys come back in Oxia's order because
the store order of encoded keys is that order (see `oxia.keys`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tablekeeper_proto.oxia import client_pb2
from tablekeeper_server.oxia import keys
from tablekeeper_server.oxia.records import fill_version, unpack, version_of
from tablekeeper_server.range.records import StoredRecord, decode_record
from tablekeeper_server.storage.api import KvStore

Comparison = client_pb2.KeyComparisonType
LIST_PAGE_KEYS = 1000
SCAN_PAGE_RECORDS = 1000
SCAN_PAGE_BYTES = 2 * 1024 * 1024
READ_PAGE_VALUE_BYTES = 2 * 1024 * 1024
"""A read's answers go out in messages of about this many value bytes (Oxia's server caps each
read reply's values at 2 MiB, counted as the values' encoded size, and sends the rest in
further messages): a batch of large values stays under the clients' 4 MiB message limit."""


def _records(store: KvStore, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]:
    for key, raw in store.scan(start, end):
        yield key, decode_record(raw)


def _last(store: KvStore, start: bytes, end: bytes) -> tuple[bytes, StoredRecord] | None:
    # The store scans forward only: a floor lookup walks the shard's keys below the target.
    found = None
    for item in _records(store, start, end):
        found = item
    return found


_OK = client_pb2.Status.Value("OK")
_KEY_NOT_FOUND = client_pb2.Status.Value("KEY_NOT_FOUND")
_EQUAL = Comparison.Value("EQUAL")
_CEILING = Comparison.Value("CEILING")
_HIGHER = Comparison.Value("HIGHER")
_FLOOR = Comparison.Value("FLOOR")


def _find(store: KvStore, req: client_pb2.GetRequest) -> tuple[bytes, StoredRecord] | None:
    """The record a get with a comparison other than EQUAL answers with, if any."""
    target = keys.store_key(req.key)
    kind = req.comparison_type
    if kind in (_CEILING, _HIGHER):
        start = target if kind == _CEILING else target + b"\x00"
        return next(_records(store, start, keys.END), None)
    end = target + b"\x00" if kind == _FLOOR else target
    return _last(store, keys.PREFIX, end)


def fill_get(store: KvStore, req: client_pb2.GetRequest, response: client_pb2.GetResponse) -> int:
    """Answer one get into `response` (a message of the reply being built, filled in place);
    return its value's length."""
    if req.comparison_type == _EQUAL:
        raw = store.get(keys.store_key(req.key))
        if raw is None:
            response.status = _KEY_NOT_FOUND
            return 0
        record = decode_record(raw)
    else:
        found = _find(store, req)
        if found is None:
            response.status = _KEY_NOT_FOUND
            return 0
        response.key = keys.from_store_key(found[0])
        record = found[1]
    value = fill_version(response.version, record)
    if req.include_value:
        response.value = value
        return len(value)
    return 0


def get(store: KvStore, req: client_pb2.GetRequest) -> client_pb2.GetResponse:
    response = client_pb2.GetResponse(status=_OK)
    fill_get(store, req, response)
    return response


def read_responses(
    store: KvStore, gets: Iterable[client_pb2.GetRequest]
) -> Iterator[client_pb2.ReadResponse]:
    """The answers of a read's gets, in order, in messages as Oxia's server sends them: a
    message ends with the answer that brings its values to `READ_PAGE_VALUE_BYTES` or more (so
    one value larger than that travels alone). No gets, no message. Each answer is built in
    its message (no copy)."""
    message = client_pb2.ReadResponse()
    add = message.gets.add
    size = 0
    for req in gets:
        size += _encoded_bytes_size(fill_get(store, req, add()))
        if size >= READ_PAGE_VALUE_BYTES:
            yield message
            message = client_pb2.ReadResponse()
            add = message.gets.add
            size = 0
    if message.gets:
        yield message


def _encoded_bytes_size(length: int) -> int:
    """A bytes field's payload on the wire: its length prefix (a varint) and its bytes."""
    return (max(length, 1).bit_length() + 6) // 7 + length


def to_get_response(
    store_key: bytes, record: StoredRecord, include_value: bool, include_key: bool
) -> client_pb2.GetResponse:
    meta, value = unpack(record.value)
    response = client_pb2.GetResponse(status=client_pb2.Status.OK, version=version_of(record, meta))
    if include_value:
        response.value = value
    if include_key:
        response.key = keys.from_store_key(store_key)
    return response


def list_pages(store: KvStore, start: str, end: str) -> Iterator[list[str]]:
    """The Oxia keys in [start, end), `LIST_PAGE_KEYS` a page, read at once from one view."""
    low, high = keys.store_span(start, end)
    found = keys.decode_children(store.keys(low, high), start)
    for at in range(0, len(found), LIST_PAGE_KEYS):
        yield found[at : at + LIST_PAGE_KEYS]


def scan_pages(store: KvStore, start: str, end: str) -> Iterator[list[client_pb2.GetResponse]]:
    low, high = keys.store_span(start, end)
    page: list[client_pb2.GetResponse] = []
    size = 0
    if low < high:
        for key, record in _records(store, low, high):
            page.append(to_get_response(key, record, True, True))
            size += len(key) + len(record.value)
            if len(page) >= SCAN_PAGE_RECORDS or size >= SCAN_PAGE_BYTES:
                yield page
                page, size = [], 0
    if page:
        yield page
