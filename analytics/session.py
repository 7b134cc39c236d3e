"""The one place a SparkSession is built (jobs, the CLI, the benchmark).

``local[*]`` by default; ``--master`` wins; under ``spark-submit`` the master and every
``--conf`` come from spark-submit and are left alone. The session clock is UTC, so
``to_date(ts)`` is the UTC day the lake partitions by. A local master binds the driver to
127.0.0.1 (nothing listens on another interface).
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
APP_NAME = "idempay-daily-audit"
LOOPBACK = "127.0.0.1"


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(master: str | None = None, *, app_name: str = APP_NAME) -> SparkSession:
    builder = SparkSession.builder.appName(app_name)
    if master is None and not under_spark_submit():
        master = DEFAULT_MASTER
    if master:
        builder = builder.master(master)
    if master and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)  # read when the JVM starts
        builder = builder.config("spark.driver.host", LOOPBACK).config(
            "spark.driver.bindAddress", LOOPBACK
        )
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.legacy.parquet.nanosAsLong", "true")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if not under_spark_submit():  # spark-submit's --driver-memory decides otherwise
        builder = builder.config(
            "spark.driver.memory", os.environ.get("IDEMPAY_SPARK_DRIVER_MEMORY", "2g")
        )
    spark = builder.getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        # Spark's default of 200 costs ~4x the audit's run time on a small cluster or a
        # laptop; two partitions per core keeps every core busy. An explicit --conf wins.
        parallelism = spark.sparkContext.defaultParallelism
        spark.conf.set("spark.sql.shuffle.partitions", str(max(4, 2 * parallelism)))
    spark.sparkContext.setLogLevel("ERROR")
    return spark
