"""Live latency measured in the product: a Finished job's live rows fill ``live_latency_seconds``, and
``GET /jobs/{name}`` gives their p50/p99 over the last minute (core.latency's definition)."""

from __future__ import annotations

import httpx
import pytest

from source_backfill.testing.metrics import scrape, total
from tests.integration.daemon.conftest import finished, job_of, job_spec, wait_for

pytestmark = pytest.mark.integration

HISTOGRAM = "live_latency_seconds"


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_a_finished_jobs_live_rows_fill_the_latency_histogram_and_the_api(
    daemon_factory, new_topic, producer_for, tmp_path, monkeypatch, path
):
    if path == "spark":  # every live batch aggregated by Spark: latency from each split's timestamp range
        from source_backfill.runtime import source as live_source

        monkeypatch.setattr(live_source, "SMALL_BATCH_ROWS", 0)
    name = f"lat-{path}"  # the metrics are the process's: one job name per case, none carried over
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(200, 2)  # some history: not measured
    d = daemon_factory([topic], [job_spec(name, tmp_path)])
    wait_for(lambda: finished(d, name), timeout=120, what="backfill finished")
    history = job_of(d, name).rows[0]
    p.stream(2, per_second=50)
    wait_for(lambda: total(scrape(d.api_url), f"{HISTOGRAM}_count", job=name) >= 100, timeout=120,
             what="live rows measured")
    p.stop()
    after = scrape(d.api_url)
    measured = total(after, f"{HISTOGRAM}_count", job=name)
    assert history >= 200
    assert measured <= total(after, "job_rows", job=name, kind="live")  # live rows only, never history
    mean = total(after, f"{HISTOGRAM}_sum", job=name) / measured
    # seconds, not hours (a time zone) nor negative (a unit): forcing the Spark path on 2 shared cores,
    # epochs fall behind and the figure is honestly tens of seconds
    assert 0 < mean < 120
    job = httpx.get(f"{d.api_url}/jobs/{name}").json()
    lat = job["live_latency"]
    assert lat["timestamp_type"] == "create_time" and lat["window_s"] == 60 and lat["rows"] > 0
    assert 0 < lat["p50_s"] <= lat["p99_s"] < 120
    print(f"{path}: live latency p50={lat['p50_s']:.3f}s p99={lat['p99_s']:.3f}s mean={mean:.3f}s "
          f"rows={lat['rows']}")
