"""Benchmarks: ``python -m bench [name ...]`` (``make bench``); figures go to :data:`RESULTS`."""

from pathlib import Path

#: Every benchmark's figures, merged (``bench/__main__.py``); the goals table of docs/benchmarks.md is
#: written from it.
RESULTS = Path(__file__).parent / "results" / "latest.json"
