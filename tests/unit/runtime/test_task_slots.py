"""The task slots the history width may use: local[N], local[*], a cluster's executors (no Spark here)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from source_backfill.runtime.spark import task_slots


def session(master: str, parallelism: int = 4, executors: list[tuple[str, int]] | None = None) -> Any:
    class Seq:
        def __init__(self, items: list[tuple[str, int]]) -> None:
            self.items = items

        def size(self) -> int:
            return len(self.items)

        def apply(self, i: int) -> Any:
            ident, cores = self.items[i]
            return SimpleNamespace(id=lambda: ident, totalCores=lambda: cores)

    def status_store() -> Any:
        if executors is None:
            raise RuntimeError("no status store")
        return SimpleNamespace(executorList=lambda _active: Seq(executors))

    jsc = SimpleNamespace(sc=lambda: SimpleNamespace(statusStore=status_store))
    context = SimpleNamespace(master=master, defaultParallelism=parallelism, _jsc=jsc)
    return SimpleNamespace(sparkContext=context)


@pytest.mark.parametrize(("master", "slots"), [("local", 1), ("local[2]", 2), ("local[16]", 16),
                                                ("local[3, 2]", 3), ("local[*]", os.cpu_count() or 1)])
def test_local_masters_give_their_threads(master: str, slots: int) -> None:
    assert task_slots(session(master)) == slots


def test_a_cluster_gives_its_executors_cores_else_the_default_parallelism() -> None:
    executors = [("driver", 8), ("1", 4), ("2", 4)]
    assert task_slots(session("spark://m:7077", executors=executors)) == 8  # the driver's cores not counted
    assert task_slots(session("spark://m:7077", parallelism=6, executors=[("driver", 2)])) == 6  # none yet
    assert task_slots(session("k8s://api", parallelism=5)) == 5  # no status store
