"""The dry run's plan: where a job would start, the time at a rate, the measured rate, retention."""

from __future__ import annotations

from source_backfill.config import JobSpec
from source_backfill.runtime.dry_run import (
    HistoryRates,
    SplitPlan,
    effective_limit,
    retention_overtakes,
    seconds_at,
    start_offsets,
)


def spec(**kw) -> JobSpec:
    return JobSpec(name="j", source="s", sink_path="/t/j", **kw)


def test_start_offsets_follow_the_job_s_attach_rules() -> None:
    splits, earliest, ends = ["t:0", "t:1"], {"t:0": 10, "t:1": 0}, {"t:0": 100, "t:1": 50}
    never = lambda *_: {}  # noqa: E731
    assert start_offsets(spec(), splits, earliest, ends, never) == {"t:0": 10, "t:1": 0}
    offsets = spec(start={"kind": "offsets", "offsets": {"t:0": 5, "t:1": 70}})
    assert start_offsets(offsets, splits, earliest, ends, never) == {"t:0": 10, "t:1": 50}  # clamped
    assert start_offsets(spec(start={"kind": "latest"}), splits, earliest, ends, never) == ends
    ts = spec(start={"kind": "timestamp", "timestamp_ms": 7})
    found = {"t:0": 40, "t:1": 3}
    assert start_offsets(ts, splits, earliest, ends, lambda s, t: found) == found


def test_the_limit_and_the_seconds() -> None:
    assert effective_limit(spec(), 0.5) is None
    assert effective_limit(spec(rate_limit=2000.0), 0.5) == 2000
    assert effective_limit(spec(rate_limit=2000.0, max_rows_per_epoch=500), 0.5) == 1000
    # the rate limit is kept on the wall clock: epochs 1 s apart on a 0.5 s trigger read at the limit
    assert effective_limit(spec(rate_limit=2000.0), 0.5, 1.0) == 2000
    # max_rows_per_epoch is a budget per epoch: half as many epochs read half as many rows per second
    assert effective_limit(spec(max_rows_per_epoch=500), 0.5, 1.0) == 500
    assert effective_limit(spec(max_rows_per_epoch=500), 0.5, 0.2) == 1000  # never above the cap
    assert seconds_at(50_000, 2000) == 25 and seconds_at(5, None) is None and seconds_at(0, 0) == 0
    assert seconds_at(50_000, 2000, startup_s=3) == 28
    assert seconds_at(5, 0) == float("inf")


def test_what_the_daemon_measured_on_a_source() -> None:
    rates = HistoryRates(since=1000.0)
    rates.observe("s", "old", "backfilling", 10**6, created_at=900.0, limited=False, now=1001.0)
    assert rates.rate("s") is None and rates.startup_s("s") is None  # recovered after a restart
    rates.observe("s", "a", "backfilling", 0, created_at=1000.0, limited=False, now=1001.0)
    rates.observe("s", "a", "backfilling", 1000, created_at=1000.0, limited=False, now=1004.0)
    assert rates.startup_s("s") == 4  # create to the first history rows
    rates.observe("s", "a", "backfilling", 20_000, created_at=1000.0, limited=False, now=1005.0)
    assert rates.rate("s") == 4000  # so far, create to now
    rates.observe("s", "a", "finished", 40_000, created_at=1000.0, limited=False, now=1008.0)
    rates.observe("s", "a", "finished", 40_000, created_at=1000.0, limited=False, now=1100.0)
    assert rates.rate("s") == 5000  # kept from its finish, not diluted while it follows the live stream
    rates.observe("s", "b", "backfilling", 1000, created_at=1200.0, limited=False, now=1201.0)
    rates.observe("s", "b", "finished", 9000, created_at=1200.0, limited=False, now=1203.0)
    assert rates.rate("s") == 5000  # slower than the fastest finished: not the daemon's pace
    rates.observe("s", "slow", "backfilling", 10, created_at=1300.0, limited=True, now=1300.5)
    assert rates.rate("s") == 5000 and rates.startup_s("s") == 0.5  # a limited job: its startup only
    for epoch, at in ((7, 100.0), (8, 101.0), (8, 101.0), (9, 102.5)):
        rates.observe_epoch("s", epoch, at)
    assert rates.epoch_period_s("s") == 1.25 and rates.epoch_period_s("other") is None


def test_a_retention_warning_when_the_log_start_would_pass_the_copy() -> None:
    now = 1_000_000
    # one record a millisecond since now - 100 s; kept 120 s: the log start moves 1000 offsets/s
    written_at = lambda o: now - 100_000 + o  # noqa: E731
    plans = [SplitPlan("t:0", 0, 100_000, 0)]

    def log_start_at(splits, ts_ms):
        return {s: max(0, ts_ms - written_at(0)) for s in splits}

    assert retention_overtakes(plans, 5000, {"t": 120_000}, log_start_at, now) is None  # copy outruns it
    warning = retention_overtakes(plans, 500, {"t": 120_000}, log_start_at, now)  # 20 s ahead, half its pace
    assert warning is not None and "log start of t:0" in warning and "passes the copy" in warning
    assert retention_overtakes(plans, 500, {"t": None}, log_start_at, now) is None  # kept forever


class _Admin:
    """The admin calls a plan makes, over a fixed log: ``t`` with two partitions."""

    def topic_partitions(self):
        return {"t": 2}

    def list_splits(self, topics):
        return [("t", 0), ("t", 1)]

    def earliest_offsets(self, splits):
        return {"t:0": 100, "t:1": 0}

    def end_offsets(self, splits):
        return {"t:0": 1100, "t:1": 500}

    def offsets_for_timestamp(self, splits, ts):
        return {s: 0 for s in splits}

    def retention_ms(self, topics):
        return {t: None for t in topics}


def test_a_kafka_plan_per_split_with_both_estimates_and_start_warnings() -> None:
    from source_backfill.config import SourceConfig
    from source_backfill.runtime.dry_run import plan_kafka_job

    source = SourceConfig(name="s", topics=["t"], bootstrap_servers="x:9092", trigger_interval_s=0.5)
    rates = HistoryRates(since=0.0)
    rates.observe("s", "done", "finished", 3000, created_at=10.0, limited=False, now=13.0)  # 1000 rows/s
    job = spec(rate_limit=300.0, start={"kind": "offsets", "offsets": {"t:0": 50, "u:3": 1}})
    plan = plan_kafka_job(job, source, _Admin(), rates)
    assert [(s["split"], s["from_offset"], s["to_offset"]) for s in plan["splits"]] == [
        ("t:0", 100, 1100), ("t:1", 0, 500)]
    assert plan["offsets_total"] == 1500 and plan["bytes_total"] is None
    assert plan["seconds_at_rate_limit"] == 5.0 + 3.0  # at 300 rows/s, after the 3 s startup measured
    assert plan["seconds_at_measured_rate"] == 1.5
    warnings = " | ".join(plan["warnings"])
    assert "u:3" in warnings and "below the log start" in warnings


def _archive(path, held: dict[int, list[range]]) -> None:
    """An archive table of ``t``: per partition, the offsets of ``held``'s ranges (Kafka's columns)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    rows = [(p, o) for p, ranges in held.items() for r in ranges for o in r]
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())])
    write_deltalake(str(path), pa.table({
        "key": [None] * len(rows), "value": [b"v"] * len(rows), "topic": ["t"] * len(rows),
        "partition": [p for p, _ in rows], "offset": [o for _, o in rows],
        "timestamp": [0] * len(rows), "timestampType": [0] * len(rows)}, schema=schema))


def test_a_plan_with_the_source_s_archive_starts_where_the_attach_would_and_counts_tiers(tmp_path) -> None:
    from source_backfill.config import SourceConfig
    from source_backfill.runtime.dry_run import plan_kafka_job

    # t:0's log starts at 100: the archive holds 0..39 and 50..149 of it (40..49: a gap); t:1's at 0
    _archive(tmp_path / "a", {0: [range(0, 40), range(50, 150)], 1: [range(0, 10)]})
    for trusted, t0 in ((False, {"archive": 90, "kafka": 1000, "gap": 10, "loss": 0}),
                        (True, {"archive": 140, "kafka": 950, "gap": 10, "loss": 0})):
        source = SourceConfig(name="s", topics=["t"], bootstrap_servers="x:9092",
                              archive={"path": str(tmp_path / "a"), "trusted": trusted})
        plan = plan_kafka_job(spec(), source, _Admin(), HistoryRates(since=0.0))
        by_split = {s["split"]: s for s in plan["splits"]}
        assert (by_split["t:0"]["from_offset"], by_split["t:0"]["log_start"]) == (0, 100)  # archive first
        assert by_split["t:0"]["tiers"] == t0, trusted
        assert by_split["t:1"]["tiers"]["kafka"] == (500 if not trusted else 490)
        assert plan["tiers_total"]["archive"] == t0["archive"] + (0 if not trusted else 10)
        assert sum(plan["tiers_total"].values()) == plan["offsets_total"] == 1100 + 500
    # a job reading Kafka alone has no tiers and starts at the log start
    plan = plan_kafka_job(spec(history_source="kafka"), source, _Admin(), HistoryRates(since=0.0))
    assert plan["tiers_total"] is None and plan["splits"][0]["from_offset"] == 100
    # the archive alone: what it lacks above its span is data loss, said so
    plan = plan_kafka_job(spec(history_source="archive"), source, _Admin(), HistoryRates(since=0.0))
    assert plan["tiers_total"]["loss"] == (1100 - 150) + (500 - 10)
    assert any("neither the archive nor Kafka" in w for w in plan["warnings"])


def test_an_archive_that_cannot_be_read_is_a_warning_of_the_plan(tmp_path) -> None:
    from source_backfill.config import SourceConfig
    from source_backfill.runtime.dry_run import plan_kafka_job

    source = SourceConfig(name="s", topics=["t"], bootstrap_servers="x:9092",
                          archive={"path": str(tmp_path / "nothing")})
    plan = plan_kafka_job(spec(), source, _Admin(), HistoryRates(since=0.0))
    assert any("cannot be read" in w for w in plan["warnings"]), plan["warnings"]


class _Table:
    """A delta source's table as the plan reads it: its newest version and data files (with row counts)."""

    def __init__(self, rows: int | None, files: int = 4) -> None:
        self.rows, self.files = rows, files

    def latest_version(self) -> int:
        return 9

    def data_files(self, version: int) -> list[tuple[str, int]] | None:
        if self.rows is None:  # a file without statistics
            return None
        share, extra = divmod(self.rows, self.files)
        return [(f"f{i}", share + (i < extra)) for i in range(self.files)]


def test_a_table_plan_says_how_the_copy_would_go_by_the_job_s_own_rule() -> None:
    from source_backfill.config import SourceConfig
    from source_backfill.runtime.dry_run import plan_table_job

    source = SourceConfig(name="t", kind="delta", table_path="/t", primary_key=["id"], spark_copy_rows=1000,
                          table_index_rows=5000)

    def plan(strategy: str, rows: int | None, *, spark: bool = True, **kw: object) -> dict:
        spec = JobSpec(name="j", source="t", sink_path="/x", strategy=strategy, **kw)
        return plan_table_job(spec, source, _Table(rows), spark=spark)

    big = plan("snapshot", 1000, rate_limit=100.0)
    assert big["table"] | {"why": ""} == {"version": 9, "rows": 1000, "files": 4, "copy_by": "files",
                                           "engine": "spark", "spilled": False, "why": ""}
    assert "spark_copy_rows" in big["table"]["why"] and big["seconds_at_rate_limit"] == 10.0
    assert plan("chain", 5000)["table"]["copy_by"] == "files"
    small = plan("snapshot", 999)["table"]
    assert (small["copy_by"], small["engine"], small["spilled"]) == ("vnodes", "delta-rs", False)
    assert "under spark_copy_rows" in small["why"]
    no_spark = plan("snapshot", 6000, spark=False)["table"]
    assert no_spark["copy_by"] == "vnodes" and no_spark["spilled"] and "runs no Spark" in no_spark["why"]
    arranged = plan("arrangement", 10**6)["table"]  # by vnode whatever its size: its rule needs key order
    assert arranged["copy_by"] == "vnodes" and arranged["spilled"] and "arrangement" in arranged["why"]
    unknown = plan("snapshot", None)  # a file without statistics: no rows, no estimate, by vnode
    assert unknown["table"]["copy_by"] == "vnodes" and unknown["seconds_at_rate_limit"] is None
    assert plan("chain", 10**6, spark=False)["table"]["spilled"] is False  # chain reads in one pass
    off = plan_table_job(JobSpec(name="j", source="t", sink_path="/x", strategy="snapshot"),
                         source.model_copy(update={"spark_copy_rows": None}), _Table(10**6), spark=True)
    assert off["table"]["copy_by"] == "vnodes" and "off" in off["table"]["why"]
