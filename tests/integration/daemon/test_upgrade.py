"""An upgrade: the daemon of the release before lanes, stopped mid-backfill, restarted on this code.

Lanes changed how a job resumes (its ``live_to`` comes from its last commit's ``covered_to``, and every
batch is checked to start where its output ends), not what it writes: this test holds the state the
previous release wrote (its mutation log, its source's checkpoint, its jobs' Delta commits) to that. The
previous release is this repository's own history (``git archive`` of :data:`PREVIOUS`), run as a daemon
process; a source tree without its history (a tarball) skips, saying why.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from connectors.jars import jars_root
from source_backfill.testing import RunningDaemon
from tests.integration.daemon.conftest import exactly_once, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
#: The last commit before lanes (9008018): the release whose state this code must take over.
PREVIOUS = "287ead4"
HISTORY = 20_000


@pytest.fixture
def previous_release(tmp_path: Path) -> Path:
    """The previous release's packages (``source_backfill``, ``connectors``), extracted from git."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the previous release comes from the repository's history")
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"],  # noqa: S607
                           capture_output=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this clone (a shallow clone?)")
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS, "source_backfill", "connectors"],  # noqa: S607
                         capture_output=True, check=True).stdout
    out = tmp_path / "previous"
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(out, filter="data")
    return out


def _daemon(work: Path, bootstrap: str, topic: str, code: Path) -> RunningDaemon:
    """The daemon process on ``work``'s state, running the packages under ``code``."""
    jobs = [{"name": "copying", "source": "src", "rate_limit": 1_500},  # mid-backfill at the stop
            {"name": "caught-up", "source": "src"}]  # Finished before it: resumes from its commit
    daemon = RunningDaemon(work, bootstrap, [{"name": "src", "topics": [topic]}], jobs,
                           {"daemon": {"shutdown_timeout_s": 10}})
    assert daemon.env is not None
    daemon.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
    daemon.env["SOURCE_BACKFILL_JARS"] = str(jars_root())  # the same pom: this checkout's fetched jars
    return daemon


@pytest.mark.slow  # two daemon processes one after the other (~1-3 min): make test-slow (CI)
def test_the_previous_release_stopped_mid_backfill_ends_exactly_once_on_this_code(
    previous_release, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(HISTORY, 2)
    p.stream(2, per_second=40)
    work = tmp_path / "daemon"
    work.mkdir()
    old = _daemon(work, kafka_bootstrap, topic, previous_release)
    old.start()
    try:
        old.wait_ready(240)
        old.wait_finished("caught-up", 240)
        wait_for(lambda: old.job("copying")["rows_history"] > 0, what="the copy under way")
        view = old.job("copying")
        assert view["status"] == "backfilling"
        assert "lag_s" not in view, "the first daemon ran this code, not the previous release's"
        assert old.stop(timeout_s=60) == 0
    finally:
        old.kill()

    new = _daemon(work, kafka_bootstrap, topic, ROOT)
    new.start()
    try:
        new.wait_ready(240)
        assert "lag_s" in new.job("copying")  # this code now
        new.wait_finished("copying", 300)
        new.wait_finished("caught-up", 120)
        p.stop()
        for job in ("copying", "caught-up"):  # every offset of the log once, offset by offset
            assert exactly_once(new.tables / job, kafka_bootstrap, [topic]).ok
    finally:
        new.kill()
