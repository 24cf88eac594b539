"""Three (or more) embedded Kafka brokers as one KRaft cluster, for failover tests and the test kit.

Each node is an :class:`~connectors.kafka.embedded.EmbeddedBroker` process that is both broker and
controller (``process.roles = broker,controller``), all formatted with one cluster id and voting in one
controller quorum, so the cluster keeps a controller and partition leaders while a majority of nodes runs.
Topics are replicated to every node by default (``default.replication.factor`` = the node count) with
``min.insync.replicas = 2``: a producer with ``acks=all`` keeps writing while one node is down, as in
production.

``dedicated_controller=True`` starts one controller-only node (id ``nodes + 1``) beside ``nodes`` brokers
(``process.roles = broker``): the controller keeps electing partition leaders while any number of brokers
is down, which a quorum of broker+controller nodes cannot (two of three down lose the quorum). An unclean
leader election needs it: the last in-sync replica down, an out-of-sync one back (``tests/integration/
daemon/test_truncation.py``).

A node can be killed (SIGKILL, :meth:`EmbeddedCluster.kill`) and restarted on its kept folder and ports
(:meth:`EmbeddedCluster.restart`); :meth:`EmbeddedCluster.leader` says which node leads a partition now.
The nodes' folders live in one temporary folder, removed at :meth:`EmbeddedCluster.stop`.

What librdkafka's admin client cannot do (issue 49: broker quotas, partition reassignment) runs Kafka's
own Java Admin client from the broker's jars (``jvm/ClusterTool.java``, compiled once with the ``javac`` of
a JDK 17+): :func:`set_client_quota`, :func:`reassign_partitions` and :func:`partition_reassignments` take
any cluster's bootstrap; :class:`FetchThrottleWatch` reads the brokers' own quota metrics (JMX, attached
to the broker processes of this machine), so a test can tell which clients a broker throttled and for
how long. :meth:`EmbeddedCluster.create_topic` places a topic's replicas on chosen nodes,
:meth:`EmbeddedCluster.reassign` moves them and :meth:`EmbeddedCluster.wait_reassigned` waits until the
move is complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from connectors.child_process import die_with_parent, free_port, java
from connectors.kafka.embedded import ClusterNode, EmbeddedBroker, new_cluster_id
from source_backfill.errors import BrokerUnavailableError, KafkaConnectorError

logger = logging.getLogger(__name__)


def cluster_overrides(nodes: int) -> dict[str, str]:
    """Broker settings of a cluster of ``nodes``: replicated internal topics, two in-sync replicas."""
    isr = str(min(2, nodes))
    rf = str(nodes)
    return {
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "unclean.leader.election.enable": "false",
    }


#: The Java source of the admin calls and metrics librdkafka has no call for (see the module's docstring).
TOOL_SOURCE = Path(__file__).with_name("jvm") / "ClusterTool.java"
_TOOL_LOCK = threading.Lock()


def _javac() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").exists():
        return str(Path(home) / "bin" / "javac")
    found = shutil.which("javac")
    if found is None:
        msg = ("javac is not on PATH (and JAVA_HOME has none): the admin calls of connectors.kafka.cluster "
               "(client quotas, partition reassignments) need a JDK 17+, not a JRE")
        raise KafkaConnectorError(msg)
    return found


def _tool_classes() -> Path:
    """The folder of ``ClusterTool.class``: compiled once per source and jars, kept in the temp folder."""
    from connectors.jars import broker_classpath

    classpath = broker_classpath()
    digest = hashlib.sha256(TOOL_SOURCE.read_bytes() + classpath.encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"source-backfill-cluster-tool-{digest}"
    with _TOOL_LOCK:
        if (out / "ClusterTool.class").exists():
            return out
        work = Path(tempfile.mkdtemp(prefix=f"{out.name}.", dir=out.parent))
        done = subprocess.run([_javac(), "-nowarn", "-cp", classpath, "-d", str(work), str(TOOL_SOURCE)],
                              capture_output=True, text=True, check=False, timeout=300)
        if done.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            msg = f"compiling {TOOL_SOURCE.name} failed: {(done.stdout + done.stderr)[-1500:]}"
            raise KafkaConnectorError(msg)
        try:
            work.rename(out)  # atomic: a process compiling beside this one keeps its own or this one
        except OSError:
            shutil.rmtree(work, ignore_errors=True)  # another process's is there already
        return out


def _tool_command(*args: str) -> list[str]:
    from connectors.jars import broker_classpath

    classpath = f"{_tool_classes()}{os.pathsep}{broker_classpath()}"
    return [java("Kafka's admin client", KafkaConnectorError), "-Xmx128m", "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC", "-cp", classpath, "ClusterTool", *args]


def run_cluster_tool(*args: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Run ``ClusterTool`` with ``args`` (``jvm/ClusterTool.java`` lists its commands); its JSON lines.

    A failure raises :class:`KafkaConnectorError` with what the tool said.
    """
    done = subprocess.run(_tool_command(*args), capture_output=True, text=True, check=False,  # noqa: S603
                          timeout=timeout_s, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        msg = f"ClusterTool {args[0]} failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}"
        raise KafkaConnectorError(msg)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def set_client_quota(bootstrap: str, quotas: Mapping[str, float | None], *,
                     entity: Literal["clients", "users"] = "clients", name: str | None = None) -> None:
    """Set (or, with a ``None`` value, remove) client quotas on one entity of the cluster at ``bootstrap``.

    ``quotas``: Kafka's quota keys, e.g. ``{"consumer_byte_rate": 65536}`` (bytes per second, per broker:
    each broker throttles the traffic it serves itself). ``entity``: ``clients`` (by ``client.id``: each
    client id gets the quota of its own) or ``users`` (by principal; every client of the user shares it;
    unauthenticated clients are ``ANONYMOUS``); ``name`` ``None``: the entity type's default, which applies
    to every client id (or user) without a quota of its own. What ``kafka-configs.sh --alter --entity-type
    clients --entity-default --add-config consumer_byte_rate=...`` does (``Admin.alterClientQuotas``). The
    controller has accepted it on return; each broker applies it once it has read the metadata record.
    """
    if not quotas:
        msg = "set_client_quota: no quota given"
        raise ValueError(msg)
    ops = [f"{key}=" if value is None else f"{key}={float(value)!r}" for key, value in quotas.items()]
    run_cluster_tool("quota", bootstrap, entity, "-" if name is None else name, *ops)


def client_quotas(bootstrap: str) -> list[dict[str, Any]]:
    """Every client quota of the cluster: ``{"entity": {"client-id": None}, "quotas": {...}}`` each.

    An entity's ``None`` name is its type's default entity.
    """
    return run_cluster_tool("quotas", bootstrap)


def reassign_partitions(bootstrap: str, topic: str, replicas: Mapping[int, Sequence[int]]) -> None:
    """Start moving ``topic``'s partitions to new replicas: ``{partition: [node ids]}``, the first preferred.

    ``Admin.alterPartitionReassignments`` (what ``kafka-reassign-partitions.sh --execute`` sends): the
    controller adds the new replicas, which copy the log from the leader, then, once they are in sync,
    removes the old ones and elects a leader among the new if the old is gone. Returns once the controller
    accepted it: :func:`partition_reassignments` says which are still under way.
    """
    moves = [f"{p}={','.join(str(n) for n in nodes)}" for p, nodes in sorted(replicas.items())]
    run_cluster_tool("reassign", bootstrap, topic, *moves)


def partition_reassignments(bootstrap: str) -> dict[tuple[str, int], dict[str, list[int]]]:
    """The reassignments under way: ``(topic, partition)`` -> ``replicas``, ``adding``, ``removing``."""
    keys = ("replicas", "adding", "removing")
    return {(r["topic"], int(r["partition"])): {k: [int(n) for n in r[k]] for k in keys}
            for r in run_cluster_tool("reassigning", bootstrap)}


class FetchThrottleWatch:
    """The brokers' fetch quota metrics, per client, sampled while the watch runs.

    Kafka throttles a client over its ``consumer_byte_rate`` by delaying its next fetches (it answers, then
    mutes the connection; the client waits too, KIP-219) and keeps, per client id (user and client id with
    user quotas), a ``throttle-time`` (the average delay in the quota window, ms) and a ``byte-rate``: the
    metrics ``kafka.server:type=Fetch,user=...,client-id=...``. The watch attaches to each broker's JVM
    (``{node id: pid}``; local processes of the same user) and reads them every ``interval_s``, keeping each
    client's peak, since the window forgets within seconds. The clients of a quota entity default have a
    metric each once any quota is set.

    >>> with cluster.watch_fetch_throttle() as watch:  # doctest: +SKIP
    ...     ...  # read under a quota
    >>> watch.throttled()  # {(node, client id): peak throttle-time ms} of the clients it delayed
    """

    def __init__(self, brokers: Mapping[int, int], interval_s: float = 0.25,
                 ready_timeout_s: float = 120.0) -> None:
        self._brokers = dict(brokers)
        self._interval_ms = max(50, round(interval_s * 1000))
        self._ready_timeout_s = ready_timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._throttle: dict[tuple[int, str], float] = {}
        self._rate: dict[tuple[int, str], float] = {}
        self._error: list[str] = []

    def start(self) -> FetchThrottleWatch:
        """Attach to every broker; return once the first metrics can be read."""
        if self._proc is not None:
            return self
        pairs = [f"{node}={pid}" for node, pid in sorted(self._brokers.items())]
        self._proc = subprocess.Popen(  # noqa: S603
            _tool_command("watch-fetch", str(self._interval_ms), *pairs), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=die_with_parent)  # noqa: PLW1509 - its own group, SIGTERM if this process dies
        self._thread = threading.Thread(target=self._read, name="fetch-throttle-watch", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self._ready_timeout_s
        while not self._ready.wait(0.2):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                err = self._proc.stderr.read() if self._proc.stderr and self._proc.poll() is not None else ""
                self.stop()
                msg = f"the fetch quota watch did not attach to the brokers {pairs}: {err.strip()[-1500:]}"
                raise KafkaConnectorError(msg)
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if not line.startswith("{"):
                continue
            sample = json.loads(line)
            if "ready" in sample:
                self._ready.set()
                continue
            key = (int(sample["node"]), str(sample["client_id"]))
            with self._lock:
                delay, rate = float(sample.get("throttle_time", 0.0)), float(sample.get("byte_rate", 0.0))
                self._throttle[key] = max(self._throttle.get(key, 0.0), delay)
                self._rate[key] = max(self._rate.get(key, 0.0), rate)

    def throttled(self) -> dict[tuple[int, str], float]:
        """``{(node, client id): peak throttle-time ms}`` of the clients a broker delayed since the start."""
        with self._lock:
            return {k: v for k, v in self._throttle.items() if v > 0}

    def clients(self) -> dict[tuple[int, str], float]:
        """``{(node, client id): peak byte-rate}`` of every client seen fetching under a quota."""
        with self._lock:
            return dict(self._rate)

    def stop(self) -> None:
        """Stop the watch (its process ends when its stdin closes); what it saw stays readable."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> FetchThrottleWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EmbeddedCluster:
    """``nodes`` embedded KRaft nodes forming one cluster on free 127.0.0.1 ports.

    >>> with EmbeddedCluster() as cluster:  # doctest: +SKIP
    ...     print(cluster.bootstrap)  # every node's address, comma-separated
    """

    def __init__(self, nodes: int = 3, startup_timeout_s: float = 120.0, full_jit: bool = False,
                 overrides: dict[str, str] | None = None, dedicated_controller: bool = False) -> None:
        if nodes < 1:
            msg = f"a cluster needs a node, got {nodes}"
            raise ValueError(msg)
        self._count = nodes
        self._timeout = startup_timeout_s
        self._full_jit = full_jit
        self._overrides = {**cluster_overrides(nodes), **(overrides or {})}
        self._dedicated = dedicated_controller
        self._root: Path | None = None
        #: the controller-only node (``dedicated_controller``), else None
        self.controller: EmbeddedBroker | None = None
        #: the nodes by id (1, 2, 3, ...), whether running or killed
        self.nodes: dict[int, EmbeddedBroker] = {}

    @property
    def bootstrap(self) -> str:
        """Every node's ``host:port``, comma-separated (a client finds the others from any of them)."""
        return ",".join(n.bootstrap for n in self.nodes.values())

    def start(self) -> EmbeddedCluster:
        """Launch every node, then wait until each answers (a node waits for a quorum of controllers)."""
        if self.nodes:
            return self
        self._root = Path(tempfile.mkdtemp(prefix="kafka-cluster-"))
        ports: list[int] = []
        while len(ports) < 2 * (self._count + 1):
            port = free_port()
            if port not in ports:
                ports.append(port)
        cid = new_cluster_id()
        if self._dedicated:
            cid_node = self._count + 1
            voters = f"{cid_node}@127.0.0.1:{ports[2 * self._count + 1]}"
            self.controller = EmbeddedBroker(
                log_dir=self._root / "controller", overrides=self._overrides, startup_timeout_s=self._timeout,
                node=ClusterNode(cid_node, ports[2 * self._count], ports[2 * self._count + 1], voters, cid,
                                 roles="controller"))
        else:
            voters = ",".join(f"{i + 1}@127.0.0.1:{ports[2 * i + 1]}" for i in range(self._count))
        for i in range(self._count):
            node = ClusterNode(i + 1, ports[2 * i], ports[2 * i + 1], voters, cid,
                               roles="broker" if self._dedicated else "broker,controller")
            self.nodes[i + 1] = EmbeddedBroker(
                log_dir=self._root / f"node-{i + 1}", overrides=self._overrides,
                startup_timeout_s=self._timeout, full_jit=self._full_jit, node=node)
        every = [*([self.controller] if self.controller is not None else []), *self.nodes.values()]
        try:
            for broker in every:
                broker.start(wait=False)
            for broker in every:
                broker.wait_ready()
            self._wait_registered(self._count)
        except BaseException:
            self.stop()
            raise
        logger.info('embedded kafka cluster started nodes=%d bootstrap="%s"', self._count, self.bootstrap)
        return self

    def kill(self, node_id: int) -> None:
        """SIGKILL node ``node_id`` (its folder and ports are kept for :meth:`restart`)."""
        self.nodes[node_id].stop(kill=True)
        logger.info("embedded kafka node killed node=%d", node_id)

    def restart(self, node_id: int) -> None:
        """Start node ``node_id`` again on its folder and ports; return once the cluster counts it again."""
        self.nodes[node_id].start()
        self._wait_registered(sum(n.running for n in self.nodes.values()))

    def running(self) -> list[int]:
        """The ids of the nodes whose process runs."""
        return [i for i, n in self.nodes.items() if n.running]

    def leader(self, topic: str, partition: int) -> int:
        """The id of the node leading ``topic``'s ``partition`` now (-1: none)."""
        md = self._admin().list_topics(topic, timeout=10)
        return int(md.topics[topic].partitions[partition].leader)

    def in_sync(self, topic: str, partition: int) -> list[int]:
        """The ids of the partition's in-sync replicas now."""
        md = self._admin().list_topics(topic, timeout=10)
        return sorted(int(n) for n in md.topics[topic].partitions[partition].isrs)

    def replicas(self, topic: str, partition: int) -> list[int]:
        """The ids of the partition's replicas now, in the metadata's order.

        During a reassignment: the target's and the leaving ones.
        """
        md = self._admin().list_topics(topic, timeout=10)
        return [int(n) for n in md.topics[topic].partitions[partition].replicas]

    def create_topic(self, name: str, replicas: Sequence[Sequence[int]]) -> None:
        """Create ``name`` with a partition per entry of ``replicas``, on those nodes (the first leads)."""
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        admin = self._admin()  # kept until the answer: a client destroyed meanwhile fails its futures
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=len(replicas), replica_assignment=[list(r) for r in replicas])],
            operation_timeout=30)
        futures[name].result(60)
        deadline = time.monotonic() + self._timeout

        def led() -> bool:  # the metadata may not list the new topic's partitions yet
            found = admin.list_topics(name, timeout=10).topics.get(name)
            parts = found.partitions if found is not None else {}
            return all(p in parts and parts[p].leader in nodes for p, nodes in enumerate(replicas))

        while not led():
            if time.monotonic() > deadline:
                msg = f"topic {name}: no leader among its replicas {replicas} within {self._timeout:g} s"
                raise BrokerUnavailableError(msg)
            time.sleep(0.2)

    def set_client_quota(self, quotas: Mapping[str, float | None], *,
                         entity: Literal["clients", "users"] = "clients", name: str | None = None) -> None:
        """:func:`set_client_quota` on this cluster (``None`` values remove)."""
        set_client_quota(self._live_bootstrap(), quotas, entity=entity, name=name)

    def reassign(self, topic: str, replicas: Mapping[int, Sequence[int]]) -> None:
        """:func:`reassign_partitions` on this cluster: start moving ``topic``'s partitions."""
        reassign_partitions(self._live_bootstrap(), topic, replicas)

    def wait_reassigned(self, topic: str, replicas: Mapping[int, Sequence[int]],
                        timeout_s: float = 180.0) -> dict[int, int]:
        """Wait until each partition's move to ``replicas`` is complete; its leader by partition.

        Complete: the metadata lists exactly the target replicas (the leaving ones removed), all of them in
        sync, a leader among them, and the controller lists no reassignment of the topic under way.
        """
        target = {p: sorted(nodes) for p, nodes in replicas.items()}
        deadline = time.monotonic() + timeout_s
        seen: Any = None
        while time.monotonic() < deadline:
            md = self._admin().list_topics(topic, timeout=10).topics[topic].partitions
            seen = {p: (sorted(md[p].replicas), sorted(md[p].isrs), md[p].leader) for p in target}
            if all(r == target[p] and isr == target[p] and leader in target[p]
                   for p, (r, isr, leader) in seen.items()):
                ongoing = partition_reassignments(self._live_bootstrap())
                if not any(t == topic and p in target for t, p in ongoing):
                    return {p: int(leader) for p, (_, _, leader) in seen.items()}
            time.sleep(0.5)
        msg = (f"reassignment of {topic} to {target} not complete within {timeout_s:g} s; "
               f"(replicas, in sync, leader) by partition: {seen}")
        raise BrokerUnavailableError(msg)

    def watch_fetch_throttle(self, interval_s: float = 0.25) -> FetchThrottleWatch:
        """A :class:`FetchThrottleWatch` over the running nodes (start it, or use it as a context)."""
        pids = {i: self.nodes[i].pid for i in self.running()}
        return FetchThrottleWatch({i: pid for i, pid in pids.items() if pid is not None}, interval_s)

    def _live_bootstrap(self) -> str:
        return ",".join(self.nodes[i].bootstrap for i in self.running())

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self._live_bootstrap(), "log_level": "0"})

    def _wait_registered(self, count: int) -> None:
        """Wait until the cluster's metadata lists ``count`` brokers."""
        deadline = time.monotonic() + self._timeout
        seen = 0
        while time.monotonic() < deadline:
            try:
                seen = len(self._admin().list_topics(timeout=2).brokers)
            except Exception:  # noqa: BLE001 - not answering yet
                seen = 0
            if seen >= count:
                return
            time.sleep(0.2)
        msg = f"embedded Kafka cluster: {seen} of {count} brokers registered within {self._timeout:g} s"
        raise BrokerUnavailableError(msg)

    def stop(self) -> None:
        """Stop every node and remove the cluster's folder."""
        for broker in self.nodes.values():
            broker.stop()
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
        self.nodes = {}
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
