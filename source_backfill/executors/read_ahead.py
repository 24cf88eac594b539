"""A job's history reads ahead of its epochs: staged by background Spark jobs, taken at an epoch boundary.

The job decides what to read and whether a finished read still fits (:func:`core.adopt_history`); this
module keeps the reads themselves: at most ``MAX_READS_AHEAD`` staged and not committed, each one a
thread running a Spark job in the FAIR pool ``history`` under a job group of its own (so it can be
cancelled), taken in the order they were planned (they chain: each continues where the one before it
ends), thrown away with their staged files when they no longer fit, the job pauses or it closes.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from source_backfill import metrics
from source_backfill.core import HistoryRange
from source_backfill.executors.history import StagedProgress
from source_backfill.executors.spark_work import READ_AHEAD

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from connectors.delta.sink import DeltaEpochSink
    from connectors.delta.staging import StagedFiles

#: At most this many history reads ahead are staged and not committed yet (bounds the staged data).
MAX_READS_AHEAD = 4
#: The FAIR scheduler pool of the read-ahead jobs: the live stream's jobs get their slots first.
HISTORY_POOL = "history"


@dataclass
class ReadAhead:
    """History ranges read ahead of the epoch that commits them: files staged by a background job."""

    ranges: tuple[HistoryRange, ...]
    group: str
    done: threading.Event = field(default_factory=threading.Event)
    staged: StagedFiles | None = None
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    error: Exception | None = None
    #: Thrown away while its job ran: the thread removes what it staged.
    dropped: bool = False
    thread: threading.Thread | None = None
    #: What the copy holds so far (its closed files), while it runs and once done.
    progress: StagedProgress = field(default_factory=StagedProgress)
    #: Spark tasks the copy was started with (its job's share of the source's history width then).
    tasks: int = 1
    #: What its rows were shaped under (a decoding job's reader schemas then); adopted only while current.
    shaped_under: object = None

    @property
    def rows(self) -> int:
        """Records staged (known once done)."""
        return sum(self.counts.values())

    @property
    def offsets(self) -> int:
        """Offsets the ranges span (what the per-epoch cap counts)."""
        return sum(r.size for r in self.ranges)


@dataclass(frozen=True)
class Adopted:
    """The reads ahead an epoch takes: their staged files, rows per split and ranges."""

    reads: list[ReadAhead] = field(default_factory=list)
    staged: list[StagedFiles] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    ranges: list[HistoryRange] = field(default_factory=list)


class ReadsAhead:
    """The reads ahead of one job (thread-safe: epochs take them while their threads finish)."""

    def __init__(self, job: str, spark: SparkSession, sink: DeltaEpochSink,
                 work: Callable[..., AbstractContextManager[None]] | None = None) -> None:
        self.job = job
        #: Runs a read's Spark work under the job's deadline, marked in flight (the job's ``spark_work``).
        self._work = work or (lambda *_a, **_k: nullcontext())
        self.spark = spark
        self.sink = sink
        self.lock = threading.RLock()
        self._reads: list[ReadAhead] = []
        self.closed = False

    def done(self) -> list[ReadAhead]:
        """The reads that are done, in the order they were planned (they chain).

        They stay listed until the epoch's commit retires them, so a read planned meanwhile still
        continues after them.
        """
        with self.lock:
            done = []
            for a in self._reads:
                if not a.done.is_set():
                    break
                done.append(a)
            return done

    def ranges(self) -> list[HistoryRange]:
        """Every listed read's ranges, in order (where a new read continues from)."""
        with self.lock:
            return [r for a in self._reads for r in a.ranges]

    def copied(self) -> dict[str, tuple[int, int]]:
        """``split -> (rows, last offset)`` copied by the listed reads, running ones included.

        The reads chain (each continues where the one before it ends), so a split's last offset is the
        highest any of them reached.
        """
        with self.lock:
            reads = [a for a in self._reads if not a.dropped and a.error is None]
        total: dict[str, tuple[int, int]] = {}
        for read in reads:  # Parquet footers: read outside the lock, epochs need it
            for split, (n, last) in read.progress.read().items():
                rows, top = total.get(split, (0, -1))
                total[split] = (rows + n, max(top, last))
        return total

    def may_start(self) -> bool:
        """No read running, fewer than ``MAX_READS_AHEAD`` staged, not closed."""
        with self.lock:
            return (not self.closed and len(self._reads) < MAX_READS_AHEAD
                    and all(a.done.is_set() for a in self._reads))

    def tasks_in_flight(self) -> set[int]:
        """The tasks each running read was started with."""
        with self.lock:
            return {a.tasks for a in self._reads if not a.done.is_set()}

    def in_flight_besides(self, taken: Iterable[ReadAhead]) -> bool:
        """Whether any read is listed besides ``taken``."""
        taken = list(taken)
        with self.lock:
            return any(a not in taken for a in self._reads)

    def retire(self, taken: Iterable[ReadAhead]) -> None:
        """The reads an epoch committed leave the list."""
        taken = list(taken)
        with self.lock:
            self._reads = [a for a in self._reads if a not in taken]

    def drop(self) -> None:
        """Throw every read away: staged files removed, running Spark jobs cancelled."""
        with self.lock:
            reads, self._reads = self._reads, []
            for a in reads:
                a.dropped = True
                outcome = "failed" if a.error is not None else "dropped"
                metrics.HISTORY_READS_AHEAD.labels(self.job, outcome).inc()
                if a.done.is_set():
                    if a.staged is not None:
                        self.sink.discard(a.staged)
                else:
                    self.spark.sparkContext.cancelJobGroup(a.group)

    def start(self, ranges: Sequence[HistoryRange],
              stage: Callable[[ReadAhead], tuple[StagedFiles, dict[str, int]]],
              then: Callable[[ReadAhead], None], *, tasks: int = 1, shaped_under: object = None) -> ReadAhead:
        """Run ``stage(read)`` in a new thread as a cancellable Spark job group; ``then(read)`` after.

        ``tasks``: the Spark tasks ``stage`` copies with (kept: :meth:`tasks_in_flight`).
        ``shaped_under``: what the rows are shaped under (kept: :attr:`ReadAhead.shaped_under`).
        """
        from pyspark import InheritableThread

        read = ReadAhead(tuple(ranges), f"history-{self.job}-{uuid.uuid4().hex[:12]}", tasks=tasks,
                         shaped_under=shaped_under)
        read.thread = InheritableThread(target=self._run, args=(read, stage, then), name=read.group,
                                        daemon=True)
        with self.lock:
            self._reads.append(read)
        read.thread.start()
        return read

    def _run(self, read: ReadAhead, stage: Callable[[ReadAhead], tuple[StagedFiles, dict[str, int]]],
             then: Callable[[ReadAhead], None]) -> None:
        """Background thread: the read runs in the FAIR pool ``history``.

        The live stream's tasks get free slots first and never queue behind history tasks.
        """
        sc = self.spark.sparkContext
        sc.setJobGroup(read.group, f"history read ahead of job {self.job}", interruptOnCancel=True)
        sc.setLocalProperty("spark.scheduler.pool", HISTORY_POOL)
        t0 = time.monotonic()
        try:
            with self._work(f"a history read ahead ({len(read.ranges)} ranges)", kind=READ_AHEAD):
                read.staged, read.counts = stage(read)
            read.seconds = time.monotonic() - t0
        except Exception as exc:  # noqa: BLE001 - reported to the epoch that takes this read
            read.error = exc
        with self.lock:
            read.done.set()
            if read.dropped and read.staged is not None:
                self.sink.discard(read.staged)
        then(read)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop: running reads are cancelled and staged files removed (none committed).

        Waits (``timeout_s`` at most) for the reads' threads, so nothing is left behind once it returns.
        """
        with self.lock:
            self.closed = True
            threads = [a.thread for a in self._reads if a.thread is not None]
        self.drop()
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def within_cap(reads: list[ReadAhead], cap: int | None) -> list[ReadAhead]:
    """The first done reads whose offsets fit ``max_rows_per_epoch`` (at least one: each read fits it).

    The others stay staged for the next epochs; they chain after these, so they still fit then.
    """
    if cap is None:
        return reads
    kept: list[ReadAhead] = []
    total = 0
    for read in reads:
        if kept and total + read.offsets > cap:
            break
        kept.append(read)
        total += read.offsets
    return kept
