"""Backfills decoded by schema id (issue 48): ``formats.avro_ratio_vs_raw_copy``, ``.evolution_exactly_once``.

One embedded broker (full JIT, as production brokers run) and the embedded Schema Registry.

**Decoding's cost.** A topic of ``BENCH_FORMATS_RECORDS`` (1,000,000) Confluent-framed Avro records of a
10-field record (~150 B each) on 4 partitions. Jobs backfilling it from ``earliest`` are created in turn,
``BENCH_FORMATS_PAIRS`` (3) pairs, each timed from its create to Finished, after one untimed job of each
kind: a raw copy (the bytes as they are, the daemon's defaults) and an Avro job (``format.value =
"avro"``: every record decoded into typed columns). Each timed job is created right after an epoch of its
source: a copy ends at the epoch that adopts its read, so where its create falls in the trigger interval
weighs on its time, and without this the jobs' order set it (the Avro job came after the copy read in its
epochs, whose last epoch ends late in its interval: it started ~0.7 s into one, the raw copy ~0.05 s;
with a 3.2 s read the Avro job took 4.27 s, adopted at its fifth epoch boundary, the raw copy 2.95 s).
``formats.avro_ratio_vs_raw_copy`` = records/s of the Avro job / records/s of the raw copy, medians (goal
>= 0.7). Also, the same with the raw copy reading
its history inside the epochs as the Avro job does (``read_ahead = false``):
``formats.avro_ratio_vs_raw_in_epoch``, what decoding alone costs. And a Protobuf job over the same
values as a proto3 message on a topic of their own (``format.value = "protobuf"``, decoded in Python
workers): ``formats.protobuf_ratio_vs_raw_copy`` (no goal).

**Evolution, exactly once.** A topic of ``BENCH_FORMATS_EVOLUTION_RECORDS`` (1,000,000) records written by
v1, v2 and v3 of a subject (a third each), then an Avro job (``evolve``), and while it backfills a live
producer writes v3 and then moves to v4 (a field added). Once it has caught up, its table must hold every
offset once (``source_backfill.verify``) and every row the values its writer gave, resolved onto the
table's final reader (defaults where the reader adds a field): ``formats.evolution_exactly_once`` = 1.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.jobs import backfill_seconds
from tests.fixtures.avro import VERSIONS, record

QUICK = os.environ.get("BENCH_QUICK") == "1"
RECORDS = int(os.environ.get("BENCH_FORMATS_RECORDS", "20000" if QUICK else "1000000"))
EVOLUTION_RECORDS = int(os.environ.get("BENCH_FORMATS_EVOLUTION_RECORDS", "20000" if QUICK else "1000000"))
PAIRS = int(os.environ.get("BENCH_FORMATS_PAIRS", "1" if QUICK else "3"))
PARTITIONS = 4

#: A 10-field record of ~150 B in Avro (the issue's): ids, amounts, text.
WIDE = {"type": "record", "name": "Payment", "fields": [
    {"name": "id", "type": "long"}, {"name": "account", "type": "long"}, {"name": "amount", "type": "double"},
    {"name": "fee", "type": "double"}, {"name": "currency", "type": "string"},
    {"name": "merchant", "type": "string"}, {"name": "city", "type": "string"},
    {"name": "channel", "type": "string"}, {"name": "approved", "type": "boolean"},
    {"name": "note", "type": ["null", "string"], "default": None}]}

#: v1 ⊂ v2 ⊂ v3 ⊂ v4 of the tests' Avro fixture, each adding a field with a default
EVOLUTION = {v: schema.avro() for v, schema in VERSIONS.items()}


def _register(url: str, subject: str, schema: dict[str, Any]) -> int:
    import httpx

    r = httpx.post(f"{url}/subjects/{subject}/versions", json={"schema": json.dumps(schema)}, timeout=30)
    r.raise_for_status()
    return int(r.json()["id"])


def _wide(i: int) -> dict[str, Any]:
    return {"id": i, "account": 1_000_000 + i % 9_973, "amount": i * 0.37, "fee": (i % 100) / 10,
            "currency": ("EUR", "USD", "GBP")[i % 3], "merchant": f"merchant-{i % 5_000:05d}",
            "city": ("Lisbon", "Porto", "Braga", "Faro")[i % 4], "channel": ("web", "app", "pos")[i % 3],
            "approved": i % 11 != 0, "note": None if i % 4 else f"batch {i // 1000}"}


class _Writer:
    """Confluent-framed Avro records into a topic, as fast as the broker takes them."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                                  "batch.num.messages": 20000, "queue.buffering.max.messages": 1_000_000})
        self.sent = 0

    def write(self, sid: int, schema: dict[str, Any], records: Any) -> int:
        import fastavro

        parsed = fastavro.parse_schema(schema)
        header = b"\x00" + struct.pack(">I", sid)
        n = 0
        for rec in records:
            buf = io.BytesIO()
            buf.write(header)
            fastavro.schemaless_writer(buf, parsed, rec)
            self.produce(buf.getvalue(), rec["id"] % PARTITIONS)
            n += 1
        self.producer.flush(300)
        return n

    def produce(self, value: bytes, partition: int) -> None:
        """One record, waiting while the producer's queue is full."""
        while True:
            try:
                self.producer.produce(self.topic, value=value, partition=partition)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.sent += 1
        if self.sent % 20000 == 0:
            self.producer.poll(0)


#: WIDE as a proto3 message (the same fields, types and values)
WIDE_PROTO = """syntax = "proto3";
message Payment {
  int64 id = 1; int64 account = 2; double amount = 3; double fee = 4; string currency = 5;
  string merchant = 6; string city = 7; string channel = 8; bool approved = 9; optional string note = 10;
}
"""


def _write_protobuf(bootstrap: str, registry: str, topic: str) -> None:
    """:data:`RECORDS` records of :data:`WIDE_PROTO` (the Avro topic's values) into ``topic``."""
    import httpx

    from connectors.schema_registry.decode_protobuf import message_class
    from source_backfill.core.proto_schema import first_message, zigzag_indexes

    r = httpx.post(f"{registry}/subjects/{topic}-value/versions", timeout=30,
                   json={"schema": WIDE_PROTO, "schemaType": "PROTOBUF"})
    r.raise_for_status()
    header = b"\x00" + struct.pack(">I", int(r.json()["id"])) + zigzag_indexes((0,))
    cls = message_class(first_message(WIDE_PROTO))
    writer = _Writer(bootstrap, topic)
    for i in range(RECORDS):
        rec = {k: v for k, v in _wide(i).items() if v is not None}
        writer.produce(header + cls(**rec).SerializeToString(), i % PARTITIONS)
    writer.producer.flush(300)


def _after_an_epoch(daemon: Any, source: str, timeout_s: float = 30.0) -> None:
    """Return once ``source`` has completed an epoch since the call (each timed job starts at one).

    After ``timeout_s`` without one it returns anyway: that job is timed unaligned, not lost.
    """
    src = daemon.sources[source]
    seen, deadline = src.last_epoch, time.monotonic() + timeout_s
    while src.last_epoch == seen and time.monotonic() < deadline:
        time.sleep(0.005)


def _decoding_cost(daemon: Any, work: Path) -> dict[str, float]:
    kinds: dict[str, dict[str, Any]] = {
        "raw": {},
        "raw_in_epoch": {"read_ahead": False},
        "avro": {"format": {"value": "avro"}},
        "protobuf": {"source": "wide_proto", "format": {"value": "protobuf"}},
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for kind, extra in kinds.items():  # warm-up, not timed
        warm = f"{kind}-warm"
        backfill_seconds(daemon, {"name": warm, "source": "wide", "sink_path": str(work / warm), **extra})
    for pair in range(PAIRS):
        for kind, extra in kinds.items():
            name = f"{kind}-{pair}"
            spec = {"name": name, "source": "wide", "sink_path": str(work / name), **extra}
            _after_an_epoch(daemon, spec["source"])
            took = backfill_seconds(daemon, spec)
            times[kind].append(took)
            print(f"  round {pair + 1}: {kind} backfill {took:.1f} s ({RECORDS / took:,.0f} records/s)",
                  flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["raw"] / med["avro"]
    in_epoch = med["raw_in_epoch"] / med["avro"]
    proto = med["raw"] / med["protobuf"]
    print(f"formats.avro_ratio_vs_raw_copy = {ratio:.3f} (raw {med['raw']:.1f} s, avro {med['avro']:.1f} s, "
          f"medians of {PAIRS}; goal >= 0.7); vs a raw copy read in its epochs {in_epoch:.3f} "
          f"({med['raw_in_epoch']:.1f} s); formats.protobuf_ratio_vs_raw_copy = {proto:.3f} (protobuf "
          f"{med['protobuf']:.1f} s, no goal)", flush=True)
    return {"formats.avro_ratio_vs_raw_copy": round(ratio, 3), "formats.avro_ratio_vs_raw_in_epoch":
            round(in_epoch, 3), "formats.protobuf_ratio_vs_raw_copy": round(proto, 3),
            "formats.raw_backfill_s": round(med["raw"], 2),
            "formats.raw_in_epoch_backfill_s": round(med["raw_in_epoch"], 2),
            "formats.avro_backfill_s": round(med["avro"], 2),
            "formats.protobuf_backfill_s": round(med["protobuf"], 2), "formats.records": RECORDS}


def _evolution(daemon: Any, bootstrap: str, registry: str, writer: _Writer, ids: dict[int, int],
               work: Path) -> dict[str, Any]:
    from deltalake import DeltaTable

    from source_backfill.config import JobSpec
    from source_backfill.core.schema_evolution import parse, resolve
    from source_backfill.executors.decoding import READER_PROPERTY
    from source_backfill.verify import check_exactly_once

    sent: dict[int, int] = {}  # id -> writer version
    next_id = [EVOLUTION_RECORDS]
    stop = threading.Event()

    def live() -> None:  # v3 for a while, then v4 (registered then: the job's reader is v3), ~500 records/s
        version = 3
        started = time.monotonic()
        while not stop.wait(0.1):
            if version == 3 and time.monotonic() - started > 5:
                ids[4] = _register(registry, f"{writer.topic}-value", EVOLUTION[4])
                version = 4
            batch = range(next_id[0], next_id[0] + 50)
            writer.write(ids[version], EVOLUTION[version], (record(version, i) for i in batch))
            for i in batch:
                sent[i] = version
            next_id[0] += 50

    thread = threading.Thread(target=live, daemon=True)
    name, path = "evolving", work / "evolving"
    t = time.monotonic()
    daemon.registry.create(JobSpec(name=name, source="orders", sink_path=str(path),
                                   format={"value": "avro"}))  # type: ignore[arg-type]
    thread.start()
    jobs = daemon.sources["orders"].jobs
    while name not in jobs or not jobs[name].backfill_done:
        if daemon.registry.get(name).error is not None:
            stop.set()
            msg = f"{name} failed: {daemon.registry.get(name).error}"
            raise RuntimeError(msg)
        time.sleep(0.2)
    took = time.monotonic() - t
    stop.set()
    thread.join(60)
    deadline = time.monotonic() + 120
    while True:
        report = check_exactly_once(str(path), bootstrap, [writer.topic])
        if report.ok or time.monotonic() > deadline:
            break
        time.sleep(1)
    table = DeltaTable(str(path))
    reader = parse(table.metadata().configuration[READER_PROPERTY])
    rows = table.to_pyarrow_table(columns=[f.name for f in reader.fields]).to_pylist()
    wrong = 0
    third = EVOLUTION_RECORDS // 3
    for row in rows:
        i = row["id"]
        version = sent.get(i) or (1 if i < third else 2 if i < 2 * third else 3)
        want = resolve(reader, parse(EVOLUTION[version])).project(record(version, i))
        wrong += any(row[k] != v for k, v in want.items())
    ok = report.ok and wrong == 0 and len(rows) == EVOLUTION_RECORDS + len(sent)
    v4 = sum(v == 4 for v in sent.values())
    print(f"formats.evolution_exactly_once = {int(ok)} ({len(rows):,} rows, {EVOLUTION_RECORDS:,} history "
          f"over v1-v3 + {len(sent):,} live, {v4:,} of them v4; exactly once: {report.ok}, rows not as their "
          f"writer gave them: {wrong}; columns {[f.name for f in reader.fields]}; backfill {took:.1f} s)",
          flush=True)
    return {"formats.evolution_exactly_once": int(ok), "formats.evolution_rows": len(rows),
            "formats.evolution_backfill_s": round(took, 2)}


def main() -> dict[str, Any]:
    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker
    from source_backfill.config import load_settings
    from source_backfill.daemon import Daemon
    from source_backfill.testing import schema_registry_url

    work = Path(tempfile.mkdtemp(prefix="bench-formats-"))
    with EmbeddedBroker(full_jit=True) as broker, schema_registry_url() as registry:
        admin = KafkaAdmin(broker.bootstrap)
        for topic in ("bench-wide", "bench-wide-proto", "bench-orders"):
            admin.create_topic(topic, PARTITIONS)
        admin.close()
        t = time.monotonic()
        wide = _Writer(broker.bootstrap, "bench-wide")
        wide.write(_register(registry, "bench-wide-value", WIDE), WIDE, (_wide(i) for i in range(RECORDS)))
        print(f"  {RECORDS:,} Avro records in {time.monotonic() - t:.1f} s", flush=True)
        t = time.monotonic()
        _write_protobuf(broker.bootstrap, registry, "bench-wide-proto")
        print(f"  {RECORDS:,} Protobuf records in {time.monotonic() - t:.1f} s", flush=True)
        orders = _Writer(broker.bootstrap, "bench-orders")
        ids = {v: _register(registry, "bench-orders-value", EVOLUTION[v]) for v in (1, 2, 3)}
        third = EVOLUTION_RECORDS // 3
        spans = ((1, range(third)), (2, range(third, 2 * third)), (3, range(2 * third, EVOLUTION_RECORDS)))
        for v, span in spans:
            orders.write(ids[v], EVOLUTION[v], (record(v, i) for i in span))
        base = {"bootstrap_servers": broker.bootstrap, "trigger_interval_s": 1.0,
                "starting_offsets": "latest", "schema_registry": {"url": registry}}
        settings = load_settings(
            daemon={"state_root": str(work / "state")}, api={"port": 0}, metrics={"port": None},
            sources=[{**base, "name": "wide", "topics": ["bench-wide"]},
                     {**base, "name": "wide_proto", "topics": ["bench-wide-proto"]},
                     {**base, "name": "orders", "topics": ["bench-orders"]}],
        )
        daemon = Daemon(settings)
        daemon.start()
        try:
            figures = _decoding_cost(daemon, work)
            figures.update(_evolution(daemon, broker.bootstrap, registry, orders, ids, work))
        finally:
            daemon.stop()
    return figures


if __name__ == "__main__":
    main()
