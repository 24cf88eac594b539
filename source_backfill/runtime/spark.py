"""Build the SparkSession the daemon, the tests and the benchmarks share."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

from connectors.kafka.security import REDACTED_OPTIONS

logger = logging.getLogger(__name__)

#: Defaults that keep a laptop (or this 2-core CI box) responsive; any key can be overridden by config.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "2g",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    # no ${env:VAR} / ${system:prop} / ${spark.conf} substitution in SQL text: a job's transform would
    # read the daemon's environment (its token) through it (the transform check refuses '${' as well)
    "spark.sql.variable.substitute": "false",
    # the Kafka readers' options carry the security section's secrets inline (a JAAS line, a PEM key):
    # plans, the UI and event logs show those options redacted (connectors/kafka/security.py)
    "spark.sql.redaction.options.regex": REDACTED_OPTIONS,
    # history read ahead runs in a pool of its own (fairscheduler.xml): while it holds slots, the next
    # free one goes to the live stream's jobs
    "spark.scheduler.mode": "FAIR",
    "spark.scheduler.allocation.file": str(Path(__file__).with_name("fairscheduler.xml")),
    # delta-rs and Delta readers expect microsecond timestamps, not Spark's legacy INT96
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # delta-spark (its jars come with spark.jars, see connectors/jars.py)
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # delta-spark rebuilds a table's snapshot with 50 tasks by default: 4.0 -> 0.8 s per epoch here
    "spark.databricks.delta.snapshotPartitions": "1",
    # local files without Hadoop's .crc sidecars: the streaming checkpoint's two writes per trigger (offset
    # log, commit log) took ~50 ms each with them, ~30 ms without (a caught-up trigger's fixed cost)
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
    # Spark's Kafka reader keeps each partition reader's last poll (its whole record list, up to
    # max.poll.records) in a pool keyed by (group id, partition), 5 min by default, for the next read
    # that continues at that offset. A batch read gets a group id of its own, so a history read's
    # entries are never taken again, only held: 10 jobs on 100 partitions at a 1 s trigger held 7.5M
    # records (1,326 entries) and the 2 GB heap died of OutOfMemoryError in ~2 min. Kept 10 s: a live
    # stream's micro-batch on a trigger up to that still continues from its last poll.
    "spark.kafka.consumer.fetchedData.cache.timeout": "10s",
    "spark.kafka.consumer.fetchedData.cache.evictorThreadRunInterval": "5s",
    # the pool of Spark's Kafka consumers (one per group id and partition) holds 64 by default, a soft
    # cap: past it every borrow evicts the oldest idle ones. A source of 100 partitions has a consumer
    # per partition for its live stream and for each poll class of its history reads: with 64, each
    # history read made most of its consumers anew (a connection, a config parse, metadata), most of
    # a rate-limited read's cost. Idle consumers still go after spark.kafka.consumer.cache.timeout (5 min).
    "spark.kafka.consumer.cache.capacity": "1024",
    # Kafka batch reads (history) with the source's V2 reader, like the live stream: its tasks check for a
    # kill at every record. Spark's V1 Kafka reader does not, so a cancelled history read with a slow
    # transform (a job past its deadline, a read ahead dropped) kept both cores busy for minutes after it
    # was cancelled; with V2 its tasks stop at once (measured: 0.95 cores/task thread vs 0.05 after 2 s)
    "spark.sql.sources.useV1SourceList": "avro,csv,json,orc,parquet,text",
    # Spark's Kafka source asks for each partition's tasks on one executor (its cached consumer), and the
    # scheduler waits 3 s for it: the offset pieces of one partition's history copy then ran one after
    # another on that executor while the others idled (a two-worker cluster: every history task on one
    # executor). Kafka reads have no data locality; a consumer made elsewhere costs milliseconds.
    "spark.locality.wait": "0s",
    # on a cluster with spark.cores.max, the session waits (up to 30 s) until executors hold all those
    # cores before it starts: the history width reads the task slots at start (runtime/width.py), and
    # a daemon ready with one of two executors registered copied a first history on one task
    # (Spark's default for standalone is 0: start with whatever registered). local[N]: no effect.
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "30s",
}

#: Over :data:`DEFAULT_CONF` in a daemon whose Spark serves ``delta`` sources alone (``spark.tables``):
#: its Spark only copies large table versions by files, with no live stream whose per-second latency a
#: stop-the-world collection would hold up. The serial collector, told to keep the heap within 10-20 %
#: of what is live after each collection, keeps a long copy's heap near its live set: G1 expands the
#: heap under a long copy's allocation rate towards its cap, so a 20M-row copy peaked at 1.76x a 1M one
#: (daemon + JVM, 1,426 vs 808 MiB); with these, 1.26x (845 vs 669 MiB), in 4.7 s instead of 5.4 s
#: (``make bench BENCH_ARGS=scale_table``; G1 with ``GCTimeRatio`` 1 or 4, ParallelGC, 32 MB regions or
#: a 768 MB heap all stayed at 1.56-2.3x). A ``spark.conf`` of the daemon's own overrides it.
TABLE_DAEMON_CONF: dict[str, str] = {
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=20",
}


def daemon_conf(conf: Mapping[str, str], *, kafka: bool) -> dict[str, str]:
    """The Spark conf a daemon asks for over :data:`DEFAULT_CONF`: its own ``spark.conf``.

    Over :data:`TABLE_DAEMON_CONF` when it has no ``kafka`` source (its Spark copies tables alone).
    """
    return dict(conf) if kafka else {**TABLE_DAEMON_CONF, **conf}


def build_spark(
    master: str = "local[*]",
    app_name: str = "source-backfill",
    conf: Mapping[str, str] | None = None,
    *,
    python_sources: bool = True,
) -> SparkSession:
    """Create (or return the active) SparkSession with our defaults and data sources registered.

    ``python_sources=False`` leaves the Python data sources unregistered (registering starts a Python
    worker, ~1 s of a daemon's start): a daemon whose sources all read with Spark's own connector.

    The JVM jars of :mod:`connectors.jars` (Spark's Kafka connector, delta-spark) are on its
    classpath (a missing jar raises :class:`~source_backfill.errors.JvmDependencyError` naming the
    command that fetches it), and the Python data sources of :mod:`connectors.kafka` are registered, so
    both ``format("kafka")`` and ``format(KAFKA_FORMAT)`` work right after this call.
    """
    from pyspark.sql import SparkSession

    from connectors.jars import spark_jars

    os.environ.setdefault("PYSPARK_PYTHON", _python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", _python())
    # py4j logs every command it sends at DEBUG, option values included: a Kafka reader's carry the
    # security section's secrets (connectors/kafka/security.py), so its logger never goes below INFO
    py4j = logging.getLogger("py4j")
    py4j.setLevel(max(py4j.getEffectiveLevel(), logging.INFO))
    builder = SparkSession.builder.master(master).appName(app_name)
    jars = {"spark.jars": ",".join(str(j) for j in spark_jars())}
    # a local session talks to itself over loopback (not the host's first interface)
    local = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"} \
        if master.startswith("local") else {}
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    for key, value in {**DEFAULT_CONF, **jars, **local, **dict(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _quiet_loggers(spark)
    if python_sources:
        register_data_sources(spark)
    logger.info('spark started master="%s" version="%s"', master, spark.version)
    return spark


#: JVM loggers raised to ERROR: their warnings do not apply to how the service uses Spark.
#: ``KafkaSourceProvider`` warns on every read that sets ``kafka.group.id`` that queries sharing a group
#: interfere; a source's history reads share one on purpose (``SparkKafkaConnector.history_group``) and,
#: assigning partitions and committing nothing, never join it.
QUIET_LOGGERS = ("org.apache.spark.sql.kafka010.KafkaSourceProvider",)


def _quiet_loggers(spark: SparkSession) -> None:
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - log4j's levels are only reachable through the gateway
    if jvm is None:
        return
    try:
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        for name in QUIET_LOGGERS:
            configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.ERROR)
    except Exception:  # noqa: BLE001 - only log lines are at stake
        logger.debug("JVM loggers not quieted", exc_info=True)


def register_data_sources(spark: SparkSession) -> None:
    """Register the project's Python data sources on ``spark`` (idempotent)."""
    try:
        from connectors.kafka.source import register
    except ImportError:  # connector not built yet
        return
    register(spark)


def warm_history_copy(spark: SparkSession) -> None:
    """Run one Python task that loads what a history read ahead runs.

    Spark's first Python RDD job of a session costs ~2 s more than the next ones (measured on two
    cores): paid here, at start, instead of by a job's first read ahead while it competes with the live
    stream.
    """
    from connectors.kafka.parquet_copy import warm_copy

    spark.sparkContext.parallelize([0], 1).map(warm_copy).collect()


def warm_table_copy(spark: SparkSession) -> None:
    """Read and write a few rows of Parquet once, as a copy by files does (a delta source's large copy).

    The first Parquet scan and write of a session load and compile what every later one reuses: ~1.5 s
    of a daemon's first 1M-row copy on two cores (2.6 s against 1.1 s for the next). Paid at start.
    """
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="source-backfill-warm-")
    try:
        df = spark.range(1000).selectExpr("id", "cast(id as string) as payload")
        df.write.mode("overwrite").parquet(f"{folder}/a")
        spark.read.schema(df.schema).parquet(f"{folder}/a").write.mode("overwrite").parquet(f"{folder}/b")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _python() -> str:
    import sys

    return sys.executable


def task_slots(spark: SparkSession) -> int:
    """Spark tasks that can run at once: the N of ``local[N]`` (``local[*]``: the machine's cores).

    On a cluster: the cores of the executors registered now (Spark's status store), else the default
    parallelism. Asked again as executors come and go (``runtime/width.py``).
    """
    import re

    master = spark.sparkContext.master or ""
    local = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master)
    if local is not None:
        n = local.group(1)
        return (os.cpu_count() or 1) if n == "*" else int(n or 1)
    try:
        executors = spark.sparkContext._jsc.sc().statusStore().executorList(True)  # noqa: SLF001
        cores = sum(int(executors.apply(i).totalCores()) for i in range(executors.size())
                    if executors.apply(i).id() != "driver")
    except Exception:  # noqa: BLE001 - the status store is Spark's internal API: fall back
        cores = 0
    return cores if cores > 0 else max(1, int(spark.sparkContext.defaultParallelism))


#: Spark's loggers that report a cancelled write at ERROR (with a stack): the stop cancels the busy lanes'
#: writes on purpose, and their failure is the lane's, logged by the daemon (``job step stopped``).
CANCELLED_WRITE_LOGGERS = (
    "org.apache.spark.sql.execution.datasources.FileFormatWriter",  # "Aborting job ..."
    "org.apache.spark.util.Utils",  # "Aborting task" (the task's side of the same write)
    "org.apache.spark.internal.io.SparkHadoopWriter",
)


def quiet_cancelled_writes(spark: SparkSession) -> None:
    """The daemon stops: the writes its stop cancels log nothing at ERROR ("Aborting job ...").

    Only from the stop on: a write that fails while the daemon runs keeps Spark's own ERROR line.
    """
    try:
        jvm = spark.sparkContext._jvm  # noqa: SLF001 - log4j's levels have no Python API
        assert jvm is not None  # noqa: S101 - a live session has a gateway
        off = jvm.org.apache.logging.log4j.Level.OFF
        for name in CANCELLED_WRITE_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, off)
    except Exception as exc:  # noqa: BLE001 - a louder stop is no reason to fail one
        logger.debug("cancelled writes not quieted: %s", exc)
