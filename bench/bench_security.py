"""Backfill over SASL_SSL vs over plaintext, same run (issue 47): ``security.sasl_ssl_ratio``.

Two embedded brokers, one plaintext and one with a ``SASL_SSL`` listener (SCRAM-SHA-512, a private CA: the
test suite's secured broker), each holding the same history (``BENCH_SECURITY_RECORDS``, 1,000,000
records of ~130 B on 4 partitions). One daemon reads both, one source each; jobs backfilling the whole
history from ``earliest`` are created in turn, plaintext first, ``BENCH_SECURITY_PAIRS`` (3) pairs, each
timed from its create to Finished, after one untimed job on each source (Spark's and each client's first
read pay their warm-up: a first plaintext copy took 10 s, the next 5 s). ``security.sasl_ssl_ratio`` =
records/s over SASL_SSL / records/s in plaintext, medians (goal >= 0.8): what TLS and SCRAM cost a user's
backfill, Spark's Java client reading history and the admin and driver reads going through librdkafka.
``BENCH_SECURITY_PROTOCOL=SSL`` runs the same over TLS with client certificates and no SASL
(``security.ssl_ratio``), to tell what TLS costs from what SCRAM adds.

Both brokers compile hot code fully (``EmbeddedBroker(full_jit=True)``), as a production broker does; the
test suite's stop at C1, which has no AES-GCM intrinsics: against those the same backfill over SASL_SSL
read at 0.55 of plaintext's rate, the broker's TLS the bottleneck. ``BENCH_SECURITY_FULL_JIT=0`` measures
that case again.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.jobs import backfill_seconds
from bench.records import fill

QUICK = os.environ.get("BENCH_QUICK") == "1"
RECORDS = int(os.environ.get("BENCH_SECURITY_RECORDS", "20000" if QUICK else "1000000"))
PAIRS = int(os.environ.get("BENCH_SECURITY_PAIRS", "3"))
#: ``SSL`` (TLS with client certificates, no SASL) tells what TLS costs from what SCRAM adds.
PROTOCOL = os.environ.get("BENCH_SECURITY_PROTOCOL", "SASL_SSL")
PARTITIONS = 4
TOPIC = "bench-security"


def _history(broker: Any, config: dict[str, str]) -> None:
    from connectors.kafka.admin import KafkaAdmin

    admin = KafkaAdmin(broker.bootstrap, {k: v for k, v in config.items() if k != "bootstrap.servers"})
    try:
        admin.create_topic(TOPIC, PARTITIONS)
    finally:
        admin.close()
    t = time.monotonic()
    fill(broker.bootstrap, TOPIC, RECORDS, PARTITIONS, config)
    print(f"  {broker.security}: {RECORDS:,} records in {time.monotonic() - t:.1f} s", flush=True)


def main() -> dict[str, float]:
    from connectors.kafka.embedded import EmbeddedBroker
    from source_backfill.config import load_settings
    from source_backfill.daemon import Daemon

    work = Path(tempfile.mkdtemp(prefix="bench-security-"))
    jit = os.environ.get("BENCH_SECURITY_FULL_JIT", "1") == "1"
    with EmbeddedBroker(full_jit=jit) as plain, \
            EmbeddedBroker(security=PROTOCOL, full_jit=jit) as secured:  # type: ignore[arg-type]
        _history(plain, {})
        _history(secured, secured.librdkafka_config())
        base = {"topics": [TOPIC], "trigger_interval_s": 1.0, "starting_offsets": "latest"}
        settings = load_settings(
            daemon={"state_root": str(work / "state")}, api={"port": 0}, metrics={"port": None},
            sources=[{**base, "name": "plain", "bootstrap_servers": plain.bootstrap},
                     {**base, "name": "secured", "bootstrap_servers": secured.bootstrap,
                      "security": secured.client_security()}],
        )
        daemon = Daemon(settings)
        daemon.start()
        try:
            times: dict[str, list[float]] = {"plain": [], "secured": []}
            for source in ("plain", "secured"):  # warm-up, not timed
                warm = f"{source}-warm"
                backfill_seconds(daemon, {"name": warm, "source": source, "sink_path": str(work / warm)})
            for pair in range(PAIRS):
                for source in ("plain", "secured"):
                    name = f"{source}-{pair}"
                    spec = {"name": name, "source": source, "sink_path": str(work / name)}
                    took = backfill_seconds(daemon, spec)
                    times[source].append(took)
                    rate = RECORDS / took
                    print(f"  pair {pair + 1}: {source} backfill {took:.1f} s ({rate:,.0f} records/s)",
                          flush=True)
        finally:
            daemon.stop()
    plain_s, sasl_s = statistics.median(times["plain"]), statistics.median(times["secured"])
    ratio = plain_s / sasl_s  # records/s over SASL_SSL / records/s in plaintext
    key = "security.sasl_ssl_ratio" if PROTOCOL == "SASL_SSL" else f"security.{PROTOCOL.lower()}_ratio"
    print(f"{key} = {ratio:.3f} (plaintext {plain_s:.1f} s, {PROTOCOL} {sasl_s:.1f} s, "
          f"medians of {PAIRS}; goal >= 0.8)", flush=True)
    return {key: round(ratio, 3), "security.plain_backfill_s": round(plain_s, 2),
            f"security.{PROTOCOL.lower()}_backfill_s": round(sasl_s, 2), "security.records": RECORDS}


if __name__ == "__main__":
    main()
