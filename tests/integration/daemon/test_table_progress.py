"""A table-backfill job's progress as users watch it: rows copied of the pinned version's row count (the
Delta log's count), never going back, higher after every 5 s of the snapshot, with an ETA in every phase.

(It showed ``0.0%  vnodes 0/256`` while 130,000 rows were copied, then jumped to 100 %, with no ETA.)
"""

from __future__ import annotations

import time

import pytest
from deltalake import DeltaTable

from source_backfill.testing.delta import ChangingTable
from source_backfill.testing.process import DaemonProcess, free_port
from tests.integration.daemon.conftest import table_daemon_config

pytestmark = pytest.mark.integration

ROWS = 20_000
LIMIT = 2_000


def _config(tmp_path, port):
    return table_daemon_config(tmp_path, port, f"""chunk_rows = 4
replay_versions_per_epoch = 8
[[jobs]]
name = "snap"
source = "tbl"
sink_path = "{tmp_path / 'snap'}"
strategy = "snapshot"
mode = "changelog"
rate_limit = {LIMIT}
""")


def _log_rows(path: str, version: int) -> int:
    """Rows of the table at ``version`` by its Delta log's per-file stats."""
    import pyarrow as pa

    actions = pa.table(DeltaTable(path, version=version).get_add_actions(flatten=True))
    return int(sum(actions.column("num_records").to_pylist()))


def test_table_progress_moves_with_the_rows_copied_and_has_an_eta_in_every_phase(tmp_path):
    up = ChangingTable.create(str(tmp_path / "src"), ROWS, seed=5)
    port = free_port()
    daemon = DaemonProcess(_config(tmp_path, port), port, tmp_path / "daemon.log")
    daemon.start()
    thread, stop = up.writer_thread(0.05)
    samples: list[tuple[float, dict]] = []
    try:
        daemon.wait_ready(60)
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            r = daemon.get("/jobs/snap")
            view = r.json() if r is not None and r.status_code == 200 else None
            if view is not None and view["table"] is not None:
                samples.append((time.monotonic(), view))
                phase = view["table"]["phase"]
                # past the snapshot: until the replay shows an ETA, or the job follows live
                if phase == "consume_upstream" or (phase != "consuming_snapshot"
                                                   and view["eta_seconds"] is not None):
                    break
            time.sleep(0.25)
    finally:
        stop.set()
        thread.join()
        daemon.stop()
    snapshot = [(t, v) for t, v in samples if v["table"]["phase"] == "consuming_snapshot"]
    assert len(snapshot) >= 20, f"the snapshot was too quick to watch: {len(snapshot)} samples"
    pinned = snapshot[-1][1]["table"]["pinned_version"]
    assert snapshot[-1][1]["table"]["rows_total"] == _log_rows(str(tmp_path / "src"), pinned)
    fractions = [v["progress"] for _, v in samples]
    assert fractions == sorted(fractions), "progress went back"
    for i, (t, v) in enumerate(snapshot):  # higher after every 5 s of the snapshot
        later = next(((u, w) for u, w in snapshot[i:] if u - t >= 5), None)
        if later is not None:
            assert later[1]["progress"] > v["progress"], (v["table"], later[1]["table"])
    with_rows = [v for _, v in snapshot if v["table"]["rows_copied"] > 0]
    assert with_rows and all(v["eta_seconds"] is not None for v in with_rows[1:])
    for v in with_rows[1:]:  # never faster than the rate limit
        left = v["table"]["rows_total"] - v["table"]["rows_copied"]
        assert v["eta_seconds"] >= left / LIMIT - 1e-6, v
    after = [v for _, v in samples if v["table"]["phase"] != "consuming_snapshot"]
    assert after and after[-1]["progress"] == 1.0
    assert any(v["eta_seconds"] is not None for v in after), [v["table"] for v in after]
    etas = [round(v["eta_seconds"], 1) for v in with_rows[:: max(1, len(with_rows) // 8)]]
    print(f"snapshot samples={len(snapshot)} rows_total={snapshot[-1][1]['table']['rows_total']} etas={etas}")
