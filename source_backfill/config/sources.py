"""A source (``sources[]``): one shared live stream and the jobs on it."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from source_backfill.config.base import EMBEDDED, Name, _Frozen, _off_or
from source_backfill.config.kafka import (
    SECURITY_OPTIONS,
    ArchiveConfig,
    HistoryWidthConfig,
    KafkaSecurity,
    SchemaRegistryConfig,
)

if TYPE_CHECKING:
    pass


class SourceConfig(_Frozen):
    """One shared live source, fanned out to its jobs.

    ``kind = "kafka"`` (the default): one streaming query reading ``topics``. ``kind = "delta"``: a Delta
    table with change data feed (``table_path``, keyed by ``primary_key``), followed version by version;
    its jobs copy the table with a table-backfill ``strategy``, then follow its changes.
    """

    name: Name = Field(description="The source's name (jobs name it); one shared live stream per source.")
    kind: Literal["kafka", "delta"] = Field(default="kafka", description=(
        "`kafka`: one streaming query reading `topics`. `delta`: the source is a Delta table with change "
        "data feed (`table_path`, keyed by `primary_key`), copied and followed by table-backfill jobs "
        "(docs/architecture.md, \"Table backfill\")."))
    connector: Literal["spark", "python"] = Field(default="spark", description=(
        "How a `kafka` source reads Kafka: `spark` = Spark's own Kafka source (spark-sql-kafka, the jar "
        "`make jars` fetches) for the live stream and every history read; `python` = the project's Python "
        "data source (`kafka_py`), the fallback for a cluster without the jar. Same rows, offsets and "
        "ranges (`tests/integration/kafka/test_contract.py` runs on both)."))
    table_path: str | None = Field(default=None, description=(
        "The Delta table a `delta` source follows (its change data feed must be on)."))
    primary_key: list[str] = Field(default_factory=list, description=(
        "The key columns of a `delta` source (integer or string columns; they order the copy)."))
    replay_versions_per_epoch: int = Field(default=16, gt=0, description=(
        "Table versions a snapshot or chain job replays per epoch (more when more arrived: its lag shrinks "
        "every epoch)."))
    chunk_rows: int = Field(default=1024, gt=0, description=(
        "Rows a table-backfill job reads per vnode (of 256) per epoch, before its rate limit."))
    table_index_rows: int = Field(default=1_000_000, ge=0, description=(
        "A `delta` source's table version of more rows than this (by the log's file statistics) is spilled "
        "to local disk (the system's temporary folder) by vnode, each vnode sorted by key, and the "
        "snapshot and arrangement chunks are read from there: the driver holds one vnode's rows at a time "
        "instead of the whole version (`connectors/delta/spill.py`). Up to it the version is sorted in "
        "memory, which is faster."))
    spark_copy_rows: int | None = Field(default=250_000, ge=0, le=10**15, strict=True, description=(
        "A snapshot or chain job whose pinned version holds at least this many rows (by the log's file "
        "statistics) copies it with Spark's executors, whole data files per epoch (the copy by files), "
        "when the daemon runs Spark (it does with a `kafka` source, or with `spark.tables`); `false`: "
        "always on the driver with delta-rs; `0`: every copy on Spark. Measured (bench `scale_table`): "
        "equal at 100k rows, Spark faster from 300k."))
    spark_copy_epoch_rows: int = Field(default=20_000_000, gt=0, le=10**15, strict=True, description=(
        "A copy by files takes at most this many rows (whole files; at least one) an epoch: its unit of "
        "progress and of what a crash redoes."))
    bootstrap_servers: str = Field(default=EMBEDDED, description=(
        "Kafka bootstrap servers (`host:port,...`), `embedded` for the embedded Apache Kafka (its log under "
        "`state_root/kafka`), or `${VAR}`: the value of the environment variable `VAR` (the image's config "
        "names `${KAFKA_BOOTSTRAP_SERVERS}`)."))
    topics: list[str] = Field(default_factory=list, description=(
        "The topics a `kafka` source reads (or `topic_pattern`)."))
    topic_pattern: str | None = Field(default=None, description=(
        "A regex of topics instead of `topics`; topics that appear later are picked up."))
    security: KafkaSecurity = Field(default_factory=KafkaSecurity, description=(
        "How the source's Kafka clients connect to a secured cluster (SASL_SSL, mTLS, a private CA), "
        "translated for Spark's Java client and for librdkafka (docs: \"Connect to your cluster\")."))
    schema_registry: SchemaRegistryConfig | None = Field(default=None, description=(
        "The Schema Registry the source's records name their schemas in: jobs with `format.value = "
        "\"avro\"` decode by it (docs: \"Avro and the Schema Registry\")."))
    kafka: dict[str, str] = Field(default_factory=dict, description=(
        "Other `kafka.*` consumer options without the prefix (security options go in `security`: they are "
        "refused here, in either client's spelling). Both connectors read with "
        "`isolation.level = read_committed` unless this says otherwise; Spark's consumers with "
        "`max.poll.records = 10000` (the Java client's 500 read history ~30 % slower). A source's history "
        "reads share its consumers under the group `source-backfill-<source>-history-<digest of the kafka "
        "options>-<poll>`, polling 1,000 records when their largest range is at most that, else 10,000 "
        "(docs/architecture.md, \"History read ahead\"); a `group.id` here is used for every read "
        "instead."))
    trigger_interval_s: float = Field(default=1.0, gt=0, description=(
        "The epoch interval: an epoch every trigger, on a quiet topic too (the Spark connector's tick, "
        "docs/architecture.md, \"Idle topics\"); a source whose checkpoint was written before 2026-11-27 "
        "keeps its old tick, an epoch at most once a second."))
    max_offsets_per_trigger: int | None = Field(default=None, gt=0, description=(
        "Admission control of the live stream: offsets per micro-batch at most (unset: all that arrived)."))
    max_read_tasks: int | None = Field(default=None, gt=0, description=(
        "Spark tasks one Kafka read makes at most: small partitions are read together (a 100-partition "
        "topic is not 100 tasks per epoch); unset: twice Spark's default parallelism."))
    starting_offsets: Literal["earliest", "latest"] = Field(default="latest", description=(
        "Where the live stream starts the first time the source runs (jobs backfill what lies before)."))
    fail_on_data_loss: bool = Field(default=True, description=(
        "History below the log start fails the job, naming split and offsets; `false`: skipped and counted "
        "(`job_data_loss_offsets_total`)."))
    poll_timeout_s: float = Field(default=60.0, gt=0, description=(
        "A Kafka read (a live batch's or a history read's) without progress this long fails (broker "
        "unreachable): the live query restarts, a history read backs off."))
    job_timeout_s: float = Field(default=300.0, gt=0, description=(
        "A job's Spark work in one epoch (its transform over the live batch, history read in the epoch) or "
        "in one read ahead that runs longer is cancelled, and that job fails alone."))
    max_parallel_jobs: int = Field(default=4, gt=0, le=64, description=(
        "The jobs' steps that run at once, each job on its own lane (its epochs in order, its own Spark "
        "jobs and commit; the live batch is read once for all). The source's epoch waits for them at most "
        "two triggers: a job still busy skips the next epochs and rejoins by offsets (docs: \"Lanes\")."))
    max_job_lag_s: float = Field(default=900.0, gt=0, description=(
        "A job whose output lacks the records of a source epoch it skipped (its steps slower than the "
        "trigger) for longer than this is failed, saying so: the source's checkpoint moves on without it, "
        "and a lag past the topic's retention would lose records (`job_lag_seconds`, status `lagging`)."))
    truncation_check_interval_s: float = Field(default=30.0, gt=0, description=(
        "How often a `kafka` source reads again, per partition, the last record it copied (its anchor, "
        "`sources/<name>/anchors.json`) and compares its content: a log that now ends at or below it, or "
        "holds another record there (an unclean leader election, a lost disk), fails the source's jobs "
        "that read it (`kafka_truncations_total`). Also checked at start and after a failure of the live "
        "query (docs/guides/kafka-failures.md)."))
    history_width: HistoryWidthConfig = Field(default_factory=HistoryWidthConfig, description=(
        "How many Spark tasks the source's history copies (reads ahead) run together, governed by the live "
        "latency by default; the jobs backfilling share the width (docs: \"History width\")."))
    archive: ArchiveConfig | list[ArchiveConfig] | None = Field(default=None, description=(
        "A Kafka source's archive tier: one Delta table of the topic's records as Kafka gave them, or a "
        "list of them, in order (an offset is read from the first that holds it). A job's history offsets "
        "below the log start that it holds are read from it (Spark, at the version pinned when the job "
        "first reads it) instead of being lost. Its offsets held twice fail the jobs that read it (docs: "
        "\"History beyond Kafka's retention\")."))

    @field_validator("archive")
    @classmethod
    def _archives_distinct(cls, value: ArchiveConfig | list[ArchiveConfig] | None,
                           ) -> ArchiveConfig | list[ArchiveConfig] | None:
        if isinstance(value, list):
            if not value:
                msg = "archive: an empty list (leave it out for no archive)"
                raise ValueError(msg)
            paths = [a.path for a in value]
            if len(set(paths)) != len(paths):
                msg = "archive: the same table twice"
                raise ValueError(msg)
        return value

    @property
    def archives(self) -> list[ArchiveConfig]:
        """The source's archives in order (none: ``[]``)."""
        if self.archive is None:
            return []
        return list(self.archive) if isinstance(self.archive, list) else [self.archive]

    @field_validator("spark_copy_rows", mode="before")
    @classmethod
    def _spark_copy_off(cls, value: object) -> object:
        """``false`` (or "off") turns the copy by Spark off; a bool is never a row count."""
        return _off_or(value, "spark_copy_rows is a row count (0: every copy), or false: never on Spark")

    @field_validator("bootstrap_servers")
    @classmethod
    def _from_environment(cls, value: str) -> str:
        found = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value.strip())
        if found is None:
            return value
        resolved = os.environ.get(found.group(1), "").strip()
        if not resolved:
            msg = f"bootstrap_servers names ${{{found.group(1)}}} but that environment variable is not set"
            raise ValueError(msg)
        return resolved

    @field_validator("kafka")
    @classmethod
    def _no_security_options(cls, value: dict[str, str]) -> dict[str, str]:
        refused = sorted(k for k in value if k.lower().removeprefix("kafka.") in SECURITY_OPTIONS)
        if refused:
            msg = (f"kafka: {', '.join(refused)}: security options go in the source's security section "
                   "(protocol, mechanism, username, password_file, ca_file, client_cert_file, "
                   "client_key_file), which sets them for both of the daemon's Kafka clients")
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _has_topics(self) -> SourceConfig:
        if self.kind == "delta":
            if not self.table_path or not self.primary_key:
                msg = f'delta source "{self.name}" needs table_path and primary_key'
                raise ValueError(msg)
            if self.topics or self.topic_pattern or self.archive is not None:
                msg = (f'delta source "{self.name}" reads a table: topics, topic_pattern and archive are '
                       "for kafka")
                raise ValueError(msg)
            return self
        if self.table_path or self.primary_key:
            msg = f'kafka source "{self.name}": table_path and primary_key are for kind = "delta"'
            raise ValueError(msg)
        if not self.topics and not self.topic_pattern:
            msg = f'source "{self.name}" needs topics or topic_pattern'
            raise ValueError(msg)
        if self.topics and self.topic_pattern:
            msg = f'source "{self.name}": give topics or topic_pattern, not both'
            raise ValueError(msg)
        return self
