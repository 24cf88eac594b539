"""The one error hierarchy of source-backfill.

Every error the product raises on purpose derives from :class:`SourceBackfillError`, so callers (the API,
the CLI, the epoch loop) can tell "ours, with a clear message" from a bug. Subsystems add one-line
subclasses here rather than defining their own roots.
"""

from __future__ import annotations

import re


class SourceBackfillError(Exception):
    """Root of every error raised on purpose by source-backfill."""


# -- configuration and input -------------------------------------------------------------------------
class ConfigError(SourceBackfillError):
    """The configuration is invalid or inconsistent."""


class TransformError(ConfigError):
    """A job's SQL transform does not parse, or reads something other than ``{source}``."""


class SinkPathError(ConfigError):
    """A job's sink path is outside the daemon's data root."""


class SinkConflictError(SinkPathError):
    """A job's sink path is taken: another job's table (or a folder of it), or a table another job wrote."""


class VerifyRefusedError(ConfigError):
    """A job's table cannot be checked against its source (no offset columns, no commit of the job yet)."""


class ArchiveError(ConfigError):
    """A source's archive table cannot serve history (columns lacking, offsets held twice)."""


class StateFormatError(SourceBackfillError):
    """A persisted backfill state is malformed (bad JSON, unknown stage, wrong types)."""


class MutationLogError(StateFormatError):
    """The job registry's durable mutation log is malformed (other than a torn last line)."""


class StateWriteError(SourceBackfillError):
    """The daemon's own state (the mutation log under ``state_root``) could not be written durably."""


class StateMoveError(StateWriteError):
    """A folder of the daemon's state could not be moved aside (a source's reset): its message says which."""


class InvalidOffsetError(SourceBackfillError):
    """An offset went backwards or is otherwise impossible for the split it belongs to."""


# -- JVM dependencies ---------------------------------------------------------------------------------
class JvmDependencyError(ConfigError):
    """A JVM dependency (Spark's Kafka connector, delta-spark, the Kafka broker) is missing or mismatched.

    Also: the Schema Registry the tests start could not be built (Java or Maven missing, a failed build).
    """


# -- Kafka ---------------------------------------------------------------------------------------------
class KafkaConnectorError(SourceBackfillError):
    """A Kafka connector error."""


class UnknownTopicError(KafkaConnectorError):
    """A subscribed topic does not exist on the broker."""


class BrokerUnavailableError(KafkaConnectorError):
    """The broker could not be reached before the deadline."""


class KafkaAuthorizationError(KafkaConnectorError):
    """The cluster refuses the source's principal an operation on a topic or group (ACLs)."""


class DataLossError(KafkaConnectorError):
    """Requested offsets are below the log start (retention or compaction removed them)."""


# -- Schema Registry ----------------------------------------------------------------------------------
class SchemaRegistryError(SourceBackfillError):
    """A Schema Registry error."""


class RegistryUnavailableError(SchemaRegistryError):
    """The Schema Registry could not be reached (or did not start) before the deadline."""


class SchemaNotFoundError(SchemaRegistryError):
    """The Schema Registry does not know a schema id or subject (not retried: waiting will not bring it)."""


class WireFormatError(SchemaRegistryError):
    """A record is not in the Confluent wire format (null, shorter than its header, wrong magic byte)."""


class SchemaChangeError(SchemaRegistryError):
    """A writer schema the job's policy (pin, evolve, fail) cannot take: names the field, both types, why."""


# -- Delta ---------------------------------------------------------------------------------------------
class DeltaSinkError(SourceBackfillError):
    """A Delta sink error."""


class ForeignTableError(DeltaSinkError):
    """The table's log belongs to another job, so this job refuses to write to or recover from it."""


class ConcurrentCommitError(DeltaSinkError):
    """Another writer committed the same epoch concurrently."""


# -- runtime and control ------------------------------------------------------------------------------
class JobError(SourceBackfillError):
    """A job-level error."""


class JobNotFoundError(JobError):
    """No job with that name is registered."""


class JobExistsError(JobError):
    """A job with that name is already registered."""


class SourceNotFoundError(JobError):
    """No source with that name is configured."""


class SourceRunningError(JobError):
    """A source's reset asked while it runs: a reset is only for a source stopped for good."""


class JobNotFailedError(JobError):
    """A retry into a new table asked of a job that has not failed (it would leave a running table)."""


class QuotaExceededError(JobError):
    """A namespace's quota refuses a request (a create, a rate limit): nothing is changed.

    ``namespace``: the namespace whose quota it is (its viewers see the refusal in the audit).
    """

    def __init__(self, message: str, namespace: str | None = None) -> None:
        super().__init__(message)
        self.namespace = namespace


class DecodeFailedError(JobError):
    """A job's records cannot be decoded as it asks: fails that job alone.

    An undecodable record with ``on_decode_error = "fail"``, a writer schema its evolution policy refuses,
    a reader schema that cannot be had.
    """


class ReaderOutgrownError(SourceBackfillError):
    """A history read ahead met records its reader schema (the one it was started under) does not cover.

    Never a job's failure: the read is thrown away and the job reads that history in its epochs, where
    the table grows with the rows that need it.
    """


class SparkWorkTimeoutError(JobError):
    """A job's Spark work (an epoch's, or a read ahead's) ran past its deadline and was cancelled."""


class AuthenticationError(SourceBackfillError):
    """A bearer credential is not accepted (bad signature, expired, foreign issuer, unknown roles).

    Its message is a short reason for the log and the 401, never the credential itself.
    """


class LaneStoppedError(SourceBackfillError):
    """A job's lane was stopped under its step (a drop, a retry, the daemon stopping).

    The step commits nothing, and it is not the job's failure.
    """


class SparkWorkCancelledError(LaneStoppedError):
    """A job's Spark work was cancelled by control (its drop or retry, the daemon stopping), not failed."""


#: An error of the Kafka client inside a JVM stack trace (Spark's Kafka source), with its message.
_KAFKA_CLIENT_ERROR = re.compile(r"(org\.apache\.kafka\.[\w.$]+(?:Exception|Error): [^\n]+)")


#: The JVM exception py4j reports under its own first line (``An error occurred while calling o12.x.``).
_JVM_ERROR = re.compile(r"^: ((?:[\w$]+\.)+[\w$]*(?:Exception|Error)\b[^\n]*)", re.MULTILINE)


def one_line(exc: BaseException, limit: int = 500) -> str:
    """One line saying what went wrong, for logs, the API and health, at most ``limit`` characters.

    Spark wraps errors raised in Python (a data source's reader, ``foreachBatch``) in JVM errors whose
    first line only says that Python raised. The reader's own data-loss line (split and offsets) is
    taken when present, else the Python exception's line (``RuntimeError: ...``) that ends the embedded
    traceback, followed by the wrapper's first line. From Spark's Kafka source (a JVM stack), the Kafka
    client's error line is taken (``org.apache.kafka...TimeoutException: ...``). A py4j error's first
    line only names the JVM call; the JVM exception's line under it is taken (``SparkException: Job
    aborted due to stage failure: ...``).
    """
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    at = text.find("data loss on Kafka split")
    if at >= 0:
        return text[at:].splitlines()[0][:limit]
    kafka = _KAFKA_CLIENT_ERROR.search(text)
    if kafka is not None:  # Spark's Kafka source: the client's error says what happened
        return f"{kafka.group(1).strip()} ({first[:200]})"[:limit]
    if first.startswith("An error occurred while calling"):  # py4j: the JVM's exception says what
        jvm = _JVM_ERROR.search(text)
        if jvm is not None:
            first = f"{jvm.group(1).strip()} ({first[:100]})"
    marker = "Traceback (most recent call last):"
    if marker in text:
        tail = text[text.rindex(marker) + len(marker):].splitlines()
        cause = next((ln.strip() for ln in tail if ln[:1].isalpha() and ": " in ln), None)
        if cause is not None:
            first = f"{cause} ({first[:200]})"
    return first[:limit]
