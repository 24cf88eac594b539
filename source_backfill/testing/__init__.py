"""A pytest plugin to test pipelines against a real broker and a real daemon (``-p source_backfill.testing``).

Fixtures:

* ``kafka_bootstrap`` (session): ``KAFKA_BOOTSTRAP_SERVERS`` when set; else a KRaft Kafka container
  started with testcontainers when a Docker engine answers (``DOCKER_HOST``, e.g. podman's socket) and its
  image can be had: ``SOURCE_BACKFILL_KAFKA_IMAGE``, default :data:`KAFKA_IMAGE` (the official
  ``apache/kafka`` at the broker version this project pins); else the embedded Apache Kafka broker (one
  KRaft node on loopback; its jars come from ``make jars`` or ``SOURCE_BACKFILL_JARS``), saying why in one
  line when an engine answered.
* ``backfill_daemon``: a factory starting ``source-backfill run`` as a real process on a free API port
  with a temporary state root, configured with the ``sources`` and ``jobs`` you pass (the same keys as the
  TOML file); stopped after the test. Its :class:`RunningDaemon` creates jobs, waits for them to finish
  and knows where their tables are.
* ``assert_exactly_once``: ``assert_exactly_once(daemon, job)`` checks, offset by offset, that the job's
  Delta table holds its topics' records exactly once (missing, duplicated and unexpected records named),
  retrying while the job catches up.
* ``secured_broker`` (session): an embedded broker whose listener is ``SASL_SSL`` (SCRAM-SHA-512/256, TLS
  from a private CA made for it) with ACLs on; user ``alice`` is granted everything, ``add_user`` makes
  users with nothing granted. ``secured_broker.client_security("alice")`` is what the daemon's
  ``security`` section takes, ``secured_broker.librdkafka_config("alice")`` a confluent-kafka config.
* ``mtls_broker`` (session): an embedded broker whose listener is ``SSL`` and requires a client
  certificate (signed by its CA; one per user, ``alice`` made), no ACLs.

  Both are started on first use only (the embedded broker: jars from ``make jars`` or
  ``SOURCE_BACKFILL_JARS``, ``java`` and ``openssl`` on ``PATH``); see :func:`secured_kafka`.
* ``schema_registry`` (session): the URL of a Confluent-compatible Schema Registry, what
  ``SchemaRegistryClient({"url": ...})`` takes: ``SCHEMA_REGISTRY_URL`` when set; else an embedded Apicurio
  Registry (in memory, global compatibility ``BACKWARD`` as Confluent's default), built on first use
  with Maven from ``deploy/schema-registry/`` of a checkout (``make registry``;
  ``SOURCE_BACKFILL_REGISTRY_SOURCES`` names those sources elsewhere) and cached beside the jars; see
  :func:`schema_registry_url`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from source_backfill.testing.process import DaemonProcess, free_port

if TYPE_CHECKING:
    from connectors.kafka.cluster import EmbeddedCluster
    from connectors.kafka.embedded import EmbeddedBroker

#: The Kafka image of the testcontainers path (``SOURCE_BACKFILL_KAFKA_IMAGE`` overrides it): the official
#: Apache Kafka image at the broker version pinned in deploy/jvm/pom.xml. It is configured by environment
#: (KRaft, one node), so an image reading the same settings stands in for it (``make test-containers``
#: builds ``localhost/apache-kafka-standin:<version>`` from the pinned jars).
KAFKA_IMAGE = "apache/kafka:4.1.1"

#: Label of the containers the kit starts (so a run killed before its cleanup leaves findable ones).
CONTAINER_LABEL = "io.source-backfill.test-kit"

logger = logging.getLogger(__name__)


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:  # noqa: BLE001 - no docker package, no engine, no permission: all mean no
        return False
    return True


def kafka_image() -> str:
    """The testcontainers path's Kafka image: ``SOURCE_BACKFILL_KAFKA_IMAGE``, else :data:`KAFKA_IMAGE`."""
    return os.environ.get("SOURCE_BACKFILL_KAFKA_IMAGE") or KAFKA_IMAGE


def _image_missing(image: str) -> str | None:
    """``None`` when the engine has ``image`` or pulls it now; else why not, in one line."""
    import docker

    client = docker.from_env(timeout=120)
    try:
        client.images.get(image)
        return None
    except docker.errors.ImageNotFound:
        pass
    except Exception as exc:  # noqa: BLE001 - an engine that cannot answer this has no image for us
        return _one_line(exc)
    try:
        # the stream, not images.pull: an engine may answer 200 and report the failure inside it (podman)
        for event in client.api.pull(image, stream=True, decode=True):
            if isinstance(event, dict) and event.get("error"):
                return _one_line(Exception(f"pull failed: {event['error']}"))
        client.images.get(image)
    except Exception as exc:  # noqa: BLE001 - no registry, no such tag, no permission: no image
        return _one_line(exc)
    return None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _fall_back(image: str, why: str) -> None:
    why = " ".join(why.split())
    line = (f"source_backfill.testing: a container engine answers but Kafka image {image!r} cannot be "
            f"had ({why}); using the embedded broker instead")
    logger.warning(line)
    warnings.warn(line, stacklevel=3)


@contextmanager
def kafka_container(image: str | None = None, startup_timeout_s: float = 120.0) -> Iterator[str]:
    """One KRaft Kafka node in a container (testcontainers), its bootstrap address for the duration.

    Settings by environment, as the official ``apache/kafka`` image reads them. The broker listens on a
    port free on this host, published as the same port, so the address it advertises is the one clients
    dial: no start script to rewrite after the port is known. The container is removed on exit.
    """
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.docker_client import DockerClient

    image = image or kafka_image()
    port = free_port()
    host = DockerClient().host()
    container = (
        DockerContainer(image)
        .with_bind_ports(port, port)  # as testcontainers publishes its ports: on the engine's interfaces
        .with_env("KAFKA_NODE_ID", "1")
        .with_env("KAFKA_PROCESS_ROLES", "broker,controller")
        .with_env("KAFKA_LISTENERS", f"PLAINTEXT://:{port},CONTROLLER://localhost:9093")
        .with_env("KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://{host}:{port}")
        .with_env("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT")
        .with_env("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT")
        .with_env("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
        .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS", "4")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR", "1")
        .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        .with_kwargs(labels={CONTAINER_LABEL: "kafka"})
    )
    container.start()
    try:
        bootstrap = f"{host}:{port}"
        _wait_metadata(bootstrap, startup_timeout_s, container)
        logger.info('kafka container started image="%s" bootstrap="%s"', image, bootstrap)
        yield bootstrap
    finally:
        container.stop()


def _wait_metadata(bootstrap: str, timeout_s: float, container: Any) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    last: object = None
    try:
        while time.monotonic() < deadline:
            try:
                if admin.list_topics(timeout=1).brokers:
                    return
            except Exception as exc:  # noqa: BLE001 - not ready yet
                last = exc
            time.sleep(0.3)
    finally:
        del admin  # no client left polling the broker once it is stopped
    logs = b"".join(container.get_logs()).decode(errors="replace")[-2000:]
    msg = f"the Kafka container at {bootstrap} did not answer within {timeout_s}s ({last}); log:\n{logs}"
    raise RuntimeError(msg)


@contextmanager
def kafka_broker() -> Iterator[str]:
    """A Kafka bootstrap address for the duration: the environment's, a container's, or an embedded one."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    if _docker_answers():
        image = kafka_image()
        why = _image_missing(image)
        if why is None:
            with kafka_container(image) as bootstrap:
                yield bootstrap
            return
        _fall_back(image, why)
    from connectors.kafka.embedded import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.bootstrap


@contextmanager
def schema_registry_url() -> Iterator[str]:
    """A Schema Registry's Confluent API URL for the duration: the environment's, or an embedded one.

    ``SCHEMA_REGISTRY_URL`` if set (used as it is: nothing is configured on it); else the embedded
    Apicurio Registry, built first if the cache lacks a build of the current sources (a minute or two on a
    fresh machine, a no-op after).
    """
    env = os.environ.get("SCHEMA_REGISTRY_URL")
    if env:
        yield env
        return
    from connectors.schema_registry.embedded import EmbeddedRegistry
    from source_backfill.runtime.schema_registry import build

    build()
    with EmbeddedRegistry() as registry:
        yield registry.url


@contextmanager
def secured_kafka(security: Literal["SASL_SSL", "SSL"] = "SASL_SSL", acls: bool = True,
                  users: tuple[str, ...] = ("alice",)) -> Iterator[EmbeddedBroker]:
    """A started secured embedded broker for the duration (see :class:`EmbeddedBroker`).

    Always the embedded broker, whatever ``KAFKA_BOOTSTRAP_SERVERS`` says: the test needs the CA, the
    users and their secrets, which only a broker made here has. With ``acls``, every user in ``users`` is
    granted everything (:meth:`EmbeddedBroker.grant_all`), so the ones a test adds later are the
    restricted ones.
    """
    from connectors.kafka.embedded import EmbeddedBroker

    with EmbeddedBroker(security=security, acls=acls, users=users, startup_timeout_s=180.0) as broker:
        if acls:
            for user in users:
                broker.grant_all(user)
        yield broker


class RunningDaemon(DaemonProcess):
    """A daemon started by the ``backfill_daemon`` fixture; ``tables`` holds the jobs' Delta tables."""

    def __init__(self, workdir: Path, bootstrap: str, sources: list[dict[str, Any]],
                 jobs: list[dict[str, Any]], settings: dict[str, Any]) -> None:
        port = free_port()
        self.bootstrap = bootstrap
        self.tables = workdir / "tables"
        self.sources = [{"bootstrap_servers": bootstrap, "trigger_interval_s": 0.5, **s} for s in sources]
        env = {
            "SOURCE_BACKFILL_DAEMON__STATE_ROOT": str(workdir / "state"),
            "SOURCE_BACKFILL_API__HOST": "127.0.0.1",
            "SOURCE_BACKFILL_API__PORT": str(port),
            "SOURCE_BACKFILL_METRICS__PORT": "off",
            "SOURCE_BACKFILL_SPARK__MASTER": "local[2]",
            "SOURCE_BACKFILL_SOURCES": json.dumps(self.sources),
            "SOURCE_BACKFILL_JOBS": json.dumps([self._with_sink(j) for j in jobs]),
        }
        for section, values in settings.items():
            for key, value in values.items():
                env[f"SOURCE_BACKFILL_{section.upper()}__{key.upper()}"] = (
                    value if isinstance(value, str) else json.dumps(value)
                )
        config = workdir / "daemon.toml"
        config.write_text("# settings come from SOURCE_BACKFILL_* variables set by the test kit\n")
        super().__init__(config, port, workdir / "daemon.log", env)

    def _with_sink(self, job: dict[str, Any]) -> dict[str, Any]:
        return {"sink_path": str(self.tables / job["name"]), **job}

    def topics(self, job: str) -> list[str]:
        """The topics of ``job``'s source."""
        return list(self._source_of(job)["topics"])

    def bootstrap_of(self, job: str) -> str:
        """The bootstrap servers of ``job``'s source (a source may name a cluster of its own)."""
        return str(self._source_of(job)["bootstrap_servers"])

    def kafka_options(self, job: str) -> dict[str, str]:
        """The options a librdkafka client of ``job``'s source takes: its ``kafka`` map and ``security``.

        On a secured cluster the checks read the log as the daemon does.
        """
        from connectors.kafka.security import librdkafka_options
        from source_backfill.config import SourceConfig

        return librdkafka_options(SourceConfig.model_validate(self._source_of(job)))

    def _source_of(self, job: str) -> dict[str, Any]:
        info = self.job(job)
        return next(s for s in self.sources if s["name"] == info["source"])

    def job(self, name: str) -> dict[str, Any]:
        """``GET /jobs/{name}`` (the job's status, rows, per-split progress)."""
        r = self.get(f"/jobs/{name}")
        if r is None or r.status_code != 200:
            msg = f"job {name!r} not readable: {None if r is None else r.text}"
            raise AssertionError(msg)
        return dict(r.json())

    def create_job(self, **spec: Any) -> dict[str, Any]:
        """``POST /jobs``; ``sink_path`` defaults to ``tables/<name>``."""
        # a create checks its transform with Spark: seconds on a busy machine, so no 5 s limit here
        r = self.request("POST", "/jobs", self._with_sink(spec), timeout_s=60.0)
        if r is None or r.status_code != 201:
            msg = f"job not created: {None if r is None else r.text}"
            raise AssertionError(msg)
        return dict(r.json())

    def wait_finished(self, name: str, timeout_s: float = 300.0) -> dict[str, Any]:
        """Block until ``name`` reports ``finished``; a failed job raises with its error."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.job(name)
            if job["status"] == "finished":
                return job
            if job["status"] == "failed":
                msg = f"job {name!r} failed: {job.get('error')}"
                raise AssertionError(msg)
            if time.monotonic() > deadline:
                msg = f"job {name!r} not finished within {timeout_s}s: {job['status']}; log:\n{self.tail()}"
                raise AssertionError(msg)
            time.sleep(0.5)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real Kafka for the session (see :func:`kafka_broker`)."""
    with kafka_broker() as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def secured_broker() -> Iterator[EmbeddedBroker]:
    """An embedded ``SASL_SSL`` broker with ACLs on for the session; ``alice`` granted everything."""
    with secured_kafka("SASL_SSL", acls=True) as broker:
        yield broker


@pytest.fixture(scope="session")
def mtls_broker() -> Iterator[EmbeddedBroker]:
    """An embedded ``SSL`` broker requiring client certificates for the session (``alice``'s made)."""
    with secured_kafka("SSL", acls=False) as broker:
        yield broker


@contextmanager
def kafka_cluster_of(nodes: int = 3) -> Iterator[EmbeddedCluster]:
    """``nodes`` embedded KRaft brokers for the duration (replication ``nodes``, ``min.insync.replicas`` 2).

    ``.bootstrap`` for clients and sources; ``kill(node)``, ``restart(node)``, ``leader(topic,
    partition)`` and ``in_sync(topic, partition)`` for failover tests (the controllers elect a new leader
    after the broker session timeout, 3 s here; Kafka's default is 9 s). Topics: create them with that
    replication factor, or on chosen nodes with ``create_topic(name, [[1, 2], [2, 1]])``. Quotas and
    moves (Kafka's Java admin, needs a JDK): ``set_client_quota({"consumer_byte_rate": ...})``,
    ``reassign(topic, {partition: [nodes]})`` then ``wait_reassigned``, and ``watch_fetch_throttle()``
    for which clients the brokers throttled (:mod:`connectors.kafka.cluster`).
    """
    from connectors.kafka.cluster import EmbeddedCluster

    with EmbeddedCluster(nodes, overrides={"broker.session.timeout.ms": "3000",
                                           "broker.heartbeat.interval.ms": "500"}) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[EmbeddedCluster]:
    """Three embedded KRaft brokers for the session (:func:`kafka_cluster_of`)."""
    with kafka_cluster_of(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """A Schema Registry's Confluent API URL for the session (see :func:`schema_registry_url`)."""
    with schema_registry_url() as url:
        yield url


@pytest.fixture
def backfill_daemon(kafka_bootstrap: str) -> Iterator[Callable[..., RunningDaemon]]:
    """``backfill_daemon(sources=[...], jobs=[...], **settings)``: a ready daemon process, stopped after."""
    started: list[RunningDaemon] = []
    workdirs: list[tempfile.TemporaryDirectory[str]] = []

    def start(sources: list[dict[str, Any]], jobs: list[dict[str, Any]] | None = None,
              **settings: dict[str, Any]) -> RunningDaemon:
        workdir = tempfile.TemporaryDirectory(prefix="backfill-daemon-")
        workdirs.append(workdir)
        daemon = RunningDaemon(Path(workdir.name), kafka_bootstrap, sources, jobs or [], settings)
        started.append(daemon)
        daemon.start()
        daemon.wait_ready()
        return daemon

    yield start
    for daemon in started:
        daemon.stop()
    for workdir in workdirs:
        workdir.cleanup()


@pytest.fixture
def assert_exactly_once() -> Callable[..., Any]:
    """``assert_exactly_once(daemon, job, timeout_s=120)``: the job's table holds its topics exactly once."""
    from source_backfill.verify import check_exactly_once

    def check(daemon: RunningDaemon, job: str, timeout_s: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout_s
        table = daemon.tables / job
        while True:
            report = None
            if (table / "_delta_log").exists():
                report = check_exactly_once(str(table), daemon.bootstrap_of(job), daemon.topics(job),
                                            kafka_options=daemon.kafka_options(job))
                if report.ok:
                    return report
            if time.monotonic() > deadline:
                detail = report.summary() if report is not None else "no table yet"
                msg = f"job {job!r} is not exactly once after {timeout_s}s:\n{detail}"
                raise AssertionError(msg)
            time.sleep(1.0)

    return check
