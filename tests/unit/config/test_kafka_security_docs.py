"""The worked configurations of docs/operations/kafka-security.md and the deploy examples load as written."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from source_backfill.config import SourceConfig

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "operations" / "kafka-security.md"


def _toml_blocks() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", PAGE.read_text(), flags=re.S)


@pytest.mark.parametrize("block", _toml_blocks())
def test_each_worked_source_on_the_page_is_a_valid_source(block: str) -> None:
    [source] = tomllib.loads(block)["sources"]
    config = SourceConfig.model_validate(source)
    assert config.security.protocol in ("SASL_SSL", "SSL")


def test_the_page_has_both_worked_configurations() -> None:
    protocols = {tomllib.loads(b)["sources"][0]["security"]["protocol"] for b in _toml_blocks()}
    assert protocols == {"SASL_SSL", "SSL"}


def test_the_kubernetes_example_secret_has_the_files_its_source_line_names() -> None:
    path = ROOT / "deploy" / "k8s" / "examples" / "kafka-client.yaml"
    secret = yaml.safe_load(path.read_text())
    line = "".join(t.lstrip("# ").rstrip() + " " for t in path.read_text().splitlines()
                   if "security =" in t or "password_file" in t)
    named = set(re.findall(r"/var/run/secrets/kafka/([\w.]+)", line))
    assert named and named <= set(secret["stringData"])
