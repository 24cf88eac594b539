"""The Prometheus files of deploy/prometheus: valid for Prometheus itself, and every alert unit-tested.

``promtool`` (Debian: ``apt-get install prometheus``; ``make test`` installs it when run as root) checks the
config and rules and runs the rules' unit tests in ``alerts_test.yml``; without it those tests skip.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

PROMETHEUS = Path(__file__).resolve().parents[3] / "deploy" / "prometheus"

promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not on PATH (Debian: apt-get install prometheus; make test installs it as root)",
)


def _promtool(*args: str) -> str:
    done = subprocess.run(["promtool", *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


@promtool
def test_promtool_accepts_the_config_and_the_rules():
    assert "SUCCESS" in _promtool("check", "config", "prometheus.yml")  # its rule_files are checked too
    assert "SUCCESS" in _promtool("check", "rules", "alerts.yml")


@promtool
def test_the_alert_rules_pass_their_unit_tests():
    assert "SUCCESS" in _promtool("test", "rules", "alerts_test.yml")


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_does_not():
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    assert alerts, "no alert rules found"
    assert alerts - fires == set(), "alerts never seen firing in alerts_test.yml"
    assert alerts - silent == set(), "alerts never seen staying silent in alerts_test.yml"
    assert (fires | silent) - alerts == set(), "alerts_test.yml tests alerts that alerts.yml does not define"
