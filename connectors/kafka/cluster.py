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
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from connectors.child_process import free_port
from connectors.kafka.embedded import ClusterNode, EmbeddedBroker, new_cluster_id
from source_backfill.errors import BrokerUnavailableError

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

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        live = ",".join(self.nodes[i].bootstrap for i in self.running())
        return AdminClient({"bootstrap.servers": live, "log_level": "0"})

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
