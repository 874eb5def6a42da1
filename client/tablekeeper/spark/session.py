"""A SparkSession for the jobs in this package (and the README example).

For `local[...]` masters everything binds to 127.0.0.1 and the UI is off; executors run this
interpreter (`PYSPARK_PYTHON`, unless already set), so they import the same `tablekeeper`.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from tablekeeper.spark import register


def get_session(
    master: str = "local[2]", app_name: str = "tablekeeper", **conf: str
) -> SparkSession:
    """Build (or get) a session with the `tablekeeper` format registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
        )
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
