"""The history gate with namespaces: turns by namespace first, and each namespace's slot time counted."""

from __future__ import annotations

from source_backfill import metrics
from source_backfill.executors.history_gate import HistoryGate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _held(source: str, namespace: str) -> float:
    return metrics.HISTORY_SLOT_SECONDS.labels(source, namespace)._value.get()  # noqa: SLF001


def test_a_freed_slot_goes_to_the_namespace_that_held_less_then_queue_order():
    clock = Clock()
    gate = HistoryGate(stale_s=60, clock=clock, source="gate-test", by_namespace=True)
    gate.resize(1, 1.0)
    tried: list[str] = []
    assert gate.take("a1", 1, lambda: tried.append("a1"), "team-a")
    for job in ("a2", "a3"):  # team-a's others queue first ...
        clock.now += 1
        assert not gate.take(job, 1, lambda j=job: tried.append(j), "team-a")
    clock.now += 1
    assert not gate.take("b1", 1, lambda: tried.append("b1"), "team-b")  # ... team-b's after them
    clock.now += 1
    gate.give_back("a1", 3.0)
    assert tried == ["b1"]  # team-a held 3 s, team-b none: team-b's turn, though it asked last
    assert _held("gate-test", "team-a") == 3.0 and _held("gate-test", "team-b") == 0.0


def test_without_namespaces_the_queue_order_holds():
    clock = Clock()
    gate = HistoryGate(stale_s=60, clock=clock, source="gate-test-2")
    gate.resize(1, 1.0)
    tried: list[str] = []
    assert gate.take("a1", 1, lambda: None, "team-a")
    clock.now += 1
    assert not gate.take("a2", 1, lambda: tried.append("a2"), "team-a")
    clock.now += 1
    assert not gate.take("b1", 1, lambda: tried.append("b1"), "team-b")
    gate.give_back("a1", 3.0)
    assert tried == ["a2"]
