"""A Kafka source's sections: its history width, archive tier, security and Schema Registry."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from source_backfill.config.base import _Frozen

if TYPE_CHECKING:
    pass


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
