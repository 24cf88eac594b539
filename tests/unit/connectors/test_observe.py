"""Reading Spark observations without waiting and with a deadline (connectors/observe.py), no JVM."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from connectors.observe import arrived, observed
from source_backfill.errors import SourceBackfillError


class _Future:
    def __init__(self, done: bool | Exception) -> None:
        self.done = done

    def isCompleted(self) -> bool:  # noqa: N802 - the JVM's name
        if isinstance(self.done, Exception):
            raise self.done
        return self.done


def _observation(done: bool | Exception | None) -> SimpleNamespace:
    java = None if done is None else SimpleNamespace(future=lambda: _Future(done))
    return SimpleNamespace(_jo=java)


def test_arrived_only_once_its_action_finished_and_never_from_a_dead_jvm():
    assert arrived(_observation(True)) is True  # type: ignore[arg-type]
    assert arrived(_observation(False)) is False  # type: ignore[arg-type]
    assert arrived(_observation(None)) is False  # type: ignore[arg-type]  # not observed by a DataFrame yet
    assert arrived(_observation(ConnectionError("py4j: the JVM is gone"))) is False  # type: ignore[arg-type]


def test_observed_waits_at_most_its_deadline_and_passes_errors_on():
    never = threading.Event()

    class Waits:
        @property
        def get(self) -> dict[str, int]:
            never.wait()
            return {}

    with pytest.raises(SourceBackfillError, match="within 0s"):
        observed(Waits(), timeout_s=0.05)  # type: ignore[arg-type]
    never.set()

    class Fails:
        @property
        def get(self) -> dict[str, int]:
            raise ValueError("the action failed")

    with pytest.raises(ValueError, match="the action failed"):
        observed(Fails(), timeout_s=1)  # type: ignore[arg-type]
    assert observed(SimpleNamespace(get={"bytes": 7}), timeout_s=1) == {"bytes": 7}  # type: ignore[arg-type]
