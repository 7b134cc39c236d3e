"""The Java options of every Spark driver JVM the suite starts.

C1 only and the serial collector: the same answers for less CPU on a two-core machine
(`idempay audit` of a three-day lake: 85 s of machine CPU with the JVM's defaults, 59-63 s
with these). tests/conftest.py hands them to every JVM Spark's launcher starts
(SPARK_SUBMIT_OPTS: the CLI's audit, spark-submit, the demo's audit, the analytics session);
tests/analytics' session and spark-submit runs also pass them as
``spark.driver.extraJavaOptions`` (and the standalone cluster's executors as
``spark.executor.extraJavaOptions``).

Measured and left out: a dynamic class-data-sharing archive of Spark's class path
(``-XX:ArchiveClassesAtExit`` once, ``-XX:SharedArchiveFile`` after) takes about 17 % off
each driver's CPU (an audit of a small lake: 31 s -> 26 s), but writing the archive costs
38-58 s of CPU, and CI installs Spark afresh in each clone (the archive is bound to the jars'
paths and times), so it would be built on every run for the few short-lived drivers a run
starts: no saving. A driver whose class path differs from the archive's (its own
SPARK_CONF_DIR) also prints a warning on stdout and runs without it.
"""

from __future__ import annotations

SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
