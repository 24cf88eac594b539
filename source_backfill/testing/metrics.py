"""Read the daemon's ``/metrics`` the way Prometheus does, for tests and benchmarks."""

from __future__ import annotations

import httpx

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str) -> Samples:
    """``GET {url}/metrics`` as ``name -> [(labels, value)]``, names without ``source_backfill_``.

    An unreachable daemon gives no samples.
    """
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"{url}/metrics", timeout=30).text
    except httpx.HTTPError:
        return {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name.removeprefix("source_backfill_"), []).append((s.labels, s.value))
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))
