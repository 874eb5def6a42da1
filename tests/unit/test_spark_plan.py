"""The Spark connector's planning-time pieces, without a Spark session: options, write schema
checks, partition planning and pkey pushdown."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.datasource import EqualTo, GreaterThan, In  # noqa: E402
from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from tablekeeper.bulk import TableLayout  # noqa: E402
from tablekeeper.routing import RangeInfo, RangeRouter  # noqa: E402
from tablekeeper.spark import OptionError, check_write_schema, parse_options  # noqa: E402
from tablekeeper.spark.source import TableKeeperPushdownReader, plan_partitions  # noqa: E402

pytestmark = pytest.mark.unit


def _schema(**columns: object) -> StructType:
    return StructType([StructField(name, t, True) for name, t in columns.items()])  # type: ignore[arg-type]


def _layout() -> TableLayout:
    step = 2**64 // 4
    ranges = [
        RangeInfo(1024 + i, -(2**63) + i * step, -(2**63) + (i + 1) * step, 0) for i in range(4)
    ]
    return TableLayout("ns", "t", 1024, 0, ranges)


def test_options() -> None:
    options = parse_options({"TABLE": "ns/t", "Service": "bk://h:1", "batchSize": "10"})
    assert (options.namespace, options.table, options.service, options.batch_size) == (
        "ns",
        "t",
        "bk://h:1",
        10,
    )
    assert parse_options({"path": "a/b", "checkpointLocation": "/x"}).table_name == "a/b"
    for bad, message in [
        ({}, "table"),
        ({"table": "nons"}, "namespace/table"),
        ({"table": "a/b", "mode": "upsert"}, "mode"),
        ({"table": "a/b", "batchSize": "0"}, "batchSize"),
        ({"table": "a/b", "exactlyOnce": "maybe"}, "true or false"),
        ({"table": "a/b", "tabel": "x"}, "unknown option"),
        ({"table": "a/b", "includeMarkers": "true"}, "binary"),
    ]:
        with pytest.raises(OptionError, match=message):
            parse_options(bad)


def test_write_schema_checks() -> None:
    check_write_schema(_schema(pkey=StringType(), lkey=BinaryType(), value=StringType()), "put")
    check_write_schema(
        _schema(pkey=StringType(), lkey=StringType(), amount=IntegerType()), "increment"
    )
    for schema, mode, message in [
        (_schema(pkey=StringType(), lkey=StringType()), "put", "missing: value"),
        (_schema(pkey=StringType(), lkey=StringType(), value=LongType()), "put", "value is bigint"),
        (
            _schema(pkey=StringType(), lkey=StringType(), amount=DoubleType()),
            "increment",
            "integer",
        ),
        (
            _schema(pkey=StringType(), lkey=StringType(), value=StringType(), x=StringType()),
            "put",
            "x",
        ),
    ]:
        with pytest.raises(OptionError, match=message):
            check_write_schema(schema, mode)


def test_plan_partitions_and_pushdown() -> None:
    layout = _layout()
    assert [p.range_id for p in plan_partitions(layout, None)] == [1024, 1025, 1026, 1027]
    router = RangeRouter(layout.ranges)
    reader = TableKeeperPushdownReader(parse_options({"table": "ns/t"}), layout)
    other = GreaterThan(("version",), 1)
    kept = list(
        reader.pushFilters([In(("pkey",), ("a", "b", "c", "d")), EqualTo(("pkey",), "b"), other])
    )
    assert kept == [other]
    planned = reader.partitions()
    assert [(p.range_id, p.pkeys) for p in planned] == [  # type: ignore[attr-defined]
        (router.route(b"b").range_id, (b"b",))
    ]
    empty = TableKeeperPushdownReader(parse_options({"table": "ns/t"}), layout)
    list(empty.pushFilters([EqualTo(("pkey",), "a"), EqualTo(("pkey",), "b")]))
    assert empty.partitions() == []
