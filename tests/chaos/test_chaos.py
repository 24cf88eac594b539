"""The crash suite's short mode (``make test``): a few SIGKILL/restart cycles, then exactly once, against
the embedded broker's SASL_SSL mode.

Three cycles by default: enough for a kill mid-backfill, one in the archive part, one with the tail's
repair in flight (the 3rd cycle), a short burst that makes the slow source's heavy job skip epochs (the
1st) and a long one that fails it past its lag bound before the kill (the 2nd); a 4th asserted nothing
more (it was the default until 2026-11-28: ~50 s of make test). ``CHAOS_CYCLES`` and
``CHAOS_SEED`` override the cycle count and the seed (the seed is printed, so a failing run can be
replayed); ``make chaos CYCLES=N`` runs the crash suite as a soak (CI: 20 cycles, after ``make test``).
"""

from __future__ import annotations

import os

import pytest

from tests.chaos.chaos import run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def test_sigkill_at_random_moments_then_every_job_exactly_once(secured_broker, tmp_path, record_property):
    """Against the secured broker (SASL_SSL, SCRAM, a private CA, ACLs on): every client of the daemon and
    of the suite connects as the cluster asks through kills and restarts. CI's ``make chaos CYCLES=10
    SECURED=1`` runs more cycles the same way (and ``CYCLES=20 CLUSTER=1`` on three brokers); ``make chaos``
    on a plain broker by hand."""
    cycles = int(os.environ.get("CHAOS_CYCLES", "3"))
    seed = int(os.environ["CHAOS_SEED"]) if os.environ.get("CHAOS_SEED") else None
    summary = run_chaos(secured_broker.bootstrap, tmp_path, cycles, seed,
                        kafka=secured_broker.librdkafka_config(), security=secured_broker.client_security())
    record_property("summary", summary.line())  # shown in make test's output, pass or fail (conftest)
    assert summary.cycles == cycles
    assert summary.records >= 200_000
    assert summary.mid_backfill >= min(5, cycles), summary.line()  # the kills hit a running backfill
    assert summary.mid_archive >= min(1, cycles), summary.line()  # and its archive part
    assert summary.whole_files > 0, summary.line()  # some of the archive's files were taken whole
    assert summary.ok, summary.line()  # the audit table's too: each accepted mutation id once
    assert summary.audit_rows > 0, summary.line()
    if cycles >= 3:  # the 3rd cycle asks the tail for a repair: it is done by the end, whatever the kills
        assert summary.repairs_committed is not None, summary.line()
    if cycles >= 2:  # the heavy job lagged behind its neighbour and read the skipped offsets back by offsets,
        # and the 2nd cycle's long burst failed it past its bound (the driver retried it): exactly once all
        # the same (summary.ok above)
        assert summary.skipped > 0 and summary.rejoins > 0, summary.line()
        assert summary.bound_hits > 0 and summary.retries > 0, summary.line()

