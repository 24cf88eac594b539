"""Test configuration: shared fixtures live in tests/fixtures and are loaded as plugins."""

pytest_plugins = ["tests.fixtures.spark", "tests.fixtures.kafka"]
