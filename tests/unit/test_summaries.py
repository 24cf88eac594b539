"""A test's ``summary`` user property is printed at the end of the run (the crash suite's line)."""

from __future__ import annotations

pytest_plugins = ["pytester"]


def test_a_recorded_summary_is_printed_in_its_section_pass_or_fail(pytester):
    pytester.makeconftest("from tests.conftest import pytest_terminal_summary  # noqa: F401\n")
    pytester.makepyfile("""
        def test_passes(record_property):
            record_property("summary", "cycles=2 missing=0")
            record_property("other", "not shown")

        def test_fails(record_property):
            record_property("summary", "cycles=1 missing=3")
            assert False
    """)
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.re_match_lines([r".*summaries.*", r".*::test_passes: cycles=2 missing=0",
                                  r".*::test_fails: cycles=1 missing=3"], consecutive=True)
    result.stdout.no_fnmatch_line("*not shown*")
