"""An embedded Apache Kafka broker: one KRaft node (broker + controller) as a subprocess on loopback.

Used by the tests, the benchmarks and ``make run`` when no ``KAFKA_BOOTSTRAP_SERVERS`` is configured and no
Docker engine answers. The broker's jars come from :func:`connectors.jars.broker_classpath`
(``make jars``). Its log lives in a temp folder that is removed at stop, or in ``log_dir`` when one is
given (``make run`` keeps it under ``state_root``, so a restarted demo keeps its topics and reuses its
ports when they are free). The broker runs in a process group of its own and is stopped with it; it also
gets SIGTERM if the Python process that started it dies (Linux ``PR_SET_PDEATHSIG``), so no stray ``java``
outlives a killed test run.

``security="SASL_SSL"`` or ``"SSL"`` starts a secured node instead (SCRAM users or client certificates,
TLS with a private CA, optionally ACLs; :mod:`connectors.kafka.embedded_security` says how), so the tests
can run clients and the daemon against a real secured broker: :meth:`EmbeddedBroker.client_security` is
what the daemon's ``security`` section takes, :meth:`EmbeddedBroker.librdkafka_config` a confluent-kafka
configuration.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from connectors.child_process import ChildServer, die_with_parent, free_port, java, port_free
from source_backfill.errors import BrokerUnavailableError, KafkaConnectorError

if TYPE_CHECKING:
    from connectors.kafka.embedded_security import BrokerSecurity
    from connectors.kafka.tls_material import Issued

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

_JVM_OPTS = ["-Xms128m", "-Xmx768m", "-XX:+UseG1GC", "-Xshare:auto", "-Djava.awt.headless=true"]
#: The JIT of a broker started for tests: C1 alone (the first tier) starts it sooner on 2 cores. A broker
#: measured for throughput (``full_jit=True``) compiles hot code with C2 as a production broker does.
_FAST_START = ["-XX:TieredStopAtLevel=1"]


def _java() -> str:
    return java("the embedded Kafka broker", KafkaConnectorError)


Security = Literal["PLAINTEXT", "SASL_SSL", "SSL"]


@dataclass(frozen=True)
class ClusterNode:
    """A node's place in a cluster of embedded brokers: its id, its ports, the quorum and cluster id."""

    node_id: int
    port: int
    controller_port: int
    #: ``controller.quorum.voters`` of the cluster: ``1@127.0.0.1:<port>,2@...``
    voters: str
    cluster_id: str
    #: ``process.roles``: ``broker,controller`` (each node both), or ``broker`` / ``controller`` alone (a
    #: cluster with a dedicated controller, whose brokers can all be down while it elects leaders)
    roles: str = "broker,controller"

    @property
    def broker(self) -> bool:
        """Whether the node serves clients (a controller alone has only its controller listener)."""
        return "broker" in self.roles


class EmbeddedBroker(ChildServer):
    """An Apache Kafka KRaft node on free 127.0.0.1 ports.

    >>> with EmbeddedBroker() as broker:  # doctest: +SKIP
    ...     print(broker.bootstrap)

    ``security``: ``PLAINTEXT`` (the default), ``SASL_SSL`` (SCRAM-SHA-512/256 users ``admin`` and
    ``users``) or ``SSL`` (mutual TLS: a client certificate per user). ``acls`` turns Kafka's
    ``StandardAuthorizer`` on with nothing allowed unless granted (:meth:`grant`); ``admin`` is a super
    user. A secured node also listens on :attr:`mismatch_bootstrap`, whose certificate names only
    ``wrong.example``, and has an untrusted CA's certificate in :attr:`untrusted_ca_file`.
    ``full_jit``: the broker's JVM compiles hot code with C2 as a production broker does (benchmarks);
    by default it stops at C1, which starts sooner.
    """

    def __init__(
        self,
        port: int | None = None,
        log_dir: str | Path | None = None,
        startup_timeout_s: float = 60.0,
        overrides: dict[str, str] | None = None,
        security: Security = "PLAINTEXT",
        acls: bool = False,
        users: Iterable[str] = ("alice",),
        full_jit: bool = False,
        node: ClusterNode | None = None,
    ) -> None:
        if acls and security == "PLAINTEXT":
            msg = "acls need a secured broker (security='SASL_SSL' or 'SSL'): PLAINTEXT has no principals"
            raise ValueError(msg)
        self.security: Security = security
        self._acls = acls
        self._users = list(users)
        self._jvm_opts = _JVM_OPTS if full_jit else [*_JVM_OPTS, *_FAST_START]
        self._secured: BrokerSecurity | None = None
        self._port = port
        self._keep = log_dir is not None
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._startup_timeout_s = startup_timeout_s
        self._overrides = dict(overrides or {})
        #: this node's place in a cluster (:class:`connectors.kafka.cluster.EmbeddedCluster`); None: alone
        self._node = node
        self._formatted = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: Path | None = None
        self.bootstrap = ""
        #: a secured node's listener whose certificate does not name the host (empty when PLAINTEXT)
        self.mismatch_bootstrap = ""
        self.controller_port = 0

    @property
    def log_dir(self) -> Path | None:
        """The folder holding the broker's data (and ``broker.out``, its console log)."""
        return self._log_dir

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self, wait: bool = True) -> EmbeddedBroker:
        """Format the log folder if new, start the broker and wait until a metadata request answers.

        ``wait=False``: return once the process runs (a cluster's nodes are all launched before any of
        them can answer: a node waits for a quorum of controllers); :meth:`wait_ready` then waits.
        """
        if self._proc is not None:
            return self
        from connectors.jars import broker_classpath

        classpath = broker_classpath()
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="kafka-embedded-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        port, cport, mport = self._ports()
        self.bootstrap = f"127.0.0.1:{port}"
        self.mismatch_bootstrap = f"127.0.0.1:{mport}" if mport else ""
        self.controller_port = cport
        if self.security != "PLAINTEXT":
            from connectors.kafka.embedded_security import BrokerSecurity

            self._secured = BrokerSecurity(self._log_dir / "security", self.security, self._acls, self._users)
            self._secured.prepare()
        props = self._write_config(port, cport, mport)
        data = self._log_dir / "data"
        formatted = (data / "meta.properties").exists()
        if not formatted:
            self._format(classpath, props)
        self._out = self._log_dir / "broker.out"
        with self._out.open("ab") as out:
            self._proc = subprocess.Popen(  # noqa: S603
                [_java(), *self._jvm_opts, f"-Dlog4j2.configurationFile={self._log_dir / 'log4j2.yaml'}",
                 "-cp", classpath, "kafka.Kafka", str(props)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - setsid + parent-death signal
            )
        self._formatted = formatted
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> EmbeddedBroker:
        """Wait until the started broker answers a metadata request (a failure stops it)."""
        assert self._proc is not None, "start() first"
        try:
            self._wait_ready()
            if self._formatted and self._secured is not None:  # a kept folder: users named since its format
                for user in self._secured.users:
                    self.add_user(user)
        except BaseException:
            self.stop()
            raise
        logger.info('embedded kafka started bootstrap="%s" pid="%s" log_dir="%s"',
                    self.bootstrap, self._proc.pid if self._proc else None, self._log_dir)
        return self

    def _ports(self) -> tuple[int, int, int]:
        """The broker, controller and (secured) mismatch ports: given, else a kept folder's if still free."""
        assert self._log_dir is not None
        saved = self._log_dir / "ports.json"
        secured = self.security != "PLAINTEXT"
        if self._node is not None:  # a cluster's node: its ports were chosen with the cluster's
            return self._node.port, self._node.controller_port, 0
        if self._port is None and saved.exists():
            with contextlib.suppress(ValueError, KeyError, OSError):
                old = json.loads(saved.read_text())
                mport = int(old.get("mismatch", 0)) if secured else 0
                if (port_free(old["broker"]) and port_free(old["controller"])
                        and (not secured or (mport and port_free(mport)))):
                    return int(old["broker"]), int(old["controller"]), mport
        taken = [self._port or free_port()]
        while len(taken) < (3 if secured else 2):
            new = free_port()
            if new not in taken:
                taken.append(new)
        port, cport = taken[0], taken[1]
        mport = taken[2] if secured else 0
        saved.write_text(json.dumps({"broker": port, "controller": cport, "mismatch": mport}))
        return port, cport, mport

    def _write_config(self, port: int, cport: int, mport: int) -> Path:
        assert self._log_dir is not None
        listeners = {
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        }
        if self._secured is not None:
            listeners = self._secured.broker_properties(port, mport, cport)
        if self._node is not None and not self._node.broker:  # a controller alone: its listener only
            listeners = {"listeners": f"CONTROLLER://127.0.0.1:{cport}"}
        elif self._node is not None and self._node.roles == "broker":  # its controller is another node's
            listeners = {"listeners": f"PLAINTEXT://127.0.0.1:{port}",
                         "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}"}
        node_id = 1 if self._node is None else self._node.node_id
        voters = f"1@127.0.0.1:{cport}" if self._node is None else self._node.voters
        conf = {
            **BROKER_DEFAULTS,
            **listeners,
            "node.id": str(node_id),
            "process.roles": "broker,controller" if self._node is None else self._node.roles,
            "controller.quorum.voters": voters,
            "log.dirs": str(self._log_dir / "data"),
            **self._overrides,
        }
        props = self._log_dir / "server.properties"
        props.touch(mode=0o600)  # a secured node's holds the key password and the admin's SCRAM password
        props.chmod(0o600)
        props.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        (self._log_dir / "log4j2.yaml").write_text(_LOG4J)
        return props

    def _format(self, classpath: str, props: Path) -> None:
        cmd = [_java(), "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", classpath, "kafka.tools.StorageTool",
               "format", f"--cluster-id={self._node.cluster_id if self._node else new_cluster_id()}", "-c",
               str(props), "--ignore-formatted"]
        # SCRAM users (secured mode): their passwords are on this short-lived command line only
        scram = self._secured.format_args() if self._secured is not None else []
        done = subprocess.run(cmd + scram, capture_output=True, text=True, check=False, timeout=120)  # noqa: S603
        if done.returncode != 0:
            out = done.stdout[-1500:] + done.stderr[-1500:]
            if self._secured is not None:
                for user in self._secured.users:
                    out = out.replace(self._secured.password(user), "***")
            msg = f"formatting the embedded Kafka log folder failed: {out}"
            raise BrokerUnavailableError(msg)

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self._startup_timeout_s
        last_error: object = None
        admin: Any = AdminClient(dict(self._admin_config()))
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                msg = f"Kafka exited with code {self._proc.returncode} during startup; log: {self.log_tail()}"
                raise BrokerUnavailableError(msg)
            if self._node is not None and not self._node.broker:  # no client listener: its port opens
                if not port_free(self.controller_port):
                    return
                last_error = "controller port not open yet"
                time.sleep(0.2)
                continue
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

    # -- secured mode: what clients need, users and ACLs -------------------------------------------------
    def _admin_config(self) -> dict[str, str]:
        if self._secured is None:
            return {"bootstrap.servers": self.bootstrap, "log_level": "0"}
        from connectors.kafka.embedded_security import ADMIN

        return {**self.librdkafka_config(ADMIN), "log_level": "0"}

    def _security(self) -> BrokerSecurity:
        if self._secured is None:
            state = "" if self.security == "PLAINTEXT" else ", not started"
            msg = f"this broker is {self.security}{state}: client settings need a started secured broker"
            raise KafkaConnectorError(msg)
        return self._secured

    def client_security(self, user: str = "alice", mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        """What a client needs to connect as ``user``, in the field names of the daemon's ``security``.

        ``protocol``; ``SASL_SSL``: ``mechanism``, ``username``, ``password_file``; ``SSL``:
        ``client_cert_file``, ``client_key_file``, ``key_password_file``; both: ``ca_file``. Paths are
        absolute; a password file holds the password without a newline.
        """
        return self._security().client_security(user, mechanism)

    def librdkafka_config(self, user: str = "alice", mechanism: str = "SCRAM-SHA-512",
                          hostname_mismatch: bool = False) -> dict[str, str]:
        """A confluent-kafka configuration connecting as ``user`` (secrets inline, for the tests' clients).

        ``hostname_mismatch``: to :attr:`mismatch_bootstrap`, whose certificate does not name the host.
        """
        bootstrap = self.mismatch_bootstrap if hostname_mismatch else self.bootstrap
        return self._security().librdkafka_config(user, bootstrap, mechanism)

    @property
    def ca_file(self) -> Path:
        """The private CA's certificate (secured mode)."""
        return self._security().ca_file

    def expired_certificate(self) -> Issued:
        """A server certificate for ``127.0.0.1`` and ``localhost`` signed by the broker's CA, expired.

        Valid on 1 January 2020 only: for a TLS listener a client trusting the CA must refuse as expired.
        """
        return self._security().ca.issue("expired", "127.0.0.1", ("DNS:localhost", "IP:127.0.0.1"),
                                         expired=True)

    @property
    def untrusted_ca_file(self) -> Path:
        """A CA certificate that signed nothing this broker presents: a client trusting it must fail."""
        return self._security().untrusted_ca_file

    def add_user(self, user: str, timeout_s: float = 60.0) -> str:
        """Make ``user``, without ACLs, and return its principal, ``User:<user>``.

        With ``acls`` on, such a user may connect and do nothing else. ``SASL_SSL``: SCRAM credentials sent
        by the admin, waited for until they authenticate; ``SSL``: a client certificate ``CN=<user>``
        signed by the broker's CA.
        """
        secured = self._security()
        secured.add_user(user)
        if secured.protocol == "SASL_SSL":
            from connectors.kafka import embedded_security

            embedded_security.upsert_scram(self._admin_config(), user, secured.password(user), timeout_s)
            embedded_security.wait_authenticates(self.librdkafka_config(user), timeout_s)
        return secured.principal(user)

    def revoke(self, user: str, timeout_s: float = 60.0) -> None:
        """Delete ``user``'s SCRAM credentials (``SASL_SSL``).

        Its connections fail at their next authentication (a broker started with
        ``connections.max.reauth.ms`` asks for one that often).
        """
        from connectors.kafka import embedded_security

        if self._security().protocol != "SASL_SSL":
            msg = "revoke deletes SCRAM credentials: a SASL_SSL broker's"
            raise KafkaConnectorError(msg)
        embedded_security.delete_scram(self._admin_config(), user, timeout_s)

    def grant(self, user: str, topic: str | None = None, group: str | None = None,
              operations: Iterable[str] = ("READ", "DESCRIBE"), timeout_s: float = 60.0) -> None:
        """Allow ``user`` ``operations`` on ``topic`` and on consumer ``group``; return once applied.

        ``operations``: confluent-kafka's ``AclOperation`` names (``READ``, ``DESCRIBE``, ``WRITE``,
        ``ALL``, ...); a name ``*`` means every topic or group.
        """
        from connectors.kafka import embedded_security

        secured = self._security()
        resources = [(kind, name) for kind, name in (("TOPIC", topic), ("GROUP", group)) if name is not None]
        embedded_security.grant(self._admin_config(), secured.principal(user), resources, list(operations),
                                timeout_s)

    def grant_all(self, user: str, timeout_s: float = 60.0) -> None:
        """Allow ``user`` everything on every topic, group, transactional id and the cluster.

        Not a super user for all that: ACLs it holds, so it acts as a fully granted client of a cluster
        with ACLs on, beside users granted less.
        """
        from connectors.kafka import embedded_security

        resources = [("TOPIC", "*"), ("GROUP", "*"), ("TRANSACTIONAL_ID", "*"), ("BROKER", "kafka-cluster")]
        embedded_security.grant(self._admin_config(), self._security().principal(user), resources, ["ALL"],
                                timeout_s)

    def _stopped(self) -> None:
        logger.info('embedded kafka stopped bootstrap="%s"', self.bootstrap)


def new_cluster_id() -> str:
    """A random Kafka cluster id (22 characters of URL-safe base64 of a UUID).

    About one id in 32 starts with ``-``; Kafka's argument parser would read such an id as an option
    (``--cluster-id: expected one argument``), so it is passed as ``--cluster-id=ID`` and a leading
    ``-`` is replaced as well.
    """
    import base64

    raw = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return "A" + raw[1:] if raw.startswith("-") else raw
