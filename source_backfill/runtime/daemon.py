"""The daemon: Spark, the live sources and their jobs, the control API and the metrics endpoint.

``run_daemon(settings)`` blocks until SIGTERM/SIGINT, then stops every source after its running epoch
(never half-committed) and shuts the API down.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from source_backfill import metrics
from source_backfill.config import EMBEDDED, JobSpec, Settings, check_job_fits_source
from source_backfill.errors import ConfigError

if TYPE_CHECKING:
    from source_backfill.runtime.source import LiveSource
    from source_backfill.runtime.table_source import TableLiveSource

logger = logging.getLogger(__name__)


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
        from connectors.kafka.admin import KafkaAdmin
        from source_backfill.api.app import create_app, create_metrics_app
        from source_backfill.api.server import ApiServer
        from source_backfill.runtime.registry import JobRegistry
        from source_backfill.runtime.source import LiveSource
        from source_backfill.runtime.spark import build_spark, warm_history_copy

        cfg = self.settings
        root = cfg.daemon.state_root
        root.mkdir(parents=True, exist_ok=True)
        # a job's sink may not be a delta source's table either (it would write into what it reads)
        tables = [Path(s.table_path) for s in cfg.sources if s.kind == "delta" and s.table_path]
        self.registry = JobRegistry(root, [s.name for s in cfg.sources], data_root=cfg.daemon.data_root,
                                    check_spec=self._check_spec, protected_paths=tables)
        for spec in cfg.jobs:
            try:
                self.registry.ensure(spec)
            except ConfigError as exc:  # edited in the file after it was registered: the registry wins
                logger.warning('config job differs from the registered one, keeping the registered spec '
                               'job="%s" detail="%s" (use the API to throttle, or drop and re-create)',
                               spec.name, exc)
        if any(s.kind == "kafka" for s in cfg.sources):  # delta sources read with delta-rs: no Spark
            python = any(s.kind == "kafka" and s.connector == "python" for s in cfg.sources)
            self.spark = build_spark(cfg.spark.master, "source-backfill", cfg.spark.conf,
                                     python_sources=python)
            if python:
                warm_history_copy(self.spark)  # the Python connector's read ahead runs in Python workers
            self._check_registered_transforms()
        for source in cfg.sources:
            if source.kind == "delta":
                from source_backfill.runtime.table_source import TableLiveSource

                table_source = TableLiveSource(source, self.registry)
                self.sources[source.name] = table_source
                table_source.start()
                continue
            bootstrap = self._bootstrap(source.bootstrap_servers)
            admin = KafkaAdmin(bootstrap, dict(source.kafka))
            live = LiveSource(
                source, self.spark, self.registry, admin, state_root=root, bootstrap_servers=bootstrap
            )
            self.sources[source.name] = live  # before start: a failed start still stops its query
            live.start()
        if cfg.metrics.port is not None:  # uvicorn like the API, with its connection limits
            self._metrics_server = ApiServer(create_metrics_app(), cfg.api.host, cfg.metrics.port,
                                             limits=self._server_limits(), name="metrics")
            self._metrics_server.start()
            logger.info('metrics served url="%s/metrics"', self._metrics_server.url)
        app = create_app(
            self.registry, cfg.api.token, health=self.health, guard_reads=cfg.api.guard_reads,
            max_body_bytes=cfg.api.max_body_bytes, allowed_hosts=cfg.api.served_hosts,
        )
        self._api = ApiServer(app, cfg.api.host, cfg.api.port, limits=self._server_limits())
        self._api.start()
        threading.Thread(target=self._watch_lag, name="epoch-lag", daemon=True).start()
        logger.info('daemon started api="%s" sources=%d', self._api.url, len(self.sources))

    def _server_limits(self) -> Any:
        """The API's connection limits (the metrics port gets the same)."""
        from source_backfill.api.server import ServerLimits

        api = self.settings.api
        return ServerLimits(header_timeout_s=api.header_timeout_s, body_timeout_s=api.body_timeout_s,
                            keep_alive_timeout_s=api.keep_alive_timeout_s,
                            max_connections=api.max_connections, max_header_bytes=api.max_header_bytes)

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
        """Stop sources after their running epoch, then the API, the embedded broker last."""
        self._stop.set()
        for source in self.sources.values():
            source.stop(self.settings.daemon.shutdown_timeout_s)
        if self._api is not None:
            self._api.stop()
        if self._metrics_server is not None:
            self._metrics_server.stop()
            self._metrics_server = None
        if self._broker is not None:
            self._broker.stop()
        logger.info("daemon stopped")

    def wait(self) -> None:
        """Block until :meth:`stop` is called (or a signal arrives)."""
        while not self._stop.wait(0.5):
            pass

    def health(self) -> dict[str, Any]:
        """Per-source health; ``ok`` is False while a source's query keeps failing or its epochs stall.

        ``ready``: every source has completed an epoch since start and is healthy (Kubernetes readiness).
        Failed jobs are listed but do not make the daemon unhealthy: the other jobs go on.
        """
        stale = self.settings.daemon.stale_after_intervals
        sources = {name: s.health(stale) for name, s in self.sources.items()}
        ok = all(s["healthy"] for s in sources.values())
        ready = ok and self._started.is_set() and all(s["ready"] for s in sources.values())
        return {"ok": ok, "ready": ready, "uptime_s": round(time.time() - self.started_at, 1),
                "sources": sources}

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
        while not self._stop.wait(1.0):
            for name, source in self.sources.items():
                if source.last_epoch_at is not None:
                    metrics.EPOCH_LAG.labels(name).set(time.time() - source.last_epoch_at)


def run_daemon(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT; return the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    daemon = Daemon(settings)

    def _signal(signum: int, _frame: Any) -> None:
        logger.info("signal received signum=%d, stopping", signum)
        daemon._stop.set()  # noqa: SLF001 - the handler only flips the flag; stop() runs below

    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)
    daemon.start()
    signal.signal(signal.SIGINT, _signal)  # Spark's context replaced it with one raising KeyboardInterrupt
    try:
        daemon.wait()
    finally:
        daemon.stop()
    return 0
