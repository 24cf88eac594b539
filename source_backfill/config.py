"""The one typed configuration model: a TOML file, overridden by ``SOURCE_BACKFILL_*`` environment variables.

Nested keys use ``__`` in the environment: ``SOURCE_BACKFILL_API__TOKEN=secret``,
``SOURCE_BACKFILL_SPARK__MASTER=spark://host:7077``. Lists (sources, jobs) come from the file; a JSON
value in the environment replaces the whole list.
"""

from __future__ import annotations

import contextvars
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from source_backfill.core.splits import parse_split_id
from source_backfill.errors import ConfigError, StateFormatError

if TYPE_CHECKING:
    from source_backfill.metrics import PerSplit

#: Names of sources and jobs appear in paths, metric labels and URLs.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]

#: A transform starts with SELECT or WITH (any case) and reads ``{source}``. Checked by JobSpec's validator
#: (which says which half is missing) and published in the API schema, so clients and fuzzers see the rule.
#: Spelled out in ASCII (no ``\s``, ``\b``): Python's and JavaScript's regexes differ on what those match.
_TRANSFORM_START = r"^[ \t\n\r\f\v]*(?:[Ss][Ee][Ll][Ee][Cc][Tt]|[Ww][Ii][Tt][Hh])(?![A-Za-z0-9_])"
TRANSFORM_PATTERN = _TRANSFORM_START + r"[\s\S]*\{source\}"
#: The longest transform accepted (the transform check refuses longer ones before parsing them too).
MAX_TRANSFORM_CHARS = 16_384

#: A transform's text as the schema states it (``JobSpec``'s validator says which rule a text breaks).
TransformText = Annotated[str, Field(max_length=MAX_TRANSFORM_CHARS,
                                     json_schema_extra={"pattern": TRANSFORM_PATTERN})]

def transform_text(value: str | None) -> str | None:
    """A transform's text checked by the rules the schema states (``TRANSFORM_PATTERN``); ValueError why."""
    if value is None:
        return None
    if not re.match(_TRANSFORM_START, value):
        msg = "transform must be a Spark SQL SELECT (or WITH ... SELECT) query"
        raise ValueError(msg)
    if "{source}" not in value:
        msg = "transform must read the Kafka rows as {source}, e.g. SELECT key, value FROM {source}"
        raise ValueError(msg)
    return value


#: The bootstrap value that makes the daemon start its own in-memory broker (laptop and demo default).
EMBEDDED = "embedded"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _unicode_text(cls, value: object) -> object:
        r"""Refuse text that is not Unicode, and paths holding a NUL byte.

        Lone surrogates (a JSON ``\ud800`` escape; environment bytes that are not UTF-8) cannot be written
        as UTF-8 again: accepted, they failed later, in the mutation log or a response.
        """
        if _lone_surrogate(value):
            msg = "text is not valid Unicode (a lone surrogate such as \\ud800)"
            raise ValueError(msg)
        if isinstance(value, PurePath) and "\x00" in str(value):
            msg = "a path cannot hold a NUL byte"
            raise ValueError(msg)
        return value


def _lone_surrogate(value: object) -> bool:
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_lone_surrogate(k) or _lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_lone_surrogate(v) for v in value)
    return False


# -- job start positions ------------------------------------------------------------------------------
def _kind_required(schema: dict[str, Any]) -> None:
    schema["required"] = ["kind", *(r for r in schema.get("required", []) if r != "kind")]


class _Start(_Frozen):
    #: ``kind`` picks the start position, so a request must name it (the default only serves Python callers);
    #: the schema says so, or a client could send ``{"timestamp_ms": 0}``, valid by the schema, and get 422.
    model_config = ConfigDict(json_schema_extra=_kind_required)


class EarliestStart(_Start):
    """Backfill from the earliest offset still in the log (the default)."""

    kind: Literal["earliest"] = Field(default="earliest", description="`earliest`: from the log start.")


class OffsetsStart(_Start):
    """Backfill from an explicit offset per split (``"topic:partition" -> offset``); others from earliest."""

    kind: Literal["offsets"] = Field(default="offsets", description="`offsets`: from an offset per split.")
    #: The schema states the rule _split_ids checks, so API clients (and the schema fuzzer) see it.
    offsets: dict[str, Annotated[int, Field(ge=0)]] = Field(
        json_schema_extra={"propertyNames": {"pattern": r"^[\s\S]+:[0-9]+$"}},
        description='The first offset to backfill per split, `{"topic:partition" = offset}`; the splits it '
                    "does not name start at the earliest offset.",
    )

    @field_validator("offsets")
    @classmethod
    def _split_ids(cls, value: dict[str, int]) -> dict[str, int]:
        for split in value:
            try:
                parse_split_id(split)
            except StateFormatError as exc:  # pydantic reports a ValueError as a validation error
                raise ValueError(str(exc)) from None
        return value


class TimestampStart(_Start):
    """Backfill from the first record at or after ``timestamp_ms`` (Kafka record timestamps)."""

    kind: Literal["timestamp"] = Field(default="timestamp", description="`timestamp`: from a record time.")
    timestamp_ms: Annotated[int, Field(ge=0)] = Field(
        description="Milliseconds since the Unix epoch: each split starts at its first record whose Kafka "
                    "timestamp is at or after it (in the source's archive too, below the log start).")


class LatestStart(_Start):
    """No history: only records after the job's attach position (RisingWave's ``scan.startup.mode = latest``).

    Every split is Finished at attach; the live stream brings what follows.
    """

    kind: Literal["latest"] = Field(default="latest",
                                    description="`latest`: no history, only records after the attach.")


StartSpec = Annotated[
    EarliestStart | OffsetsStart | TimestampStart | LatestStart, Field(discriminator="kind")
]


# -- sources and jobs ----------------------------------------------------------------------------------
class HistoryWidthConfig(_Frozen):
    """How many Spark tasks a Kafka source's history copies may run (``sources[].history_width``).

    By default a governor decides (``core.governor``): it widens the copies while the live latency (p99)
    of the source's Finished jobs stays within a target, and narrows them when it rises. The width is
    shared by the source's jobs that are backfilling; one job's copy of a few large partitions is cut
    into offset pieces so that it can use its share.
    """

    min_tasks: int = Field(default=1, gt=0, le=4096, description=(
        "The width is never below this many tasks (of all the source's copies together)."))
    max_tasks: int | None = Field(default=None, gt=0, le=4096, description=(
        "The width is never above this many tasks; unset: the task slots Spark has (the N of `local[N]`, "
        "the executors' cores on a cluster, read again every 30 s)."))
    min_duty: float = Field(default=0.125, gt=0, le=1.0, description=(
        "Below one task (with `min_tasks` 1) the governor slows the copies down to this share of the time "
        "at the least, one task copying that share of the time (`runtime/width.py`); `1.0`: never below "
        "one task copying all the time."))
    fixed_tasks: int | None = Field(default=None, gt=0, le=4096, description=(
        "Governor off: every copy runs this many tasks (at least `min_tasks`, at most `max_tasks`); the "
        "benchmarks compare fixed widths so."))
    latency_target_s: float | None = Field(default=None, gt=0, description=(
        "The live latency (p99 of the Finished jobs' live rows, seconds) the governor keeps; unset: "
        "`latency_target_ratio` × the p99 the Finished jobs had while no copy ran."))
    latency_target_ratio: float = Field(default=1.2, ge=1.0, le=100.0, description=(
        "The default target, relative to the Finished jobs' p99 while no copy ran (the last minute's)."))

    @model_validator(mode="after")
    def _bounds(self) -> HistoryWidthConfig:
        if self.max_tasks is not None and self.max_tasks < self.min_tasks:
            msg = f"history_width: max_tasks ({self.max_tasks}) is below min_tasks ({self.min_tasks})"
            raise ValueError(msg)
        return self


class ArchiveConfig(_Frozen):
    """A Delta table of a Kafka source's records as Kafka gave them (``sources[].archive``).

    The archive tier (docs/architecture.md, "History tiers"): a job's history offsets the archive holds
    are read from it (Spark over Parquet) instead of the broker, those below the log start included,
    which Kafka no longer has. It is the operator's setting, never a job's: a job only chooses whether
    to use it (``history_source``).
    """

    path: str = Field(min_length=1, description=(
        "The archive's Delta table: its `topic`, `partition`, `offset` columns and the rest of Kafka's, as "
        "a job of this service without a transform writes them."))
    trusted: bool = Field(default=False, description=(
        "The archive's records are Kafka's wherever both hold an offset (this service's own identity job "
        "wrote it, each offset once): it is read wherever it holds offsets. `false` (a foreign table): it "
        "is read only below the log start, where nothing is left to compare it with; Kafka serves the "
        "rest."))
    check_offsets: int = Field(default=1000, ge=0, le=10_000_000, description=(
        "An archive not `trusted` that overlaps what Kafka still holds is compared with Kafka there before "
        "a job reads it: this many offsets per split from the log start (`core.tiers.overlap_window`), "
        "record by record (key, value, timestamp, timestampType). A difference, or a record one side "
        "lacks, refuses the archive (its jobs fail, naming split and offset): it proves the archive is a "
        "copy of this topic's log before its part below the log start, which nothing can check, is "
        "copied. `0`: not compared."))


#: Kafka client options a ``security`` section sets, in either client's spelling (librdkafka, Java):
#: refused in ``sources[].kafka``, so each secret has one way in (a file or an environment variable).
SECURITY_OPTIONS = frozenset({
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "sasl.jaas.config", "sasl.login.callback.handler.class", "sasl.client.callback.handler.class",
    "ssl.ca.location", "ssl.ca.pem", "ssl.certificate.location", "ssl.certificate.pem", "ssl.key.location",
    "ssl.key.pem", "ssl.key.password", "ssl.keystore.location", "ssl.keystore.password",
    "ssl.keystore.type", "ssl.keystore.key", "ssl.keystore.certificate.chain", "ssl.truststore.location",
    "ssl.truststore.password", "ssl.truststore.type", "ssl.truststore.certificates",
    "ssl.endpoint.identification.algorithm", "config.providers",
})


class KafkaSecurity(_Frozen):
    """How a ``kafka`` source's clients connect to a secured cluster: one section, each client's spelling.

    Spark's Java client and librdkafka (the admin client, the driver's small reads, the Python connector,
    the Parquet copy, ``verify``) spell these differently; ``connectors/kafka/security.py`` translates this
    section for each. Secrets come from a file (a mounted Kubernetes secret) or an environment variable,
    read when a client is made, never kept in the config. OAUTHBEARER (Confluent Cloud, MSK IAM) is not
    supported yet.
    """

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description=(
            "`security.protocol`: `SASL_SSL` (SASL over TLS: MSK, Confluent Platform, Strimzi, Redpanda), "
            "`SSL` (TLS, with a client certificate for mTLS), `SASL_PLAINTEXT`, or `PLAINTEXT`."))
    mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] | None = Field(default=None, description=(
        "The SASL mechanism (`SASL_*` protocols only)."))
    username: str | None = Field(default=None, min_length=1, description="The SASL user name.")
    password_file: Path | None = Field(default=None, description=(
        "A file holding the SASL password (a trailing newline is dropped)."))
    password_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description=(
        "An environment variable holding the SASL password, instead of `password_file`."))
    ca_file: Path | None = Field(default=None, description=(
        "PEM file of the CA(s) that signed the brokers' certificates (a private CA); unset: the system's."))
    client_cert_file: Path | None = Field(default=None, description=(
        "PEM file of the client's certificate (mTLS), with `client_key_file`."))
    client_key_file: Path | None = Field(default=None, description=(
        "PEM file of the client certificate's private key (mTLS)."))
    key_password_file: Path | None = Field(default=None, description=(
        "A file holding the password of an encrypted `client_key_file`."))
    check_hostname: bool = Field(default=True, description=(
        "Check that a broker's certificate names the host the client connected to (`false` only for a test "
        "cluster whose certificates name no host)."))

    @model_validator(mode="after")
    def _coherent(self) -> KafkaSecurity:
        sasl, tls = self.protocol.startswith("SASL_"), self.protocol.endswith("SSL")
        if sasl:
            if self.mechanism is None or self.username is None:
                msg = f"security: protocol {self.protocol} needs mechanism and username"
                raise ValueError(msg)
            if (self.password_file is None) == (self.password_env is None):
                msg = "security: give the SASL password as password_file or password_env (one of them)"
                raise ValueError(msg)
        elif any(v is not None for v in (self.mechanism, self.username, self.password_file,
                                          self.password_env)):
            msg = f"security: mechanism, username and password are for SASL protocols, not {self.protocol}"
            raise ValueError(msg)
        files = (self.ca_file, self.client_cert_file, self.client_key_file, self.key_password_file)
        if not tls and any(f is not None for f in files):
            msg = f"security: ca_file and the client certificate are for TLS protocols, not {self.protocol}"
            raise ValueError(msg)
        if (self.client_cert_file is None) != (self.client_key_file is None):
            msg = "security: client_cert_file and client_key_file go together (mTLS)"
            raise ValueError(msg)
        if self.key_password_file is not None and self.client_key_file is None:
            msg = "security: key_password_file is the password of client_key_file"
            raise ValueError(msg)
        return self


class SchemaRegistryConfig(_Frozen):
    """The Schema Registry a ``kafka`` source's records name their writer schemas in (Confluent's REST API).

    Declared by the operator on the source, never by a job: a job only says how it decodes
    (``jobs[].format``), so no job can point the daemon at a URL or a secret file of its choosing.
    """

    url: str = Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$", max_length=2048, description=(
        "The registry's base URL: `http://registry:8081`, or Apicurio's "
        "`http://registry:8080/apis/ccompat/v7`."))
    username: str | None = Field(default=None, min_length=1, description=(
        "The basic-auth user (unset: no authentication)."))
    password_file: Path | None = Field(default=None, description=(
        "A file holding the basic-auth password (a trailing newline is dropped)."))
    ca_file: Path | None = Field(default=None, description=(
        "PEM file of the CA(s) that signed the registry's certificate (a private CA); unset: the system's."))
    deadline_s: float = Field(default=120.0, gt=0, le=3600, description=(
        "How long a registry that does not answer is retried before the epoch fails (the job is then "
        "rebuilt from its table and tries again): a registry down for less delays, never skips."))

    @model_validator(mode="after")
    def _coherent(self) -> SchemaRegistryConfig:
        if (self.username is None) != (self.password_file is None):
            msg = "schema_registry: username and password_file go together"
            raise ValueError(msg)
        return self


#: A job's dead-letter table is its table's path with this after it.
DEAD_LETTER_SUFFIX = "_dead_letters"


class FormatSpec(_Frozen):
    """How a job decodes its Kafka records' values before its transform (docs/guides/avro.md).

    ``raw`` keeps Kafka's bytes (``key``, ``value``, ...). ``avro`` decodes each value in the Confluent wire
    format by its own writer schema's id, fetched from the source's ``schema_registry``, onto the job's
    reader schema: the transform's ``{source}`` then has the Kafka columns without ``value`` and one column
    per field of the reader.
    """

    value: Literal["raw", "avro"] = Field(default="raw", description=(
        "`raw` (Kafka's bytes) or `avro` (Confluent-framed Avro by schema id; the source needs a "
        "`schema_registry`). Protobuf and JSON Schema are not supported yet."))
    subject: str | None = Field(default=None, min_length=1, max_length=255, description=(
        "The registry subject of the reader schema; unset: `<topic>-value` of the source's only topic."))
    reader_version: int | None = Field(default=None, gt=0, strict=True, description=(
        "The subject's version the job reads onto; unset: its latest when the job's table is created."))
    evolution: Literal["evolve", "pin", "fail"] = Field(default="evolve", description=(
        "A writer schema the reader lacks a field of: `evolve` (the reader gains it, the table gains its "
        "column with the first rows that hold it), `pin` (the reader stays; its defaults fill what it "
        "adds), `fail` (any writer other than the reader's fails the job). A writer the reader cannot read "
        "(a type changed incompatibly, a field removed that has no default) fails the job alone."))
    on_decode_error: Literal["fail", "dead_letter"] = Field(default="fail", description=(
        "A record that cannot be decoded (another magic byte, an id the registry does not know, a "
        "truncated body): `fail` the job, or `dead_letter` it into the Delta table at `<sink_path>"
        "_dead_letters` (raw record, offset, error), exactly once beside the job's table."))

    @model_validator(mode="after")
    def _coherent(self) -> FormatSpec:
        if self.value == "raw" and (self.subject is not None or self.reader_version is not None
                                    or self.on_decode_error != "fail" or self.evolution != "evolve"):
            msg = "format: subject, reader_version, evolution and on_decode_error are for value = \"avro\""
            raise ValueError(msg)
        return self


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


class JobSpec(_Frozen):
    """A downstream job: backfill the source's history, then follow it live, into a Delta table."""

    name: Name = Field(description="The job's name (in paths, metric labels and URLs).")
    source: Name = Field(description="The source the job reads (`sources[].name`).")
    sink_path: str = Field(min_length=1, description=(
        "The job's Delta table (a local path). It must lie inside `daemon.data_root` when that is set and "
        "overlap neither the state root nor another job's table (docs: \"Security\", \"State and sinks\")."))
    start: StartSpec = Field(default_factory=EarliestStart, description=(
        'Where the job\'s history starts: `{kind = "earliest"}`, `{kind = "offsets", offsets = {"t:0" = '
        '42}}`, `{kind = "timestamp", timestamp_ms = ...}` or `{kind = "latest"}` (no history: only records '
        "after the attach position)."))
    #: strict: ``true`` is not 1 row/s, nor ``"5"`` a number (the schema says number, and so do we).
    rate_limit: float | None = Field(default=None, ge=0, allow_inf_nan=False, strict=True, description=(
        "History rows per second, met on average (a token bucket on the wall clock); unset: unlimited; `0`: "
        "read no history for now (nothing is lost; it resumes when raised)."))
    max_rows_per_epoch: int | None = Field(default=None, gt=0, description=(
        "A cap on history offsets per epoch (and per read ahead)."))
    read_ahead: bool = Field(default=True, description=(
        "Copy history between epochs, in a background Spark job, its commit at the next epoch boundary (a "
        "transform is applied as it copies); `false` reads it inside the epochs."))
    transform: TransformText | None = Field(default=None, description=(
        "One Spark SQL query over `{source}` (the Kafka columns), at most 16,384 characters; unset: "
        "identity. Judged by allow-list on Spark's parsed plan before anything runs (only the plan nodes, "
        "expressions and built-in functions `executors/transform_allowed.py` names; relations only "
        "`{source}` and its own `WITH` names), else a 422 naming the construct (docs/architecture.md, "
        "\"Transforms\")."))
    mode: Literal["append", "merge", "changelog"] | None = Field(default=None, description=(
        "What lands in the table. Kafka sources: `append` (the default). Delta sources: `merge` (the "
        "default; the table copied by key) or `changelog` (every change appended with `_change_type`, "
        "`_epoch` and `_seq`, which order them). Unset: the source kind's default."))
    strategy: Literal["snapshot", "arrangement", "chain"] | None = Field(default=None, description=(
        "How a job on a `delta` source copies the table: `snapshot` (pin the version, copy it per vnode, "
        "replay the changes after it), `arrangement` (copy the moving table per vnode, forward changes of "
        "the rows already copied) or `chain` (the pinned snapshot in one pass, then the changes); "
        "docs/architecture.md, \"Table backfill\"."))
    writer: Literal["delta-rs", "delta-spark"] = Field(default="delta-rs", description=(
        "Who commits the job's table: `delta-rs` (an append written straight into the log while nothing "
        "else wrote there, else a delta-rs commit), or `delta-spark` (5-25× slower per epoch here; history "
        "then read inside the epochs)."))
    format: FormatSpec = Field(default_factory=FormatSpec, description=(
        "Kafka jobs: how record values are decoded before the transform: `{value = \"raw\"}` (the "
        "default) or `{value = \"avro\", evolution = ..., on_decode_error = ...}` by the source's "
        "`schema_registry`."))
    history_source: Literal["auto", "kafka", "archive"] = Field(default="auto", description=(
        "Kafka jobs: where history comes from. `auto`: the source's archive for what it holds (below the "
        "log start, or everywhere when `trusted`), Kafka for the rest, and `earliest` starts at the lower "
        "of the two (Kafka alone without an archive); `kafka`: the broker only; `archive`: the archive only "
        "(what it lacks is a gap inside its span, else data loss; needs `sources[].archive`)."))

    @field_validator("transform")
    @classmethod
    def _transform_reads_source(cls, value: str | None) -> str | None:
        return transform_text(value)

    @property
    def dead_letter_path(self) -> str | None:
        """The job's dead-letter table (``format.on_decode_error = "dead_letter"``), beside its table."""
        if self.format.on_decode_error != "dead_letter":
            return None
        return f"{self.sink_path.rstrip('/')}{DEAD_LETTER_SUFFIX}"

    @property
    def tables(self) -> list[str]:
        """Every table the job writes: its own, and its dead-letter table if it has one."""
        return [self.sink_path] + ([] if self.dead_letter_path is None else [self.dead_letter_path])


#: The most splits one repair names (a job's splits, all of them, is what an empty list says).
MAX_REPAIR_SPLITS = 10_000


class RepairSpec(_Frozen):
    """``POST /jobs/{name}/repair``: replace the job's rows of a window with a fresh copy (one commit).

    The window is offsets ``[from_offset, to_offset)`` or the records whose Kafka timestamps are in
    ``[from_timestamp_ms, to_timestamp_ms)`` (resolved to offsets in Kafka, so only where Kafka still
    holds them), of ``splits`` (``"topic:partition"``; empty: every split of the job). The daemon cuts it
    to what the job's table holds (docs/architecture.md, "Repair a range in place").
    """

    splits: list[Annotated[str, Field(pattern=r"^[\s\S]+:[0-9]+$")]] = Field(
        default_factory=list, max_length=MAX_REPAIR_SPLITS,
        description='The splits to repair (`"topic:partition"`); empty: every split of the job.')
    from_offset: int | None = Field(default=None, ge=0, strict=True, description=(
        "The window's first offset (with `to_offset`)."))
    to_offset: int | None = Field(default=None, ge=0, strict=True, description=(
        "The offset after the window's last (exclusive)."))
    from_timestamp_ms: int | None = Field(default=None, ge=0, strict=True, description=(
        "Instead of offsets: the first Kafka timestamp (ms) of the window (resolved in Kafka)."))
    to_timestamp_ms: int | None = Field(default=None, ge=0, strict=True, description=(
        "The Kafka timestamp (ms) the window ends before (exclusive)."))

    @field_validator("splits")
    @classmethod
    def _split_ids(cls, value: list[str]) -> list[str]:
        for split in value:
            try:
                parse_split_id(split)
            except StateFormatError as exc:
                raise ValueError(str(exc)) from None
        if len(set(value)) != len(value):
            msg = "splits names a split more than once"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _one_window(self) -> RepairSpec:
        offsets = (self.from_offset, self.to_offset)
        stamps = (self.from_timestamp_ms, self.to_timestamp_ms)
        given = [w for w in (offsets, stamps) if any(v is not None for v in w)]
        if len(given) != 1 or any(v is None for v in given[0]):
            msg = ("a repair names one window: from_offset and to_offset, or from_timestamp_ms and "
                   "to_timestamp_ms")
            raise ValueError(msg)
        lo, hi = given[0]
        assert lo is not None and hi is not None  # noqa: S101 - checked just above
        if lo >= hi:
            msg = f"the window is empty: from ({lo}) must be below to ({hi}), which is exclusive"
            raise ValueError(msg)
        return self

    @property
    def by_timestamp(self) -> bool:
        """The window is given in Kafka timestamps (else in offsets)."""
        return self.from_timestamp_ms is not None


def check_job_fits_source(job: JobSpec, source: SourceConfig) -> None:
    """A job's mode and strategy must suit its source's kind; ValueError saying what to change."""
    if source.kind == "delta":
        if job.strategy is None:
            msg = (f'job "{job.name}" reads delta source "{source.name}": set strategy = "snapshot", '
                   '"arrangement" or "chain"')
            raise ValueError(msg)
        if job.mode == "append":
            msg = f'job "{job.name}" reads delta source "{source.name}": mode is "merge" or "changelog"'
            raise ValueError(msg)
        if job.transform is not None:
            msg = f'job "{job.name}": a transform applies to Kafka rows, not to a delta source'
            raise ValueError(msg)
        if job.history_source != "auto":
            msg = f'job "{job.name}": history_source is for kafka sources, not delta source "{source.name}"'
            raise ValueError(msg)
        if job.format.value != "raw":
            msg = f'job "{job.name}": format decodes Kafka records, not rows of delta source {source.name}'
            raise ValueError(msg)
        return
    if job.format.value == "avro":
        if source.schema_registry is None:
            msg = (f'job "{job.name}": format.value = "avro" needs a schema_registry on source '
                   f'"{source.name}" (sources[].schema_registry, set by the daemon\'s operator)')
            raise ValueError(msg)
        if job.format.subject is None and len(source.topics) != 1:
            msg = (f'job "{job.name}": format.subject is needed when source "{source.name}" reads other than '
                   "one topic (its reader schema's subject)")
            raise ValueError(msg)
        if job.writer != "delta-rs":
            msg = f'job "{job.name}": the table of an avro job is written by delta-rs (it grows its columns)'
            raise ValueError(msg)
    if job.history_source == "archive" and not source.archives:
        msg = (f'job "{job.name}": history_source = "archive" but source "{source.name}" has no archive '
               "(sources[].archive)")
        raise ValueError(msg)
    if job.strategy is not None or job.mode not in (None, "append"):
        msg = (f'job "{job.name}" reads kafka source "{source.name}": strategy and mode "{job.mode}" are for '
               "delta sources")
        raise ValueError(msg)


class SparkConfig(_Frozen):
    """Where Spark runs and any extra Spark conf."""

    master: str = Field(default="local[*]", description=(
        "Any Spark master (`local[N]`, `spark://host:7077`, `k8s://...`); the daemon is the application "
        "and its driver (docs: \"Connecting to a cluster\")."))
    conf: dict[str, str] = Field(default_factory=dict, description=(
        "Spark conf over the defaults of `runtime/spark.py`'s `DEFAULT_CONF`: among them "
        "`spark.driver.memory = 2g` (in local mode the one JVM's heap, executors included), "
        "`spark.kafka.consumer.fetchedData.cache.timeout = 10s` (Spark's 5 min kept every history read's "
        "last polls and ran the heap out under load), `spark.kafka.consumer.cache.capacity = 1024` "
        "(Spark's 64 is a soft cap past which every borrow closes idle consumers), `spark.locality.wait = "
        "0s` (the scheduler waited 3 s for the executor Spark's Kafka source prefers per partition). A "
        "daemon with no `kafka` source also gets `TABLE_DAEMON_CONF`'s `spark.driver.extraJavaOptions` "
        "(the serial collector, 10-20 % of the heap free after a collection; docs/architecture.md, "
        "\"Table backfill\")."))
    tables: bool = Field(default=False, description=(
        "Start Spark in a daemon of `delta` sources alone, so that their large snapshot and chain copies "
        "run on it (`sources[].spark_copy_rows`); without it such a daemon starts no JVM and copies on the "
        "driver. A daemon with a `kafka` source always runs Spark."))


#: Names the API always serves: a browser names them only for a page on this machine's loopback.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?"
_HOST_NAME = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*")


def normalize_host(entry: str) -> str | None:
    """A host name or IP address as compared with a ``Host`` header (lower case, IPv6 without brackets).

    ``"*"`` and ``"*.domain"`` are kept as they are; None when ``entry`` is none of these (a port, a
    scheme, a path, spaces).
    """
    name = entry.strip().lower().rstrip(".")
    if name == "*":
        return name
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        pass
    return name if _HOST_NAME.fullmatch(name) else None


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return host == "*"


class ApiConfig(_Frozen):
    """The HTTP control API's bind address, token and request limits."""

    host: str = Field(default="127.0.0.1", description=(
        "The control API's bind address; a non-loopback host needs a token (or "
        "`api.allow_unauthenticated = true`)."))
    port: int = Field(default=8080, ge=0, le=65535, description="The control API's port.")
    token: SecretStr | None = Field(default=None, description=(
        "When set, mutating calls need `Authorization: Bearer <token>`; compared in constant time, never "
        "logged or echoed."))
    token_file: Path | None = Field(default=None, description=(
        "Read the token from this file instead (a mounted secret; read once at start, surrounding "
        "whitespace stripped), so it is never on a command line. Exclusive with `token`."))
    guard_reads: bool = Field(default=False, description=(
        "The job reads and `/metrics` on the API port need the token too (`/health`, `/ready`, `/live` "
        "never do; a separate `metrics.port` is not guarded)."))
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description=(
        "Larger request bodies get 413 before they are read."))
    allow_unauthenticated: bool = Field(default=False, description=(
        "Serve a non-loopback address without a token (anyone who reaches the port may drop jobs)."))
    allowed_hosts: list[str] = Field(default_factory=list, description=(
        "Host names (or IPs, `\"*.domain\"` for its subdomains) a request's `Host` may name besides the "
        "loopback names and a non-wildcard `api.host`, any port; others get 421 (not `/live`, `/ready`). "
        "`\"*\"`: any (no DNS-rebinding defence). Env: JSON, "
        "`SOURCE_BACKFILL_API__ALLOWED_HOSTS='[\"api.example.com\"]'`."))
    header_timeout_s: float = Field(default=5.0, gt=0, le=300, description=(
        "A connection that has not sent a request's complete headers this long after it opened (or after "
        "its last response) is closed."))
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600, description=(
        "A request body not complete this long after its headers: the connection is closed."))
    keep_alive_timeout_s: float = Field(default=5.0, gt=0, le=300, description=(
        "An idle kept-alive connection is closed after this long."))
    max_connections: int = Field(default=100, ge=2, le=10_000, description=(
        "Open connections at most, per port (API, metrics); a new one closes the one that has waited "
        "longest for its client's headers or body, or gets 503 when the daemon is working on a request on "
        "every one."))
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, le=1 << 20, description=(
        "A request line and headers still incomplete past this many bytes: 400, connection closed (h11 "
        "measures what it holds unparsed: headers that arrive whole in one read of up to 256 KiB pass)."))

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        names = []
        for entry in value:
            name = normalize_host(entry)
            if name is None:
                msg = (f"api.allowed_hosts: {entry!r} is not a host name, an IP address, \"*.domain\" or "
                       "\"*\" (give names without scheme or port)")
                raise ValueError(msg)
            names.append(name)
        return names

    @property
    def served_hosts(self) -> tuple[str, ...]:
        """What the ``Host`` header of a request may name: loopback, the bind host, ``allowed_hosts``."""
        hosts = list(LOOPBACK_HOSTS)
        bind = normalize_host(self.host)
        if bind is not None and not _is_wildcard(bind):
            hosts.append(bind)
        hosts += self.allowed_hosts
        return tuple(dict.fromkeys(hosts))

    @model_validator(mode="after")
    def _token_from_file(self) -> ApiConfig:
        if self.token_file is None:
            return self
        if self.token is not None:
            msg = "set api.token or api.token_file, not both"
            raise ValueError(msg)
        try:
            text = self.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"api.token_file {self.token_file} cannot be read: {type(exc).__name__}"
            raise ValueError(msg) from None
        if not text:
            msg = f"api.token_file {self.token_file} is empty"
            raise ValueError(msg)
        object.__setattr__(self, "token", SecretStr(text))  # frozen model: set once, while validating
        return self

    @model_validator(mode="after")
    def _token_not_empty(self) -> ApiConfig:
        # An empty token would be compared with the empty credentials of a request that sends none.
        if self.token is not None and not self.token.get_secret_value().strip():
            msg = "api.token is empty: set a token, or leave it unset"
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _guarded_reads_need_a_token(self) -> ApiConfig:
        if self.guard_reads and self.token is None:
            msg = "api.guard_reads needs api.token or api.token_file"
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _no_open_api_on_the_network(self) -> ApiConfig:
        loopback = self.host in ("localhost", "::1") or self.host.startswith("127.")
        if not loopback and self.token is None and not self.allow_unauthenticated:
            msg = (f"api.host {self.host} is reachable from other machines but api.token is not set: set "
                   "a token (SOURCE_BACKFILL_API__TOKEN), or api.allow_unauthenticated = true")
            raise ValueError(msg)
        return self


class MetricsConfig(_Frozen):
    """The Prometheus endpoint, and which splits get series of their own."""

    port: int | None = Field(default=9108, ge=0, le=65535, description=(
        "The Prometheus port (`/metrics` is also on the API port); `false` (env: `off`) to serve it there "
        "only. Serves `GET /metrics` only, with the `api.*` connection limits, any `Host`."))
    per_split: Literal["auto", "always", "never"] = Field(default="auto", description=(
        "Which splits get series of their own (`history_rows`, `live_rows`, `split_stage`, "
        "`split_lag_offsets`, `data_loss_offsets`): `auto` = those not Finished and those with data loss, "
        "at most `per_split_max` per job (data loss first, then the most lagging; series of a split that "
        "no longer qualifies are removed); `always` = every split (4 series per split: 40,000 for a job on "
        "10,000 partitions); `never`. Job-level series (`job_*`) always; every split in "
        "`GET /jobs/{name}`."))
    per_split_max: int = Field(default=50, ge=0, le=100_000, description="The cap of `auto`, per job.")

    def per_split_policy(self) -> PerSplit:
        """The policy ``source_backfill.metrics`` applies (``metrics.configure_per_split``)."""
        from source_backfill.metrics import PerSplit

        return PerSplit(self.per_split, self.per_split_max)

    @field_validator("port", mode="before")
    @classmethod
    def _off(cls, value: object) -> object:
        # true would be port 1: say what is meant instead
        return _off_or(value, "metrics.port is a port number, or false to serve /metrics on the API port "
                              "only")


_OFF = {"off", "none", "null", "false", "disabled", ""}


def _off_or(value: object, true_is: str) -> object:
    """``false`` or an "off" word as None (the setting off); ``true`` refused with ``true_is``; else as is."""
    if value is False or (isinstance(value, str) and value.strip().lower() in _OFF):
        return None
    if isinstance(value, bool):
        raise ValueError(true_is)
    return value


class DaemonConfig(_Frozen):
    """Process-wide settings."""

    state_root: Path = Field(default=Path("var/state"), description=(
        "Root of everything the daemon persists: the mutation log, streaming checkpoints, the embedded "
        "broker's log (made `0700`; no job's `sink_path` may overlap it)."))
    shutdown_timeout_s: float = Field(default=30.0, gt=0, description=(
        "How long SIGTERM waits for the running epoch (never half-committed). Send it to the daemon's "
        "process alone, as Docker and Kubernetes do (under systemd: `KillMode=mixed`): a SIGTERM to its "
        "whole process group stops Spark's JVM under the epoch, and the daemon then reports a dead JVM and "
        "exits 70."))
    data_root: Path | None = Field(default=None, description=(
        "When set, every job's `sink_path` must resolve inside it (no `..`, no symlink out): API creates "
        "elsewhere get 422."))
    stale_after_intervals: float = Field(default=60.0, gt=1, description=(
        "A source whose last epoch is older than this many trigger intervals is unhealthy."))
    quarantine_after_crashes: int = Field(default=3, ge=1, description=(
        "A job whose Spark work was in flight at this many deaths of Spark's JVM in a row (seen by the "
        "daemon's watchdog) is failed as `quarantined` at the next start, before it runs again, until it "
        "is retried."))


_toml_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("toml_file", default=None)


class Settings(BaseSettings):
    """Everything the daemon is configured with."""

    model_config = SettingsConfigDict(
        env_prefix="SOURCE_BACKFILL_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    daemon: DaemonConfig = Field(default_factory=DaemonConfig, description="Process-wide settings.")
    spark: SparkConfig = Field(default_factory=SparkConfig, description="Where Spark runs, and its conf.")
    api: ApiConfig = Field(default_factory=ApiConfig, description=(
        "The HTTP control API: bind address, token, request limits."))
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description=(
        "The Prometheus endpoint, and which splits get series of their own."))
    sources: list[SourceConfig] = Field(default_factory=list, description=(
        "The shared live sources (`[[sources]]` in TOML), each fanned out to its jobs."))
    jobs: list[JobSpec] = Field(default_factory=list, description=(
        "Jobs the daemon starts with (`[[jobs]]`); jobs created through the API are kept in the mutation "
        "log."))

    @model_validator(mode="after")
    def _references(self) -> Settings:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            msg = f"duplicate source names: {names}"
            raise ValueError(msg)
        jobs = [j.name for j in self.jobs]
        if len(set(jobs)) != len(jobs):
            msg = f"duplicate job names: {jobs}"
            raise ValueError(msg)
        for job in self.jobs:
            if job.source not in names:
                msg = f'job "{job.name}" reads unknown source "{job.source}" (configured: {names})'
                raise ValueError(msg)
            check_job_fits_source(job, self.source(job.source))
        return self

    def source(self, name: str) -> SourceConfig:
        """The source called ``name``."""
        for source in self.sources:
            if source.name == name:
                return source
        msg = f'unknown source "{name}"'
        raise ConfigError(msg)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Precedence: explicit arguments, then the environment, then the TOML file."""
        toml = _toml_file.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml))
        return tuple(sources)


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load settings from ``path`` (TOML) with environment overrides; raise ConfigError when invalid."""
    from pydantic import ValidationError

    toml = Path(path) if path is not None else None
    if toml is not None and not toml.is_file():
        msg = f"config file not found: {toml}"
        raise ConfigError(msg)
    token = _toml_file.set(toml)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        msg = f"invalid configuration{f' in {toml}' if toml else ''}:\n{describe_errors(exc)}"
        raise ConfigError(msg) from None  # pydantic's own text echoes inputs, secrets included
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # their text has a position, no content
        msg = f"config file {toml} is not valid TOML (UTF-8): {exc}"
        raise ConfigError(msg) from None
    except OSError as exc:
        msg = f"config file {toml} cannot be read: {exc.strerror or type(exc).__name__}"
        raise ConfigError(msg) from None
    except SettingsError as exc:  # a SOURCE_BACKFILL_* value that is not JSON; names the field, not the value
        msg = f"invalid configuration: {exc}"
        raise ConfigError(msg) from None
    finally:
        _toml_file.reset(token)


#: Fields whose values never appear in an error message.
_SECRET_FIELDS = frozenset({"token", "password", "secret", "sasl.password", "ssl.key.password"})


def validation_message(error: Mapping[str, Any]) -> str:
    """Pydantic's message for one error without its ``Value error, `` prefix (our messages stand alone)."""
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")


def describe_errors(exc: Any) -> str:
    """One line per invalid field: where, what is wrong, and the value given (secrets never shown)."""
    lines = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error.get("loc", ())) or "(root)"
        secret = any(str(p).lower() in _SECRET_FIELDS or "password" in str(p).lower()
                     for p in error.get("loc", ()))
        value = error.get("input")
        if secret or error.get("type") == "extra_forbidden":  # an unknown key may be a misspelled "token"
            given = "<hidden>"
        elif isinstance(value, dict | list):  # a whole section could hold a secret (kafka options)
            given = f"a {type(value).__name__}"
        else:
            given = repr(value)[:80]
        lines.append(f"  {loc}: {validation_message(error)} (got {given})")
    return "\n".join(lines)
