"""Test configuration: shared fixtures live in tests/fixtures and are loaded as plugins.

Hypothesis runs without its per-example deadline: the suite shares 2 cores with Spark, a broker and
other tests, where a 5 ms example can take 300 ms, and a deadline then fails a correct property as
flaky. Timings belong in benchmarks.
"""

from hypothesis import settings

settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

pytest_plugins = ["tests.fixtures.spark", "tests.fixtures.kafka"]
