"""The connector's options, parsed and checked once (at planning time, before any task runs).

| option | default | meaning |
|---|---|---|
| `service` | `$TABLEKEEPER_SERVICE` or `bk://127.0.0.1:4181` | the TableKeeper service URI |
| `table` | (required) | `namespace/table` |
| `binary` | `false` | `pkey`, `lkey`, `value` are BinaryType instead of UTF-8 StringType |
| `pageSize` | `1000` | read: keys per ScanRange / Range page |
| `includeMarkers` | `false` | read: also return effectively-once marker keys (needs `binary`) |
| `pushdown` | `true` | read: push `pkey` = / IN filters down (see below) |
| `mode` | `put` | write: `put` (columns pkey, lkey, value) or `increment` (pkey, lkey, amount) |
| `batchSize` | `1000` | write: ops (or marker txns) per Batch RPC |
| `maxInFlight` | `2` | write: Batch RPCs in flight per task |
| `exactlyOnce` | `true` | increments: marker-guarded txns (retries and replays never count twice) |
| `writerId` | `batch` | batch increments: the marker scope (one running job per writer id) |
| `maxKeysPerPartition` | `2000000` | increments: distinct (pkey, lkey) a task may aggregate |
| `failAfterWrite` | (unset) | testing hook: a directory; each task fails once after writing |

Pushdown needs `spark.sql.python.filterPushdown.enabled=true` (`tablekeeper.spark.register` sets
it); without it Spark refuses a reader that implements `pushFilters`: use `pushdown=false` then.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from tablekeeper.client import DEFAULT_SERVICE

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
KNOWN = (
    "service",
    "table",
    "binary",
    "pageSize",
    "includeMarkers",
    "pushdown",
    "mode",
    "batchSize",
    "maxInFlight",
    "exactlyOnce",
    "writerId",
    "maxKeysPerPartition",
    "failAfterWrite",
    "path",  # Spark passes save(path)/load(path) as "path"; it is an alias of "table"
)
# Options Spark itself adds for some writes; accepted and ignored.
SPARK_OPTIONS = {"checkpointlocation", "queryname"}


class OptionError(ValueError):
    """A missing or invalid connector option."""


@dataclass(frozen=True, slots=True)
class Options:
    service: str
    namespace: str
    table: str
    binary: bool = False
    page_size: int = 1000
    include_markers: bool = False
    pushdown: bool = True
    mode: str = "put"
    batch_size: int = 1000
    max_in_flight: int = 2
    exactly_once: bool = True
    writer_id: str = "batch"
    max_keys_per_partition: int = 2_000_000
    fail_after_write: str | None = None

    @property
    def table_name(self) -> str:
        return f"{self.namespace}/{self.table}"


def _flag(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key.lower())
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise OptionError(f"option {key}={raw!r}: expected true or false")


def _int(options: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    raw = options.get(key.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {key}={raw!r}: expected an integer") from None
    if not low <= value <= high:
        raise OptionError(f"option {key}={value}: expected {low}..{high}")
    return value


def parse_options(options: Mapping[str, str]) -> Options:
    """Parse the connector options (keys are case-insensitive)."""
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(lowered) - {k.lower() for k in KNOWN} - SPARK_OPTIONS)
    if unknown:
        raise OptionError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(KNOWN)}")
    table = lowered.get("table") or lowered.get("path")
    if not table:
        raise OptionError('option "table" is required: "namespace/table"')
    namespace, sep, name = table.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise OptionError(f'option table={table!r}: expected "namespace/table"')
    service = lowered.get("service") or os.environ.get("TABLEKEEPER_SERVICE") or DEFAULT_SERVICE
    mode = lowered.get("mode", "put").strip().lower()
    if mode not in ("put", "increment"):
        raise OptionError(f"option mode={mode!r}: expected put or increment")
    writer_id = lowered.get("writerid", "batch")
    if not writer_id or "\x00" in writer_id:
        raise OptionError("option writerId must be a non-empty string without NUL")
    parsed = Options(
        service=service,
        namespace=namespace,
        table=name,
        binary=_flag(lowered, "binary", False),
        page_size=_int(lowered, "pageSize", 1000, 1, 10_000),
        include_markers=_flag(lowered, "includeMarkers", False),
        pushdown=_flag(lowered, "pushdown", True),
        mode=mode,
        batch_size=_int(lowered, "batchSize", 1000, 1, 10_000),
        max_in_flight=_int(lowered, "maxInFlight", 2, 1, 64),
        exactly_once=_flag(lowered, "exactlyOnce", True),
        writer_id=writer_id,
        max_keys_per_partition=_int(lowered, "maxKeysPerPartition", 2_000_000, 1, 10**9),
        fail_after_write=lowered.get("failafterwrite") or None,
    )
    if parsed.include_markers and not parsed.binary:
        raise OptionError("includeMarkers needs binary=true (marker keys are not UTF-8)")
    return parsed
