"""A checkpoint store in Apache Pulsar (BookKeeper): checkpoints survive the loss of a server disk.

Layout, in one namespace (`<tenant>/<namespace>`, default `public/tablekeeper-checkpoints`):

* the *register* topic `o.<escaped object name>` of each object: every message in it is a
  pointer (a version of the object); the last one is current. Object names map to topic names
  reversibly: `[A-Za-z0-9_.-]` stay, every other byte of the UTF-8 name (and `=`) becomes `=XX`,
  so `r/objects/ab` is `o.r=2Fobjects=2Fab`.
* the *data* topic `d.<ms since epoch>.<random>` of each object version over `INLINE_BYTES`: its
  content in `CHUNK_BYTES` (1 MiB) messages, each with its chunk index. Smaller versions (the
  manifests, RocksDB's small files) are held inline in the pointer and have no data topic.

A pointer message is `b"TKP1"`, a u32 length, a JSON header `{"size", "sha256", "chunks",
"data_topic"}` (data_topic null when inline), then the inline bytes.

Writes are atomic: a version's data topic is written completely (every chunk acknowledged, i.e.
persisted by BookKeeper) before its pointer is published, so readers see all of a version or the
one before. `put_bytes` over an existing object publishes a new pointer, then deletes the
previous version's data topic. `delete` deletes the register topic (the object is gone at that
instant), then the data topic. Reads verify chunk order, size and SHA-256.

Index (exists / list): Pulsar's own topic metadata is the index. `exists` asks the broker for the
register's last message id (non-empty register = object exists); `list` lists the namespace's
topics and decodes the register names. A crash between creating a register and publishing its
first pointer (a few milliseconds) leaves an empty register: `exists` is false and reads raise
`FileNotFoundError` for it, but `list` shows it until it is deleted (the checkpointer treats it
as a damaged checkpoint file and deletes it). A crash between writing a data topic and publishing
its pointer leaves an orphan data topic: `list` sweeps data topics older than an hour that no
register points to, at most once an hour.

Namespace policies, applied on first use: infinite retention (no subscriptions hold these
topics), message TTL 0, no automatic topic creation, inactive topics never deleted.

Pulsar unreachable: `UnavailableError`. Every method blocks; call them from a worker thread.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import re
import struct
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pulsar

from tablekeeper_server.checkpoint.api import CheckpointStore
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.errors import CorruptionError, UnavailableError
from tablekeeper_server.pulsar_common.admin import PulsarAdmin
from tablekeeper_server.pulsar_common.client import SharedClient
from tablekeeper_server.pulsar_common.positions import entry_message_id
from tablekeeper_server.pulsar_common.send import PulsarSendError, flush, send_and_wait
from tablekeeper_server.pulsar_common.topics import NamespaceTopics, namespace_policies

log = logging.getLogger(__name__)

MiB: Final = 1 << 20
CHUNK_BYTES: Final = MiB
INLINE_BYTES: Final = 256 * 1024
WINDOW: Final = 16
"""Chunks in flight at once while uploading."""
DEFAULT_NAMESPACE: Final = "tablekeeper-checkpoints"
POINTER_MAGIC: Final = b"TKP1"
CHUNK_MAGIC: Final = b"TKC1"
_LEN = struct.Struct(">I")
_CHUNK_HEADER = struct.Struct(">4sI")
REGISTER_PREFIX: Final = "o."
DATA_PREFIX: Final = "d."
ORPHAN_AGE_S: Final = 3600.0
_SAFE = re.compile(rb"[A-Za-z0-9_.-]")


def encode_object_name(name: str) -> str:
    """The register topic's local name for object `name` (reversible, see the module doc)."""
    out = []
    for byte in name.encode("utf-8"):
        char = bytes([byte])
        out.append(char.decode() if _SAFE.fullmatch(char) else f"={byte:02X}")
    return REGISTER_PREFIX + "".join(out)


def decode_object_name(local: str) -> str | None:
    """The object name of a register topic's local name; None for other topics."""
    if not local.startswith(REGISTER_PREFIX):
        return None
    raw = bytearray()
    text = local[len(REGISTER_PREFIX) :]
    i = 0
    try:
        while i < len(text):
            if text[i] == "=":
                raw.append(int(text[i + 1 : i + 3], 16))
                i += 3
            else:
                raw.extend(text[i].encode())
                i += 1
        return raw.decode("utf-8")
    except (ValueError, IndexError):
        return None


def _check_name(name: str) -> None:
    parts = name.split("/")
    if not name or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"invalid checkpoint object name {name!r}")


class PulsarCheckpointStore:
    """Checkpoint objects in Pulsar topics (see the module docstring)."""

    def __init__(
        self,
        service_url: str,
        admin_url: str,
        *,
        tenant: str = "public",
        namespace: str = DEFAULT_NAMESPACE,
        timeout_s: float = 30.0,
        clock: Clock,
    ) -> None:
        self.service_url = service_url
        self._clock = clock
        """Names data topics by creation time, times the orphan sweep and upload deadlines."""
        self.tenant = tenant
        self.namespace = namespace
        self._timeout_s = timeout_s
        self._timeout_ms = max(1000, round(timeout_s * 1000))
        self._topics = NamespaceTopics(
            PulsarAdmin(admin_url, timeout_s=timeout_s),
            tenant,
            namespace,
            namespace_policies(retention_minutes=-1, retention_mb=-1),
        )
        self._pulsar = SharedClient(service_url, timeout_s)
        self._next_sweep = 0.0

    def describe(self) -> str:
        return f"pulsar {self.service_url} namespace {self.tenant}/{self.namespace}"

    def close(self) -> None:
        self._pulsar.close()

    # -- plumbing -------------------------------------------------------------------------------

    def _client(self) -> Any:
        return self._pulsar.get()

    def _topic(self, local: str) -> str:
        return self._topics.topic(local)

    def _path(self, local: str) -> str:
        return self._topics.path(local)

    def _create_topic(self, local: str) -> None:
        self._topics.create(local)

    def _delete_topic(self, local: str) -> None:
        self._topics.delete(local)

    def _publish(self, local: str, messages: list[bytes]) -> None:
        try:
            producer = self._client().create_producer(
                self._topic(local), batching_enabled=False, send_timeout_millis=self._timeout_ms
            )
        except pulsar.PulsarException as exc:
            raise UnavailableError(f"checkpoint store: cannot write {local}: {exc}") from exc
        try:
            send_and_wait(producer, messages, self._timeout_s)
        except (PulsarSendError, pulsar.PulsarException) as exc:
            raise UnavailableError(f"checkpoint store: writing {local} failed: {exc}") from exc
        finally:
            try:
                producer.close()
            except Exception:
                log.debug("closing a producer failed", exc_info=True)

    def _reader(self, local: str, start: Any, queue: int) -> Any:
        try:
            return self._client().create_reader(
                self._topic(local),
                start,
                start_message_id_inclusive=True,
                receiver_queue_size=queue,
            )
        except pulsar.TopicNotFound as exc:
            raise FileNotFoundError(f"checkpoint store: topic {local} not found") from exc
        except pulsar.PulsarException as exc:
            raise UnavailableError(f"checkpoint store: cannot read {local}: {exc}") from exc

    def _read_next(self, reader: Any, local: str) -> bytes:
        try:
            return bytes(reader.read_next(self._timeout_ms).data())
        except pulsar.PulsarException as exc:
            raise UnavailableError(f"checkpoint store: reading {local} failed: {exc}") from exc

    # -- pointers -------------------------------------------------------------------------------

    def _last_entry(self, local: str) -> tuple[int, int] | None:
        """(ledger, entry) of the topic's last message; None if the topic is absent or empty."""
        status, body = self._topics.admin.call(
            "GET", f"{self._path(local)}/lastMessageId", allow=(404,)
        )
        if status == 404 or not isinstance(body, dict):
            return None
        ledger, entry = int(body.get("ledgerId", -1)), int(body.get("entryId", -1))
        return None if ledger < 0 or entry < 0 else (ledger, entry)

    def _pointer(self, name: str) -> tuple[dict[str, Any], bytes]:
        """The current pointer of `name`: (header, inline bytes). `FileNotFoundError` if none."""
        local = encode_object_name(name)
        last = self._last_entry(local)
        if last is None:
            raise FileNotFoundError(f"checkpoint object {name!r} not found")
        reader = self._reader(local, entry_message_id(*last), 1)
        try:
            raw = self._read_next(reader, local)
        finally:
            _close(reader)
        return _decode_pointer(raw, name)

    # -- CheckpointStore ------------------------------------------------------------------------

    def put_file(self, name: str, source: Path) -> int:
        _check_name(name)
        if self.exists(name):
            return 0
        size = source.stat().st_size
        with open(source, "rb") as file:
            return self._put(name, file.read, size, replacing=False)

    def put_bytes(self, name: str, data: bytes) -> None:
        _check_name(name)
        view = memoryview(data)
        position = [0]

        def read(count: int) -> bytes:
            piece = bytes(view[position[0] : position[0] + count])
            position[0] += len(piece)
            return piece

        self._put(name, read, len(data), replacing=True)

    def _put(self, name: str, read: Callable[[int], bytes], size: int, *, replacing: bool) -> int:
        """Write a new version of `name` and publish it; with `replacing`, then delete the data
        topic of the version it replaces."""
        local = encode_object_name(name)
        previous = None
        if replacing:
            try:
                previous = self._pointer(name)[0].get("data_topic")
            except (FileNotFoundError, CorruptionError):
                previous = None
        digest = hashlib.sha256()
        inline = b""
        data_topic: str | None = None
        chunks = 0
        if size <= INLINE_BYTES:
            inline = read(size)
            digest.update(inline)
            written = len(inline)
        else:
            data_topic = f"{DATA_PREFIX}{self._clock.now_ms()}.{uuid.uuid4().hex}"
            chunks, written = self._upload(data_topic, read, digest)
        header = {
            "size": written,
            "sha256": digest.hexdigest(),
            "chunks": chunks,
            "data_topic": data_topic,
        }
        body = json.dumps(header, sort_keys=True).encode()
        self._create_topic(local)
        self._publish(local, [POINTER_MAGIC + _LEN.pack(len(body)) + body + inline])
        if previous and previous != data_topic:
            self._delete_topic(str(previous))
        return written

    def _upload(
        self, data_topic: str, read: Callable[[int], bytes], digest: Any
    ) -> tuple[int, int]:
        """Write the chunks to a new data topic; return (chunks, bytes) once all are persisted."""
        self._create_topic(data_topic)
        try:
            producer = self._client().create_producer(
                self._topic(data_topic),
                batching_enabled=False,
                send_timeout_millis=self._timeout_ms,
                max_pending_messages=WINDOW,
                block_if_queue_full=True,
            )
        except pulsar.PulsarException as exc:
            raise UnavailableError(f"checkpoint store: cannot write {data_topic}: {exc}") from exc
        window = threading.Semaphore(WINDOW)
        failures: list[int] = []
        pending = [0]
        idle = threading.Condition()

        def done(result: Any, _message_id: Any) -> None:  # on a client thread
            with idle:
                if result != pulsar.Result.Ok:
                    failures.append(1)
                    log.warning("checkpoint store: chunk of %s failed: %s", data_topic, result)
                pending[0] -= 1
                idle.notify_all()
            window.release()

        chunks = written = 0
        try:
            while not failures and (piece := read(CHUNK_BYTES)):
                digest.update(piece)
                window.acquire()
                with idle:
                    pending[0] += 1
                producer.send_async(_CHUNK_HEADER.pack(CHUNK_MAGIC, chunks) + piece, done)
                chunks += 1
                written += len(piece)
            flush(producer)
            deadline = self._clock.monotonic_s() + self._timeout_s + 10
            with idle:
                while pending[0] and not failures:
                    if not idle.wait(max(0.0, deadline - self._clock.monotonic_s())):
                        break
                if pending[0] or failures:
                    raise UnavailableError(f"checkpoint store: upload to {data_topic} failed")
        except BaseException:
            _close(producer)
            self._delete_topic_quietly(data_topic)
            raise
        _close(producer)
        return chunks, written

    def _delete_topic_quietly(self, local: str) -> None:
        try:
            self._delete_topic(local)
        except UnavailableError as exc:
            log.warning("checkpoint store: could not delete %s: %s", local, exc.message)

    def get_file(self, name: str, dest: Path) -> None:
        _check_name(name)
        header, inline = self._pointer(name)
        with open(dest, "wb") as out:
            self._read_content(name, header, inline, out.write)

    def get_bytes(self, name: str) -> bytes:
        _check_name(name)
        header, inline = self._pointer(name)
        parts: list[bytes] = []
        self._read_content(name, header, inline, parts.append)
        return b"".join(parts)

    def _read_content(
        self, name: str, header: dict[str, Any], inline: bytes, write: Callable[[bytes], object]
    ) -> None:
        digest = hashlib.sha256()
        size = 0
        data_topic = header.get("data_topic")
        if not data_topic:
            digest.update(inline)
            write(inline)
            size = len(inline)
        else:
            local = str(data_topic)
            reader = self._reader(local, pulsar.MessageId.earliest, 4)
            try:
                for index in range(int(header["chunks"])):
                    raw = self._read_next(reader, local)
                    magic, number = _CHUNK_HEADER.unpack_from(raw)
                    if magic != CHUNK_MAGIC or number != index:
                        raise CorruptionError(
                            f"checkpoint object {name!r}: chunk {index} of {local} is "
                            f"{magic!r}/{number}"
                        )
                    piece = raw[_CHUNK_HEADER.size :]
                    digest.update(piece)
                    write(piece)
                    size += len(piece)
            finally:
                _close(reader)
        if size != header["size"] or digest.hexdigest() != header["sha256"]:
            raise CorruptionError(
                f"checkpoint object {name!r}: read {size} bytes that fail the size/SHA-256 "
                "check of its pointer"
            )

    def sha256(self, name: str) -> str:
        """Reads the object back; a torn or altered object raises `CorruptionError`."""
        _check_name(name)
        header, inline = self._pointer(name)
        self._read_content(name, header, inline, lambda _: None)  # checks size and SHA-256
        return str(header["sha256"])

    def exists(self, name: str) -> bool:
        _check_name(name)
        return self._last_entry(encode_object_name(name)) is not None

    def list(self, prefix: str) -> builtins.list[str]:
        base = prefix.rstrip("/")
        _check_name(base)
        topics = self._topics.list()
        # Names are encoded byte by byte, so the registers under the prefix are the topics
        # starting with the prefix's encoding: only those are decoded (a namespace holds every
        # range's objects).
        wanted = encode_object_name(base + "/")
        names = []
        for local in topics:
            if not local.startswith(wanted):
                continue
            name = decode_object_name(local)
            if name is not None and name.startswith(base + "/"):
                names.append(name)
        if self._clock.monotonic_s() >= self._next_sweep:
            self._next_sweep = self._clock.monotonic_s() + ORPHAN_AGE_S
            self._sweep_orphans(topics)
        return sorted(names)

    def _sweep_orphans(self, topics: builtins.list[str]) -> None:
        """Delete data topics older than `ORPHAN_AGE_S` that no register points to."""
        now_ms = self._clock.now_ms()
        old = set()
        for local in topics:
            if local.startswith(DATA_PREFIX):
                stamp = local[len(DATA_PREFIX) :].split(".", 1)[0]
                if stamp.isdigit() and now_ms - int(stamp) > ORPHAN_AGE_S * 1000:
                    old.add(local)
        if not old:
            return
        for local in topics:
            name = decode_object_name(local)
            if name is None:
                continue
            try:
                old.discard(str(self._pointer(name)[0].get("data_topic")))
            except (FileNotFoundError, CorruptionError):
                continue
        for local in sorted(old):
            log.info("checkpoint store: deleting orphaned data topic %s", local)
            self._delete_topic_quietly(local)

    def delete(self, name: str) -> None:
        _check_name(name)
        try:
            data_topic = self._pointer(name)[0].get("data_topic")
        except (FileNotFoundError, CorruptionError):
            data_topic = None
        self._delete_topic(encode_object_name(name))
        if data_topic:
            self._delete_topic_quietly(str(data_topic))


def _decode_pointer(raw: bytes, name: str) -> tuple[dict[str, Any], bytes]:
    try:
        if raw[:4] != POINTER_MAGIC:
            raise ValueError(f"bad magic {raw[:4]!r}")
        (length,) = _LEN.unpack_from(raw, 4)
        header = json.loads(raw[8 : 8 + length])
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        inline = raw[8 + length :]
        int(header["size"])
        str(header["sha256"])
        int(header["chunks"])
        return header, inline
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise CorruptionError(f"checkpoint object {name!r}: damaged pointer: {exc}") from exc


def _close(closable: Any) -> None:
    try:
        closable.close()
    except Exception:
        log.debug("closing a Pulsar producer/reader failed", exc_info=True)


if TYPE_CHECKING:

    def _implements_the_interface(store: PulsarCheckpointStore) -> CheckpointStore:
        return store
