"""The namespaces' bytes of the day, counted by table version: every version committed today counted
once, whatever kills cut the counts and the saves (the ledger saved whole, restored at a restart), against
a reference that sums each table's versions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.core.quota import DAY_S, DayLedger, day_of
from tests.budget import examples

JOBS = {"a1": "a", "a2": "a", "b1": "b"}

#: One step of a run: a job commits a version of ``size`` bytes (and counts it, or is killed before it
#: counts), the ledger is saved, or the process is killed (the ledger back to its last save).
step = st.one_of(
    st.tuples(st.just("commit"), st.sampled_from(sorted(JOBS)), st.integers(0, 10_000), st.booleans()),
    st.tuples(st.just("save")),
    st.tuples(st.just("kill")),
)


@settings(max_examples=examples(200), deadline=None)
@given(steps=st.lists(step, max_size=60))
def test_every_version_of_the_day_is_counted_once_whatever_the_kills(steps):
    today = 20_000
    tables: dict[str, list[int]] = {job: [] for job in JOBS}  # the sizes of each table's versions
    ledger = DayLedger(day=today)
    saved = DayLedger.from_json(ledger.to_json())
    first: dict[str, int] = {}  # the version each job's first count started at (before: not counted)

    def added(job: str):
        return lambda v: (tables[job][v], today * DAY_S * 1000 + 5) if v < len(tables[job]) else None

    for s in steps:
        if s[0] == "commit":
            _, job, size, counted = s
            tables[job].append(size)
            if counted:  # else killed between the commit and its count: the next count takes it
                first.setdefault(job, len(tables[job]) - 1)
                ledger.count(job, JOBS[job], len(tables[job]) - 1, today, added(job))
        elif s[0] == "save":
            saved = DayLedger.from_json(ledger.to_json())
        else:
            ledger = DayLedger.from_json(saved.to_json())
            first = {j: v for j, v in first.items() if j in saved.versions}
    for job, sizes in tables.items():  # each job commits once more after the last restart, and counts
        sizes.append(1)
        first.setdefault(job, len(sizes) - 1)
        ledger.count(job, JOBS[job], len(sizes) - 1, today, added(job))
    for namespace in ("a", "b"):
        expected = sum(sum(tables[j][first[j]:]) for j, ns in JOBS.items() if ns == namespace)
        assert ledger.used(namespace, today) == expected


def test_a_version_of_another_day_is_not_counted_and_a_new_day_starts_at_zero():
    ledger = DayLedger(day=10)
    sizes = {0: (100, 10 * DAY_S * 1000), 1: (200, 10 * DAY_S * 1000 + 1), 2: (50, 11 * DAY_S * 1000)}
    ledger.count("j", "a", 1, 10, sizes.get)
    assert ledger.used("a", 10) == 100 + 200 - 100  # a job new to the ledger starts at the version given
    assert ledger.over("a", 200, 10)
    assert not ledger.over("a", 201, 10)
    assert not ledger.over("a", None, 10)
    ledger.count("j", "a", 2, 11, sizes.get)  # the next day: version 2's 50 bytes only
    assert ledger.used("a", 11) == 50
    assert ledger.used("a", 10) == 0  # the ledger keeps one day
    assert ledger.versions == {"j": 2}


def test_versions_the_log_no_longer_holds_are_skipped_and_a_replayed_version_not_counted_again():
    ledger = DayLedger(day=1)
    ledger.count("j", "a", 3, 1, lambda v: (10, None))
    ledger.count("j", "a", 6, 1, lambda v: None if v == 5 else (10, None))  # 4 and 6; 5 cleaned up
    assert ledger.used("a", 1) == 30
    ledger.count("j", "a", 6, 1, lambda v: (10, None))  # the same version again: nothing more
    ledger.count("j", "a", 2, 1, lambda v: (10, None))  # an older one (a replay's): nothing more
    assert ledger.used("a", 1) == 30
    assert ledger.versions == {"j": 6}


def test_a_dropped_job_of_the_same_name_counts_its_new_table_from_its_first_version():
    ledger = DayLedger(day=1)
    ledger.count("j", "a", 40, 1, lambda v: (1, None))
    ledger.forget(["j"])
    ledger.count("j", "a", 0, 1, lambda v: (7, None))
    assert ledger.used("a", 1) == 8


def test_day_of_is_the_utc_day():
    assert day_of(0) == 0
    assert day_of(DAY_S - 0.001) == 0
    assert day_of(DAY_S) == 1


@given(st.one_of(st.none(), st.integers(), st.text(), st.dictionaries(st.text(), st.integers()),
                 st.fixed_dictionaries({"day": st.integers(), "written": st.just({"a": "x"}),
                                        "versions": st.just({})})))
def test_a_ledger_file_that_is_not_one_is_refused(data):
    try:
        DayLedger.from_json(data) if isinstance(data, dict) else DayLedger.from_json({"day": data})
    except ValueError:
        return
    raise AssertionError(data)
