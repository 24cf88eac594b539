"""Kafka metadata and offsets: topics, splits ("topic:partition") and exact earliest/end/timestamp offsets.

Offsets come from ListOffsets with ``read_committed`` isolation: earliest is the log start, latest the last
stable offset (an open transaction's records lie beyond it), a timestamp the first record at or after it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import RetryCallState, retry_if_exception, stop_after_delay, wait_exponential

from source_backfill.core.splits import parse_split_id
from source_backfill.errors import (
    BrokerUnavailableError,
    KafkaAuthorizationError,
    KafkaConnectorError,
    UnknownTopicError,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Consumer settings every confluent-kafka reader of this connector uses (the Python connector, the admin).
CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
    "enable.partition.eof": True,
    "fetch.queue.backoff.ms": 0,
    "auto.offset.reset": "earliest",
    "log_level": 3,
}


# -- client configuration ------------------------------------------------------------------------------
def client_config(bootstrap_servers: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Build librdkafka settings from ``options``; a ``kafka.`` key prefix is stripped."""
    conf: dict[str, Any] = {}
    for key, value in (options or {}).items():
        name = key[len("kafka.") :] if key.startswith("kafka.") else key
        conf[name] = value
    if bootstrap_servers:
        conf["bootstrap.servers"] = bootstrap_servers
    if not conf.get("bootstrap.servers"):
        msg = "kafka.bootstrap.servers is required"
        raise KafkaConnectorError(msg)
    return conf


def consumer_config(
    bootstrap_servers: str, options: Mapping[str, Any] | None = None, **overrides: Any
) -> dict[str, Any]:
    """Consumer settings: our defaults, then user ``options``, then ``overrides``; a private group id."""
    conf = {**CONSUMER_DEFAULTS, **client_config(bootstrap_servers, options), **overrides}
    conf.setdefault("group.id", f"source-backfill-{uuid.uuid4().hex}")
    return conf


def consume_available(consumer: Any, max_messages: int, timeout_s: float) -> list[Any]:
    """Up to ``max_messages`` events: wait at most ``timeout_s`` for the first, then take what is queued.

    ``consumer.consume(n, timeout)`` waits out its whole timeout unless ``n`` messages arrive, so a log
    end, a tail of transaction markers or compacted offsets would each cost a full timeout.
    """
    first = consumer.poll(timeout=timeout_s)
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *consumer.consume(num_messages=max_messages - 1, timeout=0)]


def connect_failure(text: str) -> str | None:
    """The cause a librdkafka connection error names, said for a user and followed by its text."""
    from connectors.kafka.security import cause_of

    cause = cause_of(text)
    return None if cause is None else f"{cause} [{text.strip()}]"


# -- retries -------------------------------------------------------------------------------------------
def _is_retriable(exc: BaseException) -> bool:
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    err = exc.args[0]
    if not isinstance(err, KafkaError):
        return False
    return bool(
        err.retriable()
        or err.code()
        in (
            KafkaError._TRANSPORT,
            KafkaError._TIMED_OUT,
            KafkaError._ALL_BROKERS_DOWN,
            KafkaError.LEADER_NOT_AVAILABLE,
            KafkaError.NOT_LEADER_FOR_PARTITION,
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            # a just-created partition whose leader's epoch the answering broker has not caught up with
            # (Kafka marks both retriable; librdkafka 2.16 raises them as not): "Leader epoch is newer"
            KafkaError.UNKNOWN_LEADER_EPOCH,
            KafkaError.FENCED_LEADER_EPOCH,
            # a client's broker handle decommissioned while it re-bootstraps after a lost connection
            KafkaError._DESTROY_BROKER,
        )
    )


def _is_unreachable(exc: BaseException) -> bool:
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException) or not exc.args or not isinstance(exc.args[0], KafkaError):
        return False
    return exc.args[0].code() in (
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._DESTROY_BROKER,
    )


def _check_answered(offsets: Mapping[str, int]) -> None:
    """Raise a retriable transport error when a ListOffsets result holds no offset (-1001) for a split.

    librdkafka (2.16) can answer ListOffsets with offset -1001 and no error for every partition when the
    connection drops while the request is in flight (its re-bootstrap loses the request's transport error).
    Taken as an offset, -1001 would read as a log truncated below the committed position (a data-loss
    failure), or move a split's position to -1001 with ``failOnDataLoss=false``.
    """
    from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException

    unanswered = sorted(sid for sid, offset in offsets.items() if offset == OFFSET_INVALID)
    if unanswered:
        reason = f"ListOffsets returned no offset for {', '.join(unanswered)} (request failed in flight)"
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, reason, retriable=True))


def retry_if_splits_exist(exc: Exception, client: Any, tps: Iterable[Any], timeout_s: float) -> None:
    """Raise a retriable LEADER_NOT_AVAILABLE instead of ``exc`` when it calls splits unknown that exist.

    librdkafka answers ``_NOENT`` ("Failed to query partition leaders: No leaders found", ListOffsets) or
    ``_UNKNOWN_PARTITION`` (watermarks) both for a split that does not exist and, after a lost connection,
    while its re-bootstrapped metadata holds no topic yet. A fresh metadata request from ``client`` (an
    admin client or a consumer) tells them apart: only the second is worth a retry.
    """
    from confluent_kafka import KafkaError, KafkaException

    err = exc.args[0] if exc.args else None
    unknown = (KafkaError._NOENT, KafkaError._UNKNOWN_PARTITION)
    if not isinstance(err, KafkaError) or err.code() not in unknown:
        return
    topics = client.list_topics(timeout=timeout_s).topics
    known = {(name, p) for name, t in topics.items() if t.error is None for p in t.partitions}
    if all((tp.topic, tp.partition) in known for tp in tps):
        leaderless = KafkaError(KafkaError.LEADER_NOT_AVAILABLE, err.str(), retriable=True)
        raise KafkaException(leaderless) from exc


@dataclass(frozen=True)
class PartitionHealth:
    """A source's partitions as the cluster's metadata sees them: without a leader, under-replicated."""

    no_leader: tuple[str, ...] = ()
    under_replicated: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        """What a degraded source says (empty: every partition has a leader and all its replicas in sync)."""
        out = []
        if self.no_leader:
            shown = ", ".join(self.no_leader[:5])
            out.append(f"{len(self.no_leader)} partition(s) without a leader: {shown}")
        if self.under_replicated:
            out.append(f"{len(self.under_replicated)} partition(s) under-replicated (fewer in-sync replicas "
                       f"than replicas): {', '.join(self.under_replicated[:5])}")
        return out


def call_with_retry(fn: Callable[[], T], what: str, deadline_s: float, bootstrap: str,
                    cause: Callable[[], str | None] | None = None) -> T:
    """Run ``fn``, retrying retriable Kafka errors until ``deadline_s``; unreachable -> BrokerUnavailable.

    A ``TimeoutError`` from ``fn`` (an admin future's ``result(timeout=...)``: the broker did not answer
    the request in time) counts as Kafka's own request timeout, ``_TIMED_OUT``. ``cause()``: why the
    client could not connect, as its error callback last heard it (a refused password, an untrusted
    certificate), told in the error: librdkafka's calls themselves only say "transport failure".
    """
    from confluent_kafka import KafkaError, KafkaException
    from tenacity import Retrying

    def _log(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        # one retry is routine (a new topic's leader being elected, a leader moving): said at INFO
        level = logging.INFO if state.attempt_number <= 1 else logging.WARNING
        logger.log(level, 'kafka retry op="%s" attempt="%d" error="%s"', what, state.attempt_number, exc)

    try:
        for attempt in Retrying(
            retry=retry_if_exception(_is_retriable),
            stop=stop_after_delay(deadline_s),
            wait=wait_exponential(multiplier=0.1, max=2),
            before_sleep=_log,
            reraise=True,
        ):
            with attempt:
                try:
                    return fn()
                except TimeoutError as exc:  # a future's result(timeout=...) ran out: no answer in time
                    reason = f"no answer within the attempt's timeout ({what})"
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, reason, retriable=True)) from exc
    except Exception as exc:
        if _is_unreachable(exc):
            why = cause() if cause is not None else None
            msg = f"Kafka broker at {bootstrap} unreachable for {what} within {deadline_s:.0f}s: {exc}"
            if why:
                msg = f"{msg}; {why}"
            raise BrokerUnavailableError(msg) from exc
        if isinstance(exc, KafkaConnectorError):
            raise
        msg = f"Kafka {what} failed against {bootstrap}: {exc}"
        raise KafkaConnectorError(msg) from exc
    msg = "retry loop ended without a result"  # pragma: no cover
    raise AssertionError(msg)  # pragma: no cover


class KafkaAdmin:
    """Topic administration and exact offset queries against one cluster.

    ``options`` are librdkafka settings (``kafka.`` prefixes allowed). ``timeout_s`` bounds every
    operation including its retries; an unreachable broker raises :class:`BrokerUnavailableError` then.
    """

    def __init__(
        self, bootstrap_servers: str, options: Mapping[str, Any] | None = None, timeout_s: float = 10.0
    ) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap_servers = bootstrap_servers
        self.options = dict(options or {})
        self.timeout_s = timeout_s
        conf = client_config(bootstrap_servers, self.options)
        conf.setdefault("log_level", 3)
        self._connect_error: str | None = None
        conf.setdefault("error_cb", self._on_error)
        self._client: Any = AdminClient(conf)

    def _on_error(self, err: Any) -> None:
        """The client's error callback: keep why a connection failed (auth, TLS), for the next error."""
        why = connect_failure(str(err))
        if why is not None:
            self._connect_error = why

    def connect_error(self) -> str | None:
        """Why the client's connections to the cluster fail, if its callback heard a reason.

        A certificate that failed verification is checked once more with Python's TLS, which tells an
        untrusted CA from a certificate naming another host (librdkafka says the same of both).
        """
        poll = getattr(self._client, "poll", None)
        if poll is not None:
            poll(0)  # serve the callbacks queued meanwhile (its calls do not)
        why: str | None = getattr(self, "_connect_error", None)  # (a test may build one bare)
        if why is not None and "certificate" in why:
            from connectors.kafka.security import tls_diagnosis

            return tls_diagnosis(self.bootstrap_servers, self.options) or why
        return why

    @property
    def _admin(self) -> Any:
        if self._client is None:
            msg = f"the Kafka admin client of {self.bootstrap_servers} is closed"
            raise KafkaConnectorError(msg)
        return self._client

    def close(self) -> None:
        """Drop the client, so librdkafka closes its connections and stops polling; unusable after.

        A client left alive after its broker stops logs ``Connection refused`` until the process exits.
        """
        self._client = None

    # -- helpers -------------------------------------------------------------------------------------
    def _retry(self, fn: Callable[[], T], what: str) -> T:
        return call_with_retry(fn, what, self.timeout_s, self.bootstrap_servers, self.connect_error)

    def _attempt_timeout(self) -> float:
        return max(1.0, min(5.0, self.timeout_s))

    def _consumer(self, **overrides: Any) -> Any:
        from confluent_kafka import Consumer

        overrides.setdefault("fetch.wait.max.ms", 10)
        return Consumer(consumer_config(self.bootstrap_servers, self.options, **overrides))

    def topic_partitions(self) -> dict[str, int]:
        """Every topic on the broker with its partition count."""

        def fetch() -> dict[str, int]:
            md = self._admin.list_topics(timeout=self._attempt_timeout())
            return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}

        return self._retry(fetch, "list topics")

    def partition_health(self, topics: Iterable[str] = (), pattern: str | None = None,
                         timeout_s: float = 5.0) -> PartitionHealth | None:
        """Which partitions of ``topics`` (or of the topics matching ``pattern``) lack a leader or replicas.

        One metadata request, not retried: None when the cluster did not answer within ``timeout_s``.
        """
        import re

        try:
            md = self._admin.list_topics(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - no answer: unknown, not "all well"
            return None
        wanted = set(topics)
        matcher = re.compile(pattern) if pattern else None
        no_leader, under = [], []
        for name, meta in sorted(md.topics.items()):
            if meta.error is not None or not (name in wanted or (matcher and matcher.fullmatch(name))):
                continue
            for pid, part in sorted(meta.partitions.items()):
                if part.leader < 0:
                    no_leader.append(f"{name}:{pid}")
                elif len(part.isrs) < len(part.replicas):
                    under.append(f"{name}:{pid}")
        return PartitionHealth(tuple(no_leader), tuple(under))

    # -- topics --------------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1) -> None:
        """Create ``name`` with ``partitions`` partitions (no-op if it exists); waits until it is visible."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        def create() -> None:
            fut = self._admin.create_topics(
                [NewTopic(name, partitions, replication_factor)], operation_timeout=self._attempt_timeout()
            )[name]
            try:
                fut.result(timeout=self._attempt_timeout())
            except KafkaException as exc:
                if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    return
                raise

        self._retry(create, f'create topic "{name}"')
        self._wait_partitions(name, partitions)
        logger.info('topic created topic="%s" partitions="%d"', name, partitions)

    def add_partitions(self, topic: str, total: int) -> None:
        """Grow ``topic`` to ``total`` partitions; waits until the metadata shows them."""
        from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

        if self.list_partition_count(topic) >= total:
            return

        def grow() -> None:
            fut = self._admin.create_partitions(
                [NewPartitions(topic, total)], operation_timeout=self._attempt_timeout()
            )[topic]
            fut.result(timeout=self._attempt_timeout())

        self._retry(grow, f'add partitions to "{topic}"')
        self._wait_partitions(topic, total)
        logger.info('partitions added topic="%s" total="%d"', topic, total)

    def list_partition_count(self, topic: str) -> int:
        """Number of partitions of ``topic`` (UnknownTopicError if missing)."""
        counts = self.topic_partitions()
        if topic not in counts:
            self._raise_denied([topic])
            msg = f'Kafka topic "{topic}" does not exist on {self.bootstrap_servers}'
            raise UnknownTopicError(msg)
        return counts[topic]

    def _wait_partitions(self, topic: str, count: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.topic_partitions().get(topic, 0) >= count:
                return
            time.sleep(0.05)
        msg = f'topic "{topic}" did not show {count} partitions within {self.timeout_s}s'
        raise KafkaConnectorError(msg)

    def list_splits(self, topics: Iterable[str]) -> list[tuple[str, int]]:
        """All (topic, partition) of ``topics``, sorted; UnknownTopicError names the missing topics."""
        wanted = list(dict.fromkeys(topics))
        counts = self.topic_partitions()
        missing = [t for t in wanted if t not in counts]
        if missing:
            self._raise_denied(missing)
            msg = f"Kafka topic(s) {', '.join(missing)} do not exist on {self.bootstrap_servers}"
            raise UnknownTopicError(msg)
        return [(t, p) for t in wanted for p in range(counts[t])]

    def topic_ids(self, topics: Iterable[str] = (), pattern: str | None = None,
                  timeout_s: float = 10.0) -> dict[str, str]:
        """The topic id of each of ``topics`` (and of the topics matching ``pattern``) that exists now.

        Kafka gives a topic a new id when it is created again under the same name (its offsets restart at
        0): a source compares them with the ids it recorded (``runtime/topic_record.py``). One attempt
        (two metadata requests), not retried: a cluster that does not answer raises.
        """
        import re

        from confluent_kafka import TopicCollection

        md = self._admin.list_topics(timeout=timeout_s)
        existing = {name for name, t in md.topics.items() if t.error is None}
        names = set(topics)
        if pattern:
            matcher = re.compile(pattern)
            names |= {t for t in existing if matcher.fullmatch(t)}
        wanted = sorted(names & existing)
        if not wanted:
            return {}
        futs = self._admin.describe_topics(TopicCollection(wanted), request_timeout=timeout_s)
        return {name: str(fut.result(timeout=timeout_s).topic_id) for name, fut in futs.items()}

    def retention_ms(self, topics: Iterable[str]) -> dict[str, int | None]:
        """Each topic's ``retention.ms`` (None: kept forever, -1 in Kafka) and compaction counted as none.

        A compacted topic (``cleanup.policy`` without ``delete``) moves no log start by time: None too.
        The admin client reports no log sizes (no DescribeLogDirs here), only these settings.
        """
        from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

        wanted = list(dict.fromkeys(topics))

        def describe() -> dict[str, int | None]:
            futs = self._admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in wanted],
                                                request_timeout=self._attempt_timeout())
            out: dict[str, int | None] = {}
            for res, fut in futs.items():
                conf = fut.result(timeout=self._attempt_timeout())
                ms = int(conf["retention.ms"].value) if "retention.ms" in conf else -1
                policy = conf["cleanup.policy"].value if "cleanup.policy" in conf else "delete"
                out[res.name] = ms if ms >= 0 and "delete" in str(policy) else None
            return out

        return self._retry(describe, "describe topic configs") if wanted else {}

    # -- offsets -------------------------------------------------------------------------------------
    def _tps(self, split_ids: Iterable[str]) -> dict[str, Any]:
        from confluent_kafka import TopicPartition

        return {sid: TopicPartition(*parse_split_id(sid)) for sid in split_ids}

    def _list_offsets(self, split_ids: Iterable[str], spec: Any, what: str) -> dict[str, int]:
        from confluent_kafka import IsolationLevel, KafkaException

        tps = self._tps(split_ids)
        if not tps:
            return {}

        def query() -> dict[str, int]:
            futs = self._admin.list_offsets(
                {tp: spec for tp in tps.values()},
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=self._attempt_timeout(),
            )
            by_tp = {(tp.topic, tp.partition): f for tp, f in futs.items()}
            try:
                found = {
                    sid: int(by_tp[(tp.topic, tp.partition)].result(timeout=self._attempt_timeout()).offset)
                    for sid, tp in tps.items()
                }
            except KafkaException as exc:
                retry_if_splits_exist(exc, self._admin, tps.values(), self._attempt_timeout())
                raise
            _check_answered(found)
            return found

        try:
            return self._retry(query, what)
        except KafkaConnectorError as exc:
            self._raise_unknown(tps, exc)
            raise

    def _raise_denied(self, topics: Iterable[str]) -> None:
        """KafkaAuthorizationError if the cluster refuses to describe any of ``topics`` to this client.

        A listing of every topic leaves out the ones the principal may not describe (with ACLs on, Kafka
        does not tell those from topics that do not exist); asked by name, it answers
        TOPIC_AUTHORIZATION_FAILED.
        """
        from confluent_kafka import KafkaError

        denied = []
        for topic in topics:
            try:
                md = self._admin.list_topics(topic=topic, timeout=self._attempt_timeout())
            except Exception:  # noqa: BLE001 - no answer: the caller's own error stands
                return
            meta = md.topics.get(topic)
            if meta is not None and meta.error is not None \
                    and meta.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                denied.append(topic)
        if denied:
            user = self.options.get("sasl.username")
            who = f'the user "{user}"' if user else "this client's principal"
            msg = (f"Kafka topic(s) {', '.join(denied)} on {self.bootstrap_servers}: not authorized: "
                   f"{who} may not describe them (or they do not exist). Grant it Describe and Read on "
                   "the topics and Read on the consumer groups named source-backfill-*")
            raise KafkaAuthorizationError(msg)

    def _raise_unknown(self, tps: Mapping[str, Any], exc: Exception) -> None:
        if isinstance(exc, BrokerUnavailableError):
            return
        counts = self.topic_partitions()
        missing = [sid for sid, tp in tps.items() if counts.get(tp.topic, 0) <= tp.partition]
        if missing:
            msg = f"Kafka split(s) {', '.join(missing)} do not exist on {self.bootstrap_servers}"
            raise UnknownTopicError(msg) from exc

    def earliest_offsets(self, split_ids: Iterable[str]) -> dict[str, int]:
        """The log-start offset of each split."""
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        return self._list_offsets(split_ids, earliest, "list earliest offsets")

    def end_offsets(self, split_ids: Iterable[str]) -> dict[str, int]:
        """The end of each split: the next offset to be written, or the last stable offset.

        ListOffsets latest under ``read_committed``, so an open transaction's records are never inside it.
        """
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        return self._list_offsets(split_ids, latest, "list latest offsets")

    def offsets_for_timestamp(self, split_ids: Iterable[str], ts_ms: int) -> dict[str, int]:
        """First offset whose record timestamp is >= ``ts_ms`` per split; the end offset when none is."""
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        sids = list(dict.fromkeys(split_ids))
        found = self._list_offsets(sids, OffsetSpec.for_timestamp(ts_ms), "list offsets for timestamp")
        missing = [s for s in sids if found[s] < 0]
        ends = self.end_offsets(missing) if missing else {}
        return {s: ends[s] if found[s] < 0 else found[s] for s in sids}

    def delete_records(self, before: Mapping[str, int]) -> dict[str, int]:
        """Move the log start of each split up to ``before[split]`` (retention by hand); the new starts."""
        from confluent_kafka import TopicPartition

        tps = {sid: TopicPartition(*parse_split_id(sid), offset) for sid, offset in before.items()}
        if not tps:
            return {}

        def delete() -> dict[str, int]:
            futs = self._admin.delete_records(list(tps.values()), request_timeout=self._attempt_timeout())
            by_tp = {(tp.topic, tp.partition): f for tp, f in futs.items()}
            wait = self._attempt_timeout()
            return {sid: int(by_tp[(tp.topic, tp.partition)].result(timeout=wait).low_watermark)
                    for sid, tp in tps.items()}

        result = self._retry(delete, "delete records")
        logger.info('records deleted new_log_start="%s"', result)
        return result
