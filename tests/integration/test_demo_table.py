"""``make run-table``'s demo, shortened: three table jobs under a writer end equal to the source."""

from __future__ import annotations

import pytest

from source_backfill import demo_table
from source_backfill.testing.process import free_port

pytestmark = pytest.mark.integration


def test_the_table_demo_ends_with_every_job_equal_to_the_source(tmp_path, capsys):
    code = demo_table.main(["--rows", "5000", "--duration", "6", "--api-port", str(free_port()),
                            "--root", str(tmp_path / "demo")])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("snapshot-copy", "arrangement-copy", "chain-log"):
        assert f"{name}: " in out and "equal to the source" in out
    assert "DIFFERENT" not in out
