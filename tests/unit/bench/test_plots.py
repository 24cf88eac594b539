"""The benchmark plots' arithmetic: rows/s windows from cumulative samples, and the PNGs themselves."""

from __future__ import annotations

from bench import plots


def test_rates_are_the_growth_per_window_with_the_last_count_carried():
    samples = [(0.5, 100), (1.0, 300), (2.5, 300), (2.7, 1300), (3.2, 1500)]
    ends, per_s = plots.rates(samples)
    assert ends == [1.0, 2.0, 3.0, 4.0]
    assert per_s == [300.0, 0.0, 1000.0, 200.0]
    assert plots.rates([]) == ([], [])


def test_rates_never_go_negative_when_a_count_is_sampled_late():
    _, per_s = plots.rates([(0.2, 500), (0.4, 400), (1.5, 600)])
    assert per_s == [500.0, 100.0]


def test_the_plots_are_png_files(tmp_path):
    # matplotlib comes with make venv (the bench extra): a missing one fails here, not silently
    a = plots.rows_per_s({"x": [(0.5, 10), (1.5, 30)]}, "t", "r.png", folder=tmp_path)
    b = plots.cdfs({"x": [1.0, 2.0, 5.0], "empty": []}, "t", "c.png", "ms", folder=tmp_path)
    for path in (a, b):
        assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
