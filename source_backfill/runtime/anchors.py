"""A source's anchors, kept beside its checkpoint, and their check against Kafka (``core/anchors.py``).

``<state_root>/sources/<source>/anchors.json``: ``{"newest": {split: {"offset": o, "fingerprint": f}},
"checked": {...}, "passed": {split: [...]}}``, the last record of each split as the source's newest
completed epoch gave it (all of its jobs' steps handed off), the one its last check verified, and those
epochs replaced before a check read them (``core.anchors.Anchors``; ``passed`` absent when none, as
releases before 2026-11-29 wrote it), written whole (``topic_record.write_record``). A folder without it
(an earlier release, a new source) starts with none and writes them at its next epoch.

:func:`find_truncations` reads each anchor's offset again on the driver (librdkafka with the source's
options and security, ``read_committed`` as the jobs read): the split's log start and end, and the record
at the offset. A split that does not answer is no verdict (logged): the live query's own errors say why.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from source_backfill.core import LiveStats
from source_backfill.core.anchors import (
    Anchor,
    Anchors,
    Found,
    Truncation,
    anchors_from_json,
    anchors_to_json,
    check,
)
from source_backfill.errors import StateFormatError, one_line
from source_backfill.runtime.topic_record import write_record

if TYPE_CHECKING:
    import pyarrow as pa

    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.config import SourceConfig
    from source_backfill.core import SplitId

logger = logging.getLogger(__name__)

FILE_NAME = "anchors.json"
#: How long a check waits for one anchor's record (the check runs on the source's supervisor thread).
READ_TIMEOUT_S = 10.0


def read_anchors(folder: Path) -> Anchors:
    """The recorded anchors (none when the file is absent)."""
    path = folder / FILE_NAME
    if not path.exists():
        return Anchors()
    try:
        return anchors_from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, StateFormatError) as exc:
        msg = f"{path.name} of a source cannot be read ({one_line(exc)}): remove it to record anchors again"
        raise StateFormatError(msg) from exc


def save_anchors(folder: Path, anchors: Anchors) -> None:
    """Write the anchors whole."""
    write_record(folder / FILE_NAME, anchors_to_json(anchors))


def from_stats(live: Mapping[SplitId, LiveStats]) -> list[Anchor]:
    """The anchors a live batch's stats give: each split's last record with its fingerprint."""
    return [Anchor(split, s.last, s.fingerprint) for split, s in live.items() if s.fingerprint is not None]


def last_fingerprints(rows: pa.Table, last: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], str]:
    """The fingerprints of the rows (Kafka's columns) at ``last[(topic, partition)]``'s offset."""
    import pyarrow.compute as pc

    from source_backfill.core.anchors import fingerprint

    if not last or rows.num_rows == 0:
        return {}
    # the offsets any split ends at: a handful of rows, then matched by split in Python
    picked = rows.filter(pc.is_in(rows["offset"], value_set=_int64s(sorted(set(last.values())))))
    ms = pc.divide(picked["timestamp"].cast("int64"), 1000)  # Kafka's milliseconds (exact: stored x 1000)
    out: dict[tuple[str, int], str] = {}
    for row, stamp in zip(picked.select(["key", "value", "topic", "partition", "offset"]).to_pylist(),
                          ms.to_pylist(), strict=True):
        where = (row["topic"], row["partition"])
        if last.get(where) == row["offset"]:
            out[where] = fingerprint(row["key"], row["value"], int(stamp))
    return out


def _int64s(values: list[int]) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.int64())


def find_truncations(admin: KafkaAdmin, config: SourceConfig, bootstrap: str,
                     anchors: list[Anchor]) -> tuple[list[Truncation], list[Anchor]]:
    """The anchors whose record the log no longer holds (see the module; a split may have several).

    And the anchors read (a verdict reached, truncated or not): one not read is checked again next time.
    """
    from connectors.kafka.ranges import KafkaRange, range_consumer, read_range
    from connectors.kafka.security import librdkafka_options
    from source_backfill.core import parse_split_id

    if not anchors:
        return [], []
    splits = sorted({a.split for a in anchors})
    try:
        starts = admin.earliest_offsets(splits)
        ends = admin.end_offsets(splits)
    except Exception as exc:  # noqa: BLE001 - no answer is no verdict
        logger.warning('anchors not checked source="%s" error="%s"', config.name, one_line(exc))
        return [], []
    kafka = librdkafka_options(config)
    consumer = None
    found: list[Truncation] = []
    read: list[Anchor] = []
    try:
        for anchor in anchors:
            split = anchor.split
            if split not in starts or split not in ends:
                continue
            at = Found(starts[split], ends[split])
            if at.log_start <= anchor.offset < at.log_end:
                topic, partition = parse_split_id(split)
                if consumer is None:
                    consumer = range_consumer(bootstrap, kafka, fetch_wait_ms=1)
                rng = KafkaRange(topic, partition, anchor.offset, anchor.offset + 1, check_loss=False)
                try:
                    rows = list(read_range(rng, bootstrap, kafka, poll_timeout_s=READ_TIMEOUT_S,
                                           consumer=consumer))
                except Exception as exc:  # noqa: BLE001 - not read: no verdict on this split now
                    logger.warning('anchor not read source="%s" split="%s" offset=%d error="%s"',
                                   config.name, split, anchor.offset, one_line(exc))
                    continue
                at = _record_at(rows, at, topic, partition, anchor.offset)
            verdict = check(anchor, at)
            read.append(anchor)
            if verdict is not None:
                found.append(verdict)
    finally:
        if consumer is not None:
            consumer.close()
    return found, read


def _record_at(batches: list[Any], at: Found, topic: str, partition: int, offset: int) -> Found:
    """``at`` with the first record read from ``offset`` on (its offset and fingerprint), if any."""
    import pyarrow as pa

    if not batches:
        return at
    rows = pa.Table.from_batches(batches)
    if rows.num_rows == 0:
        return at
    first = int(rows["offset"][0].as_py())
    fps = last_fingerprints(rows, {(topic, partition): first})
    return Found(at.log_start, at.log_end, first, fps.get((topic, partition)))
