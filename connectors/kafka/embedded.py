"""An embedded Apache Kafka broker: one KRaft node (broker + controller) as a subprocess on loopback.

Used by the tests, the benchmarks and ``make run`` when no ``KAFKA_BOOTSTRAP_SERVERS`` is configured and no
Docker engine answers. The broker's jars come from :func:`connectors.jars.broker_classpath`
(``make jars``). Its log lives in a temp folder that is removed at stop, or in ``log_dir`` when one is
given (``make run`` keeps it under ``state_root``, so a restarted demo keeps its topics and reuses its
ports when they are free). The broker runs in a process group of its own and is stopped with it; it also
gets SIGTERM if the Python process that started it dies (Linux ``PR_SET_PDEATHSIG``), so no stray ``java``
outlives a killed test run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from source_backfill.errors import BrokerUnavailableError, KafkaConnectorError

logger = logging.getLogger(__name__)

#: Broker settings for one node on a laptop: replication 1 everywhere, no rebalance delay, small heap.
BROKER_DEFAULTS: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "log.retention.hours": "-1",
    "log.segment.bytes": str(64 << 20),
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
}

_LOG4J = """\
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        Pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
"""

_JVM_OPTS = ["-Xms128m", "-Xmx768m", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
             "-Djava.awt.headless=true"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker binds (TIME_WAIT is ok)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        msg = "java is not on PATH (and JAVA_HOME is unset): the embedded Kafka broker needs Java 17+"
        raise KafkaConnectorError(msg)
    return found


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class EmbeddedBroker:
    """An Apache Kafka KRaft node on free 127.0.0.1 ports.

    >>> with EmbeddedBroker() as broker:  # doctest: +SKIP
    ...     print(broker.bootstrap)
    """

    def __init__(
        self,
        port: int | None = None,
        log_dir: str | Path | None = None,
        startup_timeout_s: float = 60.0,
        overrides: dict[str, str] | None = None,
    ) -> None:
        self._port = port
        self._keep = log_dir is not None
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._startup_timeout_s = startup_timeout_s
        self._overrides = dict(overrides or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: Path | None = None
        self.bootstrap = ""
        self.controller_port = 0

    @property
    def log_dir(self) -> Path | None:
        """The folder holding the broker's data (and ``broker.out``, its console log)."""
        return self._log_dir

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> EmbeddedBroker:
        """Format the log folder if new, start the broker and wait until a metadata request answers."""
        if self._proc is not None:
            return self
        from connectors.jars import broker_classpath

        classpath = broker_classpath()
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="kafka-embedded-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        port, cport = self._ports()
        self.bootstrap = f"127.0.0.1:{port}"
        self.controller_port = cport
        props = self._write_config(port, cport)
        data = self._log_dir / "data"
        if not (data / "meta.properties").exists():
            self._format(classpath, props)
        self._out = self._log_dir / "broker.out"
        with self._out.open("ab") as out:
            self._proc = subprocess.Popen(  # noqa: S603
                [_java(), *_JVM_OPTS, f"-Dlog4j2.configurationFile={self._log_dir / 'log4j2.yaml'}",
                 "-cp", classpath, "kafka.Kafka", str(props)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - setsid + parent-death signal
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        logger.info('embedded kafka started bootstrap="%s" pid="%s" log_dir="%s"',
                    self.bootstrap, self._proc.pid, self._log_dir)
        return self

    def _ports(self) -> tuple[int, int]:
        """The broker and controller ports: given, else the ones a kept log folder used if still free."""
        assert self._log_dir is not None
        saved = self._log_dir / "ports.json"
        if self._port is None and saved.exists():
            with contextlib.suppress(ValueError, KeyError, OSError):
                old = json.loads(saved.read_text())
                if _port_free(old["broker"]) and _port_free(old["controller"]):
                    return int(old["broker"]), int(old["controller"])
        port = self._port or _free_port()
        cport = _free_port()
        while cport == port:
            cport = _free_port()
        saved.write_text(json.dumps({"broker": port, "controller": cport}))
        return port, cport

    def _write_config(self, port: int, cport: int) -> Path:
        assert self._log_dir is not None
        conf = {
            **BROKER_DEFAULTS,
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.quorum.voters": f"1@127.0.0.1:{cport}",
            "log.dirs": str(self._log_dir / "data"),
            **self._overrides,
        }
        props = self._log_dir / "server.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        (self._log_dir / "log4j2.yaml").write_text(_LOG4J)
        return props

    def _format(self, classpath: str, props: Path) -> None:
        cmd = [_java(), "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", classpath, "kafka.tools.StorageTool",
               "format", f"--cluster-id={_cluster_id()}", "-c", str(props), "--ignore-formatted"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)  # noqa: S603
        if done.returncode != 0:
            out = done.stdout[-1500:] + done.stderr[-1500:]
            msg = f"formatting the embedded Kafka log folder failed: {out}"
            raise BrokerUnavailableError(msg)

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self._startup_timeout_s
        last_error: object = None
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                msg = f"Kafka exited with code {self._proc.returncode} during startup; log: {self.log_tail()}"
                raise BrokerUnavailableError(msg)
            try:
                md = admin.list_topics(timeout=1)
                if md.brokers:
                    return
                last_error = "no broker registered yet"
            except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
                last_error = exc
            time.sleep(0.2)
        msg = (
            f"embedded Kafka at {self.bootstrap} did not answer metadata within "
            f"{self._startup_timeout_s}s ({last_error}); log: {self.log_tail()}"
        )
        raise BrokerUnavailableError(msg)

    def log_tail(self, chars: int = 2000) -> str:
        """The last ``chars`` characters of the broker's console log (for error messages)."""
        if self._out is None:
            return ""
        try:
            return self._out.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, kill: bool = False) -> None:
        """Stop the broker's process group (SIGTERM, then SIGKILL after 20 s; ``kill``: SIGKILL at once).

        A temp log folder is removed; a given ``log_dir`` is kept, so :meth:`start` resumes it.
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
            with contextlib.suppress(ProcessLookupError):  # anything left in its group
                os.killpg(proc.pid, signal.SIGKILL)
            logger.info('embedded kafka stopped bootstrap="%s"', self.bootstrap)
        if not self._keep and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    @property
    def running(self) -> bool:
        """Whether the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_id() -> str:
    """A random Kafka cluster id (22 characters of URL-safe base64 of a UUID).

    About one id in 32 starts with ``-``; Kafka's argument parser would read such an id as an option
    (``--cluster-id: expected one argument``), so it is passed as ``--cluster-id=ID`` and a leading
    ``-`` is replaced as well.
    """
    import base64

    raw = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return "A" + raw[1:] if raw.startswith("-") else raw
