"""A job (``jobs[]``), its record format and repairs, and what a job asks of its source."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from source_backfill.config.access import DEFAULT_NAMESPACE
from source_backfill.config.base import Name, TransformText, _Frozen, transform_text
from source_backfill.config.sources import SourceConfig
from source_backfill.config.starts import EarliestStart, StartSpec
from source_backfill.core.splits import parse_split_id
from source_backfill.errors import StateFormatError

if TYPE_CHECKING:
    pass


#: A job's dead-letter table is its table's path with this after it.
DEAD_LETTER_SUFFIX = "_dead_letters"


class RawFormat(_Frozen):
    """``raw``: the job's ``{source}`` is Kafka's columns as they are (``key`` and ``value`` bytes)."""

    value: Literal["raw"] = Field(default="raw", description="`raw`: Kafka's bytes, not decoded.")


class AvroFormat(_Frozen):
    """``avro``, ``json`` or ``protobuf``: each value decoded by its writer schema's id before the transform.

    The values are in the Confluent wire format (docs/guides/avro.md); their writer schemas (Avro, JSON
    Schema, or a ``.proto`` file) come from the source's ``schema_registry``; each record lands in the
    job's reader schema: the transform's ``{source}`` has the Kafka columns without ``value`` and one
    column per field of the reader. One class for all three: they differ only in how a body is read.
    """

    value: Literal["avro", "json", "protobuf"] = Field(description=(
        "`avro`: Confluent-framed Avro by schema id; `json`: Confluent-framed JSON text whose schema id "
        "names a JSON Schema (an object of string, integer, number and boolean properties); `protobuf`: "
        "Confluent-framed Protobuf whose schema id names a proto3 file (its first message, of scalar "
        "fields). The source needs a `schema_registry`."))
    subject: str | None = Field(default=None, min_length=1, max_length=255, description=(
        "The registry subject of the reader schema; unset: `<topic>-value` of the source's only topic."))
    reader_version: int | None = Field(default=None, gt=0, description=(
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
    key: Literal["raw", "avro", "json", "protobuf"] = Field(default="raw", description=(
        "How each record's key is read: `raw` keeps Kafka's bytes in the `key` column; `avro`, `json`, "
        "`protobuf` decode it by its own schema id as the value is, by the same `evolution` and "
        "`on_decode_error`, into one column per field of the key's reader schema named `key_<field>` "
        "(a null key: every such column null)."))
    key_subject: str | None = Field(default=None, min_length=1, max_length=255, description=(
        "The registry subject of the key's reader schema (its latest version when the job's table is "
        "created); unset: `<topic>-key` of the source's only topic."))

    @field_validator("reader_version", mode="before")
    @classmethod
    def _not_a_bool(cls, value: object) -> object:
        if isinstance(value, bool):  # JSON's true is not version 1 (3.0 is 3, as JSON Schema says)
            msg = "reader_version is a version number, not a boolean"
            raise ValueError(msg)  # noqa: TRY004 - pydantic wants a ValueError
        return value


#: How a job decodes its records: ``raw``, or by schema id (``avro``, ``json``), told by ``value`` (the
#: schema says which keys go with which, so a body the schema accepts is one the daemon accepts).
FormatSpec = Annotated[
    Annotated[RawFormat, Tag("raw")] | Annotated[AvroFormat, Tag("registry")],
    Discriminator(lambda v: "raw" if (v.get("value", "raw") if isinstance(v, dict)
                                      else getattr(v, "value", "raw")) == "raw" else "registry"),
]


class JobSpec(_Frozen):
    """A downstream job: backfill the source's history, then follow it live, into a Delta table."""

    name: Name = Field(description=(
        "The job's name (in paths, metric labels and URLs); a job of a namespace other than `default` is "
        "named `<namespace>.<name>`, so that names never collide across namespaces."))
    namespace: Name = Field(default=DEFAULT_NAMESPACE, description=(
        "The tenant the job belongs to: a principal sees and steers it only with a role in this namespace "
        "(`api.principals_file`, `api.oidc`). Jobs created before namespaces are in `default`."))
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
    format: FormatSpec = Field(default_factory=RawFormat, description=(
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

    @model_validator(mode="after")
    def _named_in_its_namespace(self) -> JobSpec:
        if self.namespace != DEFAULT_NAMESPACE and not self.name.startswith(f"{self.namespace}."):
            msg = (f'job "{self.name}" is in namespace "{self.namespace}": name it '
                   f'"{self.namespace}.<name>" (names are unique across namespaces)')
            raise ValueError(msg)
        return self

    @property
    def dead_letter_path(self) -> str | None:
        """The job's dead-letter table (``format.on_decode_error = "dead_letter"``), beside its table."""
        if not isinstance(self.format, AvroFormat) or self.format.on_decode_error != "dead_letter":
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


class RetrySpec(_Frozen):
    """``POST /jobs/{name}/retry`` with a body: run a failed job again from the start, into a new table.

    For a job whose table holds what can no longer be resumed (its topic deleted and created again:
    docs/guides/kafka-failures.md). The job keeps its name and everything else of its spec; its start
    becomes the earliest offsets and its table a new one (``sink``, or the old path with ``-2``, ``-3``,
    ... appended, the first that is free). The old table is left as it is. Without a body a retry resumes
    the job from its table, as always.
    """

    from_: Literal["earliest"] = Field(alias="from", description=(
        "Where the job starts again: `earliest` (the log start; the only start a retry takes)."))
    new_table: Literal[True] = Field(description=(
        "`true`: into a new table, the old one left as it is (a retry never re-reads into the old table)."))
    sink: str | None = Field(default=None, min_length=1, max_length=4096, description=(
        "The new table's path, checked like a create's `sink_path` (inside `daemon.data_root` and the "
        "namespace's folder, overlapping no state and no other table, not an existing table); unset: the "
        "old path with `-2` appended (`-3`, ... when taken)."))


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
    if job.format.value != "raw":
        if source.schema_registry is None:
            msg = (f'job "{job.name}": format.value = "{job.format.value}" needs a schema_registry on source '
                   f'"{source.name}" (sources[].schema_registry, set by the daemon\'s operator)')
            raise ValueError(msg)
        if isinstance(job.format, AvroFormat) and job.format.subject is None and len(source.topics) != 1:
            msg = (f'job "{job.name}": format.subject is needed when source "{source.name}" reads other than '
                   "one topic (its reader schema's subject)")
            raise ValueError(msg)
        if isinstance(job.format, AvroFormat) and job.format.key != "raw" and \
                job.format.key_subject is None and len(source.topics) != 1:
            msg = (f'job "{job.name}": format.key_subject is needed when source "{source.name}" reads other '
                   "than one topic (its key's reader schema's subject)")
            raise ValueError(msg)
        if job.writer != "delta-rs":
            msg = (f'job "{job.name}": the table of a {job.format.value} job is written by delta-rs (it '
                   "grows its columns)")
            raise ValueError(msg)
    if job.history_source == "archive" and not source.archives:
        msg = (f'job "{job.name}": history_source = "archive" but source "{source.name}" has no archive '
               "(sources[].archive)")
        raise ValueError(msg)
    if job.strategy is not None or job.mode not in (None, "append"):
        msg = (f'job "{job.name}" reads kafka source "{source.name}": strategy and mode "{job.mode}" are for '
               "delta sources")
        raise ValueError(msg)
