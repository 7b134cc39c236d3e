"""One local SparkSession for the whole analytics suite (Spark's own testing guide).

Tiny data: two shuffle partitions, no UI, and a JVM tuned for a short life (C1 JIT only,
serial GC), which halves the suite's cold-start cost on a two-core machine. No whole-stage
code generation either: on rows this few, compiling each query's Java costs more than running
it (test_damaged_lake + test_daily_summary back to back: 81 s with it, 70 s without). The
results do not depend on it, and production's path (codegen on) is still run end to end and
compared with this session's answers: test_job's spark-submit and test_standalone's cluster
use Spark's defaults.

Nor any generated code at all (``spark.sql.codegen.factoryMode=NO_CODEGEN``: projections,
predicates and orderings are interpreted, a mode Spark's own test suites run too, instead of
compiled one by one with Janino): the session JVM's CPU for the analytics tests that use it
(test_job and test_standalone left out, one process) went from 264 and 236 s to 155 s, and
to 163 s with adaptive execution off too. Measured and left out, no clear gain: adaptive
execution off alone (230 s), C2 on for this longer-lived JVM (156 s against 163 s), one local
thread (180 s).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.support.jvm import SHORT_LIVED_JVM

__all__ = ["SHORT_LIVED_JVM", "spark"]  # test_job and test_standalone import it from here


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
        .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
