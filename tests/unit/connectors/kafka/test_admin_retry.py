"""Kafka calls under a flaky connection, against scripted clients (no broker): the admin's offset queries
and a range reader's watermark query are retried on what a reset or a silent broker makes them return."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException

from connectors.kafka.admin import KafkaAdmin, _is_retriable
from source_backfill.errors import (
    BrokerUnavailableError,
    DataLossError,
    KafkaConnectorError,
    UnknownTopicError,
)


class Unanswered(Future):
    """A future whose ``result(timeout)`` times out at once (as if its timeout had passed)."""

    def result(self, timeout: float | None = None) -> Any:
        raise TimeoutError


class ScriptedAdminClient:
    """``list_offsets`` answers from ``script``, one entry per call (the last one repeats).

    An entry is an offset for every partition, a KafkaError every partition's future fails with, or
    ``None``: the futures never complete (a broker that does not answer).
    """

    def __init__(self, *script: int | KafkaError | None) -> None:
        self.script = list(script)
        self.calls = 0

    def list_offsets(self, specs: dict[Any, Any], **_: Any) -> dict[Any, Future]:
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        futs: dict[Any, Future] = {}
        for tp in specs:
            fut: Future = Future() if step is not None else Unanswered()
            if isinstance(step, KafkaError):
                fut.set_exception(KafkaException(step))
            elif step is not None:
                fut.set_result(SimpleNamespace(offset=step + tp.partition))
            futs[tp] = fut
        return futs

    def list_topics(self, timeout: float) -> Any:
        parts = {0: None, 1: None}
        return SimpleNamespace(topics={"t": SimpleNamespace(partitions=parts, error=None)})


def _admin(client: ScriptedAdminClient, timeout_s: float = 5.0) -> KafkaAdmin:
    admin = object.__new__(KafkaAdmin)  # no librdkafka client: the scripted one answers
    admin.bootstrap_servers, admin.options, admin.timeout_s = "127.0.0.1:9", {}, timeout_s
    admin._client = client
    return admin


def test_an_offset_of_minus_1001_without_error_is_a_failed_request_and_is_retried():
    # librdkafka 2.16, connection reset while ListOffsets is in flight: offset -1001, no error
    client = ScriptedAdminClient(OFFSET_INVALID, 40)
    assert _admin(client).end_offsets(["t:0", "t:1"]) == {"t:0": 40, "t:1": 41}
    assert client.calls == 2


NO_LEADERS = KafkaError(KafkaError._NOENT, "Failed to query partition leaders: No leaders found")


def test_no_leaders_found_for_splits_that_exist_is_retried():
    # right after a lost connection librdkafka re-bootstraps: its metadata knows no topic for a moment
    client = ScriptedAdminClient(NO_LEADERS, NO_LEADERS, 7)
    assert _admin(client).earliest_offsets(["t:0"]) == {"t:0": 7}
    assert client.calls == 3


def test_no_leaders_found_for_a_split_that_does_not_exist_is_an_unknown_split_at_once():
    client = ScriptedAdminClient(NO_LEADERS, 7)
    with pytest.raises(UnknownTopicError, match="t:5"):
        _admin(client).earliest_offsets(["t:0", "t:5"])
    assert client.calls == 1


def test_offsets_never_answered_end_in_broker_unavailable_at_the_deadline():
    client = ScriptedAdminClient(OFFSET_INVALID)
    with pytest.raises(BrokerUnavailableError, match="no offset for t:0"):
        _admin(client, timeout_s=0.5).end_offsets(["t:0"])
    assert client.calls > 1


def test_a_timestamp_without_records_is_an_answer_not_a_failure():
    client = ScriptedAdminClient(-1)  # no record at or after the timestamp: the end offset is used
    admin = _admin(client)
    assert admin._list_offsets(["t:0"], None, "for timestamp") == {"t:0": -1}
    assert client.calls == 1


def test_a_non_retriable_error_is_not_retried():
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied")
    client = ScriptedAdminClient(denied, 3)
    with pytest.raises(KafkaConnectorError, match="denied"):
        _admin(client).end_offsets(["t:0"])
    assert client.calls == 1


def test_a_future_without_an_answer_in_time_is_a_request_timeout_and_is_retried():
    client = ScriptedAdminClient(None, 12)  # the first attempt's futures time out
    assert _admin(client).end_offsets(["t:1"]) == {"t:1": 13}
    assert client.calls == 2


def test_no_answer_until_the_deadline_is_broker_unavailable_with_a_message():
    client = ScriptedAdminClient(None)
    unreachable = r"unreachable for list latest offsets within \ds: .*no answer"
    with pytest.raises(BrokerUnavailableError, match=unreachable):
        _admin(client, timeout_s=0.5).end_offsets(["t:0"])
    assert client.calls > 1


class FlakyConsumer:
    """A consumer whose first watermark query fails with ``FlakyConsumer.first``, then answers (5, 9)."""

    first = KafkaError(KafkaError._DESTROY_BROKER, "Broker handle destroyed without termination")
    instances: list[FlakyConsumer] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        self.watermark_calls = 0
        FlakyConsumer.instances.append(self)

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        self.watermark_calls += 1
        if self.watermark_calls == 1:
            raise KafkaException(FlakyConsumer.first)
        return 5, 9

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return ScriptedAdminClient().list_topics(timeout)  # t:0 and t:1

    def close(self) -> None:
        pass


@pytest.mark.parametrize("code", [KafkaError._DESTROY_BROKER, KafkaError._UNKNOWN_PARTITION])
def test_a_range_reader_retries_its_watermark_query_after_a_reset(monkeypatch, code):
    import confluent_kafka

    from connectors.kafka.ranges import KafkaRange, read_range

    monkeypatch.setattr(confluent_kafka, "Consumer", FlakyConsumer)
    monkeypatch.setattr(FlakyConsumer, "first", KafkaError(code, "right after a reset"))
    # the answer after the retry is used: offsets 0..4 are below the log start
    with pytest.raises(DataLossError, match="log start is 5"):
        list(read_range(KafkaRange("t", 0, 0, 9), "127.0.0.1:9", {}))
    assert FlakyConsumer.instances[-1].watermark_calls == 2


def test_a_range_reader_fails_at_once_on_a_partition_that_does_not_exist(monkeypatch):
    import confluent_kafka

    from connectors.kafka.ranges import KafkaRange, read_range

    monkeypatch.setattr(confluent_kafka, "Consumer", FlakyConsumer)
    unknown = KafkaError(KafkaError._UNKNOWN_PARTITION, "Unknown partition")
    monkeypatch.setattr(FlakyConsumer, "first", unknown)
    with pytest.raises(KafkaConnectorError, match="Unknown partition"):
        list(read_range(KafkaRange("t", 7, 0, 9), "127.0.0.1:9", {}))
    assert FlakyConsumer.instances[-1].watermark_calls == 1


@pytest.mark.parametrize("code", [KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH,
                                  KafkaError.LEADER_NOT_AVAILABLE, KafkaError._TRANSPORT])
def test_leadership_still_settling_is_retried(code):
    # "Broker: Leader epoch is newer than broker epoch", right after a topic was created, is not final
    assert _is_retriable(KafkaException(KafkaError(code, "settling", retriable=False)))


@pytest.mark.parametrize("code", [KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.INVALID_REQUEST])
def test_a_final_answer_is_not_retried(code):
    assert not _is_retriable(KafkaException(KafkaError(code, "no", retriable=False)))


def test_a_closed_admin_says_so():
    admin = _admin(ScriptedAdminClient())
    admin.close()
    with pytest.raises(KafkaConnectorError, match="admin client of 127.0.0.1:9 is closed"):
        admin.list_splits(["t"])
