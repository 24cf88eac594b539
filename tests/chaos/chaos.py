"""The crash suite: the daemon as a real process, SIGKILLed at random moments, restarted, checked.

Two jobs on a 4-partition topic under a live producer: ``deep`` backfills >= 200k history records (rate
limited, so the kills land mid-backfill), the first 10k of each partition from the source's archive (they
are deleted from Kafka: the archive tier, a trusted Delta table whose files a read ahead covering one takes
whole, the rest read with Spark, then the hand-over to Kafka),
``tail`` starts at ``latest`` and is Finished from its attach.
Each cycle starts ``source-backfill run``, waits until the daemon is ready, sometimes sends a mutation
(pause, resume, throttle, a create then a drop of a third job, a repair of 5,000 offsets per split of a
job's rows) or grows the topic to 6 partitions, and SIGKILLs the process group after a delay drawn from the
seed — so the kills fall during history reads and reads ahead, between a file write and its Delta commit,
while a mutation is applied, during a repair (its replaceWhere write, its commit, before it is marked
applied), while partitions are added. A repair replays after a kill until it is done; the jobs have no
transform, so a repair puts back the rows it removes, and exactly once must hold through any of them.
After the last cycle the daemon runs until both jobs are Finished, and
:mod:`source_backfill.verify` must find every offset of the log exactly once in both tables.

``python -m tests.chaos --cycles N [--seed S]`` (``make chaos``) runs a soak on an embedded broker;
``tests/chaos/test_chaos.py`` runs the short mode inside ``make test``.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from source_backfill.testing.process import DaemonProcess, free_port

HISTORY = 200_000
PARTITIONS = 4
#: Offsets per partition held only by the source's archive (deleted from Kafka before the first cycle):
#: the deep job's first 40k history records come from the archive, so early kills land in that part.
ARCHIVED = 10_000
#: Offsets of one partition per archive data file: the deep job (no transform) takes a file whole when a
#: read ahead covers it (~300 offsets per split and read at its rate), so kills land among links too.
ARCHIVE_FILE_OFFSETS = 250
#: History rows/s of the deep job: 200k rows take ~80 s of daemon uptime, spread over many cycles.
DEEP_RATE = 2_500


@dataclass
class Summary:
    """What a chaos run did and found."""

    seed: int
    cycles: int = 0
    records: int = 0
    missing: int = 0
    duplicated: int = 0
    unexpected: int = 0
    #: Kills that landed while the deep job was still backfilling (its last reported status).
    mid_backfill: int = 0
    #: Of those, kills while some split of it was still in the archive's part of its history.
    mid_archive: int = 0
    events: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: The id of the tail job's last repair committed (its table's ``tail.repair`` transaction), if any.
    repairs_committed: int | None = None
    #: The archive's data files in the deep job's table at the end, taken whole (the same inodes).
    whole_files: int = 0

    @property
    def ok(self) -> bool:
        """Exactly once in every table."""
        return self.missing == self.duplicated == self.unexpected == 0

    def line(self) -> str:
        """The one summary line the suite prints."""
        return (f"cycles={self.cycles} mid_backfill={self.mid_backfill} mid_archive={self.mid_archive} "
                f"records={self.records} "
                f"missing={self.missing} "
                f"duplicated={self.duplicated} unexpected={self.unexpected} "
                f"repairs={sum(e.startswith('repair') for e in self.events)} "
                f"last_repair_committed={self.repairs_committed} whole_files={self.whole_files} "
                f"seed={self.seed} "
                f"seconds={self.seconds:.0f}")


class _Producer:
    """A steady live stream of numbered records (``rate`` per second) until stopped."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        from confluent_kafka import Producer

        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 0})
        self._topic, self._rate = topic, rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.partitions = PARTITIONS

    def fill(self, count: int) -> None:
        for i in range(count):
            while True:
                try:
                    self._producer.produce(self._topic, value=f"h{i}".encode(), partition=i % PARTITIONS)
                    break
                except BufferError:
                    self._producer.poll(0.05)
        assert self._producer.flush(60) == 0

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(10 / self._rate):
            for _ in range(10):
                self._produce(f"live{i}".encode(), i % self.partitions)
                i += 1
            self._producer.poll(0)

    def _produce(self, value: bytes, partition: int) -> None:
        """Produce one record; a partition just added is unknown until the producer's metadata refreshes."""
        from confluent_kafka import KafkaError, KafkaException

        while True:
            try:
                self._producer.produce(self._topic, value=value, partition=partition)
                return
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:  # noqa: SLF001
                    raise
                if self._stop.is_set():
                    return
            except BufferError:
                pass
            self._producer.poll(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._producer.flush(30)


class _Daemon(DaemonProcess):
    """The daemon process with the suite's two jobs: ``deep`` backfilling, ``tail`` starting at latest."""

    def __init__(self, workdir: Path, bootstrap: str, topic: str) -> None:
        self.tables = workdir / "tables"
        config = workdir / "config.toml"
        config.write_text(f"""
[daemon]
state_root = "{workdir / 'state'}"
shutdown_timeout_s = 10
[spark]
master = "local[2]"
[metrics]
port = false
[[sources]]
name = "src"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
trigger_interval_s = 0.5
archive = {{ path = "{workdir / 'archive'}", trusted = true }}
[[jobs]]
name = "deep"
source = "src"
sink_path = "{self.tables / 'deep'}"
rate_limit = {DEEP_RATE}
[[jobs]]
name = "tail"
source = "src"
sink_path = "{self.tables / 'tail'}"
start = {{kind = "latest"}}
""")
        super().__init__(config, 0, workdir / "daemon.log")

    def start(self) -> None:
        """Start on an API port free now: a port fixed for the whole soak was taken by another process
        between two cycles once (74 cycles in), and the daemon rightly refused to start."""
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = {"SOURCE_BACKFILL_API__PORT": str(port)}
        super().start()

    def status(self, job: str) -> str | None:
        r = self.get(f"/jobs/{job}")
        return r.json().get("status") if r is not None and r.status_code == 200 else None

    def in_archive_part(self, job: str) -> bool:
        """Whether the job's history has not passed the archive's offsets in some split yet."""
        r = self.get(f"/jobs/{job}")
        if r is None or r.status_code != 200:
            return False
        splits = [s for s in r.json().get("splits", []) if s.get("stage") == "backfilling"
                  and int(str(s.get("split")).rsplit(":", 1)[1]) < PARTITIONS]  # the archive holds these
        return any(max(s.get("backfilled_offset") or -1, s.get("read_ahead_offset") or -1) < ARCHIVED - 1
                   for s in splits)


def _action(rng: random.Random, daemon: _Daemon, producer: _Producer, grow: Callable[[], None],
            grown: bool) -> str:
    """One disturbance before the kill (or none), drawn from ``rng``."""
    roll = rng.random()
    if roll < 0.15:
        daemon.request("POST", "/jobs/deep/pause")
        return "pause"
    if roll < 0.35:
        daemon.request("POST", "/jobs/deep/resume")
        return "resume"
    if roll < 0.45:
        daemon.request("PATCH", "/jobs/deep", {"rate_limit": rng.choice([0, 1_000, DEEP_RATE])})
        return "throttle"
    if roll < 0.55:
        name = f"extra-{uuid.uuid4().hex[:6]}"
        daemon.request("POST", "/jobs", {"name": name, "source": "src",
                                         "sink_path": str(daemon.tables / name)})
        daemon.request("DELETE", f"/jobs/{name}")
        return "create+drop"
    if roll < 0.62 and not grown:
        grow()
        return "add partitions"
    if roll < 0.80:
        return _repair(rng, daemon, rng.choice(["tail", "tail", "deep"]))
    return "none"


def _repair(rng: random.Random, daemon: _Daemon, job: str) -> str:
    """A repair of 5,000 offsets per split of ``job``'s rows (refused for the deep job while it backfills)."""
    # the deep job holds its history's offsets; the tail its live ones, from its attach after the history
    # (~50 a second per partition): a window from just after the history overlaps them from the start
    lo = (HISTORY // PARTITIONS + rng.randrange(0, 1_000) if job == "tail"
          else rng.randrange(0, HISTORY // PARTITIONS))
    daemon.request("POST", f"/jobs/{job}/repair", {"from_offset": lo, "to_offset": lo + 5_000})
    return f"repair {job}"


def run_chaos(bootstrap: str, workdir: Path, cycles: int, seed: int | None = None,
              out: Callable[[str], None] = print) -> Summary:
    """Run ``cycles`` kill/restart cycles against ``bootstrap``; return what was found."""
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.verify import check_exactly_once

    seed = seed if seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    summary = Summary(seed=seed)
    out(f"chaos: seed={seed} cycles={cycles} workdir={workdir}")
    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    admin = KafkaAdmin(bootstrap)
    topic = f"chaos-{uuid.uuid4().hex[:8]}"
    admin.create_topic(topic, PARTITIONS)
    producer = _Producer(bootstrap, topic, rate=200)
    producer.fill(HISTORY)
    _archive(workdir / "archive", topic)  # the first ARCHIVED offsets of each partition, then gone
    sids = [f"{topic}:{p}" for p in range(PARTITIONS)]
    assert admin.delete_records(dict.fromkeys(sids, ARCHIVED)) == dict.fromkeys(sids, ARCHIVED)
    producer.start()
    grown = False

    def grow() -> None:
        nonlocal grown
        admin.add_partitions(topic, PARTITIONS + 2)
        producer.partitions = PARTITIONS + 2
        grown = True

    daemon = _Daemon(workdir, bootstrap, topic)
    try:
        for cycle in range(1, cycles + 1):
            daemon.start()
            daemon.wait_ready()
            # every 7th cycle from the 3rd repairs the tail: each run has kills with a repair in flight
            event = (_repair(rng, daemon, "tail") if cycle % 7 == 3
                     else _action(rng, daemon, producer, grow, grown))
            delay = rng.uniform(0.2, 6.0)
            time.sleep(delay)
            backfilling = daemon.status("deep") in ("backfilling", "pending")
            archive_part = daemon.in_archive_part("deep")
            daemon.kill()
            summary.mid_backfill += backfilling
            summary.mid_archive += archive_part
            summary.cycles = cycle
            summary.events.append(event)
            out(f"chaos: cycle {cycle}/{cycles} killed {delay:.1f}s after ready ({event})")
        daemon.start()
        daemon.wait_ready()
        daemon.request("POST", "/jobs/deep/resume")
        daemon.request("PATCH", "/jobs/deep", {"rate_limit": None})
        deadline = time.monotonic() + 600
        while not all(daemon.status(j) == "finished" for j in ("deep", "tail")):
            if time.monotonic() > deadline:
                msg = f"jobs not finished after the last restart; log tail:\n{daemon.tail()}"
                raise AssertionError(msg)
            time.sleep(1)
        producer.stop()
        from deltalake import DeltaTable

        summary.repairs_committed = DeltaTable(str(daemon.tables / "tail")).transaction_version("tail.repair")
        summary.whole_files = _shared_files(workdir / "archive", daemon.tables / "deep")
        for job in ("deep", "tail"):
            summary_job = _check(check_exactly_once, daemon, job, bootstrap, topic)
            summary.records += summary_job[0]
            summary.missing += summary_job[1]
            summary.duplicated += summary_job[2]
            summary.unexpected += summary_job[3]
    finally:
        producer.stop()
        daemon.stop()
    summary.seconds = time.monotonic() - t0
    out("chaos: " + summary.line())
    return summary


def _archive(path: Path, topic: str) -> None:
    """The archive: the records ``_Producer.fill`` wrote at offsets ``[0, ARCHIVED)``, as Kafka's columns.

    Record ``i`` went to partition ``i % PARTITIONS`` at offset ``i // PARTITIONS``, value ``h<i>``. The
    timestamps are not Kafka's (the suite checks offsets). Trusted (it holds each offset once, and only
    offsets deleted from Kafka): its files of ``ARCHIVE_FILE_OFFSETS`` offsets of one partition each are
    taken whole by the deep job when a read ahead covers one, the rest read.
    """
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())])
    batches = []
    for p in range(PARTITIONS):
        for lo in range(0, ARCHIVED, ARCHIVE_FILE_OFFSETS):
            offsets = list(range(lo, lo + ARCHIVE_FILE_OFFSETS))
            n = len(offsets)
            batches.append(pa.table({
                "key": [None] * n, "value": [f"h{o * PARTITIONS + p}".encode() for o in offsets],
                "topic": [topic] * n, "partition": [p] * n, "offset": offsets,
                "timestamp": [1_700_000_000_000_000] * n, "timestampType": [0] * n}, schema=schema))
    for batch in batches:  # a commit each: a data file each
        write_deltalake(str(path), batch, mode="append")


def _shared_files(archive: Path, table: Path) -> int:
    """Data files of ``table`` that are the archive's own (hard links: the same inode)."""
    from deltalake import DeltaTable

    def inodes(path: Path) -> set[int]:
        return {os.stat(u.removeprefix("file://")).st_ino for u in DeltaTable(str(path)).file_uris()}

    return len(inodes(archive) & inodes(table))


def _check(check: Callable, daemon: _Daemon, job: str, bootstrap: str, topic: str) -> tuple[int, ...]:
    """(records, missing, duplicated, unexpected) of ``job``, once its table has caught up to the log.

    The deep job's log is the archive below the log start (each of its offsets once) and Kafka's log
    from there.
    """
    from source_backfill.verify import compare, log_offsets, table_offsets

    start = None
    if job == "tail":  # it starts at its attach position: from the first offset it holds, per split
        start = {s: min(o) for s, o in table_offsets(str(daemon.tables / job)).items() if o}
    deadline = time.monotonic() + 120
    while True:
        if job == "deep":
            log = log_offsets(bootstrap, [topic])
            for p in range(PARTITIONS):
                log[f"{topic}:{p}"] = list(range(ARCHIVED)) + log[f"{topic}:{p}"]
            report = compare(log, table_offsets(str(daemon.tables / job)))
        else:
            report = check(str(daemon.tables / job), bootstrap, [topic], start=start)
        if report.ok or time.monotonic() > deadline:
            break
        time.sleep(1)
    splits = report.splits.values()
    return (sum(s.log_records for s in splits), sum(len(s.missing) for s in splits),
            sum(len(s.duplicates) for s in splits), sum(len(s.unexpected) for s in splits))


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.chaos --cycles N [--seed S] [--workdir DIR]`` on an embedded broker."""
    import argparse
    import tempfile

    from connectors.kafka.embedded import EmbeddedBroker

    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if bootstrap:
        summary = run_chaos(bootstrap, workdir, args.cycles, args.seed)
    else:
        with EmbeddedBroker() as broker:
            summary = run_chaos(broker.bootstrap, workdir, args.cycles, args.seed)
    (workdir / "summary.json").write_text(json.dumps({"line": summary.line(), "events": summary.events}))
    return 0 if summary.ok else 1
