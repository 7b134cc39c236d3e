"""One local SparkSession for the whole analytics suite (Spark's own testing guide).

Tiny data: two shuffle partitions, no UI, and a JVM tuned for a short life (C1 JIT only,
serial GC), which halves the suite's cold-start cost on a two-core machine. No whole-stage
code generation either: on rows this few, compiling each query's Java costs more than running
it (test_damaged_lake + test_daily_summary back to back: 81 s with it, 70 s without). The
results do not depend on it, and production's path (codegen on) is still run end to end and
compared with this session's answers: test_job's spark-submit and test_standalone's cluster
use Spark's defaults.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("idempay-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.legacy.parquet.nanosAsLong", "true")
        .config("spark.driver.extraJavaOptions", SHORT_LIVED_JVM)
        .config("spark.sql.codegen.wholeStage", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
