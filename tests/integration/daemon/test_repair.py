"""Repair a range in place (issue 31): a job's transform changed, then a window of its rows re-copied.

Real broker, real Spark, the daemon's HTTP API. A job writes ``v<i>``; its transform is changed to write
``V<i>`` (``PATCH /jobs/{name}``: from the next epoch on), and a repair of partition 0's offsets
``[50, 100)`` (``POST /jobs/{name}/repair``) replaces exactly those rows with the new transform's, in one
commit: every other row is as it was, the table still holds each offset once, and a repair replayed (a
crash after its commit) changes nothing. Each attack a client can send is refused, saying why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.daemon.conftest import exactly_once, finished, job_of, job_spec, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 2
KEEP = "SELECT topic, partition, offset, CAST(value AS STRING) AS v FROM {source}"
UPPER = "SELECT topic, partition, offset, upper(CAST(value AS STRING)) AS v FROM {source}"


def _rows(path: Path) -> dict[tuple[int, int], list[str]]:
    from deltalake import DeltaTable

    t = DeltaTable(str(path)).to_pyarrow_table(columns=["partition", "offset", "v"])
    out: dict[tuple[int, int], list[str]] = {}
    for p, o, v in zip(*(t.column(c).to_pylist() for c in ("partition", "offset", "v")), strict=True):
        out.setdefault((p, o), []).append(v)
    return out


def test_a_repair_replaces_exactly_its_window_with_the_new_transform_s_rows_in_one_commit(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    import httpx
    from deltalake import DeltaTable

    from source_backfill import metrics
    from source_backfill.config import RepairSpec
    from source_backfill.executors.repair import run_repair
    from tests.integration.daemon.conftest import metric_total

    def counted() -> tuple[float, ...]:
        return (metric_total(metrics.JOB_REPAIRS, job="j", outcome="done"),
                metric_total(metrics.JOB_REPAIRS, job="j", outcome="failed"),
                metric_total(metrics.JOB_REPAIR_ROWS, job="j", kind="removed"),
                metric_total(metrics.JOB_REPAIR_ROWS, job="j", kind="added"))

    before = counted()

    topic = new_topic(PARTITIONS)
    producer = producer_for(topic)
    producer.send(400, PARTITIONS)  # offsets 0..199 per partition, record i at (i % 2, i // 2)
    table = tmp_path / "j"
    d = daemon_factory([topic], [job_spec("j", tmp_path, transform=KEEP),
                                 job_spec("bare", tmp_path, transform="SELECT CAST(value AS STRING) AS v "
                                                                      "FROM {source}")])
    api = d.api_url
    wait_for(lambda: finished(d, "j") and len(_rows(table)) == 400, timeout=120, what="j copied its history")

    # the transform changes from the next epoch on: live rows after it are upper case
    r = httpx.patch(f"{api}/jobs/j", json={"transform": UPPER})
    assert r.status_code == 202, r.text
    assert r.json()["transform"] == UPPER
    wait_for(lambda: job_of(d, "j").spec.transform == UPPER, what="the new transform taken at a boundary")
    producer.send(20, PARTITIONS, start=400)  # offsets 200..209 per partition
    wait_for(lambda: len(_rows(table)) == 420, what="the live rows after the change")
    rows = _rows(table)
    assert rows[(0, 205)] == ["V410"] and rows[(0, 60)] == ["v120"]  # new rows new, old rows old

    version_before = DeltaTable(str(table)).version()
    window = {"splits": [f"{topic}:0"], "from_offset": 50, "to_offset": 100}
    r = httpx.post(f"{api}/jobs/j/repair", json=window)
    assert r.status_code == 202, r.text
    repair_id = r.json()["id"]
    assert r.json()["state"] == "pending"

    def repair() -> dict | None:
        views = httpx.get(f"{api}/jobs/j").json()["repairs"]
        return next((v for v in views if v["id"] == repair_id and v["state"] != "pending"), None)

    done = wait_for(repair, timeout=120, what="the repair done")
    assert done["state"] == "done", done
    assert done["ranges"] == {f"{topic}:0": [50, 100]}
    assert (done["rows_removed"], done["rows_added"]) == (50, 50)
    assert [a - b for a, b in zip(counted(), before, strict=True)] == [1, 0, 50, 50]  # the metrics
    rows = _rows(table)
    for (p, o), vs in rows.items():  # exactly the window changed, each offset still once
        want = f"v{o * PARTITIONS + p}"
        if p == 0 and 50 <= o < 100 or o >= 200:
            want = want.upper()
        assert vs == [want], (p, o, vs)
    assert len(rows) == 420
    exactly_once(table, kafka_bootstrap, [topic])
    # one commit: the window's rows out and the fresh ones in, carrying the repair's transaction
    from connectors.delta.log import read_commit

    commit = read_commit(str(table), done["version"])
    assert commit is not None and done["version"] > version_before
    assert DeltaTable(str(table)).transaction_version("j.repair") == repair_id

    # replayed (the daemon died after the commit, before the repair was marked applied): nothing again
    again = run_repair(job_of(d, "j"), repair_id, RepairSpec(splits=[f"{topic}:0"], from_offset=50,
                                                             to_offset=100))
    assert again.state == "done" and again.version is None and again.rows_added is None
    assert _rows(table) == rows

    # attacks, each refused saying why, the table unchanged
    def refused(method: str, path: str, body: dict, *words: str) -> None:
        resp = httpx.request(method, f"{api}{path}", json=body)
        assert resp.status_code == 422, (body, resp.text)
        text = resp.text.lower()
        assert all(w in text for w in words), (body, resp.text)

    refused("POST", "/jobs/bare/repair", {"from_offset": 0, "to_offset": 10}, "partition", "offset")
    refused("POST", "/jobs/j/repair", {"from_offset": 10, "to_offset": 10}, "empty")
    refused("POST", "/jobs/j/repair", {"from_offset": 1, "to_offset": 5, "from_timestamp_ms": 1,
                                       "to_timestamp_ms": 2}, "one window")
    refused("POST", "/jobs/j/repair", {"splits": ["other-topic:0"], "from_offset": 0, "to_offset": 5},
            "other-topic")
    refused("POST", "/jobs/j/repair", {"splits": ["no-partition"], "from_offset": 0, "to_offset": 5})
    refused("PATCH", "/jobs/j", {"transform": "SELECT partition, offset FROM {source}"}, "columns")
    refused("PATCH", "/jobs/j", {"transform": "SELECT * FROM parquet.`/etc` JOIN {source}"})
    refused("PATCH", "/jobs/j", {"transform": "DROP TABLE x"}, "select")
    refused("PATCH", "/jobs/j", {}, "rate_limit")
    assert httpx.get(f"{api}/jobs/j").json()["transform"] == UPPER

    # a transform that moves rows out of their offsets passes the column check, but its repair fails,
    # the table unchanged: a repair never removes rows it does not put back at the same positions
    shifted = ("SELECT topic, partition, offset + 1000 AS offset, upper(CAST(value AS STRING)) AS v "
               "FROM {source}")
    r = httpx.patch(f"{api}/jobs/j", json={"transform": shifted})
    assert r.status_code == 202, r.text
    r = httpx.post(f"{api}/jobs/j/repair", json={"splits": [f"{topic}:1"], "from_offset": 0, "to_offset": 10})
    bad_id = r.json()["id"]
    bad = wait_for(lambda: next((v for v in httpx.get(f"{api}/jobs/j").json()["repairs"]
                                 if v["id"] == bad_id and v["state"] != "pending"), None),
                   timeout=120, what="the shifted repair finished")
    assert bad["state"] == "failed" and "outside the window" in bad["error"], bad
    assert counted()[1] - before[1] == 1
    assert _rows(table) == rows
