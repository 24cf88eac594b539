"""Benchmarks: ``python -m bench [name ...]`` (``make bench``); figures go to :data:`RESULTS`."""

from pathlib import Path

#: Every benchmark's figures, merged (``bench/__main__.py``); the README's goals table is written from it.
RESULTS = Path(__file__).parent / "results" / "latest.json"
