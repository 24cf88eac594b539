"""The embedded broker's JVM: C1 alone for tests (it starts sooner), C2 as in production for benchmarks.

A broker stopped at C1 ran TLS without C2's AES-GCM intrinsics: a SASL_SSL backfill read at 0.55 of
plaintext's rate against it, 1.0 against the same broker compiled fully (``make bench
BENCH_ARGS=security``, docs/benchmarks.md).
"""

from connectors.kafka.embedded import EmbeddedBroker


def test_a_test_broker_stops_at_c1_and_a_benchmarked_one_compiles_fully():
    assert "-XX:TieredStopAtLevel=1" in EmbeddedBroker()._jvm_opts
    assert not any(o.startswith("-XX:TieredStopAtLevel") for o in EmbeddedBroker(full_jit=True)._jvm_opts)

