"""How the `tablekeeper` CLI prints results: `-o text` (the default, for people), `-o json` (for
scripts: one JSON object per line, so listings and watches stream and `jq` reads them) and
`-o table` (aligned columns with a header). `--hex` prints keys and values as hex, which is
exact for binary data; text and JSON otherwise show bytes that are not UTF-8 as `\\xNN`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tablekeeper.table import KeyValue
from tablekeeper.watch import WatchEvent

OUTPUT_FORMATS = ("text", "json", "table")


@dataclass(frozen=True, slots=True)
class Printer:
    output: str
    """One of `OUTPUT_FORMATS`."""
    hex: bool

    @property
    def json(self) -> bool:
        return self.output == "json"

    @property
    def table(self) -> bool:
        return self.output == "table"

    def bytes_text(self, raw: bytes) -> str:
        return raw.hex() if self.hex else raw.decode(errors="backslashreplace")

    def value_of(self, kv: KeyValue) -> str | int:
        if kv.number is not None:
            return kv.number
        return self.bytes_text(kv.value)

    def kv_doc(self, kv: KeyValue) -> dict[str, Any]:
        return {
            "pkey": self.bytes_text(kv.pkey),
            "lkey": self.bytes_text(kv.lkey),
            "value": self.value_of(kv),
            "is_number": kv.is_number,
            "version": kv.version,
            "create_revision": kv.create_revision,
            "mod_revision": kv.mod_revision,
        }

    def event_doc(self, event: WatchEvent) -> dict[str, Any]:
        return {
            "type": event.type,
            "pkey": self.bytes_text(event.pkey),
            "lkey": self.bytes_text(event.lkey),
            "revision": event.revision,
            "kv": None if event.kv is None else self.kv_doc(event.kv),
            "prev": None if event.prev is None else self.kv_doc(event.prev),
        }

    def event_text(self, event: WatchEvent) -> str:
        """`PUT<tab>lkey<tab>value` or `DELETE<tab>lkey`, like etcdctl's event names."""
        if event.kv is None:
            return f"DELETE\t{self.bytes_text(event.lkey)}"
        return f"PUT\t{self.bytes_text(event.lkey)}\t{self.value_of(event.kv)}"

    def doc(self, doc: Mapping[str, Any], text: str | None) -> None:
        """Print one result: `doc` as JSON or as a one-row table, else `text` (None: nothing)."""
        if self.json:
            line(json.dumps(doc))
        elif self.table:
            self.rows(list(doc), [doc])
        elif text is not None:
            line(text)

    def rows(self, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
        """Aligned columns under an upper-case header (nested values as JSON)."""

        def cell(value: Any) -> str:
            if value is None:
                return "-"
            if isinstance(value, dict | list):
                return json.dumps(value)
            return str(value)

        cells = [[cell(row.get(column)) for column in columns] for row in rows]
        header = [column.upper() for column in columns]
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
        for values in [header, *cells]:
            line("  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip())

    def listing(
        self, columns: Sequence[str], docs: Sequence[Mapping[str, Any]], texts: Sequence[str]
    ) -> None:
        """Print a list: JSON lines, a table, or one text line per item."""
        if self.json:
            for doc in docs:
                line(json.dumps(doc))
        elif self.table:
            if docs:
                self.rows(columns, docs)
        else:
            for text in texts:
                line(text)


def line(text: str) -> None:
    """Print and flush, so a pipe (`| head`, a test reading a watch) sees each line at once."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


__all__ = ["OUTPUT_FORMATS", "Printer", "line"]
