"""Request and response bodies of the control API (the request to create a job is :class:`JobSpec`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from source_backfill.config import JobSpec, StartSpec, TransformText, transform_text
from source_backfill.runtime.progress import (
    JobProgress,
    JobStatus,
    LiveLatency,
    SplitProgress,
    TableProgress,
)
from source_backfill.runtime.registry import JobRecord


class PatchBody(BaseModel):
    """``PATCH /jobs/{name}``: change the job's history rate limit, its transform, or both.

    A field left out is left as it is; ``null`` means unlimited (``rate_limit``) or identity
    (``transform``).
    """

    #: minProperties: the schema states that a PATCH names at least one field (clients and fuzzers see it).
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    #: History rows per second; ``null`` = unlimited, ``0`` = read no history (loses nothing).
    rate_limit: float | None = Field(default=None, ge=0, allow_inf_nan=False, strict=True)  # true is not 1
    #: The job's new transform (checked like a create's, and it must give the table the columns it has);
    #: it applies from the job's next epoch: rows committed before keep the old one (a repair re-copies
    #: a window with the new one).
    transform: TransformText | None = None

    @field_validator("transform")
    @classmethod
    def _transform_rules(cls, value: str | None) -> str | None:
        return transform_text(value)

    @model_validator(mode="after")
    def _something(self) -> PatchBody:
        if not self.model_fields_set:
            msg = "a PATCH changes rate_limit, transform or both: name at least one"
            raise ValueError(msg)
        return self


class RepairView(BaseModel):
    """A repair of a job's rows (``POST /jobs/{name}/repair``), pending or finished."""

    id: int
    #: ``pending`` (accepted, waiting for its job's turn at an epoch boundary), ``done`` or ``failed``.
    state: str
    #: The window as asked.
    window: dict[str, Any]
    #: ``"topic:partition" -> [from, to)``: the window cut to the job's rows, replaced.
    ranges: dict[str, list[int]] = Field(default_factory=dict)
    #: Splits asked for and left alone, and why (e.g. the window holds none of the job's rows).
    skipped: dict[str, str] = Field(default_factory=dict)
    rows_removed: int | None = None
    rows_added: int | None = None
    #: The table version of the repair's one commit.
    version: int | None = None
    error: str | None = None


class TableView(BaseModel):
    """A job on a ``delta`` source: its strategy's phase, vnodes copied and versions behind."""

    strategy: str
    phase: str
    vnodes_completed: int
    vnodes_total: int
    pinned_version: int | None
    cursor_version: int | None
    lag_versions: int | None
    rows: dict[str, int]
    #: Fraction of the copy done: ``rows_copied`` of ``rows_total`` (vnodes completed / total while the
    #: row count is not known yet); 1.0 once the snapshot is copied.
    progress: float
    #: Rows of the table version being copied (the pinned one; arrangement: its cursor's), and copied.
    rows_total: int | None = None
    rows_copied: int = 0
    #: A copy by files (Spark; docs/architecture.md): data files of the pinned version copied, and how
    #: many it has; null for a copy by vnode (or before the files are listed).
    files_copied: int | None = None
    files_total: int | None = None

    @classmethod
    def of(cls, t: TableProgress) -> TableView:
        """The view of a table-backfill job's published progress."""
        return cls(strategy=t.strategy, phase=t.phase, vnodes_completed=t.vnodes_completed,
                   vnodes_total=t.vnodes_total, pinned_version=t.pinned_version,
                   cursor_version=t.cursor_version, lag_versions=t.lag_versions, rows=dict(t.rows),
                   progress=t.progress, rows_total=t.rows_total, rows_copied=t.rows_copied,
                   files_copied=t.files_copied, files_total=t.files_total)


class LatencyView(BaseModel):
    """Live latency of a Kafka job (docs/guides/live-latency.md): record timestamp -> commit of its epoch."""

    #: p50 and p99 (seconds) over the live rows committed in the last ``window_s`` seconds (null: none).
    p50_s: float | None
    p99_s: float | None
    window_s: float
    rows: int
    #: The records' ``timestampType``: ``create_time`` (producer's clock, may be skewed) or
    #: ``log_append_time`` (broker's); null before the first live row.
    timestamp_type: str | None

    @classmethod
    def of(cls, lat: LiveLatency) -> LatencyView:
        """The view of a job's published latency."""
        return cls(p50_s=lat.p50_s, p99_s=lat.p99_s, window_s=lat.window_s, rows=lat.rows,
                   timestamp_type=lat.timestamp_type)


class SplitView(BaseModel):
    """One split of a job: its backfill stage and how far history has been read."""

    split: str
    stage: str
    backfilled_offset: int | None
    target_offset: int | None
    rows: int
    #: Offsets still to read: ``target_offset`` minus the higher of ``backfilled_offset`` and
    #: ``read_ahead_offset``.
    lag: int | None
    #: Fraction of the split's history read, ``(offset + 1) / (target_offset + 1)`` where ``offset`` is the
    #: higher of ``backfilled_offset`` (committed) and ``read_ahead_offset`` (copied by a read ahead, its
    #: commit waiting for an epoch); 1.0 once finished (or caught up); ``None`` while the target is
    #: unknown.
    progress: float | None
    #: The last offset copied by reads ahead not committed yet (running ones too), and their rows.
    read_ahead_offset: int | None = None
    rows_read_ahead: int = 0
    #: Offsets skipped below the log start (``fail_on_data_loss = false``) since the daemon started.
    data_loss_offsets: int = 0

    @classmethod
    def of(cls, s: SplitProgress) -> SplitView:
        """The view of one split's published progress."""
        read = s.backfilled_offset
        if s.read_ahead_offset is not None:
            read = max(-1 if read is None else read, s.read_ahead_offset)
        return cls(split=s.split, stage=s.stage, backfilled_offset=s.backfilled_offset,
                   target_offset=s.target_offset, rows=s.rows, lag=s.lag,
                   progress=split_fraction(s.stage, read, s.target_offset),
                   read_ahead_offset=s.read_ahead_offset, rows_read_ahead=s.rows_read_ahead,
                   data_loss_offsets=s.data_loss_offsets)


def split_fraction(stage: str, backfilled_offset: int | None, target_offset: int | None) -> float | None:
    """``(backfilled + 1) / (target + 1)`` clamped to [0, 1]; 1.0 when finished; ``None`` if no target."""
    if stage == "finished":
        return 1.0
    if target_offset is None:
        return None
    done = 0 if backfilled_offset is None else backfilled_offset + 1
    return max(0.0, min(1.0, done / (target_offset + 1)))


class RefusalView(BaseModel):
    """A refused request as the refusals' audit table holds it (``GET /audit/refused``)."""

    #: When it was refused (ISO 8601, UTC).
    at: str
    #: The principal refused; null when no credential authenticated (a 401).
    by: str | None
    #: The answer: 401, 403, or 404 for a job of a namespace the principal holds no role in.
    status: int
    #: Why, in the daemon's words (never the credential).
    reason: str
    method: str
    path: str
    #: The job the request named, if any.
    job: str | None = None
    #: The namespace it was about (the job's, the quota's); null: none (only admins of every namespace see
    #: those rows).
    namespace: str | None = None
    client: str | None = None
    request_id: str | None = None


class AuditView(BaseModel):
    """An accepted mutation as the audit table holds it (``GET /audit``)."""

    id: int
    #: When it was accepted (ISO 8601, UTC).
    at: str
    kind: str
    job: str
    namespace: str
    source: str
    #: The principal that asked; null for the daemon's own (a job of the config file) and older lines.
    by: str | None
    #: The API request that asked (its ``X-Request-Id``, given or made); null for the daemon's own.
    request_id: str | None = None
    #: What it changed, as JSON text (a rate limit, a transform, a repair's window).
    detail: str


class JobView(BaseModel):
    """A job: its spec, accepted control state, and the progress the epoch loop last published."""

    name: str
    #: The tenant the job belongs to (``default`` unless it names one).
    namespace: str = "default"
    source: str
    sink_path: str
    start: StartSpec
    transform: str | None
    max_rows_per_epoch: int | None
    created_at: datetime
    #: ``pending`` until the job's first epoch; ``failed`` when the epoch loop marked it so.
    status: JobStatus
    paused: bool
    rate_limit: float | None
    #: True while a drop is accepted but not applied yet.
    dropped: bool
    #: Control commands accepted but not yet applied at an epoch boundary.
    pending_mutations: int
    epoch: int | None
    rows_history: int
    rows_live: int
    #: History rows copied by reads ahead (running ones too) that no epoch committed yet.
    rows_read_ahead: int = 0
    #: History rows copied per second (wall clock, last 60 s, reads ahead included).
    history_rows_per_s: float | None
    splits_total: int
    splits_finished: int
    #: Seconds until the backfill finishes: offsets left over the recent rate, bounded by the rate limit;
    #: ``null`` while ``history_paused`` or before a rate is known.
    eta_seconds: float | None
    #: Fraction of the job's history copied (reads ahead counted as copied): Kafka jobs, rows copied over
    #: copied + offsets left; table jobs, ``table.progress``. ``null`` before the first epoch.
    progress: float | None = None
    #: Offsets still to backfill, all splits (reads ahead counted as read).
    remaining_offsets: int | None = None
    #: Paused or rate limit 0 with history left: the ETA is ``null`` and shown as "paused".
    history_paused: bool = False
    #: Why the job's namespace holds its history: its table bytes of the day written
    #: (``namespaces[].max_bytes_per_day``), until the next UTC day. ``null``: not held.
    history_held: str | None = None
    finish_reported: bool
    error: str | None
    #: The last history read error while the job backs off and retries (cleared by a good read).
    last_error: str | None = None
    splits: list[SplitView]
    #: Jobs on a ``delta`` source: the table backfill's progress (``null`` for Kafka jobs).
    table: TableView | None = None
    #: Kafka jobs: p50/p99 of the live rows' latency over the last minute (``null`` for table jobs).
    live_latency: LatencyView | None = None
    #: Kafka jobs reading their source's archive (``history_source`` not ``kafka``): history offsets
    #: planned per tier since the daemon started: ``archive``, ``kafka``, ``gap`` (below the log start,
    #: not held by the archive: read as nothing), ``loss``. ``null`` for the other jobs.
    history_tiers: dict[str, int] | None = None
    #: Kafka jobs: bytes of the records (key + value) its history reads fetched from the broker since the
    #: daemon started, the live stream aside (0 for what the source's archive served). ``null``: table jobs.
    history_broker_bytes: int | None = None
    #: The job's repairs: pending ones, then the last finished ones since the daemon started.
    repairs: list[RepairView] = Field(default_factory=list)
    #: Age in seconds of the oldest source epoch the job skipped whose records its table does not hold yet
    #: (its steps slower than the trigger: it lags alone and rejoins by offsets); 0 while it keeps up.
    #: Past ``max_job_lag_s`` it is failed.
    lag_s: float = 0.0

    @classmethod
    def of(cls, record: JobRecord, progress: JobProgress | None, pending: int = 0,
           repairs: list[dict[str, Any]] | None = None) -> JobView:
        """Merge a registry record with its progress."""
        spec = record.spec
        splits = [SplitView.of(s) for s in progress.splits] if progress is not None else []
        status: JobStatus = progress.status if progress is not None else "pending"
        lag = progress.lag_s if progress is not None else 0.0
        if lag > 0 and status in ("pending", "backfilling", "finished"):
            status = "lagging"  # a first step slower than the trigger lags too (it was shown "pending")
        if record.error is not None:
            status = "failed"
        return cls(
            name=spec.name,
            namespace=spec.namespace,
            source=spec.source,
            sink_path=spec.sink_path,
            start=spec.start,
            transform=spec.transform,
            max_rows_per_epoch=spec.max_rows_per_epoch,
            created_at=record.created_at,
            status=status,
            paused=record.paused,
            rate_limit=record.rate_limit,
            dropped=record.dropped,
            pending_mutations=pending,
            epoch=progress.epoch if progress is not None else None,
            rows_history=progress.rows_history if progress is not None else 0,
            rows_live=progress.rows_live if progress is not None else 0,
            rows_read_ahead=progress.rows_read_ahead if progress is not None else 0,
            history_rows_per_s=progress.history_rows_per_s if progress is not None else None,
            splits_total=len(splits),
            splits_finished=sum(1 for s in splits if s.stage == "finished"),
            eta_seconds=progress.eta_seconds if progress is not None else None,
            progress=progress.progress if progress is not None else None,
            remaining_offsets=progress.remaining_offsets if progress is not None else None,
            history_paused=progress.history_paused if progress is not None else False,
            history_held=progress.history_held if progress is not None else None,
            finish_reported=progress.finish_reported if progress is not None else False,
            error=record.error,
            last_error=progress.last_error if progress is not None else None,
            splits=splits,
            table=TableView.of(progress.table) if progress is not None and progress.table else None,
            live_latency=LatencyView.of(progress.live_latency)
            if progress is not None and progress.live_latency else None,
            history_tiers=dict(progress.history_tiers)
            if progress is not None and progress.history_tiers is not None else None,
            history_broker_bytes=progress.history_broker_bytes if progress is not None else None,
            repairs=[RepairView(**r) for r in repairs or []],
            lag_s=round(lag, 1),
        )


class SplitPlanView(BaseModel):
    """A dry run's split: the offsets the job would backfill, ``[from_offset, to_offset)``."""

    split: str
    from_offset: int
    #: The live position now (the job's target moves on with the live stream).
    to_offset: int
    #: Offsets to copy (records at most: transaction markers and compaction leave gaps).
    offsets: int
    log_start: int
    #: Unknown (None): the Kafka admin client reports no log sizes.
    bytes: int | None = None
    #: A job reading its source's archive: the offsets by tier (``archive``, ``kafka``, ``gap``, ``loss``).
    tiers: dict[str, int] | None = None


class TablePlanView(BaseModel):
    """A dry run of a job on a ``delta`` source: the version it would copy now, and how."""

    version: int
    #: By the log's file statistics (null: a file without them).
    rows: int | None
    files: int | None
    #: ``files`` (the copy by files, on Spark) or ``vnodes`` (by vnode and key, on the driver).
    copy_by: str
    engine: str
    #: By vnode past ``table_index_rows``: the version is spilled to local disk by vnode.
    spilled: bool
    why: str


class DryRunView(BaseModel):
    """``POST /jobs?dry_run=true``: every check of a create passed; what the job would do. Nothing changed."""

    dry_run: bool = True
    #: The job as it would be created.
    job: JobSpec
    splits: list[SplitPlanView] = Field(default_factory=list)
    offsets_total: int = 0
    #: A job reading its source's archive: all splits' offsets by tier.
    tiers_total: dict[str, int] | None = None
    #: A job on a ``delta`` source: what it would copy, and how.
    table: TablePlanView | None = None
    bytes_total: int | None = None
    bytes_note: str | None = None
    #: The job's history ceiling: its rate limit, and max_rows_per_epoch per trigger interval, read per
    #: epoch: so much less when the source's epochs come slower than its trigger interval.
    rate_limit_rows_per_s: float | None = None
    #: Seconds from a create to the first history rows, last measured on the source (0: none yet); in
    #: both estimates.
    startup_s: float = 0.0
    seconds_at_rate_limit: float | None = None
    #: The history rate (rows/s, create to finish) a job without a rate limit reached on this source.
    measured_rows_per_s: float | None = None
    seconds_at_measured_rate: float | None = None
    measured_note: str | None = None
    #: E.g. the log start would pass the copy at that rate (retention).
    warnings: list[str] = Field(default_factory=list)


class VerifyView(BaseModel):
    """A verify run (``POST /jobs/{name}/verify`` starts one): its status, and once done its result."""

    id: str
    job: str
    status: str = Field(description="running, done, refused or error")
    started_at: float
    finished_at: float | None
    #: Done: the table holds the source exactly once up to the job's committed positions.
    ok: bool | None
    #: Done: ``late-copy: exactly once, N records, 0 missing, 0 duplicated`` (or the differences).
    summary: str | None
    #: Done: totals, per split ``from``/``to`` (the offsets checked) and counts, a few offsets as examples.
    result: dict[str, Any] | None
    #: Refused or error: why.
    error: str | None


class ErrorDetail(BaseModel):
    """What went wrong, and which request field caused it (dotted path, ``null`` when none)."""

    type: str
    message: str
    field: str | None = None
    #: Every validation problem when there are several: ``[{"field": ..., "message": ...}]``.
    details: list[dict[str, Any]] | None = None


class ErrorBody(BaseModel):
    """Every 4xx/5xx response of the API."""

    error: ErrorDetail
