"""The daemon: Spark, the live sources and their jobs, the control API and the metrics endpoint.

Its composition root: the one module that wires ``runtime/`` (registry, sources, Spark, watchdog) to
``api/`` (the HTTP servers), so it sits on the top floor with the CLI and the demos, above both
(docs/architecture.md, "Layers").

``run_daemon(settings)`` blocks until SIGTERM/SIGINT, then stops every source after its running epoch
(never half-committed) and shuts the API down.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from source_backfill import metrics
from source_backfill.config import (
    EMBEDDED,
    JobSpec,
    RepairSpec,
    Settings,
    SourceConfig,
    check_job_fits_source,
)
from source_backfill.errors import ConfigError

if TYPE_CHECKING:
    from source_backfill.runtime.source import LiveSource
    from source_backfill.runtime.table_source import TableLiveSource

logger = logging.getLogger(__name__)

#: Seconds between two looks of the partition watch at the Kafka sources' partitions (a metadata request).
PARTITION_WATCH_TICKS = 5

#: The exit code of a daemon whose Spark JVM died (its supervisor restarts it).
EXIT_JVM_GONE = 70
#: After the JVM died, the process exits within this many seconds even if stopping the rest hangs.
JVM_GONE_EXIT_S = 15.0


class Daemon:
    """Everything one ``source-backfill run`` process owns."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sources: dict[str, LiveSource | TableLiveSource] = {}
        self.started_at = time.time()
        self._broker: Any = None
        self._api: Any = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._metrics_server: Any = None
        self.registry: Any = None
        self.spark: Any = None
        #: Jobs' Spark work (deadlines, in-flight markers) and the JVM's watchdog (with Spark only).
        self.work: Any = None
        self.watchdog: Any = None
        #: Resets of the Kafka sources stopped for good (``runtime/source_reset.py``; valid after start).
        self.resets: Any = None
        #: Why Spark's JVM is gone (None while it answers); the process then exits with ``exit_code``.
        self.jvm_error: str | None = None
        self.exit_code = 0
        from source_backfill.runtime.dry_run import HistoryRates

        #: History rates the source's unlimited jobs reached, create to finish (the dry run's estimate).
        self.history_rates = HistoryRates()

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the registry, Spark (for Kafka sources), the sources (recovering their jobs), API, metrics.

        If any of it fails, what was started is stopped again (sources, API, broker) before the error
        is raised, so a failed start leaves no query, port or broker process behind.
        """
        try:
            self._start()
        except BaseException:
            logger.exception("daemon start failed, releasing what was started")
            self.stop()
            raise
        self._started.set()

    def _start(self) -> None:
        from connectors.kafka.factory import connector_class
        from source_backfill.api.access import Authenticator
        from source_backfill.api.app import create_app, create_metrics_app
        from source_backfill.api.server import ApiServer
        from source_backfill.executors.spark_work import LEDGER_DIR, SparkWork, WorkLedger
        from source_backfill.runtime.registry import JobRegistry
        from source_backfill.runtime.spark import (
            build_spark,
            daemon_conf,
            warm_history_copy,
            warm_table_copy,
        )
        from source_backfill.runtime.watchdog import JvmWatchdog

        cfg = self.settings
        self.auth = Authenticator.from_config(cfg.api)  # first: a principals file that does not load stops it
        metrics.configure_per_split(cfg.metrics.per_split_policy())  # before any job publishes
        root = cfg.daemon.state_root
        root.mkdir(parents=True, exist_ok=True)
        # a job's sink may not be a delta source's table either (it would write into what it reads)
        tables = [Path(s.table_path) for s in cfg.sources if s.kind == "delta" and s.table_path]
        self.registry = JobRegistry(root, [s.name for s in cfg.sources], data_root=cfg.daemon.data_root,
                                    check_spec=self._check_spec, protected_paths=tables,
                                    check_repair=self._check_repair,
                                    check_retransform=self._check_retransform, namespaces=cfg.namespaces,
                                    audit=True)
        for spec in cfg.jobs:
            try:
                self.registry.ensure(spec)
            except ConfigError as exc:  # edited in the file after it was registered: the registry wins
                logger.warning('config job differs from the registered one, keeping the registered spec '
                               'job="%s" detail="%s" (use the API to throttle, or drop and re-create)',
                               spec.name, exc)
        from source_backfill.runtime.source_reset import SourceResets

        self.resets = SourceResets(self.registry, root, {s.name: s for s in cfg.sources}, self.sources,
                                   self._restarted_source)
        self.resets.finish_pending()  # a reset a crash cut short: its folder moved before the source starts
        ledger = WorkLedger(root / LEDGER_DIR)
        self._quarantine(ledger)
        # delta sources read with delta-rs: no Spark, unless their large copies are to run on it
        if any(s.kind == "kafka" for s in cfg.sources) or (
                cfg.spark.tables and any(s.kind == "delta" for s in cfg.sources)):
            python = any(s.kind == "kafka" and connector_class(s).python_workers for s in cfg.sources)
            conf = daemon_conf(cfg.spark.conf, kafka=any(s.kind == "kafka" for s in cfg.sources))
            self.spark = build_spark(cfg.spark.master, "source-backfill", conf, python_sources=python)
            if python:
                warm_history_copy(self.spark)  # the Python connector's read ahead runs in Python workers
            if any(s.kind == "delta" and s.spark_copy_rows is not None for s in cfg.sources):
                warm_table_copy(self.spark)  # their large copies run on Spark
            self.watchdog = JvmWatchdog(self.spark, self._jvm_died)
            self.work = SparkWork(self.spark, ledger, alive=self.watchdog.alive)
            self.watchdog.ticks = (self.work.tick,)
            self.watchdog.start()
            metrics.SPARK_JVM_UP.set(1)
            self._check_registered_transforms()
        for source in cfg.sources:
            if source.kind == "delta":
                from source_backfill.runtime.table_source import TableLiveSource

                table_source = TableLiveSource(source, self.registry, self.spark)
                self.sources[source.name] = table_source
                table_source.start()
                continue
            live = self._kafka_source(source)
            self.sources[source.name] = live  # before start: a failed start still stops its query
            live.start()
        if cfg.metrics.port is not None:  # uvicorn like the API, with its connection limits
            self._metrics_server = ApiServer(create_metrics_app(), cfg.api.host, cfg.metrics.port,
                                             limits=self._server_limits(), name="metrics")
            self._metrics_server.start()
            logger.info('metrics served url="%s/metrics"', self._metrics_server.url)
        from source_backfill.runtime.paths import redact
        from source_backfill.runtime.verifications import Verifications

        app = create_app(
            self.registry, health=self.health, guard_reads=cfg.api.guard_reads, auth=self.auth,
            max_body_bytes=cfg.api.max_body_bytes, allowed_hosts=cfg.api.served_hosts,
            verifications=Verifications(self._verify_work, lambda text: redact(text, root)),
            dry_run=self._dry_run, reset_source=self.resets.reset,
        )
        self._api = ApiServer(app, cfg.api.host, cfg.api.port, limits=self._server_limits())
        self._api.start()
        threading.Thread(target=self._watch_lag, name="epoch-lag", daemon=True).start()
        threading.Thread(target=self._watch_history_rates, name="history-rates", daemon=True).start()
        logger.info('daemon started api="%s" sources=%d', self._api.url, len(self.sources))

    def _kafka_source(self, config: SourceConfig) -> LiveSource:
        """A Kafka source of the daemon, built (not started): its admin client and connector."""
        from connectors.kafka.admin import KafkaAdmin
        from connectors.kafka.factory import connector_for
        from connectors.kafka.security import librdkafka_options
        from source_backfill.runtime.source import LiveSource

        bootstrap = self._bootstrap(config.bootstrap_servers)
        admin = KafkaAdmin(bootstrap, librdkafka_options(config))
        root = Path(self.settings.daemon.state_root)
        return LiveSource(config, self.spark, self.registry, admin, state_root=root,
                          connector=connector_for(config, bootstrap, self.spark, admin), work=self.work)

    def _restarted_source(self, config: SourceConfig) -> LiveSource:
        """A Kafka source built again by its reset: its epochs start from 0 (the estimates forget the old)."""
        self.history_rates.forget_epochs(config.name)
        return self._kafka_source(config)

    def reload_credentials(self) -> bool:
        """Read ``api.principals_file`` again (SIGHUP): rotated tokens take effect, no restart."""
        auth = getattr(self, "auth", None)
        loaded = auth.reload() if auth is not None else True
        logger.info("credentials reloaded ok=%s", loaded)
        return loaded

    def _server_limits(self) -> Any:
        """The API's connection limits (the metrics port gets the same)."""
        from source_backfill.api.server import ServerLimits

        api = self.settings.api
        return ServerLimits(header_timeout_s=api.header_timeout_s, body_timeout_s=api.body_timeout_s,
                            keep_alive_timeout_s=api.keep_alive_timeout_s,
                            max_connections=api.max_connections, max_header_bytes=api.max_header_bytes)

    def _quarantine(self, ledger: Any) -> None:
        """Count the crashes of the last run against the jobs in flight; fail those at the limit.

        A job whose Spark work was in flight at ``quarantine_after_crashes`` crashes in a row is failed
        now, durably, before its source builds it: a transform that takes the JVM down cannot do it again
        and again. ``retry`` runs it again (its count starts from 0).
        """
        limit = self.settings.daemon.quarantine_after_crashes
        crashes = ledger.recover({r.name for r in self.registry.list()})
        for name, crash in crashes.items():
            metrics.JOB_CRASHES.labels(name).set(crash.count)
            record = self.registry.get(name)
            quarantined = crash.count >= limit
            metrics.JOB_QUARANTINED.labels(name).set(1 if quarantined else 0)
            if quarantined and record.error is None:
                self.registry.set_failed(name, (
                    f"quarantined: its Spark work was in flight at {crash.count} crashes in a row "
                    f"(daemon.quarantine_after_crashes = {limit}); last: {crash.last}. Fix its transform "
                    "(or its data), then retry it"))

    def _jvm_died(self, reason: str) -> None:
        """The watchdog found Spark's JVM gone: record who was in flight, fail liveness, stop the daemon."""
        jobs = self.work.ledger.jvm_died(reason) if self.work is not None else []
        self.jvm_error = reason
        self.exit_code = EXIT_JVM_GONE
        metrics.SPARK_JVM_UP.set(0)
        logger.error('Spark JVM is gone, the daemon exits so that its supervisor restarts it reason="%s" '
                     'exit_code=%d jobs_in_flight="%s"', reason, EXIT_JVM_GONE, ",".join(jobs))
        self._stop.set()

    def _check_spec(self, spec: JobSpec) -> None:
        """A new job must suit its source's kind and pass the transform check (else a 422 naming why).

        ConfigError for the kind, TransformError naming the construct a transform may not use.
        """
        try:
            check_job_fits_source(spec, self.settings.source(spec.source))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if spec.transform is not None and self.spark is not None:
            from source_backfill.executors.transform import check_transform

            check_transform(self.spark, spec.transform)

    def _check_retransform(self, spec: JobSpec) -> None:
        """A job's new transform: a create's checks, and the table's columns kept (``job_checks``)."""
        from source_backfill.runtime.job_checks import check_retransform

        self._check_spec(spec)
        check_retransform(self.spark, self.registry.get(spec.name).spec, spec)

    def _check_repair(self, spec: JobSpec, repair: RepairSpec) -> None:
        """A repair of a job (``job_checks``): a Kafka job that committed, its table matched by position."""
        from source_backfill.runtime.job_checks import check_repair

        check_repair(spec, repair, self.settings.source(spec.source),
                     failed=self.registry.get(spec.name).error is not None)

    def _dry_run(self, spec: JobSpec) -> dict[str, Any]:
        """Every check of a create (nothing recorded), then the plan of the job on its source."""
        from source_backfill.runtime.dry_run import plan_kafka_job, plan_table_job

        self.registry.check_create(spec)
        source = self.sources.get(spec.source)
        config = self.settings.source(spec.source)
        table = getattr(source, "table", None)
        if table is not None:
            return plan_table_job(spec, config, table, spark=self.spark is not None)
        admin = getattr(source, "admin", None)
        if source is None or admin is None:
            return {"measured_note": "the source is not running: nothing estimated"}
        return plan_kafka_job(spec, config, admin, self.history_rates)

    def _watch_history_rates(self) -> None:
        """Feed :attr:`history_rates` with every source's epoch and job's history rows, 4 times a second."""
        while not self._stop.wait(0.25):
            try:
                for name, source in self.sources.items():
                    self.history_rates.observe_epoch(name, source.last_epoch, source.last_epoch_at)
                for record in self.registry.list():
                    progress = self.registry.progress(record.name)
                    if progress is not None:
                        self.history_rates.observe(
                            record.source, record.name, progress.status, progress.rows_history,
                            created_at=record.created_at.timestamp(), limited=record.rate_limit is not None)
            except Exception:  # noqa: BLE001 - an estimate's input: never the daemon's problem
                logger.debug("history rates not observed", exc_info=True)

    def _verify_work(self, name: str) -> Any:
        """What a verify run of job ``name`` does, after the quick checks (VerifyRefusedError says why not).

        A Kafka job: its table against the log up to its committed positions (:func:`verify_job`). A job
        on a delta source in merge mode, once it follows the source live: its table against the source at
        the version it caught up to, row for row by key (:func:`verify_table_job`).
        """
        from source_backfill.config import RawFormat
        from source_backfill.errors import VerifyRefusedError
        from source_backfill.verify import check_verifiable, table_job_version, verify_job, verify_table_job

        record = self.registry.get(name)
        spec = record.spec
        config = self.settings.source(spec.source)
        if config.kind == "delta":
            if (spec.mode or "merge") != "merge":
                msg = (f'job "{name}" writes a changelog: verify compares a merged copy with its source '
                       "(replay the changelog to compare it)")
                raise VerifyRefusedError(msg)
            table_job_version(spec.sink_path, name)
            source_path, key = str(config.table_path), list(config.primary_key or ())
            return lambda: verify_table_job(spec.sink_path, name, source_path, key)
        from source_backfill.runtime.source import LiveSource

        source = self.sources.get(record.source)
        if not isinstance(source, LiveSource):
            msg = f'job "{name}" reads source "{record.source}", which is not running here'
            raise VerifyRefusedError(msg)
        admin = source.admin
        check_verifiable(spec.sink_path, name)
        from connectors.kafka.security import librdkafka_options

        bootstrap, options = source.bootstrap_servers, librdkafka_options(source.config)
        archives = config.archives if spec.history_source != "kafka" else []

        def run() -> Any:  # noqa: ANN401 - a VerifyResult
            held = for_timestamp = None
            if archives:  # the archive tier: the archives stand for the log below the log start
                from connectors.delta.archive import archive_holdings, offsets_for_timestamp
                from source_backfill.core.tiers import merged

                held = merged(archive_holdings(a.path, unique_offsets=a.trusted).held for a in archives)

                def for_timestamp(splits: list[str], ts_ms: int) -> dict[str, int]:  # as the attach did
                    return offsets_for_timestamp(admin, [(a.path, None) for a in archives], splits, ts_ms)
            also = [spec.dead_letter_path] if spec.dead_letter_path else []  # each offset in one of two
            # contents are the log's where nothing changed them: no transform, values not decoded
            contents = spec.transform is None and isinstance(spec.format, RawFormat)
            return verify_job(spec.sink_path, name, admin, bootstrap, options, start=spec.start, archive=held,
                              for_timestamp=for_timestamp, also=also, contents=contents)

        return run

    def _check_registered_transforms(self) -> None:
        """Check every registered job's transform once Spark is up, here and not in an epoch.

        A job registered before Spark started (the config file's jobs) or under an older allow-list is
        checked again; a refused transform fails its job durably (``retry`` re-checks it) instead of
        reaching Spark.
        """
        from source_backfill.errors import TransformError
        from source_backfill.executors.transform import check_transform

        for record in self.registry.list():
            spec = record.spec
            if spec.transform is None or record.error is not None:
                continue
            try:
                check_transform(self.spark, spec.transform)
            except TransformError as exc:
                self.registry.set_failed(spec.name, f"transform refused: {exc}")

    @property
    def api_url(self) -> str:
        """The control API's base URL (valid after start)."""
        return str(self._api.url)

    @property
    def metrics_url(self) -> str | None:
        """The separate metrics port's base URL (valid after start), None when metrics.port is off."""
        return str(self._metrics_server.url) if self._metrics_server is not None else None

    def stop(self) -> None:
        """Stop sources after their running epoch, then the API, the embedded broker last.

        With Spark's JVM gone the sources are left as they are: no epoch can finish, and everything
        committed is in the jobs' tables.
        """
        self._stop.set()
        if self.jvm_error is None:
            if self.spark is not None:
                from source_backfill.runtime.spark import quiet_cancelled_writes

                quiet_cancelled_writes(self.spark)
            self._stop_sources(self.settings.daemon.shutdown_timeout_s)
        if self.watchdog is not None:
            self.watchdog.stop()
        if self._api is not None:
            self._api.stop()
        if self._metrics_server is not None:
            self._metrics_server.stop()
            self._metrics_server = None
        if self._broker is not None:
            self._broker.stop()
        logger.info("daemon stopped")

    def _stop_sources(self, timeout_s: float) -> None:
        """Stop every source at once (each cancels its busy lanes' Spark work, then waits for its epoch).

        One after another, a daemon of many busy sources took their timeouts' sum to stop.
        """
        threads = [threading.Thread(target=source.stop, args=(timeout_s,), name=f"stop-{name}", daemon=True)
                   for name, source in self.sources.items()]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout_s + 5
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        late = [thread.name for thread in threads if thread.is_alive()]
        if late:
            logger.warning("sources still stopping at the shutdown deadline, leaving them: %s",
                           ",".join(late))

    def wait(self) -> None:
        """Block until :meth:`stop` is called (or a signal arrives, or Spark's JVM is gone)."""
        from source_backfill.runtime.watchdog import STALL_S

        while not self._stop.wait(0.5):
            if self.watchdog is not None and self.watchdog.stalled_s() > STALL_S:
                self.watchdog.declare_dead(f"the py4j gateway did not answer for {STALL_S:g} s")

    def health(self) -> dict[str, Any]:
        """Per-source health; ``ok`` is False while a source's query keeps failing or its epochs stall.

        ``ready``: every source has completed an epoch since start and is healthy (Kubernetes readiness).
        Failed jobs are listed but do not make the daemon unhealthy: the other jobs go on.
        """
        stale = self.settings.daemon.stale_after_intervals
        sources = {name: s.health(stale) for name, s in self.sources.items()}
        live = self.jvm_error is None
        ok = live and all(s["healthy"] for s in sources.values())
        ready = ok and self._started.is_set() and all(s["ready"] for s in sources.values())
        degraded = any(s.get("degraded") for s in sources.values())
        state = "unhealthy" if not ok else "degraded" if degraded else "ok"
        return _redacted_dict({"ok": ok, "status": state, "ready": ready, "live": live,
                               "jvm_error": self.jvm_error,
                          "uptime_s": round(time.time() - self.started_at, 1), "sources": sources},
                         self.settings.daemon.state_root)

    def _bootstrap(self, configured: str) -> str:
        if configured != EMBEDDED:
            return configured
        if self._broker is None:
            from connectors.kafka.embedded import EmbeddedBroker

            # its log under state_root: a restarted daemon finds its topics (and their offsets) again
            self._broker = EmbeddedBroker(log_dir=Path(self.settings.daemon.state_root) / "kafka")
            self._broker.start()
        return str(self._broker.bootstrap)

    def _watch_lag(self) -> None:
        ticks = 0
        while not self._stop.wait(1.0):
            for name, source in self.sources.items():
                if source.last_epoch_at is not None:
                    metrics.EPOCH_LAG.labels(name).set(time.time() - source.last_epoch_at)
            ticks += 1
            if ticks % PARTITION_WATCH_TICKS == 0:
                self._watch_partitions()

    def _watch_partitions(self) -> None:
        """Each Kafka source's partitions without a leader or under-replicated: its ``degraded`` state."""
        for name, source in list(self.sources.items()):
            admin = getattr(source, "admin", None)
            if admin is None or self._stop.is_set():
                continue
            config = source.config
            seen = admin.partition_health(config.topics, config.topic_pattern, timeout_s=2.0)
            if seen is None:  # no answer: a broker outage shows in the source's own errors
                continue
            metrics.KAFKA_PARTITIONS_NO_LEADER.labels(name).set(len(seen.no_leader))
            metrics.KAFKA_PARTITIONS_UNDER_REPLICATED.labels(name).set(len(seen.under_replicated))
            problems = tuple(seen.problems())
            if problems != source.degraded:
                if problems:
                    logger.warning('source degraded source="%s" why="%s"', name, "; ".join(problems))
                else:
                    logger.info('source no longer degraded source="%s"', name)
            source.degraded = problems


def _redacted_dict(value: dict[str, Any], state_root: Path) -> dict[str, Any]:
    """A health dict with no path of the daemon's own spelled out (:func:`_redacted`)."""
    return {k: _redacted(v, state_root) for k, v in value.items()}


def _redacted(value: Any, state_root: Path) -> Any:
    """``value`` (health's dicts, lists and texts) with no path of the daemon's own spelled out."""
    from source_backfill.runtime.paths import redact

    if isinstance(value, str):
        return redact(value, state_root)
    if isinstance(value, dict):
        return _redacted_dict(value, state_root)
    if isinstance(value, list):
        return [_redacted(v, state_root) for v in value]
    return value


def run_daemon(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT; return the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    daemon = Daemon(settings)

    def _signal(signum: int, _frame: Any) -> None:
        logger.info("signal received signum=%d, stopping", signum)
        daemon._stop.set()  # noqa: SLF001 - the handler only flips the flag; stop() runs below

    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)
    signal.signal(signal.SIGHUP, lambda _signum, _frame: daemon.reload_credentials())
    daemon.start()
    signal.signal(signal.SIGINT, _signal)  # Spark's context replaced it with one raising KeyboardInterrupt
    try:
        daemon.wait()
        if daemon.exit_code:  # the JVM is gone: whatever hangs while stopping, the process exits
            deadline = threading.Timer(JVM_GONE_EXIT_S, os._exit, [daemon.exit_code])
            deadline.daemon = True
            deadline.start()
    finally:
        daemon.stop()
    if daemon.exit_code:
        logging.shutdown()
        os._exit(daemon.exit_code)  # no interpreter teardown: pyspark's exit hooks call the dead JVM
    return 0
