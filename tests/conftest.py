"""Test configuration: shared fixtures live in tests/fixtures and are loaded as plugins.

Hypothesis runs without its per-example deadline: the suite shares 2 cores with Spark, a broker and
other tests, where a 5 ms example can take 300 ms, and a deadline then fails a correct property as
flaky. Timings belong in benchmarks. ``make test`` runs fewer examples than CI (``tests/budget.py``).

``make test`` runs the suite on two pytest-xdist workers (``--dist loadfile``: a file's tests stay on one
worker, with its module fixtures); a worker's output does not reach the terminal, so a test that has a
line for the run's output (the crash suite's summary) records it as the user property ``summary`` and
:func:`pytest_terminal_summary` prints it, pass or fail, with or without workers.
"""

from hypothesis import settings

from tests.budget import FULL

# ``make test`` runs a quarter of each property test's examples, CI's ``make test-properties`` all of
# them (tests/budget.py); a test that names no number runs 25 or Hypothesis' 100
settings.register_profile("suite", deadline=None, max_examples=25)
settings.register_profile("full", deadline=None)
settings.load_profile("full" if FULL else "suite")

pytest_plugins = ["tests.fixtures.spark", "tests.fixtures.kafka", "tests.fixtures.schema_registry"]


def pytest_terminal_summary(terminalreporter):
    """Print the ``summary`` user properties the tests recorded (they travel back from xdist's workers)."""
    lines = [f"{report.nodeid}: {value}"
             for reports in terminalreporter.stats.values() for report in reports
             if getattr(report, "when", None) == "call"
             for key, value in getattr(report, "user_properties", ()) if key == "summary"]
    if lines:
        terminalreporter.section("summaries")
        for line in lines:
            terminalreporter.write_line(line)
