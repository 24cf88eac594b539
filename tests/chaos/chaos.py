"""The crash suite: the daemon as a real process, SIGKILLed at random moments, restarted, checked.

Two jobs on a 4-partition topic under a live producer: ``deep`` backfills >= 200k history records (rate
limited, so the kills land mid-backfill), the first 10k of each partition from the source's archive (they
are deleted from Kafka: the archive tier, a trusted Delta table whose files a read ahead covering one takes
whole, the rest read with Spark, then the hand-over to Kafka),
``tail`` starts at ``latest`` and is Finished from its attach.
A second source, ``slow`` (a 2-partition topic at 20 records/s, a 1 s trigger, ``max_job_lag_s`` 10 s),
runs two jobs whose lanes go at different speeds: ``heavy``, whose allowed transform keeps every column
and whose always-true predicate costs ~0.2-0.6 s of a core per ``heavy:<n>`` record younger than 20 s,
and ``beside`` (no transform), both started at ``latest``. Bursts of heavy records make its steps much
longer than the trigger, so it skips epochs, lags and rejoins by offsets while ``beside`` commits each
epoch; a long burst keeps it lagging past the bound and it is failed.
Each cycle starts ``source-backfill run``, waits until the daemon is ready, retries the slow jobs the bound
failed (``POST /jobs/{name}/retry``), sometimes sends a mutation
(pause, resume, throttle, a create then a drop of a third job, a repair of 5,000 offsets per split of a
job's rows) or grows the topic to 6 partitions, and SIGKILLs the process group after a delay drawn from the
seed — so the kills fall during history reads and reads ahead, between a file write and its Delta commit,
while a mutation is applied, during a repair (its replaceWhere write, its commit, before it is marked
applied), while partitions are added. Each cycle also sends a burst of heavy records or none: from the
1st every 4th a short one (a step of seconds), from the 2nd every 4th a long one whose kill waits until the
bound has failed the job (and half the time until the driver has retried it), the others drawn — so kills
also land while the heavy job lags, while it is failed past its bound with its cancelled step ending,
while a retry waits for its lane, and while it reads the skipped offsets back. A repair replays after a
kill until it is done; the jobs it repairs have no transform, so a repair puts back the rows it removes,
and exactly once must hold through any of them.
After the last cycle the heavy job rejoins once if it never did (a short burst), is made light
(``PATCH /jobs/heavy`` with no transform, then retried if the bound failed it), the daemon runs until all
four jobs are Finished, and :mod:`source_backfill.verify` must find every offset of the log exactly once
in every table (``heavy``'s too, offset by offset). The
summary line counts the heavy job's skipped epochs, rejoins, bound hits, the driver's retries and the kills
that found it lagging or failed.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from source_backfill.testing.process import DaemonProcess, free_port

if TYPE_CHECKING:
    from connectors.kafka.cluster import EmbeddedCluster

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

#: The second source, ``slow``: a low-rate topic whose two jobs run at different speeds on their lanes.
SLOW_PARTITIONS = 2
#: Records/s the live producer writes to the slow topic.
SLOW_RATE = 20
#: The slow source's trigger: its epochs wait 2 s for their steps. Not 0.5 s: a job's step after a
#: skipped epoch reads the skipped offsets with Spark (1-3 s here even at load 1), so at 0.5 s (a 1 s
#: wait) a light job that skipped once kept skipping, each step a rejoin, until the bound failed it
#: though it stayed within ~3 s of the live stream (the daemon's lag counts the whole run of slow steps,
#: not how far behind the job is); the final run then took 68 s instead of 28.
SLOW_TRIGGER_S = 1.0
#: ``max_job_lag_s`` of the slow source: a job whose lane skips its epochs this long is failed. A step
#: of more than ~13 s (the bound, the epoch's wait of two triggers, one trigger) hits it. Light steps
#: stay well below it, but a first one in a fresh JVM on a loaded machine (load 20 on 2 cores: a history
#: read and a first Delta write) took more than 11 s: a smaller bound failed the jobs at every start.
LAG_BOUND_S = 10.0
#: Iterations of the heavy transform's costly predicate per heavy record: ~0.2-0.6 s of one core each.
HEAVY_ITERATIONS = 100_000
#: Heavy records per burst: a dozen make a step of 2.5-7 s (it skips epochs, then rejoins by offsets), many a
#: step past the lag bound (failed, then retried by the driver). A step's Spark work is one task (a small
#: epoch's rows are coalesced into one): one core at most, so the source's epochs go on beside it.
SKIP_BURST = 12
BOUND_BURST = 120
#: A heavy record is costly only while it is younger than this (it is then read live, or again right
#: after a kill or a retry); older, it passes at once: a job failed by the bound gets past its burst
#: once retried a cycle later, instead of hitting the bound on the same records forever.
HEAVY_WINDOW_S = 20
#: The heavy job's transform: allowed by the transform check (a filter, built-in pure functions, a lambda),
#: keeps every column of the identity (so its table's offsets are checked like the others'), and its
#: predicate, always true, hashes ``n`` strings for a record whose value is ``heavy:<n>``.
HEAVY = (
    "SELECT * FROM {source} WHERE CASE "
    "WHEN CAST(value AS STRING) NOT LIKE 'heavy:%' THEN true "
    f"WHEN unix_millis(current_timestamp()) - unix_millis(timestamp) >= {HEAVY_WINDOW_S * 1000} THEN true "
    "ELSE aggregate(sequence(1, CAST(substring_index(CAST(value AS STRING), ':', -1) AS INT)), 0L, "
    "(acc, i) -> acc + length(sha2(concat(CAST(value AS STRING), CAST(i AS STRING)), 256))) > 0 END"
)
#: The jobs of the slow source: ``heavy`` (the transform above) and ``beside`` (none) on its lane next to it.
SLOW_JOBS = ("heavy", "beside")
#: What the error of a job failed by its lag bound says (``JobHost._run_lanes``).
BOUND_ERROR = "fell behind the live stream"


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
    #: Epochs of the slow source the heavy job skipped, its lane busy (each daemon's
    #: ``job_epochs_skipped_total``, read right before its kill and at the end, summed).
    skipped: int = 0
    #: The heavy job's rejoins by offsets (the daemon log's, every process): after skipped epochs, after
    #: a restart or a retry.
    rejoins: int = 0
    #: Times the heavy job was failed past the lag bound (the daemon log's ``job failed`` lines).
    bound_hits: int = 0
    #: Times its light neighbour ``beside`` was (a step of it past the bound, in a loaded or fresh JVM).
    beside_bound_hits: int = 0
    #: Retries the driver sent to a job failed by the bound (accepted).
    retries: int = 0
    #: Kills that landed while the heavy job was lagging (skipping epochs), or failed past its bound.
    killed_lagging: int = 0
    killed_failed: int = 0
    #: Cluster mode: brokers SIGKILLed (one at a time, the daemon killed after it, the broker restarted at
    #: a later cycle's start or left down across a daemon restart).
    broker_kills: int = 0
    #: The audit table's rows at the end, and the accepted mutation ids it lacks or holds twice (every
    #: id from 1 to the highest the mutation log accepted must be there once).
    audit_rows: int = 0
    audit_missing: int = 0
    audit_duplicated: int = 0

    @property
    def ok(self) -> bool:
        """Exactly once in every table, the audit table's included."""
        return self.missing == self.duplicated == self.unexpected == self.audit_missing == \
            self.audit_duplicated == 0

    def line(self) -> str:
        """The one summary line the suite prints."""
        return (f"cycles={self.cycles} mid_backfill={self.mid_backfill} mid_archive={self.mid_archive} "
                f"records={self.records} "
                f"missing={self.missing} "
                f"duplicated={self.duplicated} unexpected={self.unexpected} "
                f"repairs={sum(e.startswith('repair') for e in self.events)} "
                f"last_repair_committed={self.repairs_committed} whole_files={self.whole_files} "
                f"skipped={self.skipped} rejoins={self.rejoins} bound_hits={self.bound_hits} "
                f"beside_bound_hits={self.beside_bound_hits} retries={self.retries} "
                f"killed_lagging={self.killed_lagging} killed_failed={self.killed_failed} "
                f"broker_kills={self.broker_kills} audit_rows={self.audit_rows} "
                f"audit_missing={self.audit_missing} audit_duplicated={self.audit_duplicated} "
                f"seed={self.seed} "
                f"seconds={self.seconds:.0f}")


class _Producer:
    """A steady live stream of numbered records (``rate`` per second) until stopped."""

    def __init__(self, bootstrap: str, topic: str, rate: float, partitions: int = PARTITIONS,
                 kafka: Mapping[str, str] | None = None) -> None:
        from confluent_kafka import Producer

        self._producer = Producer({**(kafka or {}), "bootstrap.servers": bootstrap, "linger.ms": 5,
                                   "log_level": 0})
        self._topic, self._rate = topic, rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.partitions = partitions

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

    def burst(self, count: int) -> None:
        """``count`` heavy records (``heavy:<n>``), over the partitions, at once (beside the live stream)."""
        for i in range(count):
            self._produce(f"heavy:{HEAVY_ITERATIONS}".encode(), i % self.partitions)
        self._producer.flush(30)

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
    """The daemon process with the suite's jobs: ``deep`` backfilling, ``tail`` starting at latest (source
    ``src``), ``heavy`` and ``beside`` on the slow topic (source ``slow``, its lag bound small)."""

    def __init__(self, workdir: Path, bootstrap: str, topic: str, slow_topic: str,
                 security: Mapping[str, str] | None = None) -> None:
        self.tables = workdir / "tables"
        config = workdir / "config.toml"
        # both sources connect as the cluster asks (a secured broker's security section, as TOML)
        sec = ("security = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in security.items()) + " }"
               if security else "")
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
{sec}
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
[[sources]]
name = "slow"
bootstrap_servers = "{bootstrap}"
topics = ["{slow_topic}"]
trigger_interval_s = {SLOW_TRIGGER_S}
max_job_lag_s = {LAG_BOUND_S}
{sec}
[[jobs]]
name = "heavy"
source = "slow"
sink_path = "{self.tables / 'heavy'}"
start = {{kind = "latest"}}
transform = {json.dumps(HEAVY)}
[[jobs]]
name = "beside"
source = "slow"
sink_path = "{self.tables / 'beside'}"
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
        return self.view(job).get("status")

    def view(self, job: str) -> dict[str, Any]:
        """``GET /jobs/{job}`` (empty when the daemon does not answer)."""
        r = self.get(f"/jobs/{job}")
        return r.json() if r is not None and r.status_code == 200 else {}

    def counter(self, name: str, job: str) -> int:
        """The job's counter ``name`` (``job_epochs_skipped_total``...) in this daemon process (0 when it
        does not answer)."""
        r = self.get("/metrics")
        if r is None or r.status_code != 200:
            return 0
        series = f'source_backfill_{name}{{job="{job}"}} '
        return sum(int(float(line.removeprefix(series))) for line in r.text.splitlines()
                   if line.startswith(series))

    def retry_bound_failed(self) -> int:
        """``POST /jobs/{name}/retry`` for each slow job failed by its lag bound; returns how many were sent.

        Only those: any other failure stays, and the final check says which job never finished and why.
        """
        sent = 0
        for job in SLOW_JOBS:
            if BOUND_ERROR in (self.view(job).get("error") or ""):
                r = self.request("POST", f"/jobs/{job}/retry")
                sent += r is not None and r.status_code == 202
        return sent

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


def _lane_event(cycle: int, rng: random.Random, slow: _Producer) -> str:
    """A burst of heavy records on the slow topic (or none), drawn from ``rng``.

    From the 1st cycle every 4th is a short burst (the heavy job skips epochs, then rejoins), from the 2nd
    every 4th a long one (it is failed past the lag bound; that cycle's kill waits for it); the others draw.
    """
    roll = rng.random()
    if cycle % 4 == 2 or (cycle % 4 != 1 and roll < 0.2):
        slow.burst(BOUND_BURST)
        return "bound burst"
    if cycle % 4 == 1 or roll < 0.6:
        slow.burst(SKIP_BURST)
        return "skip burst"
    return "no burst"


def _wait_failed(daemon: _Daemon, job: str, timeout_s: float) -> bool:
    """Wait until the job is failed (True), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon.status(job) == "failed":
            return True
        time.sleep(0.2)
    return False


def _await_bound(daemon: _Daemon, summary: Summary, retry: bool) -> str:
    """Wait (60 s at most) until the bound fails the heavy job; then, if ``retry``, retry it at once.

    The deep job's history is paused meanwhile (if it was not): the wait would take ~15 s of the
    backfill the later cycles' kills must find running. It is resumed before the kill's delay.
    """
    paused = daemon.view("deep").get("paused", True)
    if not paused:
        daemon.request("POST", "/jobs/deep/pause")
    try:
        failed = _wait_failed(daemon, "heavy", 60)
    finally:
        if not paused:
            daemon.request("POST", "/jobs/deep/resume")
    if not failed:
        return ", not failed within 60 s"
    if retry:
        summary.retries += daemon.retry_bound_failed()
        return ", retried"
    return ""


def _await_rejoin(daemon: _Daemon, summary: Summary, timeout_s: float) -> bool:
    """Wait until the heavy job has rejoined by offsets in this daemon process (True), at most
    ``timeout_s``, retrying it when the bound fails it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon.counter("job_rejoins_total", "heavy"):
            return True
        summary.retries += daemon.retry_bound_failed()
        time.sleep(0.5)
    return False


def _make_light(daemon: _Daemon, job: str, timeout_s: float = 120) -> None:
    """``PATCH /jobs/{job}`` with no transform, until accepted (202).

    Sent again when the API does not answer in time: the check of a new transform runs in Spark, and
    beside a busy JVM on a loaded machine it took longer than the request's 5 s (seed 5150, load 15).
    Sending it again is harmless: the same transform is accepted as nothing to change.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        r = daemon.request("PATCH", f"/jobs/{job}", {"transform": None})
        if r is not None and r.status_code == 202:
            return
        if r is not None or time.monotonic() > deadline:
            msg = f"PATCH /jobs/{job} not accepted: {None if r is None else r.text}"
            raise AssertionError(msg)
        time.sleep(1)


def _count_log(log: Path, summary: Summary) -> None:
    """The heavy job's rejoins and the slow jobs' bound hits, from the daemon log of every process."""
    text = log.read_text(errors="replace") if log.exists() else ""
    summary.rejoins = text.count('job rejoins by offsets job="heavy"')
    summary.bound_hits = text.count(f'job failed job="heavy" error="{BOUND_ERROR}')
    summary.beside_bound_hits = text.count(f'job failed job="beside" error="{BOUND_ERROR}')


def run_chaos(bootstrap: str, workdir: Path, cycles: int, seed: int | None = None,
              out: Callable[[str], None] = print, *, kafka: Mapping[str, str] | None = None,
              security: Mapping[str, str] | None = None, cluster: EmbeddedCluster | None = None) -> Summary:
    """Run ``cycles`` kill/restart cycles against ``bootstrap``; return what was found.

    A secured cluster: ``kafka``, the librdkafka settings of the suite's own clients (its producers,
    admin and checks); ``security``, the daemon's sources' ``security`` section. ``cluster``: the brokers
    of ``bootstrap`` (topics replicated to each): in half the cycles a broker is SIGKILLed shortly before
    the daemon (never two at once), and restarted at the start of a later cycle or left down across it.
    """
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.verify import check_exactly_once

    seed = seed if seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    summary = Summary(seed=seed)
    out(f"chaos: seed={seed} cycles={cycles} workdir={workdir}")
    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    kafka = {k: v for k, v in (kafka or {}).items() if k != "bootstrap.servers"}
    admin = KafkaAdmin(bootstrap, kafka)
    topic = f"chaos-{uuid.uuid4().hex[:8]}"
    replicas = 1 if cluster is None else len(cluster.nodes)
    admin.create_topic(topic, PARTITIONS, replication_factor=replicas)
    producer = _Producer(bootstrap, topic, rate=200, kafka=kafka)
    slow_topic = f"{topic}-slow"
    admin.create_topic(slow_topic, SLOW_PARTITIONS, replication_factor=replicas)
    slow = _Producer(bootstrap, slow_topic, rate=SLOW_RATE, partitions=SLOW_PARTITIONS, kafka=kafka)
    producer.fill(HISTORY)
    _archive(workdir / "archive", topic)  # the first ARCHIVED offsets of each partition, then gone
    sids = [f"{topic}:{p}" for p in range(PARTITIONS)]
    assert admin.delete_records(dict.fromkeys(sids, ARCHIVED)) == dict.fromkeys(sids, ARCHIVED)
    producer.start()
    slow.start()
    grown = False

    def grow() -> None:
        nonlocal grown
        admin.add_partitions(topic, PARTITIONS + 2)
        producer.partitions = PARTITIONS + 2
        grown = True

    daemon = _Daemon(workdir, bootstrap, topic, slow_topic, security)
    down: int | None = None  # cluster mode: the broker killed and not restarted yet
    try:
        for cycle in range(1, cycles + 1):
            if down is not None and rng.random() < 0.5:
                cluster.restart(down)  # type: ignore[union-attr]
                down = None
            daemon.start()
            daemon.wait_ready()
            ready_at = time.monotonic()
            summary.retries += daemon.retry_bound_failed()
            # every 7th cycle from the 3rd repairs the tail: each run has kills with a repair in flight
            event = (_repair(rng, daemon, "tail") if cycle % 7 == 3
                     else _action(rng, daemon, producer, grow, grown))
            lane = _lane_event(cycle, rng, slow)
            delay, retry_now = rng.uniform(0.2, 6.0), rng.random() < 0.5
            if lane == "bound burst" and cycle % 4 == 2:
                # the kill lands while the job is failed past its bound, its cancelled step maybe still
                # ending; half the time right after the driver's retry of it (applied once its lane is free)
                lane += _await_bound(daemon, summary, retry_now)
                time.sleep(delay / 2)
            else:
                time.sleep(delay)
            delay = time.monotonic() - ready_at
            backfilling = daemon.status("deep") in ("backfilling", "pending")
            archive_part = daemon.in_archive_part("deep")
            heavy = daemon.status("heavy")
            summary.skipped += daemon.counter("job_epochs_skipped_total", "heavy")
            broker = ""
            if cluster is not None and down is None and rng.random() < 0.5:
                down = rng.choice(cluster.running())
                cluster.kill(down)  # a leader of some partitions, maybe the controller: the daemon reads on
                summary.broker_kills += 1
                broker = f"; broker {down} killed"
                time.sleep(rng.uniform(0.0, 3.0))
            daemon.kill()
            summary.mid_backfill += backfilling
            summary.mid_archive += archive_part
            summary.killed_lagging += heavy == "lagging"
            summary.killed_failed += heavy == "failed"
            summary.cycles = cycle
            summary.events.append(f"{event}; {lane}")
            out(f"chaos: cycle {cycle}/{cycles} killed {delay:.1f}s after ready ({event}; {lane}; "
                f"heavy {heavy}{broker})")
        if down is not None:
            cluster.restart(down)  # type: ignore[union-attr]
            down = None
        daemon.start()
        daemon.wait_ready()
        daemon.request("POST", "/jobs/deep/resume")
        daemon.request("PATCH", "/jobs/deep", {"rate_limit": None})
        _count_log(daemon.log, summary)
        if not summary.rejoins:
            # the kills left it none (its first step in a fresh JVM outlasted every cycle): the heavy job
            # skips epochs and rejoins by offsets in this run before it is made light, a short burst while
            # the deep job catches up anyway
            slow.burst(SKIP_BURST)
            _await_rejoin(daemon, summary, 60)
        # the heavy job made light (an identity: its table's columns), then retried if the bound failed it
        _make_light(daemon, "heavy")
        deadline = time.monotonic() + 600
        while not all(daemon.status(j) == "finished" for j in ("deep", "tail", *SLOW_JOBS)):
            summary.retries += daemon.retry_bound_failed()
            if time.monotonic() > deadline:
                msg = f"jobs not finished after the last restart; log tail:\n{daemon.tail()}"
                raise AssertionError(msg)
            time.sleep(1)
        summary.skipped += daemon.counter("job_epochs_skipped_total", "heavy")
        producer.stop()
        slow.stop()
        from deltalake import DeltaTable

        summary.repairs_committed = DeltaTable(str(daemon.tables / "tail")).transaction_version("tail.repair")
        summary.whole_files = _shared_files(workdir / "archive", daemon.tables / "deep")
        for job in ("deep", "tail", *SLOW_JOBS):
            job_topic = slow_topic if job in SLOW_JOBS else topic
            summary_job = _check(check_exactly_once, daemon, job, bootstrap, job_topic, kafka)
            if any(summary_job[1:4]):
                out(f"chaos: {job}: records={summary_job[0]} missing={summary_job[1]} "
                    f"duplicated={summary_job[2]} unexpected={summary_job[3]}: {summary_job[4]}")
            summary.records += summary_job[0]
            summary.missing += summary_job[1]
            summary.duplicated += summary_job[2]
            summary.unexpected += summary_job[3]
    finally:
        producer.stop()
        slow.stop()
        daemon.stop()
        _count_log(daemon.log, summary)
    _check_audit(workdir / "state", summary)
    summary.seconds = time.monotonic() - t0
    out("chaos: " + summary.line())
    return summary


def _check_audit(state: Path, summary: Summary) -> None:
    """Every mutation id the log accepted (1 to the highest, also those compaction removed since) is one
    row of the audit table, whatever the kills between a mutation's line and its row."""
    import json

    from source_backfill.runtime.audit import AuditTable

    highest = 0
    for line in (state / "mutations.jsonl").read_text().splitlines():
        entry = json.loads(line) if line.strip() else {}
        if entry.get("type") == "mutation":
            highest = max(highest, entry["id"])
        elif entry.get("next_id") is not None:  # a compacted log's mark: ids below it were handed out
            highest = max(highest, entry["next_id"] - 1)
    ids = [r["id"] for r in AuditTable(state).rows()]
    summary.audit_rows = len(ids)
    summary.audit_missing = len(set(range(1, highest + 1)) - set(ids))
    summary.audit_duplicated = len(ids) - len(set(ids))


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


def _check(check: Callable, daemon: _Daemon, job: str, bootstrap: str,
           topic: str, kafka: Mapping[str, str]) -> tuple[int, int, int, int, str]:
    """(records, missing, duplicated, unexpected, the first of them per split) of ``job``, once its table
    has caught up to the log.

    The deep job's log is the archive below the log start (each of its offsets once) and Kafka's log
    from there; the other jobs' starts at ``latest``: from the first offset they hold per split.
    """
    from source_backfill.verify import compare, log_offsets, table_offsets

    start = None
    if job != "deep":  # it starts at its attach position: from the first offset it holds, per split
        start = {s: min(o) for s, o in table_offsets(str(daemon.tables / job)).items() if o}
    deadline = time.monotonic() + 120
    while True:
        if job == "deep":
            log = log_offsets(bootstrap, [topic], kafka_options=kafka)
            for p in range(PARTITIONS):
                log[f"{topic}:{p}"] = list(range(ARCHIVED)) + log[f"{topic}:{p}"]
            report = compare(log, table_offsets(str(daemon.tables / job)))
        else:
            report = check(str(daemon.tables / job), bootstrap, [topic], start=start, kafka_options=kafka)
        if report.ok or time.monotonic() > deadline:
            break
        time.sleep(1)
    splits = report.splits.values()
    detail = "; ".join(f"{s.split} missing {list(s.missing[:10])} duplicated {list(s.duplicates[:10])} "
                       f"unexpected {list(s.unexpected[:10])}"
                       for s in splits if s.missing or s.duplicates or s.unexpected)
    return (sum(s.log_records for s in splits), sum(len(s.missing) for s in splits),
            sum(len(s.duplicates) for s in splits), sum(len(s.unexpected) for s in splits), detail)


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
    parser.add_argument("--secured", action="store_true",
                        help="against the embedded broker's SASL_SSL mode (SCRAM, a private CA, ACLs on)")
    parser.add_argument("--cluster", action="store_true",
                        help="against three embedded brokers, a broker SIGKILLed in half the cycles")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if args.cluster:
        from source_backfill.testing import kafka_cluster_of

        with kafka_cluster_of(3) as cluster:
            summary = run_chaos(cluster.bootstrap, workdir, args.cycles, args.seed, cluster=cluster)
    elif args.secured:
        from source_backfill.testing import secured_kafka

        with secured_kafka("SASL_SSL") as broker:
            summary = run_chaos(broker.bootstrap, workdir, args.cycles, args.seed,
                                kafka=broker.librdkafka_config(), security=broker.client_security())
    elif bootstrap:
        summary = run_chaos(bootstrap, workdir, args.cycles, args.seed)
    else:
        with EmbeddedBroker() as broker:
            summary = run_chaos(broker.bootstrap, workdir, args.cycles, args.seed)
    (workdir / "summary.json").write_text(json.dumps({"line": summary.line(), "events": summary.events}))
    return 0 if summary.ok else 1
