"""The archive tier's plan of a job's history ranges: by tier, no gap, no overlap (no Spark, no broker).

``ArchiveTier.plan`` cuts ranges with ``core.tiers.plan_tiers`` (tested exhaustively there); what is the
tier's own is checked here: an untrusted archive is used only below the log start in ``auto``, a job with
``archive`` reads all of it, ``kafka`` never looks, and each offset lands in exactly one list.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.delta.archive import ArchiveHoldings
from source_backfill.config import ArchiveConfig
from source_backfill.core import HistoryRange
from source_backfill.executors.archive_tier import ArchiveTier, TierPlan
from tests.budget import examples


class _Admin:
    def __init__(self, log_start: dict[str, int]) -> None:
        self.log_start = log_start

    def earliest_offsets(self, splits: Any) -> dict[str, int]:
        return {s: self.log_start[s] for s in splits}


def _tier(held: dict[str, list[tuple[int, int]]], log_start: dict[str, int], *, trusted: bool,
          more: list[tuple[dict[str, list[tuple[int, int]]], bool]] = ()) -> ArchiveTier:
    """An archive tier over ``held`` (then ``more`` archives, each with its trust), pinned without tables."""
    archives = [(held, trusted), *more]
    configs = [ArchiveConfig(path=f"/a{i}", trusted=t) for i, (_, t) in enumerate(archives)]
    tier = ArchiveTier(None, configs, _Admin(log_start))  # type: ignore[arg-type]
    for table, (h, _) in zip(tier.tables, archives, strict=True):
        table._holdings = ArchiveHoldings(version=3, held=h)  # noqa: SLF001 - pinned without a table
    return tier


def _offsets(ranges: list[HistoryRange]) -> list[tuple[str, int]]:
    return [(r.split, o) for r in ranges for o in range(r.start, r.end)]


def test_untrusted_archive_serves_below_the_log_start_only_and_gaps_inside_its_span():
    tier = _tier({"t:0": [(0, 50), (60, 300)]}, {"t:0": 200}, trusted=False)
    plan = tier.plan([HistoryRange("t:0", 0, 400)], "auto")
    assert plan.archive == [HistoryRange("t:0", 0, 50), HistoryRange("t:0", 60, 200)]
    assert plan.gap == [HistoryRange("t:0", 50, 60)]
    assert plan.kafka == [HistoryRange("t:0", 200, 400)]  # Kafka's records where Kafka has them
    assert plan.loss == []


def test_trusted_archive_serves_all_it_holds_and_archive_only_reads_nothing_from_kafka():
    trusted = _tier({"t:0": [(0, 300)]}, {"t:0": 200}, trusted=True)
    plan = trusted.plan([HistoryRange("t:0", 0, 400)], "auto")
    assert plan.archive == [HistoryRange("t:0", 0, 300)] and plan.kafka == [HistoryRange("t:0", 300, 400)]
    untrusted = _tier({"t:0": [(0, 300)]}, {"t:0": 200}, trusted=False)
    alone = untrusted.plan([HistoryRange("t:0", 0, 400)], "archive")
    assert alone.archive == [HistoryRange("t:0", 0, 300)] and alone.kafka == []
    assert alone.loss == [HistoryRange("t:0", 300, 400)]  # past the archive: data loss, never Kafka


def test_history_source_kafka_never_reads_the_archive():
    tier = _tier({"t:0": [(0, 300)]}, {"t:0": 200}, trusted=True)
    plan = tier.plan([HistoryRange("t:0", 0, 400)], "kafka")
    assert plan.kafka == [HistoryRange("t:0", 0, 400)] and not plan.archive


@settings(max_examples=examples(300), deadline=None)
@given(
    held=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1])),
                  max_size=4),
    log_start=st.integers(0, 80),
    ranges=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 30)), min_size=1, max_size=3),
    source=st.sampled_from(["auto", "archive", "kafka"]),
    trusted=st.booleans(),
)
def test_every_planned_offset_is_in_exactly_one_tier(held, log_start, ranges, source, trusted):
    # disjoint ranges of one split, as the planner makes them
    ordered, cursor = [], 0
    for start, size in sorted(ranges):
        lo = max(start, cursor)
        ordered.append(HistoryRange("t:0", lo, lo + size))
        cursor = lo + size
    tier = _tier({"t:0": held}, {"t:0": log_start}, trusted=trusted)
    plan = tier.plan(ordered, source)
    assert isinstance(plan, TierPlan)
    # a read of the archive alone is counted from the holdings, not observed: one record per offset of
    # the archive's part (the reference: its offsets one by one, each held by the archive)
    held_offsets = {o for lo, hi in held for o in range(lo, hi)}
    assert sum(tier.held_counts(plan).values()) == sum(o in held_offsets for _, o in _offsets(plan.archive))
    planned = sorted(_offsets(plan.archive) + _offsets(plan.kafka) + _offsets(plan.gap) + _offsets(plan.loss))
    assert planned == sorted(_offsets(ordered))
    for split, offset in _offsets(plan.archive):
        assert any(lo <= offset < hi for lo, hi in held)
        if source == "auto" and not trusted:
            assert offset < log_start  # an untrusted archive never stands in for Kafka
    if source == "archive":
        assert not plan.kafka
    if source != "kafka":  # (kafka: the reader meets what lies below the log start as data loss)
        assert all(o >= log_start for _, o in _offsets(plan.kafka))


def test_an_archive_path_that_is_no_delta_table_is_refused_naming_it(tmp_path):
    import pytest

    from source_backfill.errors import ArchiveError

    tier = ArchiveTier(None, [ArchiveConfig(path=str(tmp_path / "typo"))], _Admin({}))  # type: ignore[arg-type]
    with pytest.raises(ArchiveError, match="typo.* is not a Delta table"):
        tier.held()


def test_an_archive_without_kafka_s_columns_is_refused_naming_them(tmp_path):
    import pyarrow as pa
    import pytest
    from deltalake import write_deltalake

    from source_backfill.errors import ArchiveError

    # the offsets are there (a table of them plans fine) but no key, value or timestamps to copy
    write_deltalake(str(tmp_path / "bare"), pa.table({"topic": ["t"], "partition": pa.array([0], pa.int32()),
                                                      "offset": pa.array([0], pa.int64())}))
    tier = ArchiveTier(None, [ArchiveConfig(path=str(tmp_path / "bare"))], _Admin({}))  # type: ignore[arg-type]
    with pytest.raises(ArchiveError, match="has no key, value, timestamp, timestampType column"):
        tier.held()


def test_several_archives_in_order_each_offset_from_the_first_that_holds_it():
    # the first (trusted) holds 0..99 and 150..199, the second (untrusted) 0..179; the log starts at 160
    tier = _tier({"t:0": [(0, 100), (150, 200)]}, {"t:0": 160}, trusted=True,
                 more=[({"t:0": [(0, 180)]}, False)])
    plan = tier.plan([HistoryRange("t:0", 0, 300)], "auto")
    assert plan.by_archive == {0: [HistoryRange("t:0", 0, 100), HistoryRange("t:0", 150, 200)],
                               1: [HistoryRange("t:0", 100, 150)]}  # the second fills the first's hole
    assert plan.kafka == [HistoryRange("t:0", 200, 300)] and plan.gap == plan.loss == []
    assert tier.held() == {"t:0": [(0, 200)]}  # all of theirs: what stands for the log below its start
    assert tier.held_counts(plan) == {"t:0": 200}  # 150 from the first, 50 from the second


@settings(max_examples=examples(300), deadline=None)
@given(
    files=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20), st.booleans()), max_size=5),
    log_start=st.integers(0, 80),
    ranges=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 30)), min_size=1, max_size=3),
)
def test_files_taken_whole_and_the_plan_left_hold_each_planned_archive_offset_once(files, log_start, ranges):
    from connectors.delta.archive import ArchiveFile

    # an archive of one-split files (disjoint runs, as a trusted archive's are); some not fitting the sink
    runs, at = [], 0
    for gap, size, fits in files:
        runs.append((at + gap, at + gap + size, fits))
        at += gap + size
    ordered, cursor = [], 0
    for start, size in sorted(ranges):
        lo = max(start, cursor)
        ordered.append(HistoryRange("t:0", lo, lo + size))
        cursor = lo + size
    tier = _tier({"t:0": [(lo, hi) for lo, hi, _ in runs]}, {"t:0": log_start}, trusted=True)
    tier.tables[0]._holdings = ArchiveHoldings(  # noqa: SLF001
        version=3, held={"t:0": [(lo, hi) for lo, hi, _ in runs]},
        files=tuple(ArchiveFile(f"/a/{i}.parquet", "t:0", lo, hi) for i, (lo, hi, _) in enumerate(runs)))
    fitting = {f"/a/{i}.parquet" for i, (_, _, fits) in enumerate(runs) if fits}
    plan = tier.plan(ordered, "auto")
    whole, rest = tier.whole_files(plan, lambda paths: [p for p in paths if str(p) in fitting])
    # each archive offset of the plan: in exactly one whole file or in the plan left; Kafka's part as it was
    taken = [("t:0", o) for f in whole for o in range(f.start, f.end)]
    assert sorted(taken + _offsets(rest.archive)) == sorted(_offsets(plan.archive))
    assert rest.kafka == plan.kafka and rest.gap == plan.gap and rest.loss == plan.loss
    assert rest.by_archive.get(0, []) == rest.archive
    archive_offsets = {o for _, o in _offsets(plan.archive)}
    for f in whole:
        assert f.path in fitting and set(range(f.start, f.end)) <= archive_offsets
    # every fitting file inside the plan's archive part is taken (nothing read that could be linked)
    for i, (lo, hi, fits) in enumerate(runs):
        if fits and set(range(lo, hi)) <= archive_offsets:
            assert f"/a/{i}.parquet" in {f.path for f in whole}
    assert sum(tier.held_counts(rest).values()) + len(taken) == sum(tier.held_counts(plan).values())
