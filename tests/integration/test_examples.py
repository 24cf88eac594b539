"""The example users copy (examples/) passes as they run it: ``pytest -p source_backfill.testing``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("example", [
    "test_my_pipeline.py",
    pytest.param("test_my_secured_pipeline.py", marks=pytest.mark.slow),  # its own secured broker: slow tier
    pytest.param("test_my_avro_pipeline.py", marks=pytest.mark.slow),  # the registry: slow tier
    pytest.param("test_my_protobuf_pipeline.py", marks=pytest.mark.slow),
])
def test_the_example_pipeline_test_passes_with_the_plugin(example, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(  # noqa: S603 - this interpreter's pytest on the repository's example
        [sys.executable, "-m", "pytest", "-p", "source_backfill.testing", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(ROOT / "examples" / example)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    tail = "\n".join(line for line in done.stdout.splitlines() if not line.startswith("%"))[-3000:]
    assert done.returncode == 0, tail + done.stderr[-2000:]
    assert "1 passed" in done.stdout, tail
